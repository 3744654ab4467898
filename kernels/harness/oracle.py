"""The caller's float64 references, fused by torch.compile and trusted one shape at a time.

Every candidate output is compared with the problem's oracle: its reference (or its own
`oracle`) on float64 copies of the inputs (docs/problems.md, "Tolerances and the oracle"). Run
eagerly, that is one pass over the data per op, each in float64, and four references per shape
per evaluation (three verified calls and the timed output): for a memory-bound problem's large
shapes, dozens of passes over gigabytes on the GPU that every evaluation shares. Compiled, with
the upcast to float64 inside the graph, the same float64 arithmetic reads the inputs once.

The compiled oracle serves a shape only where it has been checked against the eager one: the
first reference this process needs on a shape is computed both ways, on the same inputs, and
the shape is admitted when the two agree to within `AGREE` (`compare`'s bounds: elementwise
and L2, NaN and Inf where, and only where, the eager oracle has them). Until then the eager
oracle serves it, and for good where they disagreed or the compiled one failed. Every new
compile withdraws every admission, so the code that serves a shape is always code that was
checked on that shape; and compiling happens only inside an admission, outside the GPU lock,
with only the compiled code's run under a shared hold (`Compiled.admit`): an evaluation that
would need a compile in the middle of its checks gets the eager oracle instead.

On by default on a GPU in a process that evaluates many candidates (a worker, `kernels tune`);
off on the CPU, where the interpreter, not the references, takes the time, and in a process
that evaluates one (`kernels evaluate`, `kernels profile`: `one_evaluation`), where the compile
and the admissions would cost more than the references they save.
AUTOWEB_COMPILED_ORACLE=1 turns it on anywhere, 0 off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from kernels.harness.compare import compare

# How closely the compiled oracle must agree with the eager one on a shape: compare()'s bounds
# at this tolerance, some four million times float64's rounding (2.2e-16) ...
AGREE = 1e-9
# ... for problems whose own tolerances are at least this many times looser, so that what
# separates the two oracles is nothing against what a candidate is allowed. A problem whose
# tolerance is tighter keeps the eager oracle.
MARGIN = 1000

ENV = "AUTOWEB_COMPILED_ORACLE"


def setting(value: str | None) -> bool | None:
    """AUTOWEB_COMPILED_ORACLE: "1" on, "0" off, unset for the default (`for_problem`)."""
    if value in (None, ""):
        return None
    if value in ("0", "1"):
        return value == "1"
    raise ValueError(f"{ENV}={value!r}: use 1 (compiled references) or 0 (eager only)")


# A bad setting stops the process here, when it loads the harness.
SETTING = setting(os.environ.get(ENV))
# Whether this process evaluates one candidate and ends (`one_evaluation`).
_ONE_EVALUATION = False


def one_evaluation() -> None:
    """This process evaluates one candidate: unless AUTOWEB_COMPILED_ORACLE says otherwise,
    its references are eager (about 3 s of compiles on an H100, for a sweep's references that
    take about 0.15 s of the GPU eager: docs/benchmarks/search.md)."""
    global _ONE_EVALUATION
    _ONE_EVALUATION = True


Hold = Callable[[Callable[[], Any]], Any]


class Refused(RuntimeError):
    """The compiled oracle would have compiled outside an admission."""


def refused(e: BaseException) -> bool:
    """Whether `e` is (or wraps: dynamo re-raises a backend's error) a `Refused`."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, Refused):
            return True
        e = getattr(e, "inner_exception", None) or e.__cause__  # type: ignore[assignment]
        seen += 1
    return False


def compile_oracle(problem: Any, backend: str | Callable = "inductor") -> Callable:
    """`problem.oracle_function()` under torch.compile as the harness compiles it: dynamic
    shapes, one graph (the upcast to float64 inside it), compiled at its first call."""
    upcast = problem.oracle_function()
    # A code object of its own: dynamo keeps its compiled code, and counts its recompiles
    # against a limit, per code object, which every problem's oracle would otherwise share.
    upcast.__code__ = upcast.__code__.replace(co_name=f"oracle_{problem.name}")
    return torch.compile(upcast, dynamic=True, fullgraph=True, backend=backend)


class Compiled:
    """One problem's oracle compiled for one device and input dtype, and the shapes it serves.
    Shared by every evaluation of the process (each a thread)."""

    def __init__(self, problem: Any) -> None:
        self.problem = problem
        self.fn = compile_oracle(problem, self._backend)
        self.admitted: set[str] = set()
        self.refused: dict[str, str] = {}  # shape label -> why the eager oracle serves it
        self.broken: str | None = None  # why it serves no shape at all
        self.compiles = 0
        self.admitting = threading.Lock()  # one admission at a time
        self._state = threading.Lock()
        self._tls = threading.local()

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """Inductor's compile, allowed only inside an admission; its code runs under the
        admission's hold of the GPU where one is set (`admit`), as is."""
        if not getattr(self._tls, "admitting", False):
            raise Refused("the compiled oracle would compile outside an admission")
        from torch._inductor.compile_fx import compile_fx

        inner = compile_fx(gm, example_inputs)
        with self._state:
            self.compiles += 1
            self.admitted.clear()

        def run(*args: Any) -> Any:
            hold = getattr(self._tls, "hold", None)
            return inner(*args) if hold is None else hold(lambda: inner(*args))

        return run

    def decided(self, label: str) -> bool:
        with self._state:
            return self.broken is not None or label in self.admitted or label in self.refused

    def serves(self, label: str) -> bool:
        with self._state:
            return self.broken is None and label in self.admitted

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The reference of a shape it serves; raises `Refused` (wrapped) where the inputs
        would need a compile, which only an admission may do."""
        return self.fn(*inputs)

    def withdraw(self, label: str, why: str | None = None) -> None:
        """Shape `label` is no longer served: to be admitted again (why None), or never."""
        with self._state:
            self.admitted.discard(label)
            if why is not None:
                self.refused[label] = why

    def admit(self, label: str, inputs: tuple, eager: torch.Tensor, hold: Hold) -> str | None:
        """Check the compiled oracle against `eager`, the eager oracle on `inputs`, and admit
        shape `label` when they agree. Call it with `admitting` held and no hold of the GPU:
        a compile here happens outside the lock, and `hold(work)` runs `work` (the compiled
        code, the comparison) under a shared hold. Returns why the eager oracle serves the
        shape for good, None when admitted. Raises what running out of memory raised (the
        shape is then left undecided)."""
        self._tls.admitting, self._tls.hold = True, hold
        try:
            out = self.fn(*inputs)
        except Exception as e:
            if out_of_memory(e):
                raise
            why = f"the compiled oracle failed: {type(e).__name__}: {str(e)[:300]}"
            with self._state:
                self.broken = why
            return why
        finally:
            self._tls.admitting, self._tls.hold = False, None
        tol = {"atol": AGREE, "rtol": AGREE, "l2": AGREE}
        if out.dtype != eager.dtype:
            res = {"passed": False, "reason": f"dtype {out.dtype} != eager {eager.dtype}"}
        else:
            res = hold(lambda: compare(out, eager, tol))
        with self._state:
            if res["passed"]:
                self.admitted.add(label)
                return None
            why = f"the compiled oracle disagreed with the eager one: {res.get('reason', '')}"
            self.refused[label] = why[:400]
            return why


def out_of_memory(e: BaseException) -> bool:
    """Out of GPU or host memory: nothing the work itself got wrong, and worth a retry."""
    return isinstance(e, MemoryError | torch.OutOfMemoryError) or "out of memory" in str(e).lower()


_registry: dict[tuple, Compiled] = {}
_registry_lock = threading.Lock()


def for_problem(problem: Any, device: str, dtype: torch.dtype) -> Compiled | None:
    """The process's compiled oracle for `problem`'s inputs of `dtype` on `device` ("cuda" or
    "cpu"), or None where the eager oracle serves every shape: turned off, for the process or
    by the problem (`COMPILED_ORACLE = False`), or a problem whose tolerance is within MARGIN of
    AGREE."""
    on = SETTING if SETTING is not None else device == "cuda" and not _ONE_EVALUATION
    if not on or not problem.compiled_oracle:
        return None
    tol = problem.tolerance(dtype)
    if min(float(tol[k]) for k in ("atol", "rtol", "l2")) < MARGIN * AGREE:
        return None
    key = (problem.name, id(problem.module), device, str(dtype))
    with _registry_lock:
        if key not in _registry:
            _registry[key] = Compiled(problem)
        return _registry[key]
