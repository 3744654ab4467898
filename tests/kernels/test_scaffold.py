"""`python -m kernels new-problem`: a problem and a seed from a user's own PyTorch function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import cli, knobs, problems, seedgen

# A user's model code, as it would live in their own package.
USER_OPS = '''
import torch


def add_rmsnorm(x, residual, weight, eps=1e-6):
    """Residual add then RMSNorm, as a pre-norm block computes it."""
    acc = torch.promote_types(x.dtype, torch.float32)
    h = x.to(acc) + residual.to(acc)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(acc)).to(x.dtype)


def gelu_mul(a, b):
    return torch.nn.functional.gelu(a, approximate="tanh") * b


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def softcap(x):
    return 30.0 * torch.tanh(x / 30.0)


def center(x):
    return x - x.mean()


def cumsum(x):
    return torch.cumsum(x, -1)


def proj(x, w):
    return x @ w


def upcast(x):
    return x.float() * 2


def pair(x):
    return x, x
'''


@pytest.fixture
def user(tmp_path: Path, monkeypatch) -> Path:
    """A directory holding the user's package `mymodel`, as the current directory."""
    (tmp_path / "mymodel").mkdir()
    (tmp_path / "mymodel" / "__init__.py").write_text("")
    (tmp_path / "mymodel" / "ops.py").write_text(USER_OPS)
    monkeypatch.delenv("AUTOWEB_PROBLEM_DIRS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "mymodel" or m.startswith("mymodel.")]:
        del sys.modules[name]


def new_problem(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AUTOWEB_PROBLEM_DIRS"}
    return subprocess.run(
        [sys.executable, "-m", "kernels", "new-problem", *args, "--quiet"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


MN, N = 4096 * 4096, 4096
# function: inputs, what the command says, a line of the seed, bf16 bytes at M = N = 4096
CASES = {
    "add_rmsnorm": (
        "x:M,N residual:M,N weight:N",
        "row-wise over the last dim",
        "tl.sum",
        (3 * MN + N) * 2,
    ),
    "gelu_mul": ("a:M,N b:M,N", "element-wise", "BLOCK_SIZE = 1024  # tune:", 3 * MN * 2),
    "layer_norm": (
        "x:M,N w:N b:N",
        "row-wise over the last dim",
        "n_cols - 0.0",
        (2 * MN + 2 * N) * 2,
    ),
}


@pytest.mark.parametrize("function", list(CASES))
def test_it_scaffolds_a_real_function_into_a_problem_whose_seed_is_accepted(user, function):
    inputs, op_class, in_seed, nbytes = CASES[function]
    res = new_problem(
        user,
        *(function, "--reference", f"mymodel.ops:{function}", "--dir", "probs"),
        *("--inputs", inputs, "--shapes", "M=1,N=4096 M=4096,N=4096;M=8192,N=5120"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert op_class in res.stdout
    assert "verdict: accepted" in res.stdout
    seed = (user / "probs" / "seeds" / f"{function}.py").read_text()
    assert in_seed in seed and "@triton.jit" in seed
    assert knobs.parse_knobs(seed), "the tuner has knobs to search"

    problem = problems.load(function, [str(user / "probs")])
    assert problem.seed_path == user / "probs" / "seeds" / f"{function}.py"
    assert problem.dims == {"M": (0, 0), "N": (0, 1)}
    problem.check_dims()
    assert problem.shapes("full") == [
        {"M": 1, "N": 4096},
        {"M": 4096, "N": 4096},
        {"M": 8192, "N": 5120},
    ]
    # One element, odd sizes, a row as long as the GPU sweep allows.
    assert problem.shapes("smoke") == [{"M": 1, "N": 1}, {"M": 37, "N": 1000}, {"M": 3, "N": 5120}]
    # The reference is the user's function itself.
    from mymodel import ops

    inputs = problem.make_inputs({"M": 5, "N": 40}, torch.float32, "cpu", 0)
    assert torch.equal(problem.reference(*inputs), getattr(ops, function)(*inputs))
    # bytes: every input read once, the output written once.
    assert problem.bytes({"M": 4096, "N": 4096}, torch.bfloat16) == nbytes


def test_a_function_of_no_seedable_class_gets_a_template_and_the_evaluation_says_so(user):
    res = new_problem(
        user,
        *("proj", "--reference", "mymodel.ops:proj", "--dir", "probs"),
        *("--inputs", "x:M,K w:K,N", "--shapes", "M=4096,K=4096,N=14336"),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "a commented template" in res.stdout
    assert "NotImplementedError: write the proj kernel" in res.stdout
    problem = problems.load("proj", [str(user / "probs")])
    assert problem.dims == {"M": (0, 0), "K": (0, 1), "N": (1, 1)}
    # flops: torch's count of the matmul, plus one per output element.
    shape = {"M": 4096, "K": 4096, "N": 14336}
    assert problem.flops(shape) == 2 * 4096 * 4096 * 14336 + 4096 * 14336


@pytest.mark.parametrize(
    ("function", "inputs", "op_class"),
    [
        ("add_rmsnorm", "x:M,N r:M,N w:N", seedgen.ROWWISE),
        ("layer_norm", "x:M,N w:N b:N", seedgen.ROWWISE),
        ("cumsum", "x:M,N", seedgen.ROWWISE),
        ("gelu_mul", "a:M,N b:M,N", seedgen.ELEMENTWISE),
        ("softcap", "x:M,N", seedgen.ELEMENTWISE),
        ("center", "x:M,N", seedgen.GENERAL),  # permutes like an element-wise op, but is not
        ("proj", "x:M,K w:K,N", seedgen.GENERAL),
    ],
)
def test_the_op_class_comes_from_probing_the_function(user, function, inputs, op_class):
    from mymodel import ops

    fn = getattr(ops, function)
    spec = [(n, tuple(d.split(","))) for n, d in (t.split(":") for t in inputs.split())]
    sizes = {"M": 6, "N": 10, "K": 14}
    probe_in = [torch.randn([sizes[d] for d in dims], dtype=torch.float64) for _, dims in spec]
    probe = seedgen.classify(fn, probe_in, fn(*probe_in))
    assert probe.op_class == op_class, probe.detail
    source, note = seedgen.seed_source(function, "x", fn, probe_in, [n for n, _ in spec], probe)
    compile(source, function, "exec")
    if function == "cumsum":
        assert "cannot write aten.cumsum" in note and "NotImplementedError" in source


BAD = [
    (["--reference", "nosuch.mod:f"], "cannot import 'nosuch.mod'"),
    (["--reference", "mymodel.ops:nope"], "'mymodel.ops' has no function 'nope'"),
    (["--reference", "mymodel.ops"], "expected MODULE:FUNCTION"),
    (["--shapes", "M=1,N=abc"], "'N=abc' in 'M=1,N=abc' is not DIM=SIZE"),
    (["--shapes", "M=0,N=4"], "with a positive integer size"),
    (["--shapes", "M=\u00b2,N=4"], "is not DIM=SIZE with a positive integer size"),
    (["--smoke", "M=100000000,N=100000000"], "cannot make the inputs of shape M=100000000"),
    (["--shapes", "M=1"], "gives dims ['M'], but the inputs use ['M', 'N']"),
    (["--shapes", " ; "], "--shapes is empty"),
    (["--smoke", "M=1,N=1,K=2"], "--smoke: 'M=1,N=1,K=2' gives dims"),
    (["--inputs", "x residual:M,N weight:N"], "'x' is not NAME:DIM,DIM"),
    (["--inputs", "x:M,N x:M,N weight:N"], "'x' is given twice"),
    (["--inputs", "mask:M,N r:M,N w:N"], "'mask' is a name the generated code uses"),
    (["--inputs", "x:M,N"], "cannot take the 1 inputs"),
    (["--name", "softmax"], "'softmax' is a built-in problem"),
    (["--name", "Bad-Name"], "'Bad-Name' is not a problem name"),
    (["--reference", "mymodel.ops:upcast", "--inputs", "x:M,N"], "returns torch.float32 for"),
    (["--reference", "mymodel.ops:pair", "--inputs", "x:M,N"], "returned tuple"),
    (["--dtype", "int8"], "--dtype 'int8'"),
    (["--dir", None], "say where to write it: --dir DIR, or set AUTOWEB_PROBLEM_DIRS"),
]


def _args(overrides: list) -> list[str]:
    given = dict(zip(overrides[::2], overrides[1::2], strict=True))
    args = {
        "--name": "add_rmsnorm",
        "--reference": "mymodel.ops:add_rmsnorm",
        "--inputs": "x:M,N residual:M,N weight:N",
        "--shapes": "M=1,N=4096 M=4096,N=4096",
        "--dir": "probs",
        **given,
    }
    out = ["new-problem", args.pop("--name")]
    for flag, value in args.items():
        if value is not None:
            out += [flag, value]
    return out


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_bad_input_is_a_clear_usage_error_and_writes_nothing(user, capsys, overrides, message):
    before = sorted(p.relative_to(user) for p in user.rglob("*") if "__pycache__" not in str(p))
    assert cli.main(_args(overrides)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    after = sorted(p.relative_to(user) for p in user.rglob("*") if "__pycache__" not in str(p))
    assert after == before


def test_a_name_taken_by_a_file_or_another_problem_directory_is_refused(user, capsys, monkeypatch):
    (user / "probs").mkdir()
    (user / "probs" / "add_rmsnorm.py").write_text("# the user's own file\n")
    assert cli.main(_args([])) == 2
    assert "probs/add_rmsnorm.py already exists" in capsys.readouterr().err
    assert (user / "probs" / "add_rmsnorm.py").read_text() == "# the user's own file\n"

    elsewhere = user / "team_problems"
    elsewhere.mkdir()
    (elsewhere / "gelu_mul.py").write_text("# a teammate's problem\n")
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(elsewhere))
    args = _args(["--name", "gelu_mul", "--reference", "mymodel.ops:gelu_mul"])
    assert cli.main([*args, "--inputs", "a:M,N b:M,N"]) == 2
    assert "a problem 'gelu_mul' already exists" in capsys.readouterr().err
    assert not (user / "probs" / "seeds").exists()


def test_a_missing_problem_directory_in_the_environment_writes_nothing(user, capsys, monkeypatch):
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(user / "no_such_dir"))
    assert cli.main(_args([])) == 2
    assert "no_such_dir" in capsys.readouterr().err
    assert not (user / "probs").exists()
