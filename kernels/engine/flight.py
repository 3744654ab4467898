"""Evaluations in flight: how many a search keeps going, and which of them hold a place.

A search keeps `places` evaluations in flight (`--jobs` + `--ahead` in `kernels tune`): as one
ends, the next starts. An evaluation that is still compiling `linger_s` after it started gives
its place to the next one and runs out its compile budget beside the others, at most `spare`
of them at a time. A configuration whose compile takes a minute (in a screening run, one that
the compile budget will most likely stop) then holds up no other; it costs a core meanwhile,
which is what `spare` bounds. Once it has compiled it goes on like any other evaluation, so the
caller must bound the evaluations on the GPU by other means (GPU slots,
`evaluate(..., gpu_slots=...)`): `places` bounds only those that still hold their place.

An evaluation says it has compiled by an event `{"phase": "compiled"}` to its ticket's
`on_event` (the harness sends it when the sandboxed child first asks for the GPU, or starts
verifying on the CPU). A ticket that gave its place up never takes it back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Flight", "Ticket"]


class Ticket:
    """One evaluation in flight."""

    def __init__(self, flight: Flight, started: float) -> None:
        self._flight = flight
        self.started = started
        self.compiled = False
        self.lingering = False  # it gave its place up while still compiling
        self.ended = False

    def on_event(self, event: dict) -> None:
        """The evaluation's progress events; `{"phase": "compiled"}` is the one that counts."""
        if isinstance(event, dict) and event.get("phase") == "compiled":
            with self._flight._cond:
                self.compiled = True

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
        if linger_s is not None and not linger_s > 0:
            raise ValueError(f"linger_s must be above 0 or None, got {linger_s}")
        if spare < 0:
            raise ValueError(f"spare must be 0 or more, got {spare}")
        self.places = places
        self.linger_s = linger_s if spare else None
        self.spare = spare if linger_s is not None else 0
        self._clock = clock
        self._cond = threading.Condition()
        self._tickets: list[Ticket] = []  # in flight, oldest first
        self.gave_up = 0  # places given up over the flight's life

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
            self._linger()
            return sum(1 for t in self._tickets if not t.lingering)

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
            while True:
                self._linger()
                if sum(1 for t in self._tickets if not t.lingering) < self.places:
                    return
                self._cond.wait(self._wake_in())

    # -- internals ----------------------------------------------------------------------------

    def _wake_in(self) -> float | None:
        if self.linger_s is None or sum(t.lingering for t in self._tickets) >= self.spare:
            return None
        now = self._clock()
        due = [
            t.started + self.linger_s - now
            for t in self._tickets
            if not t.lingering and not t.compiled
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
            if not t.lingering and not t.compiled and now - t.started >= self.linger_s:
                t.lingering = True
                self.gave_up += 1
                room -= 1

    def _end(self, ticket: Ticket) -> None:
        with self._cond:
            if not ticket.ended:
                ticket.ended = True
                self._tickets.remove(ticket)
                self._linger()  # a spare may have come back
                self._cond.notify_all()
