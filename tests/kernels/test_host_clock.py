"""The compile-only pass's bound on a candidate's own code (kernels.harness.childrun.HostClock):
a call that runs on outside Triton's compiler is stopped, naming the shape; compiles are exempt.

The kernels here are this file's own functions, not candidate sources: candidates run only in a
sandboxed child (tests/kernels/test_integrity.py runs the `hang` and `oom` fixtures on CUDA,
where the pass runs)."""

from __future__ import annotations

import contextlib
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from kernels import problems
from kernels.harness.childrun import HostClock, HostCodeTooLong, precompile_candidates


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _cand(kernel) -> SimpleNamespace:
    return SimpleNamespace(mod=SimpleNamespace(kernel=kernel))


def test_a_call_that_runs_on_is_stopped_once_past_its_budget() -> None:
    clock = HostClock(budget_s=0.3, tick_s=0.05)
    started = time.monotonic()

    with pytest.raises(HostCodeTooLong, match="over 0.3 CPU seconds"), clock.call():
        while True:
            pass

    assert time.monotonic() - started < 5


def test_the_candidates_own_except_exception_does_not_swallow_it() -> None:
    clock = HostClock(budget_s=0.2, tick_s=0.05)

    with pytest.raises(HostCodeTooLong), clock.call():
        while True:
            try:  # noqa: SIM105 - written as a candidate would
                _spin(0.01)
            except Exception:
                pass


def test_time_inside_the_compiler_is_not_counted() -> None:
    clock = HostClock(budget_s=0.3, tick_s=0.05)

    with clock.call():
        with clock.compiling():
            _spin(0.5)
            with clock.compiling():  # nested: the outermost compile counts once
                _spin(0.3)
        _spin(0.1)
        used = clock.used()

    assert 0.05 <= used < 0.3


def test_the_signal_handler_and_the_timer_are_put_back() -> None:
    def mine(signum, frame) -> None:
        pass

    before = signal.signal(signal.SIGALRM, mine)
    try:
        with contextlib.suppress(HostCodeTooLong), HostClock(0.1, 0.05).call():
            _spin(0.3)
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        with HostClock(5.0, 0.05).call():
            pass
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, before)


def _softmax() -> tuple:
    problem = problems.load("softmax")
    return problem, [dict(s) for s in problem.shapes("smoke")], {"dtype": "float32"}


def test_precompile_stops_a_kernel_that_loops_on_and_names_the_shape() -> None:
    problem, shapes, spec = _softmax()
    calls = []

    def kernel(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.device.type)
        if len(calls) == 2:  # the second shape's call never returns
            while True:
                pass
        return torch.empty_like(x)

    with pytest.raises(HostCodeTooLong) as caught:
        precompile_candidates(problem, shapes, spec, [_cand(kernel)], HostClock(0.3, 0.05))

    text = str(caught.value)
    assert "outside Triton's compiler" in text
    assert "on shape 1 (" in text
    assert calls == ["meta", "meta"]  # the third shape was never called


def test_precompile_lets_honest_and_failing_kernels_through() -> None:
    problem, shapes, spec = _softmax()
    seen = []

    def honest(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.device.type)
        return torch.empty_like(x)

    def failing(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("compiled at its first real call instead")

    clock = HostClock(2.0, 0.05)
    assert precompile_candidates(problem, shapes, spec, [_cand(honest)], clock) == len(shapes)
    assert precompile_candidates(problem, shapes, spec, [_cand(failing)], clock) == 0
    assert set(seen) == {"meta"}
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
