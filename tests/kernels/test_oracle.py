"""The caller's compiled float64 oracle (kernels.harness.oracle): it serves a shape only once it
has agreed with the eager oracle there, it never compiles inside a check or under the GPU lock,
a new compile withdraws every admission, and a disagreement or a failure leaves the eager oracle
serving. On the CPU, through inductor's C++ backend (the GPU runs the same code through Triton)."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernels import problems
from kernels.harness import evaluate, oracle, verdict
from kernels.harness.evaluation import _seeds

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()
WRONG = SEED.replace("y.to(y_ptr", "(y * 1.5).to(y_ptr", 1)  # every output half again too large
USER = [str(ROOT / "benchmarks" / "user_problems")]


@pytest.fixture
def on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle, "SETTING", True)
    monkeypatch.setattr(oracle, "_registry", {})


def _run(problem: problems.Problem, shapes: list[dict]) -> verdict.Run:
    return verdict.Run(problem, "cpu", shapes, _seeds(len(shapes)), torch.float32, None)


def _softmax_like(tmp_path: Path, name: str, oracle_body: str) -> problems.Problem:
    """Softmax on its first two smoke shapes, with its own `oracle`."""
    (tmp_path / f"{name}.py").write_text(
        "import torch\n\n"
        "from kernels.problems.softmax import *  # noqa: F403\n"
        "from kernels.problems.softmax import SHAPES_SMOKE\n\n"
        'SEED = "' + str(ROOT / "kernels" / "seeds" / "softmax.py") + '"\n'
        "SHAPES_SMOKE = SHAPES_SMOKE[:2]\n\n\n"
        "def oracle(x):\n" + textwrap.indent(textwrap.dedent(oracle_body), "    ")
    )
    return problems.load(name, [str(tmp_path)])


@contextlib.contextmanager
def _recorded_holds(run: verdict.Run, log: list[str]) -> Iterator[None]:
    state = {"held": False}

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        assert not state["held"], "a hold taken inside a hold"
        state["held"] = True
        log.append("hold")
        try:
            yield
        finally:
            state["held"] = False

    run.gpu_hold = hold
    yield state


def test_a_shape_is_served_compiled_once_it_agreed_with_the_eager_oracle(on: None):
    problem = problems.load("softmax")
    run = _run(problem, problem.shapes("smoke")[:1])
    label = run.results[0]["label"]

    refs = run.references(0, ["first", "second"])

    assert run.fast is not None and run.fast.serves(label)
    # The first reference was the eager one, computed to check the compiled one against; the
    # second came from the compiled oracle.
    assert run.references_by == {"compiled": 1, "eager": 1}
    for which in ("first", "second"):
        eager = problem.oracle(*run._inputs(0, which))
        assert refs[which].dtype == torch.float64
        torch.testing.assert_close(refs[which], eager, rtol=1e-12, atol=1e-12)
    assert run.notes == []


def test_the_compile_happens_outside_the_gpu_lock_and_the_compiled_code_runs_under_it(
    on: None, monkeypatch: pytest.MonkeyPatch
):
    from torch._inductor import compile_fx as cfx

    problem = problems.load("softmax")
    run = _run(problem, problem.shapes("smoke")[:1])
    log: list[str] = []
    real = cfx.compile_fx

    with _recorded_holds(run, log) as state:

        def spy(gm, example_inputs, *a, **kw):
            log.append("compile, held" if state["held"] else "compile")
            inner = real(gm, example_inputs, *a, **kw)

            def call(*args):
                log.append("compiled code, held" if state["held"] else "compiled code")
                return inner(*args)

            return call

        monkeypatch.setattr(cfx, "compile_fx", spy)
        run.references(0, ["first"])
        run.references(0, ["second"])

    assert log.count("compile") == 1 and "compile, held" not in log
    assert "compiled code" not in log
    assert log.count("compiled code, held") == 2  # the admission's, then the check's


def test_a_compile_inside_a_check_is_refused_and_the_eager_oracle_serves(on: None):
    problem = problems.load("token_logprobs", USER)
    shapes = problem.shapes("smoke")
    wide = next(i for i, s in enumerate(shapes) if s["M"] > 1)
    one = next(i for i, s in enumerate(shapes) if s["M"] == 1)  # a specialisation of its own
    run = _run(problem, shapes)
    run.references(wide, ["first"])
    fast = run.fast
    assert fast is not None and fast.compiles == 1

    # As if it had been admitted on a shape that needs a compile of its own: the check gets
    # the eager oracle, nothing compiles, and the shape waits to be admitted properly.
    label = run.results[one]["label"]
    fast.admitted.add(label)
    inputs = run._inputs(one, "first")
    with pytest.raises(Exception) as e:
        fast(*inputs)
    assert oracle.refused(e.value)
    eager_before = run.references_by["eager"]
    ref = run._reference(one, inputs)

    torch.testing.assert_close(ref, problem.oracle(*inputs), rtol=0, atol=0)
    assert run.references_by["eager"] == eager_before + 1
    assert fast.compiles == 1 and not fast.decided(label)
    assert run.notes == []


def test_a_new_compile_withdraws_every_admission(on: None):
    problem = problems.load("token_logprobs", USER)
    shapes = problem.shapes("smoke")
    wide = [i for i, s in enumerate(shapes) if s["M"] > 1][:2]
    one = next(i for i, s in enumerate(shapes) if s["M"] == 1)
    run = _run(problem, shapes)
    labels = [r["label"] for r in run.results]
    fast = run.fast
    assert fast is not None

    for i in wide:
        run.references(i, ["first"])
    assert fast.compiles == 1 and all(fast.serves(labels[i]) for i in wide)

    run.references(one, ["first"])  # compiles again: the code that served the others may change

    assert fast.compiles == 2 and fast.serves(labels[one])
    assert not any(fast.serves(labels[i]) for i in wide)
    run.references(wide[0], ["second"])  # admitted again, against the code as it is now
    assert fast.serves(labels[wide[0]]) and fast.compiles == 2


def test_a_compiled_oracle_that_disagrees_with_the_eager_one_never_serves(on: None, tmp_path: Path):
    # Off by far less than any tolerance a candidate is held to (1e-5), far more than AGREE.
    problem = _softmax_like(
        tmp_path,
        "softmax_drifts",
        """
        y = torch.softmax(x, dim=-1)
        return y * (1 + 1e-7) if torch.compiler.is_compiling() else y
        """,
    )
    run = _run(problem, problem.shapes("smoke"))

    for i in range(len(run.shapes)):
        refs = run.references(i, ["first", "second"])
        for which, ref in refs.items():
            torch.testing.assert_close(ref, problem.oracle(*run._inputs(i, which)), rtol=0, atol=0)

    assert run.references_by["compiled"] == 0
    assert len(run.notes) == 2 and all("disagreed with the eager one" in n for n in run.notes)
    assert all("the eager oracle serves it" in n for n in run.notes)
    assert run.fast is not None and len(run.fast.refused) == 2


def test_a_compiled_oracle_that_fails_leaves_the_eager_one_serving(on: None, tmp_path: Path):
    problem = _softmax_like(
        tmp_path,
        "softmax_breaks",
        """
        torch._dynamo.graph_break()
        return torch.softmax(x, dim=-1)
        """,
    )
    run = _run(problem, problem.shapes("smoke"))

    run.references(0, ["first", "second"])
    run.references(1, ["first"])

    assert run.references_by == {"compiled": 0, "eager": 3}
    assert run.fast is not None and run.fast.broken is not None
    [note] = run.notes  # the failure is told once, by the evaluation that met it
    assert "the compiled oracle failed" in note


def test_evaluations_with_the_compiled_oracle_accept_and_reject_as_with_the_eager_one(on: None):
    good = evaluate("softmax", SEED, device="interpret", tier="smoke")
    wrong = evaluate("softmax", WRONG, device="interpret", tier="smoke")

    assert good["verdict"] == "accepted", good["reasons"]
    assert good["references"]["compiled"] > 0
    assert wrong["verdict"] == "rejected" and wrong["failure"] == "incorrect"
    assert wrong["references"]["compiled"] > 0


def test_the_setting_and_where_the_compiled_oracle_is_used(monkeypatch: pytest.MonkeyPatch):
    assert oracle.setting(None) is None and oracle.setting("") is None
    assert oracle.setting("1") is True and oracle.setting("0") is False
    with pytest.raises(ValueError, match="AUTOWEB_COMPILED_ORACLE='yes': use 1"):
        oracle.setting("yes")

    monkeypatch.setattr(oracle, "_registry", {})
    problem = problems.load("softmax")
    monkeypatch.setattr(oracle, "SETTING", None)  # the default: on a GPU only
    assert oracle.for_problem(problem, "cpu", torch.float32) is None
    assert oracle.for_problem(problem, "cuda", torch.bfloat16) is not None
    monkeypatch.setattr(oracle, "SETTING", False)
    assert oracle.for_problem(problem, "cuda", torch.bfloat16) is None
    # Evaluations of one problem share one compiled oracle per device and dtype.
    monkeypatch.setattr(oracle, "SETTING", True)
    a = oracle.for_problem(problem, "cpu", torch.float32)
    assert a is not None and oracle.for_problem(problem, "cpu", torch.float32) is a
    assert oracle.for_problem(problem, "cpu", torch.bfloat16) is not a


def test_a_problem_held_to_a_tolerance_near_the_agreement_keeps_the_eager_oracle(
    on: None, tmp_path: Path
):
    (tmp_path / "softmax_tight.py").write_text(
        "import torch\n\n"
        "from kernels.problems.softmax import *  # noqa: F403\n\n"
        'SEED = "' + str(ROOT / "kernels" / "seeds" / "softmax.py") + '"\n'
        "TOLERANCE = {torch.float32: {'atol': 1e-5, 'rtol': 1e-7, 'l2': 1e-5},"
        " torch.bfloat16: {'atol': 1e-2, 'rtol': 1e-2, 'l2': 1e-2}}\n"
    )
    problem = problems.load("softmax_tight", [str(tmp_path)])

    assert oracle.for_problem(problem, "cpu", torch.float32) is None
    assert oracle.for_problem(problem, "cpu", torch.bfloat16) is not None


def test_a_problem_can_keep_the_eager_oracle(on: None, tmp_path: Path):
    body = (
        "from kernels.problems.softmax import *  # noqa: F403\n\n"
        'SEED = "' + str(ROOT / "kernels" / "seeds" / "softmax.py") + '"\n'
    )
    (tmp_path / "softmax_eager.py").write_text(body + "COMPILED_ORACLE = False\n")
    (tmp_path / "softmax_unsure.py").write_text(body + "COMPILED_ORACLE = 'no'\n")

    problem = problems.load("softmax_eager", [str(tmp_path)])
    assert problem.compiled_oracle is False
    assert oracle.for_problem(problem, "cpu", torch.float32) is None
    run = _run(problem, problem.shapes("smoke")[:1])
    run.references(0, ["first"])
    assert run.references_by == {"compiled": 0, "eager": 1}
    assert problems.load("softmax").compiled_oracle is True
    with pytest.raises(problems.ProblemError, match="COMPILED_ORACLE must be True or False"):
        problems.load("softmax_unsure", [str(tmp_path)])


def test_a_process_that_evaluates_one_candidate_keeps_the_eager_oracle_unless_told(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(oracle, "_registry", {})
    monkeypatch.setattr(oracle, "_ONE_EVALUATION", False)
    monkeypatch.setattr(oracle, "SETTING", None)
    problem = problems.load("softmax")
    assert oracle.for_problem(problem, "cuda", torch.bfloat16) is not None

    oracle.one_evaluation()

    assert oracle.for_problem(problem, "cuda", torch.bfloat16) is None
    monkeypatch.setattr(oracle, "SETTING", True)
    assert oracle.for_problem(problem, "cuda", torch.bfloat16) is not None
