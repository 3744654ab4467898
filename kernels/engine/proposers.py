"""What to try next: the knob proposer every search path uses.

A proposer is derived from what was tried (`Tried` records, in any order): given the same
records it proposes the same next configuration, so a restarted web orchestrator carries on
exactly where an uninterrupted one would have, and the CLI tuner and the web agree.

Strategy, chosen from the budget and the size of the `# tune:` space:

* **exhaustive**, when the budget covers the space: every configuration once, the starting one
  first, the rest in a space-filling order (each next one as far as possible from all tried),
  so a search cut short still spans the space;
* **space-filling, then TPE**, when the budget is below the space: the starting configuration,
  then a few space-filling picks, then optuna's TPE fitted on the recorded results. Never the
  first N in lexical order: that tries the smallest values of the first knobs and nothing else.

A configuration is never proposed twice; one that was skipped (its source was already tried
under another name) counts as tried, and the reason is the caller's to show.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from kernels.knobs import (
    Knob,
    KnobValue,
    config_key,
    parse_knobs,
    rewrite,
    settings,
    space_size,
)

EXHAUSTIVE = "exhaustive"
MODEL_BASED = "space-filling + TPE"
# Spaces larger than this are not enumerated for the space-filling order: a seeded sample of
# this many configurations stands in for the space.
ENUMERATE_LIMIT = 4096
MAX_STARTUP = 16


@dataclass(frozen=True)
class Proposal:
    source: str
    knob_values: dict[str, KnobValue]
    rationale: str


@dataclass(frozen=True)
class Tried:
    values: dict[str, KnobValue]
    geomean_ms: float | None  # None: untimed, failed or still in flight
    failed: bool
    pending: bool = False  # proposed, verdict not in yet
    skipped: bool = False  # never evaluated: its source repeated an earlier trial's


def describe(values: dict[str, KnobValue]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items()) or "(no knobs)"


class KnobProposer:
    """Proposes configurations of a source's `# tune:` knobs within a trial budget."""

    def __init__(self, source: str, *, budget: int | None = None, seed: int = 0) -> None:
        self.source = source
        self.seed = seed
        self.knobs: list[Knob] = parse_knobs(source)  # KnobError before anything is proposed
        self.size = space_size(self.knobs)
        self.start = {k.name: k.value for k in self.knobs}
        self.budget = budget
        if budget is None or budget >= self.size:
            self.strategy = EXHAUSTIVE
            self.startup = self.size
            self.why = (
                f"the budget ({'unbounded' if budget is None else budget}) covers all "
                f"{self.size} configurations: each is tried once, the start first, then in a "
                "space-filling order (those one knob away from a failed one last)"
            )
        else:
            self.strategy = MODEL_BASED
            self.startup = min(MAX_STARTUP, max(4, budget // 4), budget)
            self.why = (
                f"the budget ({budget}) is below the {self.size} configurations: the start and "
                f"{self.startup - 1} space-filling picks, then optuna TPE on the results "
                "(a failed configuration counts as slower than any that ran)"
            )

    # -- the space as points ------------------------------------------------------------------

    def _point(self, values: dict[str, KnobValue]) -> np.ndarray:
        """A configuration in [0, 1]^d: each knob's choice index over its count."""
        out = []
        for k in self.knobs:
            i = k.choices.index(values[k.name]) if values.get(k.name) in k.choices else 0
            out.append(i / (len(k.choices) - 1) if len(k.choices) > 1 else 0.0)
        return np.array(out, dtype=float)

    def _pool(self) -> list[dict[str, KnobValue]]:
        if self.size <= ENUMERATE_LIMIT:
            return list(settings(self.knobs))
        rng = random.Random(self.seed)
        seen: dict[str, dict[str, KnobValue]] = {}
        while len(seen) < ENUMERATE_LIMIT:
            values = {k.name: rng.choice(k.choices) for k in self.knobs}
            seen.setdefault(config_key(values), values)
        return list(seen.values())

    def _farthest(self, tried: Sequence[Tried], seen: set[str]) -> dict[str, KnobValue] | None:
        """The untried configuration farthest from everything tried (ties: first in the pool).

        Those one knob away from a failed configuration come last: they often fail the same
        way (a block too large for one warp to compile within the budget, whatever the stage
        count), and a compile that runs out its budget holds a slot for a minute."""
        pool = [v for v in self._pool() if config_key(v) not in seen]
        if not pool:
            return None
        if not tried:
            return pool[0]
        points = np.stack([self._point(v) for v in pool])
        dist = np.full(len(pool), np.inf)
        for t in tried:
            dist = np.minimum(dist, ((points - self._point(t.values)) ** 2).sum(axis=1))
        failed = [self._point(t.values) for t in tried if t.failed]
        if failed:
            differ = (points[:, None, :] != np.stack(failed)[None, :, :]).sum(axis=2)
            beside = (differ <= 1).any(axis=1)
            if not beside.all():
                dist = np.where(beside, -1.0, dist)
        return pool[int(np.argmax(dist))]

    # -- proposing ----------------------------------------------------------------------------

    def next(self, tried: Sequence[Tried]) -> Proposal | None:
        """The next untried configuration, or None when the space or the budget is spent."""
        seen = {config_key(t.values) for t in tried}
        if not self.knobs:
            return None if tried else self._proposal(self.start, "the starting kernel as is")
        if len(seen) >= self.size:
            return None
        if config_key(self.start) not in seen:
            return self._proposal(self.start, "the starting kernel")
        if len(seen) < self.startup:
            values = self._farthest(tried, seen)
            if values is None:
                return None
            why = (
                f"exhaustive, in a space-filling order ({len(seen) + 1} of {self.size})"
                if self.strategy == EXHAUSTIVE
                else f"space-filling pick {len(seen)} of {self.startup - 1}"
            )
            return self._proposal(values, why)
        return self._tpe_next(tried, seen)

    def _tpe_next(self, tried: Sequence[Tried], seen: set[str]) -> Proposal | None:
        dists = {k.name: CategoricalDistribution(k.choices) for k in self.knobs}
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            sampler = optuna.samplers.TPESampler(
                seed=self.seed + len(tried), n_startup_trials=min(self.startup, 10)
            )
            study = optuna.create_study(direction="minimize", sampler=sampler)
            known = [t for t in tried if not (t.pending or t.skipped) and self._fits(t.values)]
            # A failed configuration (wrong, crashed, over the compile budget) is worse than any
            # that ran: it goes in as slower than the slowest, so TPE's density of bad
            # configurations covers its neighbourhood. Added as FAIL, TPE would ignore it and
            # keep proposing next to it, as eagerly as next to the good ones it resembles.
            measured = [t.geomean_ms for t in known if not t.failed and t.geomean_ms is not None]
            worst = 2.0 * max(measured) if measured else 1.0
            for t in known:
                # Untimed runs (the CPU interpreter) all tie: TPE learns nothing from them.
                ran = t.geomean_ms if t.geomean_ms is not None else 0.0
                value = worst if t.failed else ran
                study.add_trial(create_trial(params=t.values, distributions=dists, value=value))
            for _ in range(32):
                trial = study.ask(dists)
                values = {k.name: trial.params[k.name] for k in self.knobs}
                if config_key(values) not in seen:
                    return self._proposal(values, "optuna TPE over the recorded trials")
        finally:
            optuna.logging.set_verbosity(verbosity)
        # TPE keeps proposing what it likes best, which is tried: the farthest unseen instead.
        values = self._farthest(tried, seen)
        if values is None:
            return None
        return self._proposal(values, "space-filling (TPE kept proposing tried configurations)")

    def _fits(self, values: dict[str, KnobValue]) -> bool:
        return all(values.get(k.name) in k.choices for k in self.knobs)

    def _proposal(self, values: dict[str, KnobValue], why: str) -> Proposal:
        return Proposal(
            source=rewrite(self.source, values),
            knob_values=dict(values),
            rationale=f"tuner: {describe(values)} ({why})",
        )
