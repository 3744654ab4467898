"""The verdict rules: how the sandboxed child's observations become checks, failures and the
report (docs/harness.md, Checks and Report).

`Run` is one evaluation's state; the `on_*` functions take one message of the child each
(kernels.harness.evaluation dispatches them), and `report()` assembles the verdict. Outputs are
verified here, in the caller's process, against a float64 reference this process computes:
nothing the candidate's process says about correctness is believed.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch

from kernels import problems
from kernels.harness import gpulock, oracle, roofline, sandbox, timing
from kernels.harness.compare import compare
from kernels.harness.oracle import out_of_memory
from kernels.protocol import FAILURES, HarnessFault

UNSTABLE_SPREAD = 0.5
# A float64 reference of at most this many elements is kept and compared on the host (8 MiB),
# a larger one on the device it was computed on. The comparison's arithmetic is the same.
HOST_COMPARE_MAX = 1 << 20
# The order a failure is reported in when several apply: the most specific first.
PRIORITY = (
    "timeout",
    "crashed",
    "compile_error",
    "malformed",
    "prohibited",
    "hack_suspected",
    "incorrect",
    "unstable",
)

Event = Callable[[dict], None]
T = TypeVar("T")

# This process running out of memory while it computes or compares a reference is no fault of
# the candidate: other evaluations' references and every candidate's process share the GPU. The
# work is tried again after each of these waits (seconds), with what this process had cached
# given back; past the last, the evaluation ends with HarnessFault, no verdict, to be run again.
MEMORY_RETRY_WAITS_S = (0.5, 1.0, 2.0)


class OldestFirst:
    """`n` slots, each free one given to the waiter with the smallest key (the evaluation
    that began first), ties to whoever asked first. A plain semaphore hands them round in the
    order asked, so a dozen evaluations that began together, each asking once per shape, all
    finish their checks together, late; oldest first, the first finishes first and gives its
    GPU slot to the next while the others still check. Each waiter waits for the same work in
    all either way."""

    def __init__(self, n: int) -> None:
        self._n = self._free = n
        self._cond = threading.Condition()
        self._waiting: list[tuple[float, int]] = []  # a heap of (key, ticket)
        self._tickets = itertools.count()

    def acquire(self, key: float = float("-inf"), blocking: bool = True) -> bool:
        with self._cond:
            if not blocking:
                if self._free and not self._waiting:
                    self._free -= 1
                    return True
                return False
            me = (key, next(self._tickets))
            heapq.heappush(self._waiting, me)
            try:
                while not (self._free and self._waiting[0] == me):
                    self._cond.wait()
            except BaseException:
                # Interrupted while waiting (Ctrl-C on the main thread): out of the line, or
                # everyone behind would wait for it for ever.
                self._waiting.remove(me)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._free -= 1
            if self._free and self._waiting:
                self._cond.notify_all()  # the next in line may take another free one
            return True

    def release(self) -> None:
        with self._cond:
            if self._free >= self._n:
                raise ValueError("OldestFirst released more often than acquired")
            self._free += 1
            self._cond.notify_all()


# References computed at once in this process (each evaluation in flight is a thread): a
# float64 reference of a large shape takes several GB of GPU memory while it is computed. A bad
# setting stops the process here, when it loads the harness.
_REFERENCE_SLOTS = OldestFirst(
    gpulock.slots_setting("AUTOWEB_REFERENCE_SLOTS", os.environ.get("AUTOWEB_REFERENCE_SLOTS"), 4)
)
# ... and within a share of the GPU's memory: the candidates' processes share the GPU, and
# references that took its memory ran them out of it. A shape's references are reckoned at
# REFERENCE_MEMORY_FACTOR times the problem's bytes in float64 (`bytes(shape, float64)`: its
# inputs and output, for their float64 copies and the temporaries of the computation); a
# comparison on the GPU at twice the reference's bytes.
REFERENCE_MEMORY_FACTOR = 4
REFERENCE_MEMORY_SHARE = 0.25

# The references a shape's verification is checked against, computed ahead while the child
# loads and compiles (`Run.reference_ahead`): only those compared on the host
# (`HOST_COMPARE_MAX`), kept in host memory until their shape is checked, at most this many
# bytes of them per evaluation.
AHEAD_HOST_BYTES = 256 << 20
_AHEAD_WHICHS = ("first", "second", "final")
# The reference of a shape's timed output (`Run.timed_which`), computed with its verification
# references and kept on the host until the timed output is checked: at most this many bytes of
# them per evaluation.
TIMED_HOST_BYTES = 256 << 20


def references_ahead_enabled() -> bool:
    """AUTOWEB_REFERENCES_AHEAD=1 turns it on. Off by default: on an H100 it shortened the wait
    before each timing phase without raising the screening rate (docs/benchmarks/search.md),
    and on the CPU interpreter it takes the cores the child runs on."""
    return os.environ.get("AUTOWEB_REFERENCES_AHEAD") == "1"


class MemoryBudget:
    """Bytes that the work in flight may take at once, handed out first come, first served: a
    waiter goes when it is first in line and fits, so a large reference is never starved by a
    stream of small ones. A request above the whole budget is cut to it (it runs alone)."""

    def __init__(self, budget: int) -> None:
        self.budget = max(1, int(budget))
        self.used = 0
        self._line: list[object] = []
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, nbytes: int) -> Iterator[None]:
        n = min(max(0, int(nbytes)), self.budget)
        me = object()
        with self._cond:
            self._line.append(me)
            try:
                self._cond.wait_for(lambda: self._line[0] is me and self.used + n <= self.budget)
            finally:
                self._line.remove(me)
                self._cond.notify_all()
            self.used += n
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()


_reference_memory: MemoryBudget | None = None
_reference_memory_lock = threading.Lock()


def reference_memory() -> MemoryBudget:
    """This process's budget for references on its GPU: REFERENCE_MEMORY_SHARE of the GPU's."""
    global _reference_memory
    with _reference_memory_lock:
        if _reference_memory is None:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            _reference_memory = MemoryBudget(int(total * REFERENCE_MEMORY_SHARE))
        return _reference_memory


def _read_raw(
    meta: dict, dtype: torch.dtype, root: Path, expected: list[int]
) -> tuple[bytearray, list[int]]:
    """An output file's bytes. The file is the candidate's process's work, so it is opened as
    nothing but a regular file below the sandbox directory (no symlink, FIFO or device: those
    would read another file or block this process), and it must hold exactly the reference's
    shape, which this process knows, before a byte is read."""
    path = Path(meta["file"]).resolve()
    if root.resolve() not in path.parents:
        raise ValueError("output file outside the sandbox directory")
    shape = [int(d) for d in meta["shape"]]
    if shape != list(expected):
        raise _WrongShape(f"shape {shape} != reference {list(expected)}")
    numel = math.prod(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    with sandbox.open_child_file(path) as f:
        # Sized before it is read (a file of the wrong size is refused unread), then read once
        # into its buffer: `bytearray(read_bytes())` copied every output twice, seconds a sweep.
        size = os.fstat(f.fileno()).st_size
        if size != numel * esize:
            raise ValueError(f"output file holds {size} bytes, expected {numel * esize}")
        raw = bytearray(size)
        if f.readinto(raw) != size:
            raise ValueError("output file changed while it was read")
    return raw, shape


# A CUDA context and the caching allocator's rounding: what a process needs of the GPU beyond the
# memory its allocator reports (`crowded_out`).
GPU_CONTEXT_MARGIN = 1 << 30
_ASKED = re.compile(r"Tried to allocate ([0-9.]+) (bytes|B|KiB|MiB|GiB|TiB)")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _gpu_memory(memory: object) -> tuple[int, int, int] | None:
    """(total, free, own) from the child's `gpu_memory` report (runner.gpu_memory), or None
    where it is missing or does not add up."""
    if not isinstance(memory, dict):
        return None
    try:
        total, free, own = (int(memory[k]) for k in ("total", "free", "own"))
    except (KeyError, TypeError, ValueError):
        return None
    if total <= 0 or not 0 <= free <= total or not 0 <= own <= total - free:
        return None
    return total, free, own


def gpu_memory_note(memory: object) -> str:
    """What the GPU held when the sandboxed process ran out of its memory, for a rejection's
    reason ("" where the child did not say)."""
    parts = _gpu_memory(memory)
    if parts is None:
        return ""
    total, free, own = parts
    return (
        f" (the GPU's {_gib(total)}: the sandboxed process held {_gib(own)}, "
        f"other processes {_gib(total - free - own)}, {_gib(free)} free)"
    )


def crowded_out(message: str, memory: object) -> str | None:
    """Why a GPU out-of-memory error of the sandboxed process (its `message`, and `memory`, the
    child's `gpu_memory` report) is no fault of the candidate's, or None where it is its own.

    Other processes (other evaluations' sandboxes and this one's references) had filled the GPU
    when the process held less of it than all of them together, and what it held and asked for
    (torch's "Tried to allocate") would have fit on the GPU with nothing else on it. Where the
    request's size is not in the message, the GPU must also have been full (less than
    GPU_CONTEXT_MARGIN free). A process holding as much as every other together, asking for more
    than the whole GPU, or not saying, fails as the candidate's own: `crashed`, as before.

    The report comes from the candidate's process: a candidate that forges it gains no verdict,
    only an evaluation that is run again and, failing each time, is not judged."""
    parts = _gpu_memory(memory)
    if parts is None:
        return None
    total, free, own = parts
    others = total - free - own
    if own >= others:
        return None
    found = _ASKED.search(message)
    if found is None:
        if free >= GPU_CONTEXT_MARGIN:
            return None
        asked_text = "what it asked for"
    else:
        asked = float(found.group(1)) * _UNITS[found.group(2)]
        if own + asked + GPU_CONTEXT_MARGIN > total:
            return None
        asked_text = _gib(asked)
    return (
        f"the sandboxed process ran out of GPU memory while other processes held "
        f"{_gib(others)} of the GPU's {_gib(total)}: it held {_gib(own)} and asked for "
        f"{asked_text} more, which would have fit on the GPU alone"
    )


def _resource_error(e: BaseException, text: str) -> bool:
    """Out of memory, or a device error."""
    return out_of_memory(e) or "cuda" in text.lower() or type(e).__name__ == "AcceleratorError"


class _WrongShape(ValueError):
    """An output whose shape is not the reference's: incorrect, and never read."""


def _tensor(raw: bytearray, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return t.view(dtype).reshape(shape)


class Run:
    """State of one evaluation while the child streams its observations."""

    def __init__(self, problem, dev: str, shapes, seeds, dtype, on_event: Event | None):
        self.problem = problem
        self.dev = dev
        self.shapes = shapes
        self.seeds = seeds
        self.dtype = dtype
        self._on_event = on_event
        # When the evaluation began: its place among the others' for a reference slot.
        self.began = time.monotonic()
        self.pdev = "cuda" if dev == "cuda" else "cpu"
        self.tol = problem.tolerance(dtype)
        self._oracles: dict[tuple[int, str], torch.Tensor] = {}
        self.results: list[dict] = [
            {"shape": s, "label": problems.shape_label(s), "errors": {}} for s in shapes
        ]
        self.failures: list[tuple[str, str]] = []
        self.checks: dict[str, dict] = {}
        self.notes: list[str] = []
        self.timeline: list[tuple[str, float]] = []
        # CPU seconds the sandboxed process had used when each phase first began (its start-up
        # in a pool included): against `timeline`, whether a phase computed or waited.
        self.timeline_cpu: dict[str, float] = {}
        self.end_to_end: dict | None = None
        self.timed_ms: dict[int, dict] = {}  # the child's raw timing stats per shape
        self.cached: list[dict] | None = None  # baseline entries when screening
        self.retiming = False  # several candidates (or one) timed together, not evaluated
        # A shared hold of the GPU around this process's own GPU work for one check (a
        # reference and its comparison), taken and given up per check so that a timing phase
        # waiting for the GPU never waits for a queue of checks (the caller sets it on CUDA).
        self.gpu_hold: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        # Seconds waited for one of this process's reference slots (`_REFERENCE_SLOTS`): with
        # many evaluations in flight in one process, their references queue there.
        self.reference_wait = 0.0
        # References computed ahead of their shape's check (`reference_ahead`): their keys,
        # the host bytes they hold, and how many of them the checks found ready.
        self._ahead: set[tuple[int, str]] = set()
        self._ahead_bytes = 0
        self._checked: set[int] = set()  # shapes whose `verified` report was checked
        self.ahead_computed = 0
        self.ahead_wait = 0.0  # seconds of `reference_wait` that were the work ahead's
        # Where the caller chose each shape's timing mode before the child times (a screened
        # evaluation): {"modes": {str(i): mode}, "l2_bytes": ...}, so that each shape's timed
        # output's reference is computed with its verification ones (`verification_references`)
        # and kept on the host meanwhile (`_for_timed`, `_for_timed_bytes`).
        self.timed_plan: dict | None = None
        self._for_timed: set[tuple[int, str]] = set()
        self._for_timed_bytes = 0
        self.timed_early = 0  # shapes whose timed outputs found their reference so computed
        self._meta: dict[int, tuple[int, int] | None] = {}
        # The process's compiled oracle for this problem (kernels.harness.oracle), or None, and
        # how many of this evaluation's references each oracle computed.
        self.fast = oracle.for_problem(problem, self.pdev, dtype)
        self.references_by = {"compiled": 0, "eager": 0}

    def on_event(self, event: dict) -> None:
        """Tell the caller of progress. Progress is for the caller's display and pacing: its
        callback failing (a lost Redis connection while publishing) is noted in the report,
        never taken for the candidate's failure."""
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception as e:
            if not any(n.startswith("progress not delivered") for n in self.notes):
                self.notes.append(
                    f"progress not delivered to the caller: {type(e).__name__}: {e}"[:300]
                )

    @contextlib.contextmanager
    def reference_slot(self, nbytes: int = 0) -> Iterator[None]:
        """One of this process's reference slots (the evaluation that began first goes
        first: `OldestFirst`), then, on a GPU, `nbytes` of its reference memory
        (`reference_memory`); the wait for both is counted (`reference_wait`)."""
        asked = time.monotonic()
        _REFERENCE_SLOTS.acquire(self.began)
        try:
            memory = reference_memory().take(nbytes) if self.pdev == "cuda" else None
            with memory or contextlib.nullcontext():
                self.reference_wait += time.monotonic() - asked
                yield
        finally:
            _REFERENCE_SLOTS.release()

    def fail(self, category: str, reason: str) -> None:
        self.failures.append((category, reason))

    def check(self, name: str, passed: bool | None, detail: str) -> None:
        prev = self.checks.get(name)
        if prev is None or (prev["passed"] is not False and passed is False):
            self.checks[name] = {"passed": passed, "detail": detail}

    def oracle(self, i: int, which: str) -> torch.Tensor:
        """The float64 reference on shape i's inputs `which`: a seed's name, or `rotJ`, the
        J-th input set graph-mode timing cycles through (the child's `prepare_shape`)."""
        key = (i, which)
        if key not in self._oracles:
            inputs = self._inputs(i, which)
            self._keep(key, self._reference(i, inputs))
        return self._oracles[key]

    def _inputs(self, i: int, which: str) -> tuple[torch.Tensor, ...]:
        if which.startswith("rot"):
            seed = timing.input_set_seed(self.seeds[i]["rot"], int(which[3:]))
        else:
            seed = self.seeds[i][which]
        return self.problem.make_inputs(self.shapes[i], self.dtype, self.pdev, seed)

    def _keep(self, key: tuple[int, str], ref: torch.Tensor) -> None:
        # Another shape's references go, but for those computed ahead (on the host, until
        # their shape is checked) and those of timed outputs (on the host, until checked).
        i = key[0]
        self._oracles = {
            k: v
            for k, v in self._oracles.items()
            if k[0] == i or k in self._ahead or k in self._for_timed
        }
        if ref.numel() <= HOST_COMPARE_MAX:
            # Compared on the host: a few dozen launches and a synchronisation fewer on a GPU
            # that other processes' contexts take turns on, and the GPU given up sooner.
            ref = ref.cpu()
        self._oracles[key] = ref

    def _reference(self, i: int, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The oracle on `inputs` of shape i: compiled where the process's compiled oracle
        serves the shape (`oracle.Compiled`), else eager."""
        label = self.results[i]["label"]
        fast = self.fast
        if fast is not None and fast.serves(label):
            try:
                ref = fast(*inputs)
            except Exception as e:
                if out_of_memory(e):
                    raise
                if oracle.refused(e):  # it would compile: admitted again before it serves
                    fast.withdraw(label)
                else:
                    why = f"the compiled oracle failed: {type(e).__name__}: {str(e)[:200]}"
                    fast.withdraw(label, why)
                    self.notes.append(f"{label}: {why}; the eager oracle serves it")
            else:
                self.references_by["compiled"] += 1
                return ref
        self.references_by["eager"] += 1
        return self.problem.oracle(*inputs)

    def admit(self, i: int, which: str) -> None:
        """Where the process's compiled oracle has not yet been checked on shape i, and no
        other evaluation is checking it on a shape: compute shape i's reference `which` both
        ways (`oracle.Compiled.admit`), keep the eager one as that reference, and admit the
        shape when they agree. Outside any hold of the GPU: a compile needs none. Running out
        of memory leaves the shape undecided, for the check itself to go on as usual."""
        fast = self.fast
        label = self.results[i]["label"]
        if fast is None or fast.decided(label) or not fast.admitting.acquire(blocking=False):
            return
        try:
            if fast.decided(label):
                return
            with torch.no_grad(), self.reference_slot(self.reference_bytes(i)):
                try:
                    with self.gpu_hold():
                        inputs = self._inputs(i, which)
                        ref = self.problem.oracle(*inputs)
                    self.references_by["eager"] += 1

                    def held(work: Callable[[], T]) -> T:
                        with self.gpu_hold():
                            return work()

                    why = fast.admit(label, inputs, ref, held)
                    if why is not None:
                        self.notes.append(f"{label}: {why[:300]}; the eager oracle serves it")
                    self._keep((i, which), ref)
                except Exception as e:
                    if not out_of_memory(e):
                        raise
                finally:
                    inputs = ref = None  # their memory freed, then given back to the GPU
                    if self.pdev == "cuda":
                        with self.gpu_hold():
                            torch.cuda.empty_cache()
        finally:
            fast.admitting.release()

    def problem_fault(self, i: int) -> str | None:
        """Why the problem itself fails on shape i, or None: its inputs for every seed the
        child uses on the shape, and its reference, made here, in the trusted process. Asked
        after a crash, so a broken problem is never a candidate's failure: the child's own
        account of where it crashed is not believed either way."""
        label = self.results[i]["label"]
        fresh = timing.input_set_seed(self.seeds[i]["rot"], timing.EVENTS_INPUT_SET)
        seeds = [self.seeds[i][w] for w in ("first", "second", "final")] + [fresh]
        for k, seed in enumerate(seeds):
            step = "make_inputs"
            try:
                with torch.no_grad(), self.reference_slot(self.reference_bytes(i)), self.gpu_hold():
                    inputs = self.problem.make_inputs(self.shapes[i], self.dtype, self.pdev, seed)
                    if k == 0:
                        step = "its reference"
                        self.problem.oracle(*inputs)
                        self.problem.module.reference(*inputs)
            except Exception as e:
                text = f"{type(e).__name__}: {e}"
                if _resource_error(e, text):
                    # Out of memory or a device error on a GPU others share (a candidate could
                    # leave it so): says nothing about the problem; the candidate is judged.
                    self.notes.append(f"{label}: the problem could not be checked: {text[:200]}")
                    return None
                return f"problem {self.problem.name!r} fails on {label}: {step} raised {text[:300]}"
        return None

    def own_work(self, what: str, work: Callable[[], T], nbytes: int = 0) -> T:
        """`work`, this process's own GPU work for a check (references, a comparison on the
        device) reckoned at `nbytes` of GPU memory, under one of its reference slots and that
        memory (`reference_slot`), then a shared hold of the GPU, all given up when it ends: a
        check waiting for a slot never keeps a timing phase from the GPU, and the memory it
        freed goes back to the GPU's other processes. Out of memory here is retried after the
        waits of `MEMORY_RETRY_WAITS_S`, then raised as HarnessFault."""
        for wait in (*MEMORY_RETRY_WAITS_S, None):
            try:
                with torch.no_grad(), self.reference_slot(nbytes), self.gpu_hold():
                    try:
                        return work()
                    finally:
                        if self.pdev == "cuda":
                            # Freed blocks stay in this process's cache unless returned: on a
                            # shared GPU they starve the other candidates' processes (keeping
                            # them until the next shape ran eight workers of an H200 out of
                            # memory).
                            torch.cuda.empty_cache()
            except Exception as e:
                if not out_of_memory(e):
                    raise
                why = f"{what}: this process ran out of memory: {type(e).__name__}: {e}"[:400]
            # Past the handler, the error's frames and the tensors they held are gone.
            self._oracles.clear()
            self._ahead.clear()
            self._ahead_bytes = 0
            self._for_timed.clear()
            self._for_timed_bytes = 0
            if self.pdev == "cuda":
                torch.cuda.empty_cache()
            if wait is None:
                raise HarnessFault(
                    f"{why} (tried {len(MEMORY_RETRY_WAITS_S) + 1} times); "
                    "the candidate was not judged"
                )
            self.notes.append(f"{why[:200]}; tried again after {wait} s")
            time.sleep(wait)
        raise AssertionError("unreachable")

    def reference_bytes(self, i: int) -> int:
        """The GPU memory a reference of shape i is reckoned at (REFERENCE_MEMORY_FACTOR); none
        where the problem's `bytes` cannot say (the reference's own error is what then shows)."""
        if self.pdev != "cuda":
            return 0
        try:
            nbytes = self.problem.bytes(self.shapes[i], torch.float64)
        except Exception:
            return 0
        return int(REFERENCE_MEMORY_FACTOR * nbytes) if math.isfinite(nbytes) else 0

    def reference_ahead(self, i: int) -> bool:
        """Shape i's verification references (the inputs of the child's first and second
        calls and of its graph replay), computed now, before the child reports the shape: while
        it loads, compiles and waits for a GPU slot this process would otherwise be idle, and
        then compute each reference after the shape's report, while the child's timing phase
        waits for the checks to settle. Only references small enough to be compared on the
        host, within `AHEAD_HOST_BYTES`; nothing for a shape already checked. Returns False
        once nothing more should be computed ahead (the bytes are spent); raises what computing
        them raised (the check then computes them itself, and judges what it raises)."""
        if i in self._checked or all((i, w) in self._oracles for w in _AHEAD_WHICHS):
            return True
        numel = self._output_numel(i)
        if numel is None or numel > HOST_COMPARE_MAX:
            return True  # compared on the GPU: computed when checked, not kept meanwhile
        nbytes = len(_AHEAD_WHICHS) * numel * 8
        if self._ahead_bytes + nbytes > AHEAD_HOST_BYTES:
            return False
        waited = self.reference_wait
        try:
            self.references(i, list(_AHEAD_WHICHS))
        finally:
            self.ahead_wait += self.reference_wait - waited
        new = [
            (i, w) for w in _AHEAD_WHICHS if (i, w) in self._oracles and (i, w) not in self._ahead
        ]
        self._ahead.update(new)
        self._ahead_bytes += sum(_nbytes(self._oracles[k]) for k in new)
        self.ahead_computed += len(new)
        return True

    def _sizes(self, i: int) -> tuple[int, int] | None:
        """Shape i's reference's elements and its input set's bytes, from the oracle on meta
        tensors (no data, no kernels); None where the problem cannot run on them."""
        if i not in self._meta:
            try:
                inputs = self.problem.module.make_inputs(self.shapes[i], self.dtype, "meta", None)
                numel = int(self.problem.oracle(*inputs).numel())
                self._meta[i] = (numel, timing.inputs_bytes(inputs))
            except Exception:
                self._meta[i] = None
        return self._meta[i]

    def _output_numel(self, i: int) -> int | None:
        sizes = self._sizes(i)
        return sizes[0] if sizes else None

    def timed_which(self, i: int) -> str | None:
        """The input set (`rotJ`) that shape i's timed output will be made on, where the caller
        knows it before the child times (`timed_plan`: the shape's mode is the caller's, and
        `timing.fresh_set` says the rest), its reference is compared on the host, and
        `TIMED_HOST_BYTES` has room for it; else None. Only which reference to compute early:
        the timed output is checked against the reference of the set the child names, computed
        then if it is another (`timing.is_fresh_set` bounds which it may name)."""
        plan = self.timed_plan
        mode = ((plan or {}).get("modes") or {}).get(str(i))
        sizes = self._sizes(i) if mode in ("graph", "events") else None
        if sizes is None or sizes[0] > HOST_COMPARE_MAX:
            return None
        numel, set_bytes = sizes
        if self._for_timed_bytes + numel * 8 > TIMED_HOST_BYTES:
            return None
        j = timing.fresh_set(mode, plan.get("l2_bytes"), set_bytes, self.seeds[i]["final"])
        return f"rot{j}"

    def verification_references(self, i: int, whichs: list[str]) -> str | None:
        """The references of shape i's verified outputs `whichs`, computed together under one
        hold (`references`), and with them, where the caller knows it (`timed_which`), that of
        the output the child will make on new values once it has timed the shape: kept on the
        host until that output is checked (`timed_checked`), with no hold of the GPU then.
        Returns which that one is, or None."""
        timed = self.timed_which(i) if whichs else None
        self.references(i, whichs + ([timed] if timed else []))
        ref = self._oracles.get((i, timed)) if timed else None
        if ref is None or ref.device.type != "cpu":
            return None
        self._for_timed.add((i, timed))
        self._for_timed_bytes += _nbytes(ref)
        return timed

    def timed_checked(self, i: int, which: str) -> None:
        """Shape i's timed outputs have been checked against the reference `which`: counted in
        `timed_early` where it had been computed with the verification ones, and whatever was
        kept for them goes."""
        self.timed_early += (i, which) in self._for_timed
        for key in [k for k in self._for_timed if k[0] == i]:
            self._for_timed.discard(key)
            ref = self._oracles.pop(key, None)
            if ref is not None:
                self._for_timed_bytes -= _nbytes(ref)

    def checked(self, i: int) -> None:
        """Shape i's report has been checked: what was computed ahead for it goes."""
        self._checked.add(i)
        for key in [k for k in self._ahead if k[0] == i]:
            self._ahead.discard(key)
            ref = self._oracles.pop(key, None)
            if ref is not None:
                self._ahead_bytes -= _nbytes(ref)

    def references(self, i: int, whichs: list[str]) -> dict[str, torch.Tensor]:
        """The float64 references of shape i on the inputs `whichs` (`oracle`), those not yet
        computed computed together, under one hold of the GPU (`own_work`)."""
        missing = [w for w in whichs if (i, w) not in self._oracles]
        if missing:
            self.admit(i, missing[0])
        if any((i, w) not in self._oracles for w in whichs):
            label = self.results[i]["label"]
            self.own_work(
                f"{label}: its reference",
                lambda: [self.oracle(i, w) for w in whichs],
                self.reference_bytes(i),
            )
        return {w: self._oracles[(i, w)] for w in whichs}

    def verify(self, i: int, tag: str, which: str, meta: dict, root: Path) -> bool:
        # Outside the try: a reference this process cannot compute is no unreadable output
        # (the caller then asks whether the problem fails on its own: Run.problem_fault).
        ref = self.references(i, [which])[which]
        try:
            raw, shape = _read_raw(meta, self.dtype, root, list(ref.shape))
        except _WrongShape as e:
            self.results[i]["errors"][tag] = {"passed": False, "reason": str(e)}
            return False
        except (ValueError, KeyError, TypeError, OSError) as e:
            self.fail("malformed", f"{self.results[i]['label']}: unreadable output: {e}")
            return False
        with contextlib.suppress(OSError):
            Path(meta["file"]).unlink()
        out = _tensor(raw, shape, self.dtype)
        if ref.device == out.device:  # a reference kept on the host (`HOST_COMPARE_MAX`)
            res = compare(out, ref, self.tol)
        else:
            res = self.own_work(
                f"{self.results[i]['label']}: comparing its output",
                lambda: compare(out.to(ref.device), ref, self.tol),
                2 * ref.numel() * ref.element_size(),
            )
        self.results[i]["errors"][tag] = res
        return res["passed"]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# The outputs a `verified` message may carry, and the inputs each was made on.
_VERIFIED = (("first", "first"), ("second", "second"), ("graph", "final"))


def on_verified(run: Run, msg: dict, root: Path) -> None:
    i = msg.get("i")
    if not isinstance(i, int) or not 0 <= i < len(run.shapes):
        run.fail("crashed", "the sandboxed process reported an unknown shape")
        return
    label = run.results[i]["label"]
    facts = msg.get("facts") or {}
    probs = [str(p) for p in facts.get("problems", [])]
    if facts.get("kind") == "malformed":
        run.check("output_contract", False, f"{label}: " + "; ".join(probs))
        run.fail("malformed", f"{label}: " + "; ".join(probs))
        return
    run.check("output_contract", True, "plain torch.Tensor of the right dtype and device")
    outs = msg.get("outputs") or {}
    # The references of every output the child sent (the first call, the call on new values,
    # the graph replay), computed under one hold of the GPU rather than one each, with that of
    # the shape's timed output where the caller knows it already.
    run.verification_references(i, [w for tag, w in _VERIFIED if tag in outs])
    if "first" in outs:
        ok = run.verify(i, "first", "first", outs["first"], root)
        why = f"{label}: {run.results[i]['errors'].get('first', {}).get('reason', 'unreadable')}"
        run.check(
            "correctness", ok, "fresh random inputs (secret seed), float64 reference" if ok else why
        )
        if not ok:
            run.fail("incorrect", why)
        run.results[i]["passed"] = ok
        if "second" in outs:
            ok2 = run.verify(i, "second", "second", outs["second"], root)
            if ok and not ok2:
                why = (
                    f"{label}: right on the first call, wrong after new values were written "
                    "into the same input buffers (results cached across calls)"
                )
                run.check("fresh_values", False, why)
                run.fail("hack_suspected", why)
            else:
                run.check(
                    "fresh_values", ok2 or None, "second call on new values in the same buffers"
                )
            run.results[i]["passed"] = ok and ok2
    for p in probs:
        name = (
            "no_aliasing"
            if "alias" in p
            else "inputs_unchanged"
            if "mutated" in p
            else "fresh_values"
            if "reused" in p or "first call's buffer" in p
            else "side_streams"
            if "stream" in p
            else "integrity"
        )
        run.check(name, False, f"{label}: {p}")
        run.fail("hack_suspected", f"{label}: {p}")
    for name, detail in (
        ("no_aliasing", "output shares no storage with inputs"),
        ("inputs_unchanged", "inputs bitwise unchanged"),
    ):
        run.check(name, True, detail)
    if run.dev == "cuda" and run.results[i].get("passed") is False:
        # Already wrong in a plain call: replay and timing checks would only repeat that.
        run.check("cuda_graph", None, f"{label}: not checked, the plain call is already wrong")
    elif run.dev == "cuda":
        if not any("stream" in p for p in probs):
            run.check("side_streams", True, "output final when the calling stream finished")
        if facts.get("graph_error") and "out of memory" in facts["graph_error"].lower():
            crowded = crowded_out(facts["graph_error"], facts.get("graph_memory"))
            if crowded:
                raise HarnessFault(
                    f"{label}: CUDA-graph capture: {crowded}; the candidate was not judged"
                )
            why = (
                f"{label}: out of memory during CUDA-graph capture: {facts['graph_error']}"
                + gpu_memory_note(facts.get("graph_memory"))
            )
            run.check("cuda_graph", False, why)
            run.fail("crashed", why)
        elif facts.get("graph_error"):
            why = f"{label}: breaks CUDA-graph capture: {facts['graph_error']}"
            run.check("cuda_graph", False, why)
            run.fail("hack_suspected", why)
        elif "graph" in outs:
            ok = run.verify(i, "graph", "final", outs["graph"], root)
            why = (
                "captured and replayed on new inputs"
                if ok
                else (
                    f"{label}: wrong output under CUDA-graph replay: "
                    f"{run.results[i]['errors'].get('graph', {}).get('reason')}"
                )
            )
            run.check("cuda_graph", ok, why)
            if not ok:
                run.fail("hack_suspected", why)
    if facts.get("tamper"):
        _tamper(run, facts["tamper"])


def on_e2e(run: Run, msg: dict) -> None:
    result = msg.get("result") if isinstance(msg.get("result"), dict) else {}
    passed = result.get("passed") if isinstance(result.get("passed"), bool) else False
    detail = str(result.get("detail") or "no result")[:1000]
    run.check("end_to_end", passed, detail)
    run.end_to_end = {k: v for k, v in result.items() if isinstance(v, str | int | float | bool)}
    if not passed:
        cat = result.get("failure") if result.get("failure") in FAILURES else "hack_suspected"
        run.fail(cat, f"end-to-end: {detail}")


def _tamper(run: Run, changes) -> None:
    why = "monkeypatching detected: " + "; ".join(str(c) for c in changes)[:1500]
    run.check("no_monkeypatching", False, why)
    run.fail("hack_suspected", why)


def on_timed(run: Run, msg: dict, root: Path, dinfo: dict, n_cands: int) -> None:
    i = msg.get("i")
    if not isinstance(i, int) or not 0 <= i < len(run.shapes):
        run.fail("crashed", "the sandboxed process reported an unknown shape")
        return
    r = run.results[i]
    ms = msg.get("ms") if isinstance(msg.get("ms"), dict) else {}
    outs = msg.get("outputs") or {}
    r["timing_mode"] = msg.get("mode")
    notes = [str(n) for n in msg.get("notes") or []]
    for note in notes:
        run.notes.append(f"{r['label']}: {note}")
    run.timed_ms[i] = ms
    if n_cands == 0:  # the baselines alone (measure_baselines): nothing to verify
        r["baseline_stats"] = {k: _stats(ms.get(k)) for k in ("eager", "compiled")}
        r["notes"] = notes
        return
    inputs_set = msg.get("inputs_set", 0)
    if not isinstance(inputs_set, int) or not 0 <= inputs_set <= timing.EVENTS_INPUT_SET:
        run.fail("crashed", f"{r['label']}: the sandboxed process named an unknown input set")
        return
    if msg.get("reused"):
        why = f"{r['label']}: a captured call returned another call's output (results reused)"
        run.fail("hack_suspected", why)
        return
    if not timing.is_fresh_set(msg.get("mode"), inputs_set):
        # The output verified is that of one more sample on new values, never one of the
        # samples' own inputs: a child that says otherwise did not run the harness's timing.
        run.fail("hack_suspected", f"{r['label']}: timed output not made on new values")
        return
    which = f"rot{inputs_set}"  # a fresh set, never the samples' own (`is_fresh_set`)
    timed_ok = []
    for c in range(n_cands):
        meta = outs.get(f"timed{c}")
        ok = bool(meta) and run.verify(i, f"timed{c}", which, meta, root)
        timed_ok.append(ok)
    run.timed_checked(i, which)
    if not run.retiming:
        if not timed_ok[0]:
            why = (
                f"{r['label']}: output produced while being timed is wrong: "
                f"{r['errors'].get('timed0', {}).get('reason', 'missing')}"
            )
            run.check("timed_outputs", False, why)
            run.fail("hack_suspected", why)
        else:
            run.check("timed_outputs", True, "outputs produced inside the timing loop verified")
        if run.cached is not None and ms.get("eager"):
            r["canary_eager"] = _stats(ms.get("eager"))
        _place(run, r, ms, dinfo)
    else:
        r["retime"] = {}
        for c in range(n_cands):
            st = ms.get(f"candidate{c}") or {}
            r["retime"][c] = {
                "median": _num(st.get("median")),
                "spread": _num(st.get("spread")),
                "passed": timed_ok[c] and _num(st.get("median")) is not None,
            }
        r["baseline_stats"] = {k: _stats(ms.get(k)) for k in ("eager", "compiled")}
        if not all(timed_ok):
            run.fail("hack_suspected", f"{r['label']}: outputs produced while re-timed are wrong")


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 else None


def _stats(st) -> dict | None:
    """The numbers of a timing stats dict that the caller keeps (None when there is none)."""
    if not isinstance(st, dict) or _num(st.get("median")) is None:
        return None
    keep = ("median", "spread", "ci", "n", "p25", "p75", "min", "max")
    return {k: st.get(k) for k in keep if isinstance(st.get(k), int | float)}


def _place(run: Run, r: dict, ms: dict, dinfo: dict) -> None:
    c = ms.get("candidate0") or {}
    cm = _num(c.get("median"))
    if cm is None or cm <= 0:
        run.fail("crashed", f"{r['label']}: no usable timing reported")
        return
    cs = _num(c.get("spread")) or 0.0
    r.update(
        candidate_ms=cm,
        candidate_spread=cs,
        candidate_ci=_num(c.get("ci")),
        candidate_samples=c.get("n"),
    )
    bar = _num(c.get("slower_than_ms"))
    if bar is not None and run.cached is not None:
        # Screening stopped sampling here: every sample was slower than the faster baseline.
        r["candidate_slower_than_ms"] = bar
    i = run.results.index(r)
    if run.cached is not None:
        entry = run.cached[i]
        _speedups(r, entry.get("eager"), entry.get("compiled"), cached=entry)
    else:
        _speedups(r, ms.get("eager"), ms.get("compiled"))
    ceil = dinfo.get("ceilings")
    if ceil:
        shape = r["shape"]
        pl = roofline.place(cm, run.problem.flops(shape), run.problem.bytes(shape, run.dtype), ceil)
        r.update(pl)
        if pl["beyond_roofline"]:
            why = (
                f"{r['label']}: {cm * 1e3:.1f} us is faster than the roofline floor "
                f"{pl['floor_ms'] * 1e3:.1f} us allows ({pl['roofline_fraction']:.2f}x): "
                "work skipped or timing defeated"
            )
            run.check("roofline", False, why)
            run.fail("hack_suspected", why)
        else:
            run.check("roofline", True, "every shape within the measured ceilings")
    if cs > UNSTABLE_SPREAD:
        why = f"{r['label']}: candidate timing spread {cs:.0%} of the median"
        run.check("stability", False, why)
        run.fail("unstable", why)
    else:
        run.check("stability", True, "interquartile spread under 50% of the median")


def _speedups(r: dict, eager, compiled, cached: dict | None = None) -> None:
    """The baselines' times and the candidate's speedups and wins on one shape."""
    e, k = eager or {}, compiled or {}
    cm, cs = r["candidate_ms"], r["candidate_spread"]
    em, km = _num(e.get("median")), _num(k.get("median"))
    es, ks = _num(e.get("spread")) or 0.0, _num(k.get("spread")) or 0.0
    r.update(
        eager_ms=em,
        eager_spread=es if em else None,
        compiled_ms=km,
        compiled_spread=ks if km else None,
    )
    r["speedup_eager"] = em / cm if em else None
    r["speedup_compiled"] = km / cm if km else None
    r["win_eager"] = bool(em and em / cm > 1 + cs + es)
    r["win_compiled"] = bool(km and km / cm > 1 + cs + ks)
    if cached is not None:
        r["baseline_source"] = "cached"
        r["baseline_measured_at"] = cached.get("measured_at")
        if cached.get("note") and not km:
            r["compiled_note"] = cached["note"]
    else:
        r["baseline_source"] = "measured"


def apply_baselines(report: dict, entries: list[dict]) -> None:
    """Place a screened report's timed shapes against other baseline entries (re-measured)."""
    for r, entry in zip(report["shapes"], entries, strict=True):
        if r.get("candidate_ms"):
            _speedups(r, entry.get("eager"), entry.get("compiled"), cached=entry)
    report["summary"].update(summarise(report["shapes"]))


def on_done(run: Run, msg: dict) -> None:
    strays = msg.get("strays")
    if isinstance(strays, int) and strays > 0:
        run.fail(
            "prohibited",
            f"the candidate started {strays} process(es) still running when it finished; "
            "they were killed",
        )
    ops = msg.get("ops") or {}
    if isinstance(ops, dict) and ops:
        listing = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items()))[:1000]
        why = f"library fallback: the candidate called torch compute ops ({listing})"
        if "aten._local_scalar_dense" in ops:
            why += "; _local_scalar_dense is a tensor's value read on the host (.item(), float(t))"
        run.check("library_fallback", False, why)
        run.fail("prohibited", why)
    else:
        run.check("library_fallback", True, "only allocation, view and copy ops dispatched")
    if msg.get("tamper"):
        _tamper(run, msg["tamper"])
    elif "no_monkeypatching" not in run.checks:
        run.check("no_monkeypatching", True, "torch, triton, timers and harness unchanged")


def require_complete(run: Run, *, verified: bool, timed: bool, n_cands: int, e2e: bool) -> None:
    """A run that ended without a failure must have reported every observation its spec asked
    for: each shape's outputs (fresh inputs, new values, and on a GPU the CUDA-graph replay),
    each shape's timing with its timed outputs, the end-to-end check. The messages come from
    the candidate's process, so a run that merely says it is done proves nothing: whatever is
    missing rejects it."""
    if run.failures:
        return
    tags = []
    if verified and n_cands:
        tags += ["first", "second"] + (["graph"] if run.dev == "cuda" else [])
    if timed:
        tags += [f"timed{c}" for c in range(n_cands)]
    missing = []
    for i, r in enumerate(run.results):
        lacking = [t for t in tags if t not in r["errors"]]
        if timed and i not in run.timed_ms:
            lacking.append("timing")
        if lacking:
            missing.append(f"{r['label']} ({', '.join(lacking)})")
    if e2e and run.end_to_end is None:
        missing.append("the end-to-end check")
    if missing:
        run.fail(
            "hack_suspected",
            "the sandboxed process finished without reporting "
            + "; ".join(missing[:6])
            + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""),
        )


def assemble_report(run: Run, problem, dinfo, dtype, tier, started, sources) -> dict:
    failure = None
    reasons: list[str] = []
    if run.failures:
        cats = {c for c, _ in run.failures}
        failure = next(c for c in PRIORITY if c in cats)
        seen = set()
        for c, why in sorted(run.failures, key=lambda f: PRIORITY.index(f[0])):
            if why not in seen:
                seen.add(why)
                reasons.append(f"{c}: {why}")
    shapes = run.results
    summary = {**summarise(shapes), "seconds": round(time.monotonic() - started, 3)}
    if run.dev != "cuda":
        for name in ("side_streams", "cuda_graph", "timed_outputs", "roofline", "stability"):
            run.checks.setdefault(name, {"passed": None, "detail": "skipped: needs CUDA"})
    return {
        "verdict": "rejected" if failure else "accepted",
        "failure": failure,
        "reasons": reasons,
        "problem": problem.name,
        "tier": tier,
        "dtype": str(dtype).replace("torch.", ""),
        "device": dinfo,
        "checks": run.checks,
        "shapes": shapes,
        "summary": summary,
        "notes": [n for n in run.notes if n][:50],
        **({"end_to_end": run.end_to_end} if run.end_to_end is not None else {}),
        "timeline": timeline_of(run.timeline),
        "timeline_cpu": dict(run.timeline_cpu),
        **({"references": dict(run.references_by)} if run.fast is not None else {}),
    }


def summarise(shapes: list[dict]) -> dict:
    timed = [s for s in shapes if s.get("candidate_ms")]
    se = [s["speedup_eager"] for s in timed if s.get("speedup_eager")]
    sc = [s["speedup_compiled"] for s in timed if s.get("speedup_compiled")]
    return {
        "shapes": len(shapes),
        "shapes_passed": sum(1 for s in shapes if s.get("passed")),
        "geomean_ms": geomean([s["candidate_ms"] for s in timed])
        if len(timed) == len(shapes)
        else None,
        "geomean_speedup_eager": geomean(se) if se and len(se) == len(shapes) else None,
        "geomean_speedup_compiled": geomean(sc) if sc and len(sc) == len(shapes) else None,
        "min_speedup_eager": min(se) if se else None,
        "min_speedup_compiled": min(sc) if sc else None,
        "noise": statistics.median([s["candidate_spread"] for s in timed]) if timed else None,
        "wins_eager": sum(1 for s in timed if s.get("win_eager")),
        "wins_compiled": sum(1 for s in timed if s.get("win_compiled")),
    }


def timeline_of(events: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds from handing the spec to the child until each phase first began."""
    out: dict[str, float] = {}
    for name, t in events:
        out.setdefault(name, t)
    return out
