"""The built-in tuner: searches a candidate's `# tune:` knobs and keeps only wins beyond noise.

Headless and independent of how evaluation happens: the caller passes `evaluate(source) ->
report` (the harness in a sandbox, a GPU worker, a test double) and optionally `retime(sources)
-> numbers`, which times several candidates interleaved in one process to confirm a win.

Small spaces are enumerated; larger ones are searched with optuna's TPE through ask/tell. Every
proposal is plain source produced by `kernels.knobs.rewrite`, evaluated at most once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from kernels.knobs import KnobValue, config_key, parse_knobs, rewrite, space_size

Report = dict[str, Any]
Evaluate = Callable[[str], Report]
Retime = Callable[[list[str]], list[dict[str, Any]]]

# After this many optuna proposals in a row that were already evaluated, propose an unseen
# config ourselves: TPE converges on its favourite and would otherwise spin near exhaustion.
MAX_REPEATED_PROPOSALS = 16
_RANDOM_DRAWS = 64

KEPT, REVERTED, FAILED = "kept", "reverted", "failed"


class TrialRecord(TypedDict):
    index: int
    values: dict[str, KnobValue]
    status: str  # kept | reverted | failed
    failure: str | None  # the report's failure category when failed
    reason: str
    geomean_ms: float | None
    noise: float | None
    speedups: dict[str, float | None]  # {"eager": ..., "compiled": ...}
    retimed: dict[str, dict[str, Any]] | None  # {"incumbent": {...}, "challenger": {...}}
    description: str
    seconds: float


@dataclass
class TuneResult:
    best_source: str
    best_values: dict[str, KnobValue]
    best_report: Report | None
    trials: list[TrialRecord]
    ranked: bool
    evaluations: int
    failures: int
    evals_per_minute: float | None
    strategy: str  # exhaustive | optuna
    space_size: int
    note: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def is_improvement(challenger: dict[str, Any], incumbent: dict[str, Any]) -> bool:
    """True when the challenger is faster than the incumbent by more than both noises together.

    Both sides are {"geomean_ms", "noise"} with noise a relative spread (0.02 = 2%); a missing
    or non-finite number means the win cannot be shown, so it is not an improvement.
    """
    c_ms, c_noise = _number(challenger.get("geomean_ms")), _number(challenger.get("noise"))
    i_ms, i_noise = _number(incumbent.get("geomean_ms")), _number(incumbent.get("noise"))
    if c_ms is None or c_noise is None or i_ms is None or i_noise is None:
        return False
    if c_noise < 0 or i_noise < 0 or c_ms <= 0 or i_ms <= 0:
        return False
    return c_ms < i_ms * (1 - (c_noise + i_noise))


@dataclass
class _Incumbent:
    values: dict[str, KnobValue]
    source: str
    report: Report
    numbers: dict[str, float | None]


class Tuner:
    def __init__(
        self,
        source: str,
        *,
        trials: int,
        evaluate: Evaluate,
        retime: Retime | None = None,
        seed: int | None = None,
        exhaustive_limit: int = 64,
        on_trial: Callable[[TrialRecord], None] | None = None,
        jobs: int = 1,
    ) -> None:
        if trials < 1:
            raise ValueError(f"trials must be at least 1, got {trials}")
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        if exhaustive_limit < 0:
            raise ValueError(f"exhaustive_limit must be >= 0, got {exhaustive_limit}")
        self.source = source
        self.trials = trials
        self.evaluate = evaluate
        self.retime = retime
        self.seed = seed
        self.on_trial = on_trial
        # Evaluations in flight at once: on a GPU worker, candidates compile and verify in
        # their own sandboxes while another is timed. Keep/revert stays in proposal order.
        self.jobs = jobs
        self.knobs = parse_knobs(source)  # KnobError here, before any evaluation
        self.space_size = space_size(self.knobs)
        self.strategy = "exhaustive" if self.space_size <= exhaustive_limit else "optuna"
        self.start_values: dict[str, KnobValue] = {k.name: k.value for k in self.knobs}

    def run(self) -> TuneResult:
        self._records: list[TrialRecord] = []
        self._incumbent: _Incumbent | None = None
        self._start_report: Report | None = None
        self._evaluate_seconds = 0.0
        self._evaluations = 0
        self._wall_started = time.perf_counter()
        with ThreadPoolExecutor(self.jobs) as self._pool:
            if self.strategy == "exhaustive":
                configs = list(itertools.islice(self._configs_in_order(), self.trials))
                for i in range(0, len(configs), self.jobs):
                    batch = configs[i : i + self.jobs]
                    for values, evaluated in zip(batch, self._evaluate_batch(batch), strict=True):
                        self._trial(values, evaluated)
            else:
                self._run_optuna()
        return self._result()

    def _evaluate_batch(self, batch: list[dict[str, KnobValue]]) -> list[tuple]:
        """Evaluate several configs concurrently; each result is (report, failure, reason, s)."""

        def one(values: dict[str, KnobValue]) -> tuple:
            started = time.perf_counter()
            report, failure, reason = self._evaluate(rewrite(self.source, values))
            return report, failure, reason, time.perf_counter() - started

        return list(self._pool.map(one, batch))

    # -- strategies ---------------------------------------------------------------------------

    def _configs_in_order(self) -> Iterator[dict[str, KnobValue]]:
        yield self.start_values
        start_key = config_key(self.start_values)
        for values in self._all_configs():
            if config_key(values) != start_key:
                yield values

    def _all_configs(self) -> Iterator[dict[str, KnobValue]]:
        names = [k.name for k in self.knobs]
        for combo in itertools.product(*(k.choices for k in self.knobs)):
            yield dict(zip(names, combo, strict=True))

    def _run_optuna(self) -> None:
        distributions = {k.name: CategoricalDistribution(k.choices) for k in self.knobs}
        # value told to optuna per evaluated config; None = failed
        told: dict[str, float | None] = {}
        rng = random.Random(self.seed)
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no per-trial log lines
        try:
            study = optuna.create_study(
                direction="minimize", sampler=optuna.samplers.TPESampler(seed=self.seed)
            )
            study.enqueue_trial(self.start_values)
            repeats = 0
            exhausted = False
            while (
                not exhausted and len(self._records) < self.trials and len(told) < self.space_size
            ):
                # Ask for up to `jobs` new configs (pending ones count as seen), then evaluate
                # them together and tell optuna in order.
                batch: list[tuple[optuna.Trial, dict[str, KnobValue]]] = []
                pending: set[str] = set()
                room = min(self.jobs, self.trials - len(self._records))
                while len(batch) < room and len(told) + len(pending) < self.space_size:
                    trial = study.ask(distributions)
                    values = {k.name: trial.params[k.name] for k in self.knobs}
                    key = config_key(values)
                    if key in told or key in pending:
                        _tell(study, trial, told.get(key))
                        repeats += 1
                        if repeats >= MAX_REPEATED_PROPOSALS:
                            unseen = self._unseen_config({**told, **dict.fromkeys(pending)}, rng)
                            if unseen is None:
                                exhausted = True
                                break
                            study.enqueue_trial(unseen)
                            repeats = 0
                        continue
                    repeats = 0
                    pending.add(key)
                    batch.append((trial, values))
                if not batch:
                    break
                results = self._evaluate_batch([v for _, v in batch])
                for (trial, values), evaluated in zip(batch, results, strict=True):
                    key = config_key(values)
                    record = self._trial(values, evaluated)
                    if record["status"] == FAILED:
                        told[key] = None
                    else:
                        # Untimed (interpreter) runs give TPE no signal: every correct config
                        # ties.
                        gm = record["geomean_ms"]
                        told[key] = gm if gm is not None else 0.0
                    _tell(study, trial, told[key])
        finally:
            optuna.logging.set_verbosity(verbosity)

    def _unseen_config(
        self, seen: dict[str, float | None], rng: random.Random
    ) -> dict[str, KnobValue] | None:
        for _ in range(_RANDOM_DRAWS):
            values = {k.name: rng.choice(k.choices) for k in self.knobs}
            if config_key(values) not in seen:
                return values
        # Nearly exhausted: a scan is cheap relative to what was already evaluated.
        return next((v for v in self._all_configs() if config_key(v) not in seen), None)

    # -- one trial ----------------------------------------------------------------------------

    def _trial(self, values: dict[str, KnobValue], evaluated: tuple) -> TrialRecord:
        index = len(self._records)
        source = rewrite(self.source, values)
        started = time.perf_counter()
        report, failure, reason, eval_seconds = evaluated
        self._evaluate_seconds += eval_seconds
        self._evaluations += 1
        if index == 0:
            self._start_report = report

        numbers = _summary_numbers(report)
        retimed = None
        if failure is not None or report is None:
            status = FAILED
        else:
            status, reason, retimed = self._judge(values, source, report, numbers, index)

        record: TrialRecord = {
            "index": index,
            "values": dict(values),
            "status": status,
            "failure": failure,
            "reason": reason,
            "geomean_ms": numbers["geomean_ms"],
            "noise": numbers["noise"],
            "speedups": {
                "eager": _number(_summary(report).get("geomean_speedup_eager")),
                "compiled": _number(_summary(report).get("geomean_speedup_compiled")),
            },
            "retimed": retimed,
            "description": "",
            "seconds": round(eval_seconds + time.perf_counter() - started, 6),
        }
        record["description"] = _describe(record)
        self._records.append(record)
        if self.on_trial is not None:
            self.on_trial(record.copy())
        return record

    def _evaluate(self, source: str) -> tuple[Report | None, str | None, str]:
        """Run evaluate; never raises. Returns (report, failure category or None, reason)."""
        try:
            report = self.evaluate(source)
        except Exception as exc:  # a failed config is data, not a reason to stop the search
            return None, "crashed", f"evaluate raised {type(exc).__name__}: {_first_line(exc)}"
        if not isinstance(report, dict) or "verdict" not in report:
            return None, "malformed", f"evaluate returned no report ({type(report).__name__})"
        if report["verdict"] != "accepted":
            reasons = "; ".join(str(r) for r in report.get("reasons") or [])
            return report, report.get("failure") or "rejected", reasons or "rejected"
        return report, None, ""

    def _judge(
        self,
        values: dict[str, KnobValue],
        source: str,
        report: Report,
        numbers: dict[str, float | None],
        index: int,
    ) -> tuple[str, str, dict[str, dict[str, Any]] | None]:
        """Keep or revert an accepted config: (status, reason, retimed numbers or None)."""
        incumbent = self._incumbent
        if incumbent is None:
            self._incumbent = _Incumbent(dict(values), source, report, numbers)
            if index == 0:
                return KEPT, "starting config (baseline)", None
            return KEPT, "first correct config (every earlier one failed)", None

        if numbers["geomean_ms"] is None or incumbent.numbers["geomean_ms"] is None:
            return REVERTED, "correct but untimed: cannot be ranked against the incumbent", None
        if numbers["noise"] is None or incumbent.numbers["noise"] is None:
            return REVERTED, "noise not measured: a win must exceed the measured noise", None
        c_ms, i_ms = numbers["geomean_ms"], incumbent.numbers["geomean_ms"]
        margin = numbers["noise"] + incumbent.numbers["noise"]
        versus = f"{_ms(c_ms)} vs incumbent {_ms(i_ms)} (noise {margin:.1%})"
        if not is_improvement(numbers, incumbent.numbers):
            return REVERTED, f"{versus}: not faster beyond noise", None

        retimed = None
        if self.retime is not None:
            try:
                pair = self.retime([incumbent.source, source])
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueError(f"expected 2 results, got {pair!r:.80}")
            except Exception as exc:  # an unconfirmed win is not a win
                return REVERTED, f"{versus}; re-time failed: {_first_line(exc)}", None
            retimed = {"incumbent": dict(pair[0]), "challenger": dict(pair[1])}
            again = (
                f"re-timed interleaved: {_ms(pair[1].get('geomean_ms'))} "
                f"vs {_ms(pair[0].get('geomean_ms'))}"
            )
            if not is_improvement(pair[1], pair[0]):
                return REVERTED, f"{versus}; {again}: not confirmed", retimed
            versus = f"{versus}; {again}"

        self._incumbent = _Incumbent(dict(values), source, report, numbers)
        return KEPT, f"{versus}: faster beyond noise", retimed

    # -- result -------------------------------------------------------------------------------

    def _result(self) -> TuneResult:
        records = self._records
        accepted = [r for r in records if r["status"] != FAILED]
        failures = len(records) - len(accepted)
        ranked = bool(accepted) and all(
            r["geomean_ms"] is not None and r["noise"] is not None for r in accepted
        )
        incumbent = self._incumbent
        if incumbent is None:
            best_source, best_values = self.source, self.start_values
            best_report = self._start_report
            note = f"no config passed ({failures} of {len(records)} failed); best is the start"
        else:
            best_source, best_values = incumbent.source, incumbent.values
            best_report = incumbent.report
            if ranked:
                note = f"ranked {len(accepted)} correct configs by timing, noise-aware"
            else:
                note = (
                    "no timings (e.g. the CPU interpreter): configs were checked for "
                    "correctness only and not ranked; best is the first correct config"
                )
        # Throughput is evaluations over the tuner's wall clock (with several in flight, the
        # sum of evaluation times would understate it).
        minutes = (time.perf_counter() - self._wall_started) / 60
        return TuneResult(
            best_source=best_source,
            best_values=dict(best_values),
            best_report=best_report,
            trials=records,
            ranked=ranked,
            evaluations=self._evaluations,
            failures=failures,
            evals_per_minute=self._evaluations / minutes if minutes > 0 else None,
            strategy=self.strategy,
            space_size=self.space_size,
            note=note,
        )


def _tell(study: optuna.Study, trial: optuna.Trial, value: float | None) -> None:
    if value is None:
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, value)


def _summary(report: Report | None) -> dict[str, Any]:
    summary = report.get("summary") if report else None
    return summary if isinstance(summary, dict) else {}


def _summary_numbers(report: Report | None) -> dict[str, float | None]:
    summary = _summary(report)
    return {
        "geomean_ms": _number(summary.get("geomean_ms")),
        "noise": _number(summary.get("noise")),
    }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _ms(value: object) -> str:
    number = _number(value)
    return "? ms" if number is None else f"{number:.4g} ms"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _describe(record: TrialRecord) -> str:
    config = (
        " ".join(
            f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
            for name, value in record["values"].items()
        )
        or "(no knobs)"
    )
    if record["status"] == FAILED:
        return f"{config}: failed ({record['failure']})"
    if record["geomean_ms"] is None:
        return f"{config}: correct, untimed {record['status']}"
    speedups = [
        f"{speedup:.2f}x {baseline}"
        for baseline, speedup in record["speedups"].items()
        if _number(speedup) is not None
    ]
    detail = f" ({', '.join(speedups)})" if speedups else ""
    return f"{config}: {_ms(record['geomean_ms'])}{detail} {record['status']}"
