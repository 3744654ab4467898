"""Evaluations in flight (kernels.engine.flight): places, and giving one up while compiling.
The clock is a test's own, so each case is exact; the tuner's use of it runs real threads in
tests/kernels/test_engine_tuner.py."""

from __future__ import annotations

import threading
import time

import pytest

from kernels.engine.flight import Flight, Stagger, warm_pool

COMPILING = {"phase": "compiling"}
COMPILED = {"phase": "compiled"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_linger_every_evaluation_holds_its_place_to_the_end() -> None:
    clock = Clock()
    flight = Flight(2, clock=clock)
    a, b = flight.begin(), flight.begin()
    clock.now = 1000.0
    assert flight.holding() == 2 and not flight.has_place()
    assert flight.wake_in() is None
    a.end()
    assert flight.has_place() and flight.holding() == 1
    a.end()  # twice is once
    assert flight.holding() == 1
    b.end()
    assert flight.holding() == 0


def test_a_compile_past_linger_gives_its_place_up_and_never_takes_it_back() -> None:
    clock = Clock()
    flight = Flight(2, linger_s=20.0, spare=1, clock=clock)
    slow, quick = flight.begin(), flight.begin()
    slow.on_event(COMPILING)
    quick.on_event(COMPILING)
    quick.on_event(COMPILED)
    assert not flight.has_place()
    assert flight.wake_in() == 20.0  # the slow one could give its place up then
    clock.now = 19.9
    assert not flight.has_place()
    clock.now = 20.0
    assert flight.has_place() and flight.lingering() == 1
    assert flight.gave_up == 1
    slow.on_event(COMPILED)  # it compiled after all: it keeps no place
    assert flight.holding() == 1 and flight.lingering() == 1
    slow.end()
    assert flight.lingering() == 0 and flight.holding() == 1


def test_an_evaluation_that_compiled_keeps_its_place_however_long_it_runs() -> None:
    # It waits for a GPU slot or is on the GPU: the next would only wait behind it.
    clock = Clock()
    flight = Flight(1, linger_s=20.0, spare=4, clock=clock)
    t = flight.begin()
    t.on_event(COMPILING)
    t.on_event(COMPILED)
    clock.now = 500.0
    assert not flight.has_place() and flight.wake_in() is None
    t.end()
    assert flight.has_place()


def test_at_most_spare_give_their_places_up_the_oldest_first() -> None:
    clock = Clock()
    flight = Flight(3, linger_s=10.0, spare=2, clock=clock)
    first = flight.begin()
    first.on_event(COMPILING)
    clock.now = 1.0
    second = flight.begin()
    second.on_event(COMPILING)
    clock.now = 2.0
    third = flight.begin()
    third.on_event(COMPILING)
    clock.now = 30.0
    assert flight.lingering() == 2 and flight.holding() == 1
    assert first.lingering and second.lingering and not third.lingering
    assert flight.wake_in() is None  # no spare left: nothing more can change by time alone
    clock.now = 31.0
    late = flight.begin()
    late.on_event(COMPILING)
    assert flight.holding() == 2 and flight.has_place()
    first.end()  # a spare comes back: the oldest still compiling past 10 s takes it
    assert third.lingering and not late.lingering
    assert flight.lingering() == 2 and flight.holding() == 1
    assert flight.gave_up == 3
    assert flight.wake_in() is None
    second.end()
    assert flight.wake_in() == 10.0  # `late`, 10 s after it started


@pytest.mark.parametrize(("linger_s", "spare"), [(20.0, 0), (None, 3)])
def test_linger_needs_both_a_time_and_a_spare(linger_s, spare) -> None:
    clock = Clock()
    flight = Flight(1, linger_s=linger_s, spare=spare, clock=clock)
    flight.begin().on_event(COMPILING)
    clock.now = 1e6
    assert flight.holding() == 1 and flight.lingering() == 0 and flight.wake_in() is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"places": 0}, "places must be at least 1"),
        ({"places": 2, "linger_s": 0.0, "spare": 1}, "linger_s must be a finite"),
        ({"places": 2, "linger_s": float("nan"), "spare": 1}, "linger_s must be a finite"),
        ({"places": 2, "linger_s": float("inf"), "spare": 1}, "linger_s must be a finite"),
        ({"places": 2, "spare": -1}, "spare must be 0 or more"),
    ],
)
def test_bad_settings_are_refused(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        Flight(**kw)


def test_wait_for_place_returns_when_one_ends_or_one_gives_its_place_up() -> None:
    flight = Flight(1, linger_s=0.3, spare=1)
    held = flight.begin()
    held.on_event(COMPILING)
    started = time.monotonic()
    flight.wait_for_place()  # `held` never says it compiled: it gives its place up at 0.3 s
    assert 0.25 <= time.monotonic() - started < 5
    assert held.lingering

    compiled = flight.begin()
    compiled.on_event(COMPILING)
    compiled.on_event(COMPILED)
    threading.Timer(0.2, compiled.end).start()
    started = time.monotonic()
    flight.wait_for_place()
    assert 0.15 <= time.monotonic() - started < 5


def test_only_time_spent_compiling_counts() -> None:
    # Waiting for a sandbox, or for a cold cache's baselines to be measured, is not a slow
    # compile: the clock starts at the first "compiling".
    clock = Clock()
    flight = Flight(1, linger_s=20.0, spare=1, clock=clock)
    t = flight.begin()
    clock.now = 100.0
    assert flight.wake_in() is None and not flight.has_place()
    t.on_event(COMPILING)
    t.on_event({"phase": "verifying", "shape": 0, "of": 3})  # other phases change nothing
    clock.now = 119.0
    assert flight.wake_in() == 1.0 and not flight.has_place()
    t.on_event(COMPILING)  # the harness says it twice: the first one counts
    clock.now = 120.0
    assert flight.has_place() and t.lingering


def test_every_change_that_can_free_a_place_moves_the_version_and_wakes_a_waiter() -> None:
    clock = Clock()
    flight = Flight(1, linger_s=20.0, spare=1, clock=clock)
    t = flight.begin()
    seen = flight.version
    started = time.monotonic()
    flight.wait_change(seen, 0.2)  # nothing changed: the timeout
    assert time.monotonic() - started >= 0.15

    t.on_event(COMPILING)  # the linger clock starts: a waiter must look at its timeout again
    assert flight.version != seen
    flight.wait_change(seen, 30.0)  # returns at once
    seen = flight.version
    clock.now = 20.0
    assert flight.has_place()  # it gave its place up, here, between a check and a wait
    assert flight.version != seen
    seen = flight.version
    threading.Timer(0.1, t.end).start()
    started = time.monotonic()
    flight.wait_change(seen, 30.0)
    assert time.monotonic() - started < 10 and flight.version != seen


# ---- Stagger: the first evaluations let onto the GPU one every so often ---------------------


class Slept:
    """A clock that moves only when slept on, as the stagger's waits would move it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.naps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.naps.append(round(s, 6))
        self.now += s


class Counted:
    def __init__(self) -> None:
        self.held = 0

    def acquire(self) -> bool:
        self.held += 1
        return True

    def release(self) -> None:
        self.held -= 1


def test_the_first_evaluations_take_their_slots_one_every_interval_then_at_once() -> None:
    clock, slots = Slept(), Counted()
    stagger = Stagger(slots, 3, 0.5, clock=clock, sleep=clock.sleep)
    taken = []
    for _ in range(5):
        assert stagger.acquire()
        taken.append(clock.now)
    # The first at once, the second 0.5 s after it, the third 1.0 s after it; the fourth and
    # fifth come after the ramp and wait for nothing but a slot.
    assert taken == [100.0, 100.5, 101.0, 101.0, 101.0]
    assert slots.held == 5
    stagger.release()
    assert slots.held == 4


def test_a_turn_already_due_is_not_waited_for() -> None:
    clock, slots = Slept(), Counted()
    stagger = Stagger(slots, 4, 1.0, clock=clock, sleep=clock.sleep)
    assert stagger.acquire()
    clock.now += 5.0  # the second asks late: its turn (101.0) is long past
    assert stagger.acquire()
    assert clock.naps == []
    assert stagger.acquire()  # the third's turn, 102.0, is past too
    assert clock.naps == []
    assert stagger.acquire()
    assert clock.naps == []  # and the fourth's, 103.0


def test_the_stagger_counts_turns_in_the_order_they_are_asked_for_across_threads() -> None:
    slots = threading.Semaphore(8)
    stagger = Stagger(slots, 4, 0.05)
    got: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        stagger.acquire()
        with lock:
            got.append(time.monotonic())

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    got.sort()
    gaps = [b - a for a, b in zip(got, got[1:], strict=False)]
    assert len(got) == 4 and all(g >= 0.045 for g in gaps), gaps


@pytest.mark.parametrize(
    ("n", "every", "why"),
    [
        (0, 1.0, "n must be"),
        (2, 0.0, "every_s"),
        (2, float("inf"), "every_s"),
        (2, float("nan"), "every_s"),
    ],
)
def test_a_stagger_of_the_wrong_form_is_refused(n: int, every: float, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Stagger(Counted(), n, every)


@pytest.mark.parametrize(
    "jobs, ahead, spare, trials, first, idle",
    [
        # The screening of docs/benchmarks/search.md: 12 on the GPU, 4 ahead, 4 lingering.
        (12, 4, 4, None, 21, 6),
        (12, 4, 4, 120, 21, 6),
        # Fewer trials than may begin at once: no more started than they need.
        (12, 4, 4, 5, 6, 6),
        (1, 0, 0, 1, 2, 2),
        # The interpreter: nothing ahead, nothing lingering.
        (2, 0, 0, 24, 3, 2),
    ],
)
def test_a_pool_starts_those_that_begin_at_once_then_keeps_ahead_and_two_idle(
    jobs: int, ahead: int, spare: int, trials: int | None, first: int, idle: int
) -> None:
    assert warm_pool(jobs, ahead, spare, trials) == (first, idle)
