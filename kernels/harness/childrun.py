"""What the sandboxed child does with one spec. Imported by runner.py before any candidate.

Nothing here decides correctness: outputs go to files the parent compares with its own
float64 reference. Observations that only this process can make are reported as facts:
torch ops the candidate dispatched, aliasing, mutated inputs, output type, stream leaks,
CUDA-graph capture, tampering with torch/triton/timers/the harness, timings.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib.util
import json
import math
import os
import random
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.harness import runner, static, timing

# aten ops a candidate may dispatch: allocation, views, copies and metadata. Anything else is
# a torch compute op, i.e. library fallback.
ALLOWED_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "zero_",
        "fill_",
        "full",
        "full_like",
        "new_full",
        "ones",
        "ones_like",
        "new_ones",
        "view",
        "_unsafe_view",
        "reshape",
        "as_strided",
        "t",
        "transpose",
        "permute",
        "expand",
        "select",
        "slice",
        "unsqueeze",
        "squeeze",
        "detach",
        "alias",
        "lift_fresh",
        "clone",
        "copy_",
        "_to_copy",
        "contiguous",
        "unbind",
        "split",
        "split_with_sizes",
        "narrow",
        "flatten",
        "unflatten",
        "view_as",
        "expand_as",
        "movedim",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "stride",
        "size",
        "is_contiguous",
        "dim",
        "numel",
        "is_same_size",
    }
)
# Triton's CPU interpreter moves arguments to numpy and back through these.
INTERPRETER_OPS = frozenset({"set_"})


class OpRecorder(TorchDispatchMode):
    """Records every aten op dispatched while a candidate runs."""

    def __init__(self, allowed: frozenset[str]) -> None:
        super().__init__()
        self.allowed = allowed
        self.violations: dict[str, int] = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.allowed:
            key = f"aten.{name}"
            self.violations[key] = self.violations.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        _RECORDING.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _RECORDING.remove(self)
        return super().__exit__(*exc)


# The recorders of the candidate calls running now (innermost last).
_RECORDING: list[OpRecorder] = []
PRINTED = "tensor values read as text (repr, str, format, print)"


def _record_tensor_printing() -> None:
    """A tensor turned into text reads its values on the host with every dispatch mode switched
    off (torch._tensor_str), so the recorder would not see it: a kernel parsing the text and
    computing in Python. Counted as a violation while a candidate call runs."""
    import torch._tensor_str as tensor_str

    real = tensor_str._str

    @functools.wraps(real)
    def _str(self, *args, **kwargs):
        if _RECORDING:
            rec = _RECORDING[-1]
            rec.violations[PRINTED] = rec.violations.get(PRINTED, 0) + 1
        return real(self, *args, **kwargs)

    tensor_str._str = _str


# ---- tamper detection -------------------------------------------------------------------


def _watched() -> dict[str, object]:
    import torch.nn.functional as F

    mods = {
        "torch": torch,
        "torch.Tensor": torch.Tensor,
        "torch.nn.functional": F,
        "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
        "triton": triton,
        "triton.language": triton.language,
        "time": time,
        "math": math,
        "functools": functools,
        "builtins": builtins,
        "json": json,
        "os": os,
        "random": random,
        "kernels.harness.childrun": sys.modules[__name__],
        "kernels.harness.timing": timing,
        "kernels.harness.runner": runner,
        "torch._tensor_str": sys.modules["torch._tensor_str"],
        "TorchDispatchMode": TorchDispatchMode,
    }
    try:
        import triton.testing as tt

        mods["triton.testing"] = tt
    except Exception:  # pragma: no cover - optional
        pass
    return mods


def _triton_hooks() -> dict[str, object]:
    """Triton's global hooks (run around every launch and compile), by what each holds: a hook
    chain's list of calls, or the callable."""
    out: dict[str, object] = {}
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    for name in (
        "launch_enter_hook",
        "launch_exit_hook",
        "jit_cache_hook",
        "jit_post_compile_hook",
        "kernel_load_start_hook",
        "kernel_load_end_hook",
    ):
        hook = getattr(runtime, name, None)
        calls = getattr(hook, "calls", None)
        out[f"triton.knobs.runtime.{name}"] = tuple(calls) if isinstance(calls, list) else hook
    return out


def _globals_state() -> dict[str, object]:
    cuda = torch.backends.cuda
    return {
        **_triton_hooks(),
        # what the eager baseline runs: attention backends and reduced-precision reductions
        **{
            f"{name}()": getattr(cuda, name)()
            for name in (
                "flash_sdp_enabled",
                "mem_efficient_sdp_enabled",
                "math_sdp_enabled",
                "cudnn_sdp_enabled",
            )
            if hasattr(cuda, name)
        },
        **{
            name: getattr(cuda.matmul, name)
            for name in (
                "allow_fp16_reduced_precision_reduction",
                "allow_bf16_reduced_precision_reduction",
            )
        },
        "allow_tf32(matmul)": torch.backends.cuda.matmul.allow_tf32,
        "allow_tf32(cudnn)": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "dispatch_mode_class": OpRecorder.__torch_dispatch__,
    }


class Snapshot:
    def __init__(self) -> None:
        self.objs = _watched()
        self.ids = {
            name: {k: id(v) for k, v in vars(obj).items() if not k.startswith("_")}
            for name, obj in self.objs.items()
        }
        self.state = _globals_state()

    def changes(self) -> list[str]:
        found = []
        for name, obj in self.objs.items():
            now = vars(obj)
            for k, i in self.ids[name].items():
                if k not in now:
                    found.append(f"{name}.{k} was deleted")
                elif id(now[k]) != i:
                    found.append(f"{name}.{k} was replaced")
        for k, v in _globals_state().items():
            if v != self.state[k]:
                found.append(f"global setting {k} changed from {self.state[k]!r} to {v!r}")
        return found


# ---- candidate loading ------------------------------------------------------------------


def _restricted_builtins() -> dict:
    safe = {k: v for k, v in vars(builtins).items() if k not in static.FORBIDDEN_BUILTINS}
    real_import = builtins.__import__

    # The static check holds candidates to the exact allow-list. Here, torch's C++ dispatcher
    # also imports its own submodules through the calling frame's builtins, so any submodule
    # of an allowed top-level package passes; everything else (os, sys, ctypes ...) fails.
    roots = {m.split(".")[0] for m in static.ALLOWED_IMPORTS}

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level or name.split(".")[0] not in roots:
            raise ImportError(f"import of {name!r} is not allowed in a candidate")
        return real_import(name, globals, locals, fromlist, level)

    safe["__import__"] = guarded_import
    return safe


def load_candidate(path: str, index: int) -> types.ModuleType:
    name = f"autoweb_candidate_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__["__builtins__"] = _restricted_builtins()
    sys.modules[name] = mod  # Triton resolves a jitted function's module by name
    spec.loader.exec_module(mod)
    if not callable(getattr(mod, "kernel", None)):
        raise TypeError("candidate defines no callable kernel")
    return mod


# ---- helpers ------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _reuses_a_buffer(outs: list) -> bool:
    """Whether two of a graph's captured calls returned overlapping storage: a call that hands
    back an earlier call's output launches nothing when replayed, yet is timed as a call."""
    spans = sorted(_storage_span(o) for o in outs if isinstance(o, torch.Tensor))
    return any(b0 < a1 for (_, a1), (b0, _) in zip(spans, spans[1:], strict=False))


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, a1 = _storage_span(a)
    b0, b1 = _storage_span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def _bit_flags(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
    """Per pair, on the device, whether both tensors hold the same bytes; nothing waits for the
    device (`_read_flags` does, once for all of them: torch.equal waits once per pair, and on a
    GPU shared by a dozen processes each wait is behind their work)."""
    flags = []
    for a, b in pairs:  # a tensor and its copy: one device (a resized input differs in size)
        a = a.contiguous().reshape(-1).view(torch.uint8)
        b = b.contiguous().reshape(-1).view(torch.uint8)
        same = (a == b).all() if a.numel() == b.numel() else torch.zeros((), dtype=torch.bool)
        flags.append(same.to(a.device))
    return torch.stack(flags) if flags else None


def _read_flags(flags: torch.Tensor | None) -> list[bool]:
    """`_bit_flags` on the host: one wait for the calling stream, which also completes every
    copy to host memory queued on it before (`to_host`)."""
    return [bool(f) for f in flags.tolist()] if flags is not None else []


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of an output, queued on the calling stream when `t` is on the GPU: read it
    only once that stream has been waited for (`_read_flags`, a synchronisation), so that the
    copy shares the wait of the checks queued with it instead of a wait of its own."""
    t = t.detach()
    if not t.is_cuda:
        return t.contiguous()
    # Into page-locked memory: a pageable copy from the device goes through the driver's bounce
    # buffer at a fraction of the link's speed, seconds a sweep of large outputs while this
    # process holds the GPU; the caching host allocator keeps the block for the next output.
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def save_tensor(host: torch.Tensor, out_dir: Path, tag: str) -> dict:
    """Write a host tensor (`to_host`, its copy complete) to the file the caller reads."""
    path = out_dir / f"{tag}.bin"
    host.reshape(-1).view(torch.uint8).numpy().tofile(path)
    return {
        "file": str(path),
        "shape": list(host.shape),
        "dtype": str(host.dtype).replace("torch.", ""),
    }


def write_tensor(t: torch.Tensor, out_dir: Path, tag: str) -> dict:
    """`to_host`, a wait for the copy, `save_tensor`."""
    host = to_host(t)
    if t.is_cuda:
        torch.cuda.current_stream().synchronize()
    return save_tensor(host, out_dir, tag)


def describe_output(out, inputs, device: str, dtype: torch.dtype) -> list[str]:
    """Why `out` is not a plain tensor the harness can accept (empty list: it is)."""
    if not isinstance(out, torch.Tensor):
        return [f"kernel returned {type(out).__name__}, not a torch.Tensor"]
    bad = []
    if type(out) is not torch.Tensor:
        bad.append(f"kernel returned a tensor subclass ({type(out).__name__})")
    if out.layout != torch.strided:
        bad.append(f"output layout is {out.layout}, not strided")
    if out.is_meta or out.device.type != ("cuda" if device == "cuda" else "cpu"):
        bad.append(f"output is on {out.device}, inputs on {inputs[0].device}")
    if out.dtype != dtype:
        bad.append(f"output dtype is {out.dtype}, expected {dtype}")
    if out.requires_grad:
        bad.append("output requires grad")
    return bad


def poison(inputs, device: str) -> None:
    """Leave NaN-filled freed blocks behind so an output nobody writes reads as NaN."""
    n = sum(x.numel() for x in inputs) * 2 + 1024
    junk = torch.full((n,), float("nan"), dtype=torch.float32, device=inputs[0].device)
    _sync(device)
    del junk


class Candidate:
    def __init__(self, mod, recorder: OpRecorder) -> None:
        self.mod = mod
        self.recorder = recorder

    def __call__(self, inputs):
        with self.recorder:
            return self.mod.kernel(*inputs)


# ---- phases -----------------------------------------------------------------------------


# The steps of a shape's GPU work that a child asks for the GPU for while it is shared, named
# when it asks (the GPU lock's trace labels each hold `step-NAME`): verifying, the first call,
# the call on new values and the CUDA-graph replay; preparing, the inputs and warm-up, the
# timing mode (quick timings and input sets) and each function's graph capture.
STEPS = (
    "verify-first",
    "verify-second",
    "verify-graph",
    "prepare-warmup",
    "prepare-mode",
    "prepare-capture",
)


class NoGo(Exception):
    """The caller refused the GPU to a child asking for it again between two steps."""


def step_aside(between: Callable[[str], None] | None, device: str, step: str) -> None:
    """Between two steps of a shape's GPU work, while the GPU is shared: synchronise (nothing of
    the step still runs when the hold is let go), then `between` gives the hold up and asks for
    it again for `step`, the step that comes next (the GPU lock's trace names the hold after
    it), raising NoGo if refused. So a timing phase waiting for the GPU waits for one step of
    this candidate, not a whole shape, and the GPU drains for it sooner."""
    if between is not None:
        _sync(device)
        between(step)


def verify_shape(
    i, shape, spec, problem, cand: Candidate, snap, between: Callable[[str], None] | None = None
) -> tuple[bool, dict]:
    """Run the candidate on shape i three ways (fresh inputs, new values in the same buffers,
    a CUDA-graph replay) and write its outputs; returns (whether to go on, the `verified`
    message for the parent, who judges the outputs). On the GPU, `between` runs between the
    three (`step_aside`)."""
    device, dtype = spec["device"], getattr(torch, spec["dtype"])
    seeds = spec["seeds"][i]
    out_dir = Path(spec["out_dir"]) / f"s{i}"
    out_dir.mkdir(parents=True, exist_ok=True)
    tdev = "cuda" if device == "cuda" else "cpu"
    facts: dict[str, object] = {"problems": []}
    probs: list[str] = facts["problems"]
    outputs: dict[str, dict] = {}

    a = problem.make_inputs(shape, dtype, tdev, seeds["first"])
    saved = [x.clone() for x in a]
    poison(a, device)
    out1 = cand(a)
    bad = describe_output(out1, a, device, dtype)  # attributes only: nothing waits for the GPU
    if bad:
        _sync(device)
        facts = {"problems": bad, "kind": "malformed"}
        return False, {"t": "verified", "i": i, "outputs": {}, "facts": facts}
    early = None
    if device == "cuda":
        # Work launched on another stream and not joined shows up as an output that still
        # changes after the calling stream is done. So the host waits for the calling stream
        # alone first, copies the output, and only then for the whole GPU: a device-wide
        # synchronisation before the copy would wait for the side stream too, and no output
        # could ever be seen changing.
        ev = torch.cuda.Event()
        ev.record()
        ev.synchronize()
        early = out1.clone()
    _sync(device)
    if any(_overlaps(out1, x) for x in a):
        probs.append("output aliases an input (shares its storage)")
    pairs = list(zip(a, saved, strict=True)) + ([(early, out1)] if early is not None else [])
    flags = _bit_flags(pairs)
    host = to_host(out1)  # queued behind the checks: one wait for both
    same = _read_flags(flags)
    if not all(same[: len(a)]):
        probs.append("candidate mutated an input")
    if early is not None and not same[-1]:
        probs.append("output changed after the calling stream finished (work on a side stream)")
    del early, pairs
    outputs["first"] = save_tensor(host, out_dir, "first")
    step_aside(between, device, "verify-second")

    fresh = problem.make_inputs(shape, dtype, tdev, seeds["second"])
    for x, y in zip(a, fresh, strict=True):
        x.copy_(y)
    saved = fresh
    out2 = cand(a)
    _sync(device)
    bad = describe_output(out2, a, device, dtype)
    if bad:
        facts = {"problems": bad, "kind": "malformed"}
        return False, {"t": "verified", "i": i, "outputs": outputs, "facts": facts}
    if out2 is out1 or _overlaps(out2, out1):
        probs.append("second call returned the first call's buffer (results reused across calls)")
    flags = _bit_flags(list(zip(a, saved, strict=True)))
    host = to_host(out2)
    if not all(_read_flags(flags)):
        probs.append("candidate mutated an input")
    outputs["second"] = save_tensor(host, out_dir, "second")
    del out1, out2

    if device == "cuda":
        step_aside(between, device, "verify-graph")
        try:
            g, outs = timing.capture([lambda: cand(a)], reps=1)
            final = problem.make_inputs(shape, dtype, tdev, seeds["final"])
            for x, y in zip(a, final, strict=True):
                x.copy_(y)
            g.replay()
            host = to_host(outs[0])
            torch.cuda.synchronize()
            outputs["graph"] = save_tensor(host, out_dir, "graph")
            del g, outs
        except Exception as e:  # capture refused: syncs, host reads, side streams ...
            torch.cuda.synchronize()
            facts["graph_error"] = f"{type(e).__name__}: {e}"[:500]
            if runner.gpu_out_of_memory(e):
                facts["graph_memory"] = runner.gpu_memory()
    changed = snap.changes()
    if changed:
        facts["tamper"] = changed
    if device == "cuda":
        torch.cuda.synchronize()  # nothing of this shape still runs when the GPU is let go
    return True, {"t": "verified", "i": i, "outputs": outputs, "facts": facts}


def _timed_functions(i, spec, cands, compiled_cache, notes) -> dict[str, object]:
    """What is timed on shape i. `full`: the candidates and both baselines; `screen`: the
    candidates, plus the eager baseline on the canary shape (the caller holds cached baseline
    timings and checks them against it); `baselines`: eager and compiled only."""
    mode = spec.get("timing", "full")
    fns: dict[str, object] = {}
    for c, cand in enumerate(cands):
        fns[f"candidate{c}"] = cand
    if mode != "screen" or i == spec.get("canary"):
        fns["eager"] = None  # filled in by the caller: the reference
    if mode != "screen" and spec.get("baselines_compiled", True):
        comp = compiled_cache.get("fn")
        if comp is not None and i in compiled_cache.get("ok_shapes", ()):
            fns["compiled"] = comp
        elif comp is not None:
            notes.append(
                "torch.compile produced no graph for this shape (it would run "
                "eager): compiled baseline not timed"
            )
        else:
            notes.append(compiled_cache.get("error", "torch.compile baseline unavailable"))
    return fns


class Prepared:
    """One shape made ready to time: its inputs, the functions, their samplers (graphs already
    captured in graph mode). Preparing runs kernels, so it happens while the GPU is shared;
    measuring is then nothing but samples while the GPU is held alone."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.notes: list[str] = []
        self.quick: dict[str, float] = {}
        self.samplers: dict[str, object] = {}
        self.div: dict[str, int] = {}
        self.mode = "events"
        self.keep: list[object] = []  # inputs, graphs and their outputs, alive until measured
        self.last: dict[str, object] = {}  # events mode: each function's latest output
        self.graph_out: dict[str, object] = {}
        self.graph_set = 0  # graph mode: the input set of the captured call whose output is kept
        # New values (input set `fresh_set`, made by `make_fresh` once sampling is over, so that
        # no prepared shape holds a second set) copied into the buffers `fresh_into` before one
        # more sample of each candidate, whose output is the one verified (`measure_shape`)
        self.make_fresh: Callable[[], list] | None = None
        self.fresh_into: list = []
        self.fresh_set = 0
        self.reused: list[str] = []  # candidates whose captured calls returned one buffer twice


def prepare_shape(
    i, shape, spec, problem, cands: list[Candidate], compiled_cache, between=None
) -> Prepared:
    """Inputs, warm-up and the timing mode of shape i, and in graph mode its input sets and
    each function's captured graph, for `measure_shape`. While the GPU is shared, `between`
    runs after the warm-up and before each capture (`step_aside`)."""
    prep = Prepared(i)
    dtype = getattr(torch, spec["dtype"])
    seeds = spec["seeds"][i]
    l2 = int(spec.get("l2_bytes") or timing.DEFAULT_L2_BYTES)
    a = problem.make_inputs(shape, dtype, "cuda", seeds["final"])
    flush = timing.flusher(l2)
    prep.keep.append(a)
    fns = _timed_functions(i, spec, cands, compiled_cache, prep.notes)
    if "eager" in fns:
        fns["eager"] = problem.module.reference

    def call(f, inputs):
        return f(inputs) if isinstance(f, Candidate) else f(*inputs)

    def new_values(into: list, j: int) -> None:
        """After the samples, input set j (the caller's `rotJ` reference) goes into the buffers
        `into` for one more sample of each candidate (`measure_shape`)."""
        prep.fresh_into, prep.fresh_set = into, j
        prep.make_fresh = functools.partial(
            problem.make_inputs, shape, dtype, "cuda", timing.input_set_seed(seeds["rot"], j)
        )

    with torch.no_grad():
        for f in fns.values():
            for _ in range(3):
                call(f, a)
        torch.cuda.synchronize()
        step_aside(between, "cuda", "prepare-mode")
        # One mode per shape for every function timed: the caller's (`modes`, so that a screened
        # candidate is timed as its cached baselines were), else the fastest function's quick
        # time decides (the candidates', or the baselines' when there is none).
        wanted = (spec.get("modes") or {}).get(str(i))
        if wanted not in ("graph", "events"):
            prep.quick = {n: timing.quick_ms(lambda f=f: call(f, a), flush) for n, f in fns.items()}
            first = [n for n in fns if n.startswith("candidate")] or list(fns)
            fastest = min(prep.quick[n] for n in first)
            wanted = "graph" if fastest < timing.GRAPH_THRESHOLD_MS else "events"
        if wanted == "graph":
            try:
                # The output verified is that of one captured call past the first, picked by
                # the secret seed, replayed once more after the samples on new values in that
                # call's input set (`measure_shape`; the caller computes their reference): a
                # kernel that worked only on the first call it saw captured, on the first input
                # set, or not at all once captured (a copy of a kept result), is caught.
                nsets, reps, pick = timing.graph_plan(l2, timing.inputs_bytes(a), seeds["final"])
                rot = seeds["rot"]
                sets = [a] + [
                    problem.make_inputs(shape, dtype, "cuda", timing.input_set_seed(rot, j))
                    for j in range(1, nsets)
                ]
                prep.graph_set = pick % nsets
                if cands:
                    new_values(sets[prep.graph_set], timing.MAX_INPUT_SETS + prep.graph_set)
                for name, f in fns.items():
                    step_aside(between, "cuda", "prepare-capture")
                    calls = [(lambda s=s, f=f: call(f, s)) for s in sets]
                    g, outs = timing.capture(calls, reps)
                    prep.keep.append((g, outs))
                    prep.samplers[name] = timing.graph_sampler(g)
                    prep.div[name] = reps
                    prep.graph_out[name] = outs[pick]
                    if name.startswith("candidate") and _reuses_a_buffer(outs):
                        prep.reused.append(name)
                prep.keep.append(sets)
                prep.mode = "graph"
            except NoGo:
                raise
            except Exception as e:
                prep.notes.append(
                    f"graph timing unavailable, used events: {type(e).__name__}: {e}"[:300]
                )
                prep.samplers.clear()
                prep.graph_out.clear()
                prep.keep = [a]
                prep.make_fresh, prep.fresh_into, prep.graph_set = None, [], 0
                prep.reused.clear()
                torch.cuda.synchronize()
        if prep.mode == "events":
            if cands:
                new_values(a, timing.EVENTS_INPUT_SET)
            for name, f in fns.items():

                def sample_call(f=f, name=name):
                    prep.last[name] = call(f, a)

                prep.samplers[name] = timing._event_sample(sample_call, flush)
                prep.div[name] = 1
        torch.cuda.synchronize()  # nothing of this shape still runs when the GPU is let go
    return prep


def measure_shape(prep: Prepared, spec, cands: list[Candidate], send) -> None:
    """Sample a prepared shape (the GPU is held alone) and report its timings and the
    candidates' outputs produced while timed."""
    i = prep.i
    screening = spec.get("timing") == "screen"
    # Screening stops adaptively once the medians are tight; the GPU is warmed up once, on the
    # first shape, since the shapes are then timed back to back.
    rel_ci = float(spec.get("rel_ci") or 0.01) if screening else None
    warmup_s = timing.WARMUP_S if not screening or i == 0 else 0.0
    # Screening stops sampling a candidate on a shape it has lost beyond doubt to the faster
    # baseline's cached time (`timing.lost`): no sample more would let it serve that shape.
    bar = (spec.get("bars") or {}).get(str(i)) if screening else None
    lose_ms = {f"candidate{c}": bar for c in range(len(cands))} if bar else None
    with torch.no_grad():
        results = timing.interleaved(
            prep.samplers,
            per_call_divisor=prep.div,
            budget_s=spec["budget_s"],
            rng=random.Random(spec["seeds"][i]["final"]),
            rel_ci=rel_ci,
            warmup_s=warmup_s,
            lose_ms=lose_ms,
        )
        torch.cuda.synchronize()
        inputs_set = prep.graph_set
        if prep.make_fresh is not None:
            # The samples all ran on the same values (a graph replays the same buffers; events
            # mode calls on the same inputs), so a kernel that kept an earlier result and
            # returned it would have been timed doing no work. New values go into the buffers
            # of the call whose output is verified, and each candidate is sampled once more, as
            # before; that output is the one verified. Nothing tells this sample from the ones
            # before (sampling stops on time and spread), so a kernel cannot compute only when
            # it counts: one that returns a kept result from any call on returns it here.
            fresh = prep.make_fresh()
            for x, y in zip(prep.fresh_into, fresh, strict=True):
                x.copy_(y)
            del fresh
            for c in range(len(cands)):
                prep.samplers[f"candidate{c}"]()
            torch.cuda.synchronize()
            inputs_set = prep.fresh_set
        timed_out = prep.graph_out if prep.mode == "graph" else prep.last
        out_dir = Path(spec["out_dir"]) / f"s{i}"
        out_dir.mkdir(parents=True, exist_ok=True)
        outputs = {}
        for c in range(len(cands)):
            outputs[f"timed{c}"] = write_tensor(timed_out[f"candidate{c}"], out_dir, f"timed{c}")
    send(
        t="timed",
        i=i,
        mode=prep.mode,
        ms=results,
        outputs=outputs,
        inputs_set=inputs_set,
        reused=prep.reused,
        notes=prep.notes,
        quick_ms={n: round(q, 6) for n, q in prep.quick.items()},
    )


def time_shape(i, shape, spec, problem, cands: list[Candidate], send, compiled_cache) -> None:
    measure_shape(prepare_shape(i, shape, spec, problem, cands, compiled_cache), spec, cands, send)


# CPU seconds a candidate's own code may spend in one call of the compile-only pass, outside
# Triton's compiler (`HostClock`). On meta tensors its host code does nothing but compute
# sizes and launch: an honest call takes milliseconds.
HOST_CODE_BUDGET_S = 10.0


class HostCodeTooLong(BaseException):
    """Raised into a candidate's code that ran past `HostClock`'s budget. A BaseException, so
    that the candidate's own `except Exception` lets it through."""


class HostClock:
    """Bounds the CPU seconds a candidate's own code spends in one call, outside Triton's
    compiler. While `call()` is open, a SIGALRM every `tick_s` seconds of wall time looks, on
    the main thread between two bytecodes, at this process's CPU time since the call began
    less what was spent inside `compiling()`, and past `budget_s` raises HostCodeTooLong into
    the call. CPU time, not wall time, so that a host busy with other sandboxes does not cut an
    honest call short; compiles are exempt, since a configuration may honestly compile for tens
    of seconds (the caller's compile budget bounds those). Off the main thread it bounds
    nothing: signals reach only the main thread."""

    def __init__(self, budget_s: float = HOST_CODE_BUDGET_S, tick_s: float = 0.5) -> None:
        self.budget_s = budget_s
        self.tick_s = tick_s
        self._start = 0.0
        self._compile_s = 0.0
        self._depth = 0
        self._since = 0.0  # when the outermost compile in progress began

    def used(self) -> float:
        """CPU seconds of the open call so far, outside the compiler."""
        compiling = time.process_time() - self._since if self._depth else 0.0
        return time.process_time() - self._start - self._compile_s - compiling

    @contextlib.contextmanager
    def call(self):
        self._start, self._compile_s, self._depth = time.process_time(), 0.0, 0
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = signal.signal(signal.SIGALRM, self._tick)
        signal.siginterrupt(signal.SIGALRM, False)  # system calls resume after a tick
        signal.setitimer(signal.ITIMER_REAL, self.tick_s, self.tick_s)
        try:
            yield
        finally:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            finally:
                signal.signal(signal.SIGALRM, before)

    @contextlib.contextmanager
    def compiling(self):
        if self._depth == 0:
            self._since = time.process_time()
        self._depth += 1
        try:
            yield
        finally:
            if self._depth == 1:
                self._compile_s += time.process_time() - self._since
            self._depth -= 1

    def _tick(self, signum, frame) -> None:
        if self._depth == 0 and self.used() > self.budget_s:
            raise HostCodeTooLong(
                f"over {self.budget_s:g} CPU seconds in its own code, outside Triton's compiler"
            )


def precompile_candidates(problem, shapes, spec, cands, clock: HostClock | None = None) -> int:
    """Compile the candidates' Triton kernels for every shape without launching anything.

    Runs before this child asks for the GPU, so compilation (CPU work) overlaps with other
    candidates being timed. Inputs are meta tensors (no memory, no kernels) and Triton's launch
    is turned into `warmup=True` (compile only) for the duration. Best effort: whatever fails
    here is simply compiled at its first real call during verification.

    Each call is bounded by `clock` (a `HostClock` by default): a call whose own code loops for
    ever on meta tensors (an endless loop, or allocations that take no memory there) raises
    HostCodeTooLong, naming the shape, rather than holding its place until the compile budget
    or the timeout. Its host code would do the same on the GPU's tensors, where its shared hold
    of the GPU would keep every timing phase waiting.
    """
    from triton.runtime.jit import JITFunction

    from kernels import problems

    dtype = getattr(torch, spec["dtype"])
    orig = JITFunction.run
    clock = clock or HostClock()

    def compile_only(self, *args, grid, warmup, **kwargs):
        with clock.compiling():
            return orig(self, *args, grid=grid, warmup=True, **kwargs)

    compiled = 0
    JITFunction.run = compile_only
    try:
        for i, shape in enumerate(shapes):
            try:
                inputs = problem.module.make_inputs(shape, dtype, "meta", None)
            except Exception:
                continue
            for c in cands:
                try:
                    with clock.call():
                        c.mod.kernel(*inputs)
                    compiled += 1
                except HostCodeTooLong as e:
                    raise HostCodeTooLong(
                        f"the candidate's kernel ran {e}, in one call on shape {i} "
                        f"({problems.shape_label(shape)[:200]}) with meta tensors (sizes, no "
                        "data) before it was given the GPU; it was stopped there (an endless "
                        "loop?)"
                    ) from None
                except Exception:
                    pass
    finally:
        JITFunction.run = orig
    return compiled


def precompile_baseline(problem, shapes, spec) -> dict:
    """torch.compile the reference once per shape (dynamic=False), under no_grad as timed.

    Dynamo recompiles per shape and, past its recompile limit, silently runs eager: the limit
    is raised, and a shape whose call produced no new graph is reported, not timed as
    "compiled".
    """
    import torch._dynamo
    from torch._dynamo.utils import counters

    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(64, 4 * len(shapes)))
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(512, 16 * len(shapes)))
    dtype = getattr(torch, spec["dtype"])
    out: dict = {"ok_shapes": set()}
    try:
        comp = torch.compile(problem.module.reference, dynamic=False)
        with torch.no_grad():
            for i, shape in enumerate(shapes):
                before = counters["stats"]["unique_graphs"]
                comp(*problem.make_inputs(shape, dtype, "cuda", spec["seeds"][i]["final"]))
                if counters["stats"]["unique_graphs"] > before:
                    out["ok_shapes"].add(i)
        torch.cuda.synchronize()
        out["fn"] = comp
    except Exception as e:
        out["error"] = f"torch.compile baseline failed: {type(e).__name__}: {e}"[:300]
    return out


def end_to_end(spec, problem, cand: Candidate, send) -> None:
    """Re-validation only: the kernel inside a small transformer block (kernels.harness.e2e)."""
    from kernels.harness import e2e

    send(t="progress", phase="end_to_end")
    device = "cuda" if spec["device"] == "cuda" else "cpu"
    try:
        result = e2e.run(
            problem,  # the loaded problem: a user's is not found by name in here
            cand.mod.kernel,
            device=device,
            dtype=getattr(torch, spec["dtype"]),
            seed=int(spec["seeds"][0]["final"]) % (2**31),
            budget_s=float(spec.get("budget_s") or 0.5),
        )
    except Exception as e:  # the candidate raised on the block's shapes
        if device == "cuda":
            torch.cuda.synchronize()
        result = {
            "passed": False,
            "failure": "crashed",
            "detail": f"the kernel raised inside the block: {type(e).__name__}: {e}"[:500],
        }
    send(t="e2e", result=result)


def run(spec: dict, send, recv) -> None:
    from kernels import problems

    torch.manual_seed(0)
    problem = problems.load(spec["problem"], spec.get("problem_dirs") or None)
    device = spec["device"]
    _record_tensor_printing()  # before the snapshot: putting the original back is tampering
    snap = Snapshot()
    allowed = ALLOWED_OPS | (INTERPRETER_OPS if device != "cuda" else frozenset())
    send(t="progress", phase="compiling")
    cands = []
    for k, path in enumerate(spec["candidates"]):
        try:
            mod = load_candidate(path, k)
        except BaseException as e:
            send(
                t="error",
                category="compile_error",
                message=f"loading the candidate failed: {type(e).__name__}: {e}"[:2000],
            )
            return
        cands.append(Candidate(mod, OpRecorder(allowed)))
    changed = snap.changes()
    if changed:
        send(t="done", tamper=changed, ops={})
        return

    shapes = spec["shapes"]
    if device == "cuda" and spec.get("precompile", True):
        # A call stopped by its bound raises HostCodeTooLong out of here: runner.main kills
        # what the candidate started and reports it, a `timeout`.
        precompiled = precompile_candidates(problem, shapes, spec, cands)
        send(t="progress", phase="compiling", precompiled=precompiled)
    if device == "cuda":
        send(t="want_gpu", shared=True, step="verify-first")  # verification shares the GPU
        if not recv().get("go"):
            send(t="done", tamper=snap.changes(), ops={})
            return
    if spec.get("profile"):
        for shape in shapes:
            a = problem.make_inputs(
                shape, getattr(torch, spec["dtype"]), "cuda", spec["seeds"][0]["first"]
            )
            for _ in range(2):
                cands[0](a)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("autoweb_profile")
            cands[0](a)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        send(t="profiled")
        send(t="done", tamper=snap.changes(), ops={})
        return

    def next_shape(step: str, report: dict | None = None) -> bool:
        """Between two shapes' GPU work the shared hold is given up and asked for again, so a
        timing phase waiting for the GPU runs in between rather than after every shape of every
        candidate verifying. The report on the shape just done follows the request: the parent
        checks it while this process goes on with the next shape."""
        send(t="want_gpu", shared=True, step=step)
        if report is not None:
            send(**report)
        return bool(recv().get("go"))

    def again(step: str) -> None:
        """Between two steps of one shape: the hold given up and asked for again (`step_aside`)."""
        if not next_shape(step):
            raise NoGo

    verified = True
    if spec.get("verify", True) and cands:
        for i, shape in enumerate(shapes):
            send(t="progress", phase="verifying", i=i, n=len(shapes))
            try:
                ok, report = verify_shape(
                    i, shape, spec, problem, cands[0], snap, again if device == "cuda" else None
                )
            except NoGo:
                verified = False
                break
            if not ok or i + 1 == len(shapes) or device != "cuda":
                send(**report)
            elif not next_shape("verify-first", report):
                ok = False
            if not ok:
                verified = False
                break
    if spec.get("e2e") and device != "cuda" and verified:
        end_to_end(spec, problem, cands[0], send)
    cache: dict = {}
    timed = device == "cuda" and spec.get("time", True)
    if timed and spec.get("timing", "full") != "screen" and spec.get("baselines_compiled", True):
        # Compile the torch.compile baseline for every shape now, while the GPU is shared,
        # so the exclusive timing phase is spent timing. (Screening takes the baselines'
        # timings from the caller's cache and compiles nothing.)
        send(t="progress", phase="compiling_baselines")
        cache.update(precompile_baseline(problem, shapes, spec))
    prepared: list[Prepared] = []
    if timed and verified and (spec.get("timing") == "screen" or spec.get("modes")):
        # Screening, or timing told each shape's mode by the caller: inputs, warm-up and graph
        # capture for every shape now, while the GPU is shared, so the exclusive phase below is
        # samples only. (Without the modes, each shape's is chosen from quick timings, which
        # are taken in the exclusive phase: other processes' kernels would distort them.)
        send(t="progress", phase="preparing")
        for i, s in enumerate(shapes):
            if not next_shape("prepare-warmup"):
                break
            try:
                prepared.append(prepare_shape(i, s, spec, problem, cands, cache, again))
            except NoGo:
                break
        if len(prepared) < len(shapes):
            send(t="done", tamper=snap.changes(), ops={})
            return
    if timed:
        send(t="want_gpu")
        if recv().get("go"):
            for i, shape in enumerate(shapes):
                send(t="progress", phase="benchmarking", i=i, n=len(shapes))
                if prepared:
                    measure_shape(prepared[i], spec, cands, send)
                else:
                    time_shape(i, shape, spec, problem, cands, send, cache)
            if spec.get("e2e") and verified:
                end_to_end(spec, problem, cands[0], send)
            # The caller gives this evaluation's GPU slot to the next on `gpu_done`: the inputs,
            # graphs and compiled baselines kept for timing are freed first.
            prepared.clear()
            cache.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            send(t="gpu_done")
    ops: dict[str, int] = {}
    for c in cands:
        for k, v in c.recorder.violations.items():
            ops[k] = ops.get(k, 0) + v
    send(t="done", tamper=snap.changes(), ops=ops)
