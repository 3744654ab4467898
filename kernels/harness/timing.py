"""GPU timing used inside the sandboxed runner: events, L2 flush, CUDA graphs, interleaving.

Method (docs/harness.md, Measurement): warm up; flush L2 between calls (or rotate input sets
larger than L2 under graphs); CUDA events; many samples, median and interquartile spread; all
functions of one shape interleaved in random order, round by round, in one process; kernels
under ~50 us are timed by replaying a CUDA graph of several calls, which removes launch gaps
for the candidate and the baselines alike.

Two budgets: a fixed one (at least MIN_SAMPLES and `budget_s` of sampling per shape) for
confirmations, baselines and plain evaluations, and an adaptive one for screening, which stops
as soon as the 95% confidence interval of every median is within `rel_ci` of it (at least
SCREEN_MIN_SAMPLES samples, never past `budget_s`), as do_bench-style tools do. Screening also
stops sampling a candidate on a shape it has lost beyond doubt: LOSE_MIN_SAMPLES samples, every
one slower than a bar (the faster baseline's cached median; `lost`).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

GRAPH_THRESHOLD_MS = 0.05
MIN_SAMPLES = 25
SCREEN_MIN_SAMPLES = 10
# With 6 samples the distribution-free 95% confidence interval of the median is [min, max]
# (`median_ci`): when even the fastest is slower than the bar, the median is slower too, unless
# all six fell above a median below the bar, which happens with probability 2**-6 (1.6%).
LOSE_MIN_SAMPLES = 6
MAX_SAMPLES = 200
GRAPH_REPS = 20
MAX_INPUT_SETS = 32  # graph mode cycles through at most this many input sets (L2 rotation)
# The output verified while timing is that of one more sample made once sampling is over, on
# new values copied into the buffers that call reads (childrun.measure_shape). Those values are
# input set EVENTS_INPUT_SET in events mode; in graph mode, MAX_INPUT_SETS + the set of the
# captured call whose output is kept (picked by the secret seed). No other input set of the
# shape has those seeds.
EVENTS_INPUT_SET = 2 * MAX_INPUT_SETS
# The L2 size assumed where the device's ceilings do not give it.
DEFAULT_L2_BYTES = 50 << 20


def graph_plan(l2_bytes: int | None, set_bytes: int, final_seed: int) -> tuple[int, int, int]:
    """Graph mode's plan for a shape whose inputs take `set_bytes`: (input sets cycled through,
    calls captured, the captured call whose output is kept). Enough sets that together they
    exceed the L2 2.5 times; the kept call is one past the first, picked by the secret seed
    `final_seed`. The child (childrun.prepare_shape) captures by it; the caller predicts from it
    which new values the kept call's output will be made on (`fresh_set`)."""
    l2 = int(l2_bytes or DEFAULT_L2_BYTES)
    nsets = max(1, min(MAX_INPUT_SETS, math.ceil(2.5 * l2 / max(set_bytes, 1))))
    reps = max(GRAPH_REPS, nsets)
    reps = math.ceil(reps / nsets) * nsets
    pick = random.Random(final_seed ^ 0x9A7).randrange(1, reps) if reps > 1 else 0
    return nsets, reps, pick


def fresh_set(mode: str, l2_bytes: int | None, set_bytes: int, final_seed: int) -> int:
    """The input set whose values the output verified after the samples is made on, in timing
    mode `mode` (`is_fresh_set` holds for it)."""
    if mode == "events":
        return EVENTS_INPUT_SET
    nsets, _, pick = graph_plan(l2_bytes, set_bytes, final_seed)
    return MAX_INPUT_SETS + pick % nsets


def inputs_bytes(inputs: Sequence[torch.Tensor]) -> int:
    """The bytes of one input set (every input a tensor)."""
    return sum(x.numel() * x.element_size() for x in inputs)


def input_set_seed(rot: list[int], j: int) -> int:
    """The seed of a shape's input set j (j >= 1), from its secret `rot` seeds: the sets graph
    mode cycles through and the new values made after the samples (childrun) and their float64
    references (the caller's `rotJ`) all come from here."""
    return rot[j % len(rot)] + j


def is_fresh_set(mode: object, inputs_set: int) -> bool:
    """Whether `inputs_set` names new values made after the samples, in timing mode `mode`."""
    if mode == "events":
        return inputs_set == EVENTS_INPUT_SET
    return MAX_INPUT_SETS <= inputs_set < 2 * MAX_INPUT_SETS


WARMUP_S = 0.05
SLEEP_CYCLES = 200_000  # ~100 us at H100/H200 clocks


def median_ci(samples: Sequence[float]) -> float | None:
    """Half-width of the distribution-free 95% confidence interval of the median, relative to
    the median: order statistics j, k = n/2 -+ 1.96 sqrt(n)/2 (None below 6 samples)."""
    s = sorted(samples)
    n = len(s)
    if n < 6:
        return None
    half = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    med = statistics.median(s)
    return (s[hi] - s[lo]) / (2 * med) if med > 0 else None


def stats(samples: Sequence[float]) -> dict:
    s = sorted(samples)
    n = len(s)
    q = statistics.quantiles(s, n=4, method="inclusive") if n >= 2 else [s[0]] * 3
    med = statistics.median(s)
    return {
        "median": med,
        "p25": q[0],
        "p75": q[2],
        "min": s[0],
        "max": s[-1],
        "n": n,
        "spread": (q[2] - q[0]) / med if med > 0 else None,
        "ci": median_ci(s),
    }


@triton.jit
def _gate_kernel(flag_ptr, max_spins):
    # Spin on a host-pinned flag: the GPU waits here until the host has queued the whole
    # timed region, so host-side jitter (Python, a busy CPU) never lands between the events.
    i = 0
    while (tl.load(flag_ptr, volatile=True) == 0) & (i < max_spins):
        i += 1


class Gate:
    """Blocks the stream until `open()`; falls back to a fixed spin when unavailable."""

    MAX_SPINS = 2_000_000

    def __init__(self) -> None:
        self.flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.ok = False
        try:
            self.flag.fill_(1)
            _gate_kernel[(1,)](self.flag, 10)
            torch.cuda.synchronize()
            self.flag.fill_(0)
            t0 = time.perf_counter()
            _gate_kernel[(1,)](self.flag, self.MAX_SPINS)
            time.sleep(0.002)
            self.flag.fill_(1)
            torch.cuda.synchronize()
            self.ok = time.perf_counter() - t0 < 0.5
        except Exception:
            torch.cuda.synchronize()
            self.ok = False

    def close(self) -> None:
        if self.ok:
            self.flag.fill_(0)
            _gate_kernel[(1,)](self.flag, self.MAX_SPINS)
        else:
            torch.cuda._sleep(SLEEP_CYCLES)

    def open(self) -> None:
        if self.ok:
            self.flag.fill_(1)


_gate: Gate | None = None


def gate() -> Gate:
    global _gate
    if _gate is None:
        _gate = Gate()
    return _gate


_flushers: dict[int, L2Flusher] = {}


def flusher(l2_bytes: int) -> L2Flusher:
    """One flush buffer per process (twice the L2), shared by every shape."""
    if l2_bytes not in _flushers:
        _flushers[l2_bytes] = L2Flusher(l2_bytes, "cuda")
    return _flushers[l2_bytes]


class L2Flusher:
    def __init__(self, l2_bytes: int, device: str) -> None:
        n = max(2 * l2_bytes, 64 << 20) // 4
        self.buf = torch.empty(n, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def _event_sample(fn: Callable[[], object], flush: L2Flusher) -> Callable[[], object]:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    g = gate()

    def sample():
        flush()
        g.close()
        start.record()
        fn()
        end.record()
        g.open()
        return start, end

    return sample


def quick_ms(fn: Callable[[], object], flush: L2Flusher, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        s, e = _event_sample(fn, flush)()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def capture(fns_by_set: list[Callable[[], object]], reps: int) -> tuple[object, list]:
    """Capture `reps` calls cycling over input sets into one CUDA graph; return graph, outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns_by_set[:3]:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    outs: list = []
    with torch.cuda.graph(g):
        for i in range(reps):
            outs.append(fns_by_set[i % len(fns_by_set)]())
    torch.cuda.synchronize()
    return g, outs


def interleaved(
    samplers: dict[str, Callable[[], tuple]],
    *,
    per_call_divisor: dict[str, int],
    budget_s: float,
    rng: random.Random,
    rel_ci: float | None = None,
    warmup_s: float = WARMUP_S,
    lose_ms: dict[str, float] | None = None,
) -> dict[str, dict]:
    """Take samples from each sampler in shuffled order each round.

    Fixed budget (`rel_ci` None): until MIN_SAMPLES and `budget_s`, or MAX_SAMPLES. Adaptive
    (screening): from SCREEN_MIN_SAMPLES on, stop once every median's confidence interval is
    within `rel_ci`; `budget_s` is then the most it may take. A sampler given a bar in
    `lose_ms` (adaptive only) needs no more samples once it has lost to it (`lost`): sampling
    ends when each sampler is tight or has lost, and the stats of one that ended lost, not
    tight, say so (`slower_than_ms`, the bar).
    """
    names = list(samplers)
    samples: dict[str, list[float]] = {n: [] for n in names}
    bars = {n: b for n, b in (lose_ms or {}).items() if n in samplers and b > 0}
    # Warm up by time, not count: clocks ramp from idle and a few microsecond-long calls
    # would be timed at the low clock. A caller timing shapes back to back warms up once.
    t0 = time.perf_counter()
    while True:
        for n in names:
            samplers[n]()
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= warmup_s:
            break
    t0 = time.perf_counter()
    while True:
        order = names[:]
        rng.shuffle(order)
        pending = [(n, samplers[n]()) for n in order]
        torch.cuda.synchronize()
        for n, (s, e) in pending:
            samples[n].append(s.elapsed_time(e) / per_call_divisor[n])
        k = len(samples[names[0]])
        elapsed = time.perf_counter() - t0
        if k >= MAX_SAMPLES:
            break
        if rel_ci is None:
            if k >= MIN_SAMPLES and elapsed > budget_s:
                break
        elif screened(samples, elapsed, budget_s, rel_ci, bars):
            break
    out = {n: stats(v) for n, v in samples.items()}
    if rel_ci is not None:
        for n, bar in bars.items():
            if lost(samples[n], bar) and not _enough(samples[n], rel_ci):
                out[n]["slower_than_ms"] = bar
    return out


def screened(
    samples: dict[str, list[float]],
    elapsed: float,
    budget_s: float,
    rel_ci: float,
    bars: dict[str, float],
) -> bool:
    """Whether adaptive sampling is over: each sampler's median tight (`_enough`) or, where it
    has a bar, lost to it (`lost`); or the budget spent, from SCREEN_MIN_SAMPLES on."""
    k = min(len(v) for v in samples.values())
    if k >= SCREEN_MIN_SAMPLES and elapsed > budget_s:
        return True
    return all(_enough(v, rel_ci) or lost(v, bars.get(n)) for n, v in samples.items())


def _enough(samples: list[float], rel_ci: float) -> bool:
    return len(samples) >= SCREEN_MIN_SAMPLES and _tight(samples, rel_ci)


def _tight(samples: list[float], rel_ci: float) -> bool:
    ci = median_ci(samples)
    return ci is not None and ci <= rel_ci


def lost(samples: Sequence[float], bar: float | None) -> bool:
    """Whether samples show, beyond doubt, a median slower than `bar`: at least
    LOSE_MIN_SAMPLES of them, the fastest slower than the bar."""
    return bar is not None and len(samples) >= LOSE_MIN_SAMPLES and min(samples) > bar


def graph_sampler(graph) -> Callable[[], tuple]:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    g = gate()

    def sample():
        g.close()
        start.record()
        graph.replay()
        end.record()
        g.open()
        return start, end

    return sample


def measure_ceilings(device: str = "cuda") -> dict:
    """Copy bandwidth (bytes read + written) and bf16 matrix rate, measured on this device."""
    props = torch.cuda.get_device_properties(device)
    n = 1 << 30  # 1 GiB each way
    src = torch.randn(n // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    copy_ms = statistics.median(times)
    copy_gbps = 2 * n / (copy_ms * 1e-3) / 1e9
    del src, dst
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    mm_ms = statistics.median(times)
    return {
        "copy_gbps": round(copy_gbps, 1),
        "matmul_tflops_bf16": round(2 * m**3 / (mm_ms * 1e-3) / 1e12, 1),
        "l2_bytes": int(getattr(props, "L2_cache_size", DEFAULT_L2_BYTES)),
        "sm_count": props.multi_processor_count,
        "method": "median of 20 device-to-device copies of 1 GiB (read+write bytes); "
        "median of 10 bf16 8192^3 products on random data; CUDA events",
    }
