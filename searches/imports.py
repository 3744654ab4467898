"""Import harness reports measured on another host, so that their kernels can be reviewed here.

A file is one `python -m kernels evaluate --json` report (which carries the source it judged
and that source's sha256), or a benchmark bundle such as `benchmarks/gpu_proof.py` writes
(docs/benchmarks/h200/proof-*.json: per problem, reports named `seed`, `honest_tuned` and
`best`, with the sources of the last two beside them).

Each report becomes the one trial of its own finished search, on an idea per (problem, GPU
kind) titled "Imported reports: <problem> on <kind>". Reports measured apart are not compared
with each other, so no import replaces another as its search's incumbent: every accepted,
timed import that beats both baselines beyond its noise waits in the review queue. The trial's
`imported` row (ReportImport) records where it was measured and who imported it.

A file imports whole or not at all: a report that is not one, a source whose sha256 differs
from the one the report names, an unknown problem or a report with no GPU kind stops that
file with a message naming the report. Importing the same report again changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.errors import DomainError
from kernels import problems as registry
from kernels.engine import judge
from kernels.harness.static import MAX_SOURCE_BYTES
from kernels.protocol import source_sha256
from searches import services
from searches.models import Idea, ReportImport, Search, Trial

log = logging.getLogger(__name__)

IMPORTED = "imported"  # the proposer of imported ideas and trials
MAX_FILE_BYTES = 32 * 2**20
# What a harness report holds; a file without them is not one (cleaned further by
# searches.services.clean_report, as a worker's report is).
REQUIRED = ("verdict", "problem", "device", "checks", "shapes", "summary")
# A bundle's reports whose source sits beside them: report key -> where the source is.
BUNDLE_SOURCES = {"honest_tuned": ("honest_tuned_source",), "best": ("tune", "best_source")}


class ReportImportError(DomainError):
    """The file cannot be imported; nothing of it was."""


@dataclass
class Entry:
    name: str  # where in the file: "" for a single report, "problems.softmax.best" in a bundle
    report: dict[str, Any]
    source: Any  # the source the report judged, when the file carries it


@dataclass
class Prepared:
    entry: str
    problem: str
    kind: str
    report: dict[str, Any]
    source: str
    source_sha256: str
    report_sha256: str


@dataclass
class Outcome:
    file: str
    imported: list[Trial] = field(default_factory=list)
    already: list[Trial] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "entry: why"


def idea_title(problem: str, kind: str) -> str:
    return f"Imported reports: {problem} on {kind}"


def read_entries(path: Path) -> list[Entry]:
    """The reports in a file, each with its source when the file carries it."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ReportImportError(
                f"{path} is {size / 2**20:.1f} MiB; a report file is at most "
                f"{MAX_FILE_BYTES // 2**20} MiB"
            )
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise ReportImportError(f"cannot read {path}: {e.strerror or e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportImportError(f"{path} is not JSON: {e}") from e
    except RecursionError as e:
        raise ReportImportError(f"{path}: the JSON nests too deeply") from e
    if not isinstance(data, dict):
        raise ReportImportError(
            f"{path} holds a JSON {type(data).__name__}, not a harness report (an object)"
        )
    if "verdict" in data:
        return [Entry("", data, data.get("source"))]
    bundle = data.get("problems")
    if not isinstance(bundle, dict):
        raise ReportImportError(
            f"{path} is neither a harness report (it has no verdict) nor a bundle of them "
            "(no problems): write one with `python -m kernels evaluate ... --json OUT`"
        )
    entries = []
    for pname, block in bundle.items():
        if not isinstance(block, dict):
            continue
        for key, value in block.items():
            if isinstance(value, dict) and "verdict" in value:
                where = BUNDLE_SOURCES.get(key, ())
                source: Any = block
                for step in where:
                    source = source.get(step) if isinstance(source, dict) else None
                entries.append(Entry(f"problems.{pname}.{key}", value, source if where else None))
    if not entries:
        raise ReportImportError(f"{path}: the bundle holds no harness reports")
    return entries


def _prepare(entry: Entry, where: str, candidate: str | None) -> Prepared:
    """The report checked, with its source and hashes; ReportImportError when it is bad."""
    missing = [key for key in REQUIRED if key not in entry.report]
    if missing:
        raise ReportImportError(f"{where}: not a harness report: it lacks {', '.join(missing)}")
    try:
        report = services.clean_report(entry.report)
    except DomainError as e:
        raise ReportImportError(f"{where}: {' '.join(e.messages)}") from e
    problem = report.get("problem")
    known = registry.names()
    if not isinstance(problem, str) or problem not in known:
        raise ReportImportError(
            f"{where}: unknown problem {problem!r} (known here: {', '.join(known)})"
        )
    device = report["device"] if isinstance(report["device"], dict) else {}
    kind = device.get("kind")
    if not kind:
        raise ReportImportError(f"{where}: the report names no GPU kind (device.kind)")
    shaped = {"shapes": list, "checks": dict, "summary": dict}
    for key, kind_of in shaped.items():
        if not isinstance(report[key], kind_of):
            what = "a list" if kind_of is list else "an object"
            raise ReportImportError(f"{where}: the report's {key} is not {what}")

    source = entry.source if entry.source is not None else candidate
    if not isinstance(source, str):
        raise ReportImportError(
            f"{where}: the report carries no source: give the candidate it judged "
            "(--candidate FILE), or write the report with `python -m kernels evaluate --json`, "
            "which includes it"
        )
    if not source.strip() or "\x00" in source:
        raise ReportImportError(f"{where}: the source is empty or holds a NUL byte")
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        raise ReportImportError(f"{where}: the source is over {MAX_SOURCE_BYTES // 1024} KiB")
    digest = source_sha256(source)
    claimed = report.get("source_sha256")
    if claimed is not None and claimed != digest:
        raise ReportImportError(
            f"{where}: source hash mismatch: the report judged a source with sha256 "
            f"{str(claimed)[:64]}, but the source given has sha256 {digest}"
        )
    report.pop("source", None)  # kept once, as the trial's source
    report["source_sha256"] = digest
    canonical = json.dumps({"report": report, "source": source}, sort_keys=True)
    return Prepared(
        entry=entry.name,
        problem=problem,
        kind=str(kind),
        report=report,
        source=source,
        source_sha256=digest,
        report_sha256=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
    )


def import_file(
    path: str | Path,
    *,
    user: Any,
    problems: list[str] | None = None,
    kinds: list[str] | None = None,
    candidate: str | None = None,
) -> Outcome:
    """Import the reports of one file (those of `problems` and `kinds`, when given), all or
    none. `candidate`: the source a single report judged, for a report that does not carry it."""
    path = Path(path)
    entries = read_entries(path)
    if candidate is not None and (len(entries) != 1 or entries[0].name):
        raise ReportImportError(
            f"{path}: --candidate goes with a file of one report; this one is a bundle"
        )
    if problems:
        entries = [e for e in entries if e.report.get("problem") in problems]
    if kinds:
        entries = [e for e in entries if (e.report.get("device") or {}).get("kind") in kinds]
    if not entries:
        asked = ", ".join([*(problems or []), *(kinds or [])])
        raise ReportImportError(f"{path} holds no report of {asked}")
    outcome = Outcome(file=str(path))
    ready: list[Prepared] = []
    for entry in entries:
        where = f"{path}" + (f" [{entry.name}]" if entry.name else "")
        if entry.name and entry.source is None:
            # A bundle's report of a source it does not carry (its seed, at the time): nothing
            # here could show or re-validate what it judged.
            outcome.skipped.append(f"{entry.name}: the bundle does not carry its source")
            continue
        ready.append(_prepare(entry, where, candidate))
    with transaction.atomic():
        for item in ready:
            done = (
                ReportImport.objects.filter(report_sha256=item.report_sha256)
                .select_related("trial")
                .first()
            )
            if done is not None:
                outcome.already.append(done.trial)
            else:
                outcome.imported.append(_record(item, user=user, file=path))
    return outcome


def _record(item: Prepared, *, user: Any, file: Path) -> Trial:
    now = timezone.now()
    report, kind = item.report, item.kind
    title = idea_title(item.problem, kind)
    idea = Idea.objects.filter(title=title, problem=item.problem, proposer=IMPORTED).first()
    if idea is None:
        idea = Idea.objects.create(
            title=title,
            description=(
                f"Harness reports of {item.problem} measured on {kind} hosts elsewhere and "
                "imported with `manage.py import_reports`. Each is the one trial of its own "
                "search; approving one re-validates it on a worker of this GPU kind here."
            ),
            problem=item.problem,
            target_kinds=[kind],
            proposer=IMPORTED,
            max_trials=1,
            max_gpu_minutes=1,
            max_wall_minutes=1,
            author=user,
        )
    device = report["device"]
    host = str(device.get("host") or "")[:200]
    summary = report["summary"]
    accepted = report["verdict"] == "accepted"
    search = Search.objects.create(
        idea=idea,
        status=Search.Status.FINISHED,
        stop_reason="imported report",
        request_key=f"import:{item.report_sha256}",
        created_by=user,
        started_at=now,
        finished_at=now,
        trials_total=1,
        trials_kept=int(accepted),
        trials_failed=int(not accepted),
    )
    versions = device.get("versions")
    here = f"{host or 'an unnamed host'} ({kind})"
    trial = Trial.objects.create(
        search=search,
        index=1,
        source=item.source,
        source_sha256=item.source_sha256,
        proposer=IMPORTED,
        rationale=f"Imported from {here}: {file.name}" + (f", {item.entry}" if item.entry else ""),
        status=Trial.Status.KEPT if accepted else Trial.Status.FAILED,
        failure=None if accepted else report["failure"],
        reasons=(
            [f"accepted by the harness on {here}; imported, not re-timed here"]
            if accepted
            else list(report["reasons"]) or [report["failure"]]
        ),
        report=report,
        device_kind=kind,
        device_name=str(device.get("name") or "")[:200],
        versions=versions if isinstance(versions, dict) else {},
        geomean_ms=judge.number(summary.get("geomean_ms")),
        noise=judge.number(summary.get("noise")),
        speedup_eager=judge.number(summary.get("geomean_speedup_eager")),
        speedup_compiled=judge.number(summary.get("geomean_speedup_compiled")),
        created_at=now,
        started_at=now,
        finished_at=now,
    )
    if accepted:
        search.incumbent = trial
        search.save(update_fields=["incumbent"])
    ReportImport.objects.create(
        trial=trial,
        report_sha256=item.report_sha256,
        source_sha256=item.source_sha256,
        host=host,
        kind=kind,
        device_name=trial.device_name,
        versions=trial.versions,
        file=str(file)[-500:],
        entry=item.entry,
        imported_at=now,
        imported_by=user,
    )
    log.info(
        "imported %s%s (%s on %s) as trial %s of search %s, by %s",
        file.name,
        f" [{item.entry}]" if item.entry else "",
        item.problem,
        here,
        trial.index,
        search.pk,
        user.get_username(),
    )
    return trial
