"""Evaluations in flight: how many a search keeps going, and which of them hold a place.

A search keeps `places` evaluations in flight (`--jobs` + `--ahead` in `kernels tune`): as one
ends, the next starts. An evaluation that is still compiling `linger_s` after it began to
compile gives its place to the next one and runs out its compile budget beside the others, at
most `spare` of them at a time. A configuration whose compile takes a minute (in a screening
run, one that the compile budget will most likely stop) then holds up no other; it costs a
core meanwhile, which is what `spare` bounds. Once it has compiled it goes on like any other
evaluation, so the caller must bound the evaluations on the GPU by other means (GPU slots,
`evaluate(..., gpu_slots=...)`): `places` bounds only those that still hold their place.

An evaluation tells its ticket's `on_event` when it begins to compile (`{"phase":
"compiling"}`: the sandboxed child has the candidate) and when it has compiled (`{"phase":
"compiled"}`: the child first asks for the GPU, or starts verifying on the CPU), as the harness
does. Time before it begins to compile (waiting for a sandbox, or for the baselines of a cold
cache to be measured) never counts. A ticket that gave its place up never takes it back.

`version` changes with every event that frees a place or starts the clock on one (an
evaluation ending, giving its place up, beginning to compile): a caller that checked the places
at one version waits for the next with `wait_change`, so no change between its check and its
wait is missed.

`Stagger` lets a search's first evaluations onto the GPU one every `every_s` seconds rather than
all at once. At the start every evaluation in flight compiles together and would ask for a GPU
slot within a second of the others: they would verify together, none would be ready to time
until all were, and the GPU's timing phases, one evaluation at a time, would begin only then.
Staggered, the first reach their timing phases while the later ones verify.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from kernels.harness.gpulock import Slots

__all__ = [
    "Flight",
    "Stagger",
    "Ticket",
    "linger_setting",
    "seconds_or_off",
    "spare_for",
    "warm_pool",
]


def linger_setting(linger_s: float | None, spare: int) -> tuple[float | None, int]:
    """(linger_s, spare) as a flight uses them: both or neither. Raises ValueError on a linger
    time that is not a finite number above 0, or a negative spare."""
    if linger_s is not None and not (linger_s > 0 and math.isfinite(linger_s)):
        raise ValueError(f"linger_s must be a finite number above 0 or None, got {linger_s}")
    if spare < 0:
        raise ValueError(f"spare must be 0 or more, got {spare}")
    return (linger_s, spare) if linger_s is not None and spare else (None, 0)


def seconds_or_off(value: float) -> bool:
    """Whether `value` is a setting of seconds a flag like `--linger` or `--stagger` takes: a
    finite number above 0, or 0 for off."""
    return value == 0 or 0 < value < math.inf


def spare_for(ahead: int, linger_s: float | None) -> int:
    """How many may give their places up at once (`kernels tune --linger`): as many as compile
    ahead, at least one, since each costs a core; none without a linger time."""
    return max(1, ahead) if linger_s else 0


def warm_pool(jobs: int, ahead: int, spare: int, trials: int | None = None) -> tuple[int, int]:
    """(first, idle) for a screening's pool of warm sandboxes (`kernels.harness.sandbox.Pool`):
    `first` start before its first evaluation, as many as may begin at once (`jobs` + `ahead`
    + `spare`) and one more, no more than `trials` need; once those are taken, `idle` are kept
    ready, each taken replaced in the background: `ahead` + 2, no more than `first` (6 with
    12 jobs and 4 ahead: at 65 evaluations a minute, a child's start-up of about 3 s takes
    3-4 begins to replace).

    Why not keep `first` idle throughout: each idle child holds a CUDA context (its share of
    the GPU's memory), and each taken one would start its replacement at once. The first
    wave's takes then start as many children as there are evaluations, on the cores the first
    compiles need, while the GPU's memory is fullest. On H100s (docs/benchmarks/search.md,
    "Warm sandboxes kept idle"), back to back, keeping 6 idle rather than 24 brought the first
    verdict to about half the time, and 62.5-65.5 evaluations per minute against 49.6-57.3;
    on a third and a fourth H100, with no run of the old way beside them, the default gave 61.5
    and 53.5, then 59.4 and 54.6."""
    at_once = jobs + ahead + spare
    first = (at_once if trials is None else min(at_once, trials)) + 1
    return first, min(first, ahead + 2)


class Ticket:
    """One evaluation in flight."""

    def __init__(self, flight: Flight, started: float) -> None:
        self._flight = flight
        self.started = started
        self.compiling_since: float | None = None  # when it began to compile
        self.compiled = False
        self.lingering = False  # it gave its place up while still compiling
        self.ended = False

    def on_event(self, event: dict) -> None:
        """The evaluation's progress events: `compiling` (the first) and `compiled` count."""
        phase = event.get("phase") if isinstance(event, dict) else None
        if phase not in ("compiling", "compiled"):
            return
        with self._flight._cond:
            if phase == "compiled":
                self.compiled = True
            elif self.compiling_since is None:
                self.compiling_since = self._flight._clock()
                self._flight._changed()  # a wait for its linger starts now

    def end(self) -> None:
        self._flight._end(self)


class Flight:
    def __init__(
        self,
        places: int,
        *,
        linger_s: float | None = None,
        spare: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if places < 1:
            raise ValueError(f"places must be at least 1, got {places}")
        self.places = places
        self.linger_s, self.spare = linger_setting(linger_s, spare)
        self._clock = clock
        self._cond = threading.Condition()
        self._tickets: list[Ticket] = []  # in flight, oldest first
        self.gave_up = 0  # places given up over the flight's life
        self.version = 0

    # -- the caller's side --------------------------------------------------------------------

    def begin(self) -> Ticket:
        """Start one evaluation (whether a place is free is the caller's check)."""
        with self._cond:
            ticket = Ticket(self, self._clock())
            self._tickets.append(ticket)
            return ticket

    def holding(self) -> int:
        """How many evaluations in flight hold a place."""
        with self._cond:
            return self._holding()

    def has_place(self) -> bool:
        return self.holding() < self.places

    def lingering(self) -> int:
        with self._cond:
            self._linger()
            return sum(1 for t in self._tickets if t.lingering)

    def wake_in(self) -> float | None:
        """Seconds until an evaluation in flight could give its place up (so a caller waiting
        for one to end looks again then), or None when none could."""
        with self._cond:
            self._linger()
            return self._wake_in()

    def wait_for_place(self) -> None:
        """Block until a place is free."""
        with self._cond:
            while self._holding() >= self.places:
                self._cond.wait(self._wake_in())

    def wait_change(self, since: int, timeout: float | None) -> None:
        """Block until `version` is past `since`, or `timeout` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != since, timeout)

    # -- internals ----------------------------------------------------------------------------

    def _holding(self) -> int:
        self._linger()
        return sum(1 for t in self._tickets if not t.lingering)

    def _wake_in(self) -> float | None:
        if self.linger_s is None or sum(t.lingering for t in self._tickets) >= self.spare:
            return None
        now = self._clock()
        due = [
            t.compiling_since + self.linger_s - now
            for t in self._tickets
            if t.compiling_since is not None and not t.lingering and not t.compiled
        ]
        return max(0.0, min(due)) if due else None

    def _linger(self) -> None:
        """Let the oldest evaluations still compiling past `linger_s` give their places up,
        as long as fewer than `spare` have."""
        if self.linger_s is None:
            return
        now = self._clock()
        room = self.spare - sum(1 for t in self._tickets if t.lingering)
        for t in self._tickets:
            if room <= 0:
                return
            since = t.compiling_since
            if (
                not t.lingering
                and not t.compiled
                and since is not None
                and now - since >= self.linger_s
            ):
                t.lingering = True
                self.gave_up += 1
                room -= 1
                self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._cond.notify_all()

    def _end(self, ticket: Ticket) -> None:
        with self._cond:
            if not ticket.ended:
                ticket.ended = True
                self._tickets.remove(ticket)
                self._changed()
                self._linger()  # a spare may have come back


class Stagger:
    """GPU slots whose first `n` acquisitions are let through one every `every_s` seconds: the
    k-th (from 0) no sooner than `every_s` * k after the first, and each then takes a slot of
    `slots` as usual. From the n-th on it is `slots` alone. The same `acquire`/`release`, so it
    goes wherever the slots went. Raises ValueError on an `every_s` that is not a finite
    number above 0, or an `n` below 1."""

    def __init__(
        self,
        slots: Slots,
        n: int,
        every_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (every_s > 0 and math.isfinite(every_s)):
            raise ValueError(f"every_s must be a finite number above 0, got {every_s}")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        self.slots = slots
        self.n = n
        self.every_s = every_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._first: float | None = None
        self._asked = 0  # acquisitions asked for so far

    def turn(self) -> float | None:
        """Take the next turn: when it may take a slot (None: at once, the ramp is over)."""
        with self._lock:
            k = self._asked
            self._asked += 1
            if k >= self.n:
                return None
            if self._first is None:
                self._first = self._clock()
            return self._first + k * self.every_s

    def acquire(self) -> bool:
        at = self.turn()
        if at is not None:
            # Counted in the evaluation's wait for its slot (`gpu_wait.slot_s`).
            while (left := at - self._clock()) > 0:
                self._sleep(left)
        return self.slots.acquire()

    def release(self) -> None:
        self.slots.release()
