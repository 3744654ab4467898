"""One rule everywhere: the same reports and re-times, fed to the CLI tuner and to the web
search's services, give the same keep/revert for every trial."""

from __future__ import annotations

import pytest

from kernels.engine.tuner import Tuner
from kernels.knobs import parse_knobs, rewrite
from searches import services
from searches.models import Trial
from tests.web.domain import accepted, rejected

pytestmark = pytest.mark.django_db

SOURCE = "BLOCK = 1  # tune: 1, 2, 3, 4, 5, 6\n\ndef kernel(x):\n    return x\n"
# Screening numbers per config, and each config's "true" time that an interleaved re-time
# finds: some screening wins hold, one (BLOCK=4) does not, one config fails.
SCREENED = {
    1: accepted(ms=1.00, noise=0.01),
    2: accepted(ms=0.80, noise=0.01),
    3: rejected("incorrect", "wrong on M=4096"),
    4: accepted(ms=0.55, noise=0.01),  # looks best on screening; re-timed it ties BLOCK=6
    5: accepted(ms=0.795, noise=0.01),
    6: accepted(ms=0.60, noise=0.02),
}
TRUE_MS = {1: 1.0, 2: 0.81, 4: 0.63, 5: 0.80, 6: 0.62}


def block(source: str) -> int:
    return int(parse_knobs(source)[0].value)


def test_the_cli_tuner_and_the_web_services_reach_the_same_verdicts(search) -> None:
    def evaluate(source: str) -> dict:
        return SCREENED[block(source)]

    def retime(sources: list[str]) -> list[dict]:
        return [{"geomean_ms": TRUE_MS[block(s)], "noise": 0.01} for s in sources]

    cli = Tuner(SOURCE, trials=6, evaluate=evaluate, retime=retime).run()

    web = []
    for record in cli.trials:  # the same order of arrival
        value = record["values"]["BLOCK"]
        trial = services.record_proposal(
            search=search,
            source=rewrite(SOURCE, record["values"]),
            parent=None,
            proposer="tuner",
            knob_values=record["values"],
        )
        trial = services.record_result(trial=trial, report=SCREENED[value], gpu_seconds=1.0)
        if trial.status == Trial.Status.CONFIRMING:
            against = Trial.objects.get(pk=trial.confirmation["against"]).knob_values["BLOCK"]
            pair = [{"geomean_ms": TRUE_MS[b], "noise": 0.01} for b in (against, value)]
            trial = services.record_confirmation(trial=trial, report=pair)
        web.append((value, trial.status, trial.reason))

    assert [(r["values"]["BLOCK"], r["status"], r["reason"]) for r in cli.trials] == web
    reasons = " ".join(r for _, _, r in web)
    assert ": confirmed" in reasons and "not confirmed" in reasons  # both kinds of outcome
    assert {v: s for v, s, _ in web}[4] == "reverted"
    assert cli.best_values == {"BLOCK": 6}
    assert search.__class__.objects.get(pk=search.pk).incumbent.knob_values == {"BLOCK": 6}
