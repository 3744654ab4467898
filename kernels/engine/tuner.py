"""The headless search: `python -m kernels tune` and the GPU benchmarks drive the engine here.

The caller passes how to evaluate: `evaluate(source) -> report` (screening: the harness in a
sandbox with cached baselines), `retime(sources) -> numbers` (the interleaved re-time that
confirms a win) and optionally `together(sources) -> timings` (candidates and baselines timed
interleaved on every shape, which the per-shape table is built from). `jobs` evaluations stay
in flight: as soon as one finishes the next is proposed, so compiling and verifying overlap the
GPU's timing, and a slow one does not hold the others up; verdicts are still reached in
proposal order, with the judge every path shares. With `linger_s`, an evaluation still compiling
that long gives its place to the next (at most `spare` at a time, `kernels.engine.flight`); the
tuner then calls `evaluate(source, on_event=...)` to hear when each has compiled.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict

from kernels.engine import compose, judge
from kernels.engine.flight import Flight, Ticket, linger_setting
from kernels.engine.judge import CONFIRM, FAILED, KEPT, REVERTED, Numbers
from kernels.engine.proposers import KnobProposer, Proposal, Tried, describe
from kernels.knobs import KnobValue
from kernels.problems import ProblemError
from kernels.protocol import FAULT_ATTEMPTS, HarnessFault, again_on_fault

Report = dict[str, Any]
Evaluate = Callable[..., Report]  # evaluate(source); with linger_s, evaluate(source, on_event=...)
Retime = Callable[[list[str]], list[dict[str, Any]]]
Together = Callable[[list[str]], dict[str, Any]]

__all__ = ["FAILED", "KEPT", "REVERTED", "TrialRecord", "TuneResult", "Tuner"]


class TrialRecord(TypedDict):
    index: int
    values: dict[str, KnobValue]
    status: str  # kept | reverted | failed
    failure: str | None  # the report's failure category when failed
    reason: str
    rationale: str  # why the proposer chose it
    geomean_ms: float | None
    noise: float | None
    speedups: dict[str, float | None]  # {"eager": ..., "compiled": ...}
    retimed: dict[str, dict[str, Any]] | None  # {"incumbent": {...}, "challenger": {...}}
    description: str
    seconds: float
    # Attempts the harness failed on its own part before this verdict (HarnessFault, run
    # again): 0 as a rule; FAULT_ATTEMPTS where the config was not judged at all.
    faulted_attempts: int


@dataclass
class TuneResult:
    best_source: str
    best_values: dict[str, KnobValue]
    best_report: Report | None
    trials: list[TrialRecord]
    ranked: bool
    evaluations: int
    failures: int
    confirmations: int
    evals_per_minute: float | None
    strategy: str
    strategy_why: str
    space_size: int
    note: str
    table: dict[str, Any] | None = None
    table_sources: dict[str, str] | None = None  # kernel name in the table -> its source
    minutes: float | None = None
    lingered: int = 0  # evaluations that gave their place in flight up while still compiling

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Incumbent:
    values: dict[str, KnobValue]
    source: str
    report: Report
    numbers: Numbers


class Tuner:
    def __init__(
        self,
        source: str,
        *,
        trials: int,
        evaluate: Evaluate,
        retime: Retime | None = None,
        together: Together | None = None,
        seed: int | None = None,
        on_trial: Callable[[TrialRecord], None] | None = None,
        jobs: int = 1,
        max_minutes: float | None = None,
        linger_s: float | None = None,
        spare: int = 0,
    ) -> None:
        if max_minutes is not None and not max_minutes > 0:
            raise ValueError(f"max_minutes must be above 0, got {max_minutes}")
        if trials < 1:
            raise ValueError(f"trials must be at least 1, got {trials}")
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.source = source
        self.trials = trials
        self.evaluate = evaluate
        self.retime = retime
        self.together = together
        self.on_trial = on_trial
        self.jobs = jobs
        # Evaluations still compiling after linger_s give their place up, `spare` at most.
        self.linger_s, self.spare = linger_setting(linger_s, spare)
        # A time budget: no new proposal once it is spent (those in flight finish).
        self.max_minutes = max_minutes
        # KnobError here, before any evaluation
        self.proposer = KnobProposer(source, budget=trials, seed=seed or 0)
        self.knobs = self.proposer.knobs
        self.space_size = self.proposer.size
        self.strategy = self.proposer.strategy
        self.start_values: dict[str, KnobValue] = dict(self.proposer.start)

    def run(self) -> TuneResult:
        self._records: list[TrialRecord] = []
        self._reports: list[Report | None] = []
        self._sources: list[str] = []
        self._incumbent: _Incumbent | None = None
        self._confirmations = 0
        started = time.perf_counter()
        tried: list[Tried] = []
        # In proposal order, judged from the head; `jobs` bounds those still running, so a slow
        # evaluation at the head does not stop the next ones from starting. Whatever has finished
        # at the head is judged before the next proposal, so with one job every proposal sees
        # every earlier result, however fast the evaluation returns (the sequence for a seed is
        # then the same from run to run, unless a compile past `linger_s` gives its place up).
        # An evaluation's ticket ends just before its future is done: an ended one is waited
        # for (microseconds) rather than taken as still running.
        order: deque[tuple[Proposal, int, Future, Ticket]] = deque()
        flight = Flight(self.jobs, linger_s=self.linger_s, spare=self.spare)
        with ThreadPoolExecutor(self.jobs + self.spare) as pool:
            while True:
                seen = flight.version  # anything that frees a place from here on wakes the wait
                # The one error an evaluation raises (ProblemError: the problem fails on its
                # own, so no config can be judged) ends the search as soon as it is seen.
                broken = next((f for _, _, f, t in order if t.ended and f.exception()), None)
                if broken is not None:
                    for _, _, f, _ in order:
                        f.cancel()
                    raise broken.exception()
                while order and order[0][3].ended:
                    proposal, at, future, _ = order.popleft()
                    record = self._trial(proposal, future.result())
                    tried[at] = Tried(
                        proposal.knob_values, record["geomean_ms"], record["status"] == FAILED
                    )
                more = len(tried) < self.trials and not self._out_of_time(started)
                if more and flight.has_place():
                    proposal = self.proposer.next(tried)
                    if proposal is not None:
                        tried.append(Tried(proposal.knob_values, None, False, pending=True))
                        at = len(tried) - 1
                        ticket = flight.begin()
                        future = pool.submit(self._timed_evaluate, proposal, ticket)
                        order.append((proposal, at, future, ticket))
                        continue
                if not order:
                    break
                # Until an evaluation ends, or one still compiling could give its place up
                # (only while there is a next one to take it).
                flight.wait_change(seen, flight.wake_in() if more else None)
        screening_minutes = (time.perf_counter() - started) / 60
        table, table_sources = self._table()
        result = self._result(screening_minutes, (time.perf_counter() - started) / 60, table,
                              table_sources)  # fmt: skip
        result.lingered = flight.gave_up
        return result

    def _out_of_time(self, started: float) -> bool:
        return (
            self.max_minutes is not None
            and (time.perf_counter() - started) / 60 >= self.max_minutes
        )

    # -- one trial ----------------------------------------------------------------------------

    def _timed_evaluate(self, proposal: Proposal, ticket: Ticket) -> tuple:
        started = time.perf_counter()
        try:
            report, failure, reason, faults = self._evaluate(proposal.source, ticket)
        finally:
            ticket.end()  # before the future is done: the loop then sees its place free
        return report, failure, reason, faults, time.perf_counter() - started

    def _evaluate(self, source: str, ticket: Ticket) -> tuple[Report | None, str | None, str, int]:
        """Run evaluate; raises only ProblemError (a problem that fails on its own stops the
        search). Returns (report, failure category or None, reason, how many attempts the
        harness failed on its own part before the verdict)."""
        faults: list[str] = []
        try:
            if self.linger_s is not None:
                report = again_on_fault(
                    lambda: self.evaluate(source, on_event=ticket.on_event), faults
                )
            else:
                report = again_on_fault(lambda: self.evaluate(source), faults)
        except ProblemError:
            raise
        except HarnessFault as exc:  # the harness failed each time: no verdict on the config
            why = f"not judged: the harness failed {FAULT_ATTEMPTS} times: {_first_line(exc)}"
            return None, "crashed", why, len(faults)
        except Exception as exc:  # a failed config is data, not a reason to stop the search
            why = f"evaluate raised {type(exc).__name__}: {_first_line(exc)}"
            return None, "crashed", why, len(faults)
        if not isinstance(report, dict) or "verdict" not in report:
            why = f"evaluate returned no report ({type(report).__name__})"
            return None, "malformed", why, len(faults)
        if faults:
            report["harness_faults"] = faults
        if report["verdict"] != "accepted":
            reasons = "; ".join(str(r) for r in report.get("reasons") or [])
            return report, report.get("failure") or "rejected", reasons or "rejected", len(faults)
        return report, None, "", len(faults)

    def _trial(self, proposal: Proposal, evaluated: tuple) -> TrialRecord:
        index = len(self._records)
        report, failure, reason, faulted, eval_seconds = evaluated
        started = time.perf_counter()
        numbers = Numbers.of(report)
        retimed = None
        if failure is not None or report is None:
            status = FAILED
        else:
            status, reason, retimed = self._judge(proposal, report, numbers)
        summary = (report or {}).get("summary") or {}
        record: TrialRecord = {
            "index": index,
            "values": dict(proposal.knob_values),
            "status": status,
            "failure": failure,
            "reason": reason,
            "rationale": proposal.rationale,
            "geomean_ms": numbers.geomean_ms,
            "noise": numbers.noise,
            "speedups": {
                "eager": judge.number(summary.get("geomean_speedup_eager")),
                "compiled": judge.number(summary.get("geomean_speedup_compiled")),
            },
            "retimed": retimed,
            "description": "",
            "seconds": round(eval_seconds + time.perf_counter() - started, 6),
            "faulted_attempts": faulted,
        }
        record["description"] = _describe(record)
        self._records.append(record)
        self._reports.append(report if status != FAILED else None)
        self._sources.append(proposal.source)
        if self.on_trial is not None:
            self.on_trial(record.copy())
        return record

    def _judge(
        self, proposal: Proposal, report: Report, numbers: Numbers
    ) -> tuple[str, str, dict[str, dict[str, Any]] | None]:
        """Keep or revert an accepted config: (status, reason, retimed numbers or None)."""
        incumbent = self._incumbent
        verdict = judge.screen(numbers, incumbent.numbers if incumbent else None)
        retimed = None
        if verdict.status == CONFIRM:
            if self.retime is None:
                verdict = judge.unconfirmed(verdict, "no re-time available to confirm it")
            else:
                self._confirmations += 1
                try:
                    pair = again_on_fault(lambda: self.retime([incumbent.source, proposal.source]))
                except Exception as exc:  # an unconfirmed win is not a win
                    pair = None
                    verdict = judge.unconfirmed(verdict, f"re-time failed: {_first_line(exc)}")
                if pair is not None:
                    if isinstance(pair, list) and len(pair) == 2:
                        retimed = {"incumbent": dict(pair[0]), "challenger": dict(pair[1])}
                    verdict = judge.confirm(verdict, pair)
        if verdict.status == KEPT:
            self._incumbent = _Incumbent(
                dict(proposal.knob_values), proposal.source, report, numbers
            )
        return verdict.status, verdict.reason, retimed

    # -- the per-shape table ------------------------------------------------------------------

    def _table(self) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        if self.together is None:
            return None, None
        reports = [r or {} for r in self._reports]
        chosen = compose.pick_candidates(reports)
        if not chosen:
            return None, None
        names = [f"trial {i}" for i in chosen]
        sources = [self._sources[i] for i in chosen]
        try:
            timed = again_on_fault(lambda: self.together(sources))
        except Exception as exc:
            return {"error": f"timing the table's candidates failed: {_first_line(exc)}"}, None
        if timed.get("verdict") != "accepted" and not any(
            t["passed"] for per in timed.get("kernels", []) for t in per
        ):
            return {"error": "; ".join(timed.get("reasons") or ["rejected"])[:500]}, None
        table = compose.build(
            timed["labels"], timed["shapes"], names, timed["kernels"], timed["baselines"]
        )
        for name, i in zip(names, chosen, strict=True):
            table.setdefault("configs", {})[name] = describe(self._records[i]["values"])
        return table, dict(zip(names, sources, strict=True))

    # -- result -------------------------------------------------------------------------------

    def _result(
        self,
        screening_minutes: float,
        minutes: float,
        table: dict[str, Any] | None,
        table_sources: dict[str, str] | None,
    ) -> TuneResult:
        records = self._records
        accepted = [r for r in records if r["status"] != FAILED]
        failures = len(records) - len(accepted)
        ranked = bool(accepted) and all(
            r["geomean_ms"] is not None and r["noise"] is not None for r in accepted
        )
        incumbent = self._incumbent
        if incumbent is None:
            best_source, best_values = self.source, self.start_values
            best_report = self._reports[0] if self._reports else None
            note = f"no config passed ({failures} of {len(records)} failed); best is the start"
        else:
            best_source, best_values = incumbent.source, incumbent.values
            best_report = incumbent.report
            if ranked:
                note = (
                    f"ranked {len(accepted)} correct configs by timing, noise-aware; "
                    f"{self._confirmations} win(s) re-timed against the incumbent"
                )
            else:
                note = (
                    "no timings (e.g. the CPU interpreter): configs were checked for "
                    "correctness only and not ranked; best is the first correct config"
                )
        if self.max_minutes is not None and len(records) < min(self.trials, self.space_size):
            note += f"; stopped proposing at the time budget of {self.max_minutes:g} min"
        if self.trials > self.space_size:
            note += (
                f"; the budget of {self.trials} trials is above the {self.space_size} "
                "configurations, so each was tried once"
            )
        # Throughput: screening evaluations over the wall clock of the screening loop (with
        # several in flight, the sum of evaluation times would understate it).
        return TuneResult(
            best_source=best_source,
            best_values=dict(best_values),
            best_report=best_report,
            trials=records,
            ranked=ranked,
            evaluations=len(records),
            failures=failures,
            confirmations=self._confirmations,
            evals_per_minute=len(records) / screening_minutes if screening_minutes > 0 else None,
            strategy=self.strategy,
            strategy_why=self.proposer.why,
            space_size=self.space_size,
            note=note,
            table=table,
            table_sources=table_sources,
            minutes=round(minutes, 3),
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _describe(record: TrialRecord) -> str:
    config = describe(record["values"])
    if record["status"] == FAILED:
        return f"{config}: failed ({record['failure']})"
    if record["geomean_ms"] is None:
        return f"{config}: correct, untimed {record['status']}"
    speedups = [
        f"{speedup:.2f}x {baseline}"
        for baseline, speedup in record["speedups"].items()
        if judge.number(speedup) is not None and math.isfinite(speedup)
    ]
    detail = f" ({', '.join(speedups)})" if speedups else ""
    again = record.get("faulted_attempts") or 0
    tried = f", judged on attempt {again + 1}" if again else ""
    return f"{config}: {judge.ms(record['geomean_ms'])}{detail} {record['status']}{tried}"
