"""Static checks on candidate source (kernels/harness/static.py)."""

from __future__ import annotations

import pytest

from kernels import problems
from kernels.harness.static import MAX_SOURCE_BYTES, check_source

ARGS = ("x",)

# A minimal allowed candidate; a prohibited construct is put in place of one of the markers.
BASE = """\
from __future__ import annotations

import torch
import triton
import triton.language as tl
#MODULE#

@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def kernel(x):
    #BODY#
    y = torch.empty_like(x)
    _copy[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y
"""


def _with(module: str = "", body: str = "") -> str:
    return BASE.replace("#MODULE#", module).replace("#BODY#", body or "pass")


def _line_of(source: str, snippet: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if snippet in line)


def test_the_minimal_candidate_passes() -> None:
    res = check_source(_with(), ARGS)

    assert res.ok, res.reasons
    assert res.failure is None
    assert res.reasons == []


@pytest.mark.parametrize("name", problems.names())
def test_every_seed_passes(name: str) -> None:
    problem = problems.load(name)

    res = check_source(problem.seed_path.read_text(), problem.arg_names)

    assert res.ok, res.reasons


@pytest.mark.parametrize(
    ("where", "snippet", "mentions"),
    [
        ("module", "import os", "import of 'os'"),
        ("module", "import subprocess as sp", "import of 'subprocess'"),
        ("module", "import numpy", "import of 'numpy'"),
        ("module", "from torch import _C", "private name '_C'"),
        ("module", "from . import helpers", "relative import"),
        ("module", "from math import *", "star import"),
        ("module", "from triton import autotune", "triton.autotune"),
        ("body", "torch.os.system('true')", "'os'"),
        ("body", "z = x.__class__", "'__class__'"),
        ("body", "z = x._base", "'_base'"),
        ("body", "z = __builtins__", "'__builtins__'"),
        ("body", "z = getattr(x, 'shape')", "'getattr'"),
        ("body", "setattr(torch, 'softmax', None)", "'setattr'"),
        ("body", "eval('1 + 1')", "'eval'"),
        ("body", "exec('z = 1')", "'exec'"),
        ("body", "open('/tmp/leak', 'w')", "'open'"),
        ("module", "torch.softmax = None", "monkeypatching"),
        ("module", "triton.jit = None", "monkeypatching"),
        ("module", "tl.exp = None", "monkeypatching"),
        ("module", "del torch.matmul", "monkeypatching"),
        ("body", "s = torch.cuda.Stream()", "torch.cuda.Stream"),
        ("body", "torch.cuda.synchronize()", "torch.cuda.synchronize"),
        ("module", "torch.backends.cuda.matmul.allow_tf32 = True", "backends"),
        ("body", "torch.set_default_dtype(torch.float64)", "global state"),
        ("body", "z = x.data", "'data'"),
        ("body", "z = x.untyped_storage()", "'untyped_storage'"),
        ("module", "fast = triton.autotune(configs=[], key=['n'])", "triton.autotune"),
        ("body", "triton.testing.do_bench(lambda: None)", "triton.testing"),
        ("body", "global _CACHE", "global statement"),
        ("module", "class T(torch.Tensor): pass", "class definition"),
        ("module", "async def f(): pass", "async"),
        # attribute paths are followed on the real modules
        ("body", "z = torch.serialization.tarfile", "the module 'torch.serialization'"),
        ("body", "f = torch.serialization.tarfile.bltn_open", "forbidden builtin"),
        ("module", "from typing import stdlib_re", "typing.stdlib_re is not allowed"),
        ("module", "from typing import get_type_hints", "typing.get_type_hints"),
        ("module", "from functools import singledispatch", "functools.singledispatch"),
        ("module", "T = torch", "module torch used as a value"),
        ("module", "L = tl", "module triton.language used as a value"),
        ("module", "from torch import serialization", "the module 'torch.serialization'"),
        ("body", "z = triton.runtime.driver", "triton.runtime"),
        ("body", "z = x.numpy()", "'numpy'"),
        ("body", "z = torch.from_numpy(x)", "'from_numpy'"),
        ("body", "z = x.tolist()", "'tolist'"),
        ("body", "M = tl.extra.modules", "'modules'"),
        ("body", "z = '{0.shape}'.format(x)", "'format'"),
        ("body", "x.apply_(abs)", "'apply_'"),
        ("body", "z = _copy.signature", "'signature'"),
        ("body", "z = dict(eval_str=True)", "eval_str"),
        ("body", "z = tl.sum.get_capture_scope()", "'get_capture_scope'"),
        ("body", "z = triton.JITFunction", "from 'triton.runtime.jit'"),
        ("body", "y.foo = 1", "assigning to the attribute y.foo"),
        ("body", "m = torch.get_device_module('cpu')", "'get_device_module'"),
        ("module", "def f(a: 'open(1)'): pass", "annotations must be expressions"),
    ],
)
def test_it_rejects_a_prohibited_construct_naming_its_line(
    where: str, snippet: str, mentions: str
) -> None:
    source = _with(module=snippet) if where == "module" else _with(body=snippet)
    line = _line_of(source, snippet)

    res = check_source(source, ARGS)

    assert res.failure == "prohibited", res.reasons
    hits = [r for r in res.reasons if r.startswith(f"line {line}:")]
    assert hits, f"no reason names line {line}: {res.reasons}"
    assert any(mentions in r for r in hits), res.reasons


def test_a_syntax_error_is_a_compile_error_naming_the_line() -> None:
    source = _with().replace("def kernel(x):", "def kernel(x)")
    line = _line_of(source, "def kernel(x)")

    res = check_source(source, ARGS)

    assert res.failure == "compile_error"
    assert len(res.reasons) == 1
    assert f"line {line}" in res.reasons[0]


@pytest.mark.parametrize(
    ("source", "mentions"),
    [
        (_with().replace("def kernel(x):", "def run(x):"), "no top-level"),
        (_with() + "\n\ndef kernel(x):\n    return x\n", "more than once"),
        (_with().replace("def kernel(x):", "def kernel(x, y):"), "does not match"),
        (_with().replace("def kernel(x):", "def kernel():"), "does not match"),
        (_with().replace("def kernel(x):", "def kernel(*args):"), "plain positional"),
        (_with().replace("def kernel(x):", "def kernel(x, **kw):"), "plain positional"),
        (_with().replace("def kernel(x):", "def kernel(x, *, fast=True):"), "plain positional"),
        (_with() + "#" + "x" * MAX_SOURCE_BYTES + "\n", "KiB"),
        (_with().replace("pass", "pass  # \x00"), "NUL"),
    ],
    ids=[
        "missing_kernel",
        "kernel_twice",
        "too_many_args",
        "too_few_args",
        "star_args",
        "star_kwargs",
        "keyword_only",
        "oversize",
        "nul_byte",
    ],
)
def test_it_rejects_a_broken_contract_as_malformed(source: str, mentions: str) -> None:
    res = check_source(source, ARGS)

    assert res.failure == "malformed", res.reasons
    assert any(mentions in r for r in res.reasons), res.reasons


def test_a_kernel_with_an_optional_extra_argument_matches_the_signature() -> None:
    res = check_source(_with().replace("def kernel(x):", "def kernel(x, scale=None):"), ARGS)

    assert res.ok, res.reasons


def test_source_that_is_not_text_is_malformed() -> None:
    res = check_source(b"def kernel(x): return x", ARGS)  # type: ignore[arg-type]

    assert res.failure == "malformed"


def test_the_allowed_paths_still_pass() -> None:
    body = (
        "z = torch.cuda.get_device_properties(0)\n"
        "    w = tl.extra.cuda.libdevice\n"
        "    v = torch.nn.functional.softmax\n"
        "    u = math.inf + functools.reduce(max, [1, 2])\n"
        "    t = typing.cast(int, 1)"
    )
    source = _with(module="import functools\nimport math\nimport typing", body=body)
    # `w = tl.extra.cuda.libdevice` binds a module to a name: refused like `T = torch`
    res = check_source(source, ARGS)
    assert [r for r in res.reasons if "used as a value" not in r] == [], res.reasons
    assert len(res.reasons) == 1


def test_a_path_into_a_module_outside_the_allowed_ones_is_refused_without_importing_it() -> None:
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from kernels.harness.static import check_source\n"
        "r = check_source('import torch\\n\\ndef kernel(x):\\n    return torch.onnx.export\\n',"
        " ('x',))\n"
        "print(r.failure, 'torch.onnx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["prohibited", "False"], out.stdout + out.stderr


def test_the_checker_never_imports_a_module_the_candidate_names_outside_the_allowed_ones() -> None:
    # `this` prints on import, `unittest.__main__` runs unittest and raises SystemExit: the
    # checker runs in the trusted process, so neither may be imported there.
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from kernels.harness.static import check_source\n"
        "for src in ('from this import s', 'import this', 'from unittest.__main__ import main'):\n"
        "    r = check_source(src + '\\n\\ndef kernel(x):\\n    return x\\n', ('x',))\n"
        "    print(r.failure)\n"
        "print('this' in sys.modules, 'unittest.__main__' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["prohibited"] * 3 + ["False", "False"], out.stdout + out.stderr


def test_a_name_never_defined_in_the_file_is_refused() -> None:
    # Triton's interpreter puts its own names (np, inspect ...) into the candidate's module.
    res = check_source(_with(body="z = np.exp(1.0)"), ARGS)
    assert res.failure == "prohibited"
    assert "name 'np' is used but never defined (nor an allowed builtin)" in res.reasons
    # names bound anywhere in their scope, builtins and comprehension variables are fine
    ok = _with(body="z = [max(i, 1) for i in range(3)]\n    w = (lambda v: v)(len(z))")
    assert check_source(ok, ARGS).ok


def test_source_nested_past_the_checkers_reach_is_malformed_not_a_crash() -> None:
    res = check_source("def kernel(x):\n    return 0" + "+x" * 5000 + "\n", ARGS)
    assert res.failure == "malformed" and "nests too deeply" in res.reasons[0]
