"""A user's own problem through the whole stack, on the CPU interpreter: registered from a
temporary directory (the worked example of docs/problems.md, residual add + RMSNorm), an idea,
a tuner search run by the real orchestrator and GPU worker processes, review, approval,
re-validation on the worker, release, export as a wheel, and `load()` dispatching the released
kernel in a fresh virtual environment without autoweb.

One step is not measured here: interpreter trials are untimed, and a trial enters the review
queue only with a speedup beyond its noise, so no interpreter trial ever does (the test checks
that it does not). As the other library tests do (tests/library/helpers.py), the search's
incumbent source is recorded once more, as a trial of a second search on the same idea (the
first has finished and takes no trials), with a report shaped like a GPU worker's (timings
included) standing in for a GPU run this machine cannot make. Everything after that (approval,
re-validation, release, export, dispatch) runs for real on the interpreter.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from kernels import problems
from library import export
from library import selectors as library_selectors
from library import services as library_services
from library.models import Release, Revalidation
from searches import services
from searches.models import Search
from tests.kernels.test_problems_guide import write_example
from tests.library.helpers import candidate, venv_with
from tests.web.domain import queue_search
from tests.web.test_search_e2e import _wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCRIPT = """
import importlib.util, json, torch
assert importlib.util.find_spec("kernels") is None, "autoweb is importable"
assert importlib.util.find_spec("django") is None, "django is importable"
import teamkernels
add_rmsnorm = teamkernels.load("add_rmsnorm")
gen = torch.Generator().manual_seed(0)
def inputs(m, n):
    x, r = torch.randn(m, n, generator=gen), 4 * torch.randn(m, n, generator=gen)
    return x, r, 1 + 0.1 * torch.randn(n, generator=gen)
def expected(x, r, w):
    h = (x + r).double()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).float()
out = {}
for m, n in ((5, 3000), (64, 9000), (100, 3000)):
    args = inputs(m, n)
    chosen = add_rmsnorm.choose(*args)
    torch.testing.assert_close(add_rmsnorm(*args), expected(*args), atol=1e-5, rtol=1e-5)
    out[f"{m}x{n}"] = None if chosen is None else chosen["id"]
print(json.dumps(out))
"""


def test_a_users_problem_goes_from_idea_to_a_dispatched_release(
    env,
    settings,
    tmp_path,
    monkeypatch,
):
    problem_dir = write_example(tmp_path / "user")
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(problem_dir))
    env["procs"].env["AUTOWEB_PROBLEM_DIRS"] = str(problem_dir)
    settings.REDIS_URL = env["url"]
    assert not problems.load("add_rmsnorm").builtin

    users = get_user_model().objects
    engineer = users.create_user("eng", password="pw")
    services.grant_role(user=engineer, role="engineers")
    reviewer = users.create_user("rev", password="pw")
    services.grant_role(user=reviewer, role="reviewers")

    # Idea and search: the tuner on the problem's own seed, on a real interpreter worker.
    search = queue_search(
        engineer,
        title="fuse the residual add into the norm",
        description="one pass over memory",
        problem="add_rmsnorm",
        target_kinds=["interpret"],
        prohibitions="",
        max_trials=3,
        max_wall_minutes=30,
    )
    env["start"]("-m", "kernels.worker", "--device", "interpret", "--name", "user:interpret")
    env["start"]("manage.py", "orchestrator")
    search = _wait(search, lambda s: s.status == Search.Status.FINISHED)
    incumbent = search.incumbent
    assert incumbent is not None and incumbent.report["verdict"] == "accepted"
    assert incumbent.report["problem"] == "add_rmsnorm"
    assert incumbent.report["device"]["kind"] == "interpret"
    seed = (problem_dir / "seeds" / "add_rmsnorm.py").read_text()
    # The search started from the problem's own seed: its first trial. (The incumbent is the
    # first trial judged correct, which need not be that one: in a run beside other process
    # tests on a loaded 2-core machine it was the next configuration.)
    assert search.trials.order_by("index").first().source == seed
    assert "untimed" in library_selectors.why_not_candidate(incumbent)

    # Review: the incumbent's source with a GPU-shaped report (see the module docstring).
    with transaction.atomic():
        timed = services.begin_search(search=services.start_search(idea=search.idea, user=engineer))
    shapes = [
        {"shape": s, "label": problems.shape_label(s)}
        for s in problems.load("add_rmsnorm").shapes("full")[:3]
    ]
    trial = candidate(timed, incumbent.source, shapes=shapes, prompt=None, rationale="the seed")
    assert library_selectors.why_not_candidate(trial) is None
    assert trial in library_selectors.review_queue().trials
    with transaction.atomic():
        review = library_services.decide(
            trial=trial,
            user=reviewer,
            action="approve",
            shape_range={"M": [1, 64], "N": [1, 9000]},
            text="one pass; ship it",
        )

    # Re-validation on the interpreter worker (watched by the orchestrator), then the release.
    deadline = time.monotonic() + 300
    while Revalidation.objects.filter(status=Revalidation.Status.QUEUED).exists():
        assert time.monotonic() < deadline, env["procs"].log_tails()
        time.sleep(0.5)
    reval = review.revalidations.get()
    assert reval.status == Revalidation.Status.PASSED, reval.reasons
    checks = reval.report["checks"]
    assert checks["correctness"]["passed"] is True
    assert checks["end_to_end"]["passed"] is None
    assert "declares no BLOCK_OP" in checks["end_to_end"]["detail"]
    assert "M=8,N=4096" in reval.report["revalidation"]["shapes"]  # beyond the smoke sweep
    release = Release.objects.get()
    assert (release.problem, release.kind, release.dtype) == ("add_rmsnorm", "interpret", "float32")
    assert release.source == seed

    # Export: the manifest carries the problem's own dims; the wheel runs without autoweb.
    files = export.files(export.select(["add_rmsnorm"]))
    entry = json.loads(files["manifest.json"])["problems"]["add_rmsnorm"]
    assert entry["dims"] == {"M": [0, 0], "N": [0, 1]} and entry["ranks"] == [2, 2, 1]
    name, data = export.wheel_bytes(export.select(["add_rmsnorm"]), package="teamkernels")
    wheel = tmp_path / name
    wheel.write_bytes(data)
    py = venv_with(wheel, tmp_path)
    run_env = {"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(py), "-c", SCRIPT],
        env=run_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    chosen = json.loads(out.stdout.strip().splitlines()[-1])
    # In the approved range the release runs; M = 100 is outside it: the reference.
    assert chosen == {"5x3000": release.pk, "64x9000": release.pk, "100x3000": None}
