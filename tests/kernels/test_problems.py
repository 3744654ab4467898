"""The built-in problems honour the problem contract and cover the shapes real models use."""

from __future__ import annotations

import math

import pytest
import torch

from kernels import block, problems

NAMES = list(problems.BUILTIN)
ROW_OPS = ("softmax", "rmsnorm", "layernorm", "swiglu")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("name", NAMES)
def test_it_declares_the_whole_contract(name):
    p = problems.load(name)
    assert p.signature.startswith("kernel(")
    assert p.dtype("cuda") is torch.bfloat16
    assert p.dtype("interpret") is torch.float32
    for dt in (torch.bfloat16, torch.float32):
        tol = p.tolerance(dt)
        assert set(tol) - {"rms_floor"} == {"atol", "rtol", "l2"}
        assert all(0 < tol[k] < 0.05 for k in ("atol", "rtol", "l2"))
        if "rms_floor" in tol:
            # A floor under the magnitude of the problem's outputs (a large output's RMS):
            # above it, it would loosen the check of every shape.
            big = max(p.shapes("smoke"), key=lambda s: math.prod(s.values()))
            out = p.oracle(*p.make_inputs(big, torch.float32, "cpu", 0))
            assert out.numel() > 10_000
            assert 0 < tol["rms_floor"] <= float(out.square().mean().sqrt())
    assert p.tolerance(torch.float32)["l2"] < 4e-3  # below bf16 rounding: downgrades fail
    for s in p.shapes("full") + p.shapes("smoke"):
        assert p.flops(s) > 0
        assert p.bytes(s, torch.bfloat16) > 0
        assert p.bytes(s, torch.float32) == 2 * p.bytes(s, torch.bfloat16)


@pytest.mark.parametrize("name", NAMES)
def test_smoke_sweep_has_odd_sizes_and_a_single_element_case(name):
    p = problems.load(name)
    dims = [v for s in p.shapes("smoke") for v in s.values()]
    assert any(not _is_pow2(v) for v in dims), "smoke sweep needs non-power-of-two sizes"
    assert len(p.shapes("smoke")) >= 3


@pytest.mark.parametrize("name", ROW_OPS)
def test_row_ops_cover_long_and_wide_rows(name):
    shapes = problems.load(name).shapes("full")
    big_m = max(s["M"] * s["N"] for s in shapes if s["M"] >= 65536)
    assert big_m >= 65536 * 4096
    assert any(s["N"] >= 32768 and s["M"] >= 4096 for s in shapes)
    assert any(s["M"] == 1 for s in shapes), "decode-sized rows"


def test_attention_reaches_32k_context():
    shapes = problems.load("attention").shapes("full")
    assert max(s["S"] for s in shapes) >= 32768
    assert {s["D"] for s in shapes} >= {64, 128}


@pytest.mark.parametrize("name", ["matmul", "matmul_bias_gelu"])
def test_matmul_covers_squares_and_skinny_shapes(name):
    shapes = problems.load(name).shapes("full")
    assert any(s["M"] == s["N"] == s["K"] >= 8192 for s in shapes)
    assert any(s["M"] == 1 for s in shapes)
    assert any(not _is_pow2(s["N"]) for s in shapes)


@pytest.mark.parametrize("name", NAMES)
def test_inputs_follow_the_seed_and_only_the_seed(name):
    p = problems.load(name)
    shape = p.shapes("smoke")[1]
    a = p.make_inputs(shape, torch.float32, "cpu", 7)
    b = p.make_inputs(shape, torch.float32, "cpu", 7)
    c = p.make_inputs(shape, torch.float32, "cpu", 8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert a[0].abs().sum() > 0, "never test on zeros"


@pytest.mark.parametrize("name", NAMES)
def test_oracle_matches_reference_shape_and_is_float64(name):
    p = problems.load(name)
    inputs = p.make_inputs(p.shapes("smoke")[1], torch.float32, "cpu", 3)
    ref = p.reference(*inputs)
    oracle = p.oracle(*inputs)
    assert oracle.dtype is torch.float64
    assert oracle.shape == ref.shape
    err = (ref.double() - oracle).norm() / oracle.norm()
    assert err < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_inputs_can_be_built_on_the_meta_device(name):
    # The sandbox compiles a candidate's kernels on meta inputs before it asks for the GPU.
    p = problems.load(name)
    for shape in p.shapes("full"):
        inputs = p.module.make_inputs(shape, torch.bfloat16, "meta", None)
        assert all(x.device.type == "meta" for x in inputs)


@pytest.mark.parametrize("name", NAMES)
def test_declared_dims_and_ranks_describe_the_inputs(name):
    p = problems.load(name)
    p.check_dims()
    for shape in p.shapes("full"):  # on meta: every shape, no memory
        inputs = p.module.make_inputs(shape, torch.bfloat16, "meta", None)
        assert [x.dim() for x in inputs] == list(p.ranks)
        assert {d: inputs[i].shape[a] for d, (i, a) in p.dims.items()} == shape
    assert p.block_op in block.OPS


def test_a_reference_using_its_modules_constants_compiles_inside_other_code():
    """torch.compile resolves the globals of a function it inlines (rmsnorm's EPS, from the
    model block) by module name: the registry's modules must be importable by theirs."""
    p = problems.load("rmsnorm")
    x, w = p.make_inputs({"M": 3, "N": 40}, torch.float32, "cpu", 0)
    compiled = torch.compile(lambda x, w: p.module.reference(x, w) + 0.0)
    torch.testing.assert_close(compiled(x, w), p.reference(x, w))


def test_unknown_and_invalid_names_are_clear_errors():
    with pytest.raises(problems.ProblemError, match="unknown problem"):
        problems.load("nope")
    with pytest.raises(problems.ProblemError, match="invalid problem name"):
        problems.load("../etc/passwd")
