"""Bad input to the Django-free side: problem modules that declare malformed shapes, and an
oversize candidate through the CLI. A clear message each, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernels import problems
from kernels.harness.static import MAX_SOURCE_BYTES
from tests.kernels.test_cli import ROWSCALE, SEED, cli

GOOD_SHAPES = 'SHAPES_SMOKE = [{"M": 1, "N": 1}, {"M": 7, "N": 300}, {"M": 3, "N": 5000}]'

BAD_DECLARATIONS = [
    ("SHAPES_SMOKE = []", "SHAPES_SMOKE must be a non-empty list"),
    ("SHAPES_SMOKE = 5", "SHAPES_SMOKE must be a non-empty list"),
    ('SHAPES_SMOKE = "M=4,N=8"', "SHAPES_SMOKE must be a non-empty list"),
    ('SHAPES_SMOKE = [{"M": 4, "N": 8}, 7]', "SHAPES_SMOKE[1] must be a dict of sizes"),
    ("SHAPES_SMOKE = [{}]", "SHAPES_SMOKE[0] must be a dict of sizes"),
    ('SHAPES_SMOKE = [{"M": 0, "N": 8}]', "SHAPES_SMOKE[0]['M'] must be a positive integer"),
    ('SHAPES_SMOKE = [{"M": -4, "N": 8}]', "must be a positive integer; got -4"),
    ('SHAPES_SMOKE = [{"M": 4.5, "N": 8}]', "must be a positive integer; got 4.5"),
    ('SHAPES_SMOKE = [{"M": "big", "N": 8}]', "must be a positive integer; got 'big'"),
    ('SHAPES_SMOKE = [{"M": True, "N": 8}]', "must be a positive integer; got True"),
    ('SHAPES_SMOKE = [{"M N": 4}]', "has a bad name 'M N'"),
    ('SHAPES_SMOKE = [{"M": 1}] * 1000', "over 256 shapes"),
]


def write_problem(folder: Path, name: str, shapes_line: str) -> Path:
    assert GOOD_SHAPES in ROWSCALE
    (folder / f"{name}.py").write_text(ROWSCALE.replace(GOOD_SHAPES, shapes_line))
    return folder


@pytest.mark.parametrize(("line", "message"), BAD_DECLARATIONS)
def test_a_problem_declaring_malformed_shapes_is_refused_with_a_clear_error(
    tmp_path, line, message
):
    folder = write_problem(tmp_path, "badshapes", line)
    with pytest.raises(problems.ProblemError, match="badshapes") as info:
        problems.load("badshapes", [str(folder)])
    assert message in str(info.value)


GOOD_TOLERANCE = 'torch.float32: {"atol": 1e-6, "rtol": 1e-6, "l2": 1e-6},'

BAD_TOLERANCES = [
    ('torch.float32: {"atol": 1e-6, "rtol": 1e-6},', "missing l2"),
    ('torch.float32: {"atol": 1e-6, "rtol": 1e-6, "l2": 1e-6, "rms_flor": 1},', "unknown rms_flor"),
    ('torch.float32: {"atol": -1e-6, "rtol": 1e-6, "l2": 1e-6},', "['atol'] must be a number"),
    ('torch.float32: {"atol": 1e-6, "rtol": "tight", "l2": 1e-6},', "got 'tight'"),
    ('torch.float32: {"atol": 1e-6, "rtol": 1e-6, "l2": float("inf")},', "got inf"),
    ('torch.float32: {"atol": 1e-6, "rtol": 1e-6, "l2": 1e-6, "rms_floor": True},', "got True"),
    ("torch.float32: 1e-6,", "must be a dict like"),
]


@pytest.mark.parametrize(("line", "message"), BAD_TOLERANCES)
def test_a_problem_declaring_a_malformed_tolerance_is_refused_with_a_clear_error(
    tmp_path, line, message
):
    assert GOOD_TOLERANCE in ROWSCALE
    (tmp_path / "badtol.py").write_text(ROWSCALE.replace(GOOD_TOLERANCE, line))
    with pytest.raises(problems.ProblemError, match="badtol") as info:
        problems.load("badtol", [str(tmp_path)])
    assert message in str(info.value)


def test_a_problem_may_declare_an_rms_floor(tmp_path) -> None:
    line = 'torch.float32: {"atol": 1e-6, "rtol": 1e-6, "l2": 1e-6, "rms_floor": 0.5},'
    (tmp_path / "floored.py").write_text(ROWSCALE.replace(GOOD_TOLERANCE, line))

    problem = problems.load("floored", [str(tmp_path)])

    assert problem.tolerance(torch.float32)["rms_floor"] == 0.5


GOOD_DIMS = 'DIMS = {"M": (0, 0), "N": (0, 1)}\nRANKS = (2,)'

BAD_DIMS = [
    ("RANKS = (2,)", "lacks DIMS"),
    ('DIMS = {"M": (0, 0), "N": (0, 1)}', "lacks RANKS"),
    ("DIMS = {}\nRANKS = (2,)", "DIMS must map each shape dim"),
    ('DIMS = {"M": (0, 0)}\nRANKS = (2,)', "DIMS names ['M'] but the sweeps use ['M', 'N']"),
    ('DIMS = {"M": (0, 0), "N": (0, 1), "K": (0, 1)}\nRANKS = (2,)', "every shape dim"),
    ('DIMS = {"M": (1, 0), "N": (0, 1)}\nRANKS = (2,)', "DIMS['M'] must be (input index, axis)"),
    ('DIMS = {"M": (0, 0), "N": (0, 2)}\nRANKS = (2,)', "DIMS['N'] must be (input index, axis)"),
    ('DIMS = {"M": 0, "N": (0, 1)}\nRANKS = (2,)', "got 0"),
    ('DIMS = {"M": (0, 0), "N": (0, 1)}\nRANKS = (2, 1)', "RANKS must give the rank of each"),
    ('DIMS = {"M": (0, 0), "N": (0, 1)}\nRANKS = ("2",)', "RANKS must give the rank of each"),
    (GOOD_DIMS + '\nBLOCK_OP = "conv"', "BLOCK_OP 'conv' is not an op of the model block"),
]


@pytest.mark.parametrize(("lines", "message"), BAD_DIMS)
def test_a_problem_declaring_malformed_dims_is_refused_with_a_clear_error(tmp_path, lines, message):
    assert GOOD_DIMS in ROWSCALE
    (tmp_path / "baddims.py").write_text(ROWSCALE.replace(GOOD_DIMS, lines))
    with pytest.raises(problems.ProblemError, match="baddims") as info:
        problems.load("baddims", [str(tmp_path)])
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ('DIMS = {"M": (0, 1), "N": (0, 0)}', "DIMS reads M from input 0 axis 1, which is 300"),
        ("RANKS = (3,)", "RANKS says [3] but make_inputs(M=7,N=300) gives inputs of ranks [2]"),
    ],
)
def test_dims_that_disagree_with_the_inputs_fail_the_check(tmp_path, dims, message):
    """DIMS and RANKS that load fine but do not describe the inputs: the export runs this
    check, since a swapped axis would dispatch releases on the wrong sizes."""
    line = dims if dims.startswith("DIMS") else 'DIMS = {"M": (0, 0), "N": (0, 1)}'
    ranks = dims if dims.startswith("RANKS") else "RANKS = (2,)"
    (tmp_path / "liar.py").write_text(ROWSCALE.replace(GOOD_DIMS, f"{line}\n{ranks}"))
    problem = problems.load("liar", [str(tmp_path)])
    with pytest.raises(problems.ProblemError, match="liar") as info:
        problem.check_dims()
    assert message in str(info.value)


@pytest.mark.parametrize(
    "signature", ["kernel", "kernel()", "def kernel(x):", "kernel(x, 1)", "kernel(x) or 1", "5"]
)
def test_a_problem_with_a_malformed_signature_is_refused(tmp_path, signature):
    (tmp_path / "badsig.py").write_text(
        ROWSCALE.replace('SIGNATURE = "kernel(x)"', f"SIGNATURE = {signature!r}")
    )
    with pytest.raises(problems.ProblemError, match="SIGNATURE must look like"):
        problems.load("badsig", [str(tmp_path)])


def test_the_well_formed_problem_still_loads(tmp_path):
    folder = write_problem(tmp_path, "fine", GOOD_SHAPES)
    assert problems.load("fine", [str(folder)]).shapes("smoke")[1] == {"M": 7, "N": 300}
    for name in problems.BUILTIN:
        problems.load(name)


def test_the_cli_names_the_malformed_problem_and_exits_2(tmp_path):
    folder = write_problem(tmp_path, "badshapes", 'SHAPES_SMOKE = [{"M": -4, "N": 8}]')
    env = {"AUTOWEB_PROBLEM_DIRS": str(folder)}
    res = cli(
        "evaluate", "--problem", "badshapes", "--candidate", SEED, "--device", "interpret", env=env
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "SHAPES_SMOKE[0]['M'] must be a positive integer" in res.stderr
    assert "Traceback" not in res.stderr


def test_an_oversize_candidate_is_rejected_as_malformed_by_the_cli(tmp_path):
    big = tmp_path / "big.py"
    padding = ("# " + "x" * 98 + "\n") * (MAX_SOURCE_BYTES // 100 + 10)
    big.write_text(SEED.read_text() + padding)
    assert big.stat().st_size > MAX_SOURCE_BYTES
    out = tmp_path / "report.json"
    res = cli(
        *("evaluate", "--problem", "softmax", "--candidate", big),
        *("--device", "interpret", "--json", out, "--quiet"),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    report = json.loads(out.read_text())
    assert report["verdict"] == "rejected" and report["failure"] == "malformed"
    assert any(f"over {MAX_SOURCE_BYTES // 1024} KiB" in r for r in report["reasons"])


def test_an_unknown_problem_is_a_usage_error_naming_the_known_ones():
    res = cli("evaluate", "--problem", "nope", "--candidate", SEED, "--device", "interpret")
    assert res.returncode == 2
    assert "unknown problem 'nope'" in res.stderr and "softmax" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_problem_module_that_fails_to_import_is_named_and_the_rest_still_listed(tmp_path):
    (tmp_path / "boom.py").write_text("raise RuntimeError('no GPU library here')\n")
    write_problem(tmp_path, "fine", GOOD_SHAPES)
    env = {"AUTOWEB_PROBLEM_DIRS": str(tmp_path)}

    listed = cli("problems", env=env)
    evaluated = cli(
        "evaluate", "--problem", "boom", "--candidate", SEED, "--device", "interpret", env=env
    )

    assert listed.returncode == 1 and "Traceback" not in listed.stderr
    assert (
        "problem 'boom'" in listed.stderr and "RuntimeError: no GPU library here" in listed.stderr
    )
    assert "fine " in listed.stdout and "softmax " in listed.stdout
    assert evaluated.returncode == 2 and "Traceback" not in evaluated.stderr
    assert "failed to import: RuntimeError: no GPU library here" in evaluated.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--timeout", "nan"), "--timeout must be a positive number of seconds; got nan"),
        (("--timeout", "-1"), "--timeout must be a positive number of seconds; got -1.0"),
        (("--budget", "inf"), "--budget must be a positive number of seconds; got inf"),
        (("--json", "/nonexistent-dir/r.json"), "the directory /nonexistent-dir does not exist"),
        (("--json", "/tmp"), "--json /tmp is a directory"),
    ],
)
def test_bad_numbers_and_unwritable_outputs_are_refused_before_any_work(flags, message):
    res = cli(
        "evaluate", "--problem", "softmax", "--candidate", SEED, "--device", "interpret", *flags
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert "verdict" not in res.stdout  # refused before anything was evaluated


def test_tune_refuses_more_jobs_than_it_can_run():
    res = cli("tune", "--problem", "softmax", "--device", "interpret", "--jobs", "100000")
    assert res.returncode == 2 and "--jobs must be from 1 to 256" in res.stderr


# A problem that fails on its own on its last smoke shape: in make_inputs, or in its reference.
BROKEN = {
    "inputs": (
        "def make_inputs(shape, dtype, device, generator):\n",
        "def make_inputs(shape, dtype, device, generator):\n"
        '    if shape["N"] == 5000:\n'
        '        raise RuntimeError("no inputs for N=5000")\n',
        "make_inputs raised RuntimeError: no inputs for N=5000",
    ),
    "reference": (
        "def reference(x):\n",
        "def reference(x):\n"
        "    if x.shape[1] == 5000:\n"
        '        raise ValueError("N=5000 unsupported")\n',
        "its reference raised ValueError: N=5000 unsupported",
    ),
}


@pytest.mark.parametrize("where", sorted(BROKEN))
def test_a_problem_that_fails_on_its_own_is_named_and_the_candidate_not_judged(tmp_path, where):
    from tests.kernels.test_cli import CANDIDATE

    old, new, message = BROKEN[where]
    assert old in ROWSCALE
    (tmp_path / "flaky.py").write_text(ROWSCALE.replace(old, new))
    cand = tmp_path / "scale.py"
    cand.write_text(CANDIDATE.replace("FACTOR", "2.0"))
    out = tmp_path / "report.json"

    res = cli(
        *("evaluate", "--problem", "flaky", "--candidate", cand, "--device", "interpret"),
        *("--json", out),
        env={"AUTOWEB_PROBLEM_DIRS": str(tmp_path)},
    )

    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert f"problem 'flaky' fails on M=3,N=5000: {message}" in res.stderr
    assert "the candidate was not judged" in res.stderr
    assert not out.exists()  # no verdict written for a candidate that was not judged


def test_a_candidate_that_crashes_on_a_sound_problem_is_still_crashed(tmp_path):
    from tests.kernels.test_cli import CANDIDATE

    (tmp_path / "fine.py").write_text(ROWSCALE)
    cand = tmp_path / "boom.py"
    cand.write_text(
        CANDIDATE.replace("FACTOR", "2.0").replace(
            "    x = x.contiguous()\n",
            '    if x.shape[1] == 5000:\n        raise RuntimeError("kernel bug")\n'
            "    x = x.contiguous()\n",
        )
    )
    out = tmp_path / "report.json"

    res = cli(
        *("evaluate", "--problem", "fine", "--candidate", cand, "--device", "interpret"),
        *("--json", out, "--quiet"),
        env={"AUTOWEB_PROBLEM_DIRS": str(tmp_path)},
    )

    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert report["failure"] == "crashed"
    assert report["reasons"] == ["crashed: RuntimeError: kernel bug"]


def test_a_problem_out_of_memory_in_the_check_leaves_the_candidate_judged(tmp_path):
    # Out of memory (or a device error) while the caller checks the problem says nothing about
    # the problem on a GPU others share, and a candidate could leave it so: judged as before.
    from tests.kernels.test_cli import CANDIDATE

    old = "def make_inputs(shape, dtype, device, generator):\n"
    new = old + '    if shape["N"] == 5000:\n        raise MemoryError("no room")\n'
    (tmp_path / "tight.py").write_text(ROWSCALE.replace(old, new))
    cand = tmp_path / "scale.py"
    cand.write_text(CANDIDATE.replace("FACTOR", "2.0"))
    out = tmp_path / "report.json"

    res = cli(
        *("evaluate", "--problem", "tight", "--candidate", cand, "--device", "interpret"),
        *("--json", out, "--quiet"),
        env={"AUTOWEB_PROBLEM_DIRS": str(tmp_path)},
    )

    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert report["failure"] == "crashed"
    assert any("the problem could not be checked: MemoryError: no room" in n
               for n in report["notes"]), report["notes"]  # fmt: skip
