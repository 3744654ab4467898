"""What crosses the boundary between the web side and the GPU workers, defined once.

Both sides import this module: the web process (Django: the orchestrator, the pages, the library
app) and the GPU worker (`kernels.worker`, Django-free). It imports neither torch nor Django nor
rq, so importing it costs nothing on either side. It holds

- the names of the queues, Redis keys and job functions;
- the harness's failure categories (`FAILURES`), which the trial model, the charts and the
  report checks all use, and `HarnessFault`, raised where the harness itself failed and no
  verdict was reached;
- the shapes of what crosses: the evaluation request (`EvaluationRequest`), a progress event
  (`ProgressEvent`) and the report (`Report`), as docs/harness.md describes them;
- `rejected_report()`, the one way to write a report for a candidate no harness judged;
- `source_sha256()`, how a candidate's source is named wherever it is stored or carried (a
  trial, a release, a report written for another host to import).

How the processes and queues fit together: docs/architecture.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

# -- failure categories --------------------------------------------------------------------------

FAILURES = (
    "compile_error",
    "prohibited",
    "incorrect",
    "crashed",
    "timeout",
    "unstable",
    "hack_suspected",
    "malformed",
)
VERDICTS = ("accepted", "rejected")


class HarnessFault(RuntimeError):
    """The harness could not judge the candidate: its process ran out of memory computing or
    comparing a reference, after waiting and trying again, or the candidate's process ran out
    of GPU memory because other processes had filled the GPU (other evaluations and every
    candidate's process share it). No verdict: the candidate is not to blame, and the caller
    runs the evaluation again (`again_on_fault`; a worker's job fails, and is run again as a
    lost one is)."""


# How many times an evaluation, a re-time or a table's timing is run in all while the harness
# fails on its own part (HarnessFault), before the fault is raised: then recorded as the
# harness's, never taken for the candidate's verdict.
FAULT_ATTEMPTS = 3
T = TypeVar("T")


def again_on_fault(work: Callable[[], T], faults: list[str] | None = None) -> T:
    """`work()`, run again while it raises HarnessFault, FAULT_ATTEMPTS times in all; the last
    fault is raised. Each fault's message is appended to `faults` where given: a verdict that
    came on a later attempt says so (the report's `harness_faults`), and what the attempts
    before it cost is not hidden in its latency."""
    for attempt in range(1, FAULT_ATTEMPTS + 1):
        try:
            return work()
        except HarnessFault as e:
            if faults is not None:
                faults.append(str(e)[:500])
            if attempt == FAULT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


# -- queues, keys, job names ---------------------------------------------------------------------

SEARCH_QUEUE = "search"  # the orchestrators' queue: one `run_search` job per active search slice
HEARTBEAT_S = 5  # a worker refreshes its key this often
WORKER_TTL_S = 30  # ... and is taken for dead once it has not for this long
WORKERS_KEY = "autoweb:workers"  # the set of worker names ever registered (stale ones pruned)
KINDS_SEEN_KEY = "autoweb:kinds-last-seen"  # GPU kind -> the last heartbeat of any of its workers
EVENTS_MAXLEN = 10_000  # progress events kept per search stream (approximate)

# Job functions, by the dotted name RQ stores in a job. A job runs only if it names one of these
# (`kernels.queues.SafeJob`): a job written into Redis by anyone else is refused.
EVALUATE_JOB = "kernels.worker.evaluate_job"
CONFIRM_JOB = "kernels.worker.confirm_job"
TABLE_JOB = "kernels.worker.table_job"
REVALIDATE_JOB = "kernels.worker.revalidate_job"
RUN_SEARCH_JOB = "searches.tasks.run_search"
WATCH_REVIEW_JOB = "library.tasks.watch_review"
JOB_FUNCTIONS = frozenset(
    {EVALUATE_JOB, CONFIRM_JOB, TABLE_JOB, REVALIDATE_JOB, RUN_SEARCH_JOB, WATCH_REVIEW_JOB}
)


def queue_name(kind: str) -> str:
    """The queue the workers of one GPU kind serve (`gpu.h200`, `gpu.interpret`)."""
    return f"gpu.{kind}"


def worker_key(name: str) -> str:
    """A worker's heartbeat record (JSON), expiring WORKER_TTL_S after its last beat."""
    return f"autoweb:worker:{name}"


def events_key(search_id: int | str) -> str:
    """The Redis stream of a search's progress events (`ProgressEvent`)."""
    return f"autoweb:events:{search_id}"


def baselines_key(digest: str) -> str:
    """One key's baseline timings (`kernels.harness.baselines`), shared by a GPU kind's workers."""
    return f"autoweb:baselines:{digest}"


# -- what crosses --------------------------------------------------------------------------------

Tier = Literal["smoke", "full", "revalidate"]


@dataclass(frozen=True)
class EvaluationRequest:
    """One run of the harness: what `kernels.harness.run` takes.

    `problem` is a problem's name (looked up in `problem_dirs` too); `sources` are the
    candidates' files' text: one to evaluate, several to time together
    (`verify=False`), none to time the baselines alone. `shapes` overrides the problem's sweep
    for `tier`. `extra` is merged into the spec the sandboxed child receives (timing mode,
    end-to-end check). The rest is documented in docs/harness.md.
    """

    problem: str
    sources: tuple[str, ...]
    problem_dirs: tuple[str, ...] = ()  # where a problem outside the built-ins lives
    device: str = "auto"
    tier: str = "smoke"
    shapes: tuple[dict[str, int], ...] | None = None
    timeout_s: float | None = None
    budget_s: float = 0.5
    baselines_compiled: bool = True
    verify: bool = True
    skip_static_checks: bool = False
    compile_timeout_s: float | None = None
    memory_bytes: int | None = None
    file_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ProgressEvent(TypedDict):
    """One entry of a search's progress stream (`events_key`), written by the worker."""

    type: Literal["trial_phase"]
    trial: int | None
    phase: str  # compiling, verifying, benchmarking, ...
    worker: str | None
    shape: NotRequired[int]  # the shape being worked on, 0-based ...
    of: NotRequired[int]  # ... of this many


class Check(TypedDict):
    passed: bool | None  # None: not run here (skipped, not applicable)
    detail: str


class Report(TypedDict):
    """The harness's verdict on one candidate (docs/harness.md, Report). Every report has the
    first six keys; a judged one has the rest."""

    verdict: Literal["accepted", "rejected"]
    failure: str | None  # one of FAILURES when rejected
    reasons: list[str]  # "category: why", the most specific first
    device: dict[str, Any]
    checks: dict[str, Check]
    summary: dict[str, Any]
    problem: NotRequired[str]
    tier: NotRequired[str]
    dtype: NotRequired[str]
    shapes: NotRequired[list[dict[str, Any]]]
    notes: NotRequired[list[str]]
    timeline: NotRequired[dict[str, float]]
    end_to_end: NotRequired[dict[str, Any]]
    worker: NotRequired[str | None]
    revalidation: NotRequired[dict[str, Any]]
    sandbox: NotRequired[dict[str, Any]]
    sandbox_dir: NotRequired[str]
    gpu_wait: NotRequired[dict[str, float]]
    baselines: NotRequired[dict[str, Any]]
    profile: NotRequired[dict[str, Any]]
    source: NotRequired[str]
    source_sha256: NotRequired[str]


def rejected_report(
    failure: str,
    reasons: list[str] | tuple[str, ...],
    *,
    problem: str | None = None,
    device: dict[str, Any] | None = None,
    **extra: Any,
) -> Report:
    """The report of a candidate rejected without a harness run: a problem name the worker does
    not know, a shape range that excludes every shape, static checks failed on the web side, a
    job lost too many times. `reasons` are kept as given (the failure itself when empty)."""
    if failure not in FAILURES:
        raise ValueError(f"unknown failure category {failure!r}; one of {', '.join(FAILURES)}")
    report: dict[str, Any] = {
        "verdict": "rejected",
        "failure": failure,
        "reasons": [str(r) for r in reasons] or [failure],
        "device": device or {},
        "checks": {},
        "summary": {},
        "shapes": [],
    }
    if problem is not None:
        report["problem"] = problem
    report.update(extra)
    return report  # type: ignore[return-value]


def source_sha256(source: str) -> str:
    """The hex sha256 of a candidate's source (UTF-8)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()
