"""Proposers: what the loop tries next. State is derived from the recorded trials only, so a
restarted orchestrator proposes exactly what an uninterrupted one would have.

The built-in tuner walks the `# tune:` knobs of the idea's starting kernel (its sketch, or the
problem's seed): every configuration in a fixed order when the space is small, optuna's TPE
(replaying the recorded results into a fresh study) when it is large.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from kernels import problems
from kernels.knobs import KnobValue, config_key, parse_knobs, rewrite, space_size

EXHAUSTIVE_LIMIT = 64


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


def start_source(idea) -> str:
    if idea.sketch_source and idea.sketch_source.strip():
        return idea.sketch_source
    return problems.load(idea.problem).seed_path.read_text()


class TunerProposer:
    def __init__(self, source: str, seed: int = 0) -> None:
        self.source = source
        self.seed = seed
        self.knobs = parse_knobs(source)
        self.size = space_size(self.knobs)
        self.start = {k.name: k.value for k in self.knobs}

    def _ordered(self):
        yield self.start
        names = [k.name for k in self.knobs]
        for combo in itertools.product(*(k.choices for k in self.knobs)):
            values = dict(zip(names, combo, strict=True))
            if values != self.start:
                yield values

    def next(self, tried: list[Tried]) -> Proposal | None:
        """The next untried configuration, or None when the space is exhausted."""
        seen = {config_key(t.values) for t in tried}
        if not self.knobs:
            return None if tried else self._proposal(self.start, "the starting kernel as is")
        if len(seen) >= self.size:
            return None
        if self.size <= EXHAUSTIVE_LIMIT or len(tried) == 0:
            for values in self._ordered():
                if config_key(values) not in seen:
                    why = (
                        "the starting kernel"
                        if values == self.start
                        else f"exhaustive sweep of {self.size} configurations"
                    )
                    return self._proposal(values, why)
            return None
        return self._optuna_next(tried, seen)

    def _optuna_next(self, tried: list[Tried], seen: set[str]) -> Proposal | None:
        dists = {k.name: CategoricalDistribution(k.choices) for k in self.knobs}
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            sampler = optuna.samplers.TPESampler(seed=self.seed + len(tried))
            study = optuna.create_study(direction="minimize", sampler=sampler)
            for t in tried:
                if t.pending:
                    continue
                if t.failed:
                    study.add_trial(
                        create_trial(params=t.values, distributions=dists, state=TrialState.FAIL)
                    )
                else:
                    study.add_trial(
                        create_trial(
                            params=t.values, distributions=dists, value=t.geomean_ms or 0.0
                        )
                    )
            for _ in range(32):
                trial = study.ask(dists)
                values = {k.name: trial.params[k.name] for k in self.knobs}
                if config_key(values) not in seen:
                    return self._proposal(values, "optuna TPE over the recorded trials")
        finally:
            optuna.logging.set_verbosity(verbosity)
        rng = random.Random(self.seed + len(tried))
        for _ in range(256):
            values = {k.name: rng.choice(k.choices) for k in self.knobs}
            if config_key(values) not in seen:
                return self._proposal(values, "random unseen configuration (TPE kept repeating)")
        for values in self._ordered():
            if config_key(values) not in seen:
                return self._proposal(values, "first unseen configuration")
        return None

    def _proposal(self, values: dict[str, KnobValue], why: str) -> Proposal:
        desc = " ".join(f"{k}={v}" for k, v in values.items())
        return Proposal(
            source=rewrite(self.source, values),
            knob_values=dict(values),
            rationale=f"tuner: {desc} ({why})",
        )
