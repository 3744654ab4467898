"""RMSNorm over the last dimension: x [M, N], weight [N] -> x * rsqrt(mean(x^2) + eps) * weight."""

from __future__ import annotations

import torch

from kernels.problems import _rows

SIGNATURE = "kernel(x, weight)"
DESCRIPTION = (
    "x [M, N], weight [N]; fp32 math, eps = 1e-6; y = x * rsqrt(mean(x^2, dim=-1) + eps) * weight; "
    "output dtype = x.dtype."
)
# Which input and axis each shape dim is read from, (input, axis): x [M, N], weight [N].
DIMS = {"M": (0, 0), "N": (0, 1)}
RANKS = (2, 1)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "rmsnorm"
EPS = 1e-6

# Tokens x hidden size of LLM pre-norms: decode batches (1, 128 rows), prefill up to 65536 x 4096,
# 4096 x 32768, and non-powers of two (Qwen2's 3584, 5120, 1000).
SHAPES_FULL = [
    {"M": 1, "N": 4096},
    {"M": 128, "N": 4096},
    {"M": 4096, "N": 1000},
    {"M": 4096, "N": 2048},
    {"M": 4096, "N": 3584},
    {"M": 4096, "N": 4096},
    {"M": 8192, "N": 5120},
    {"M": 16384, "N": 4096},
    {"M": 65536, "N": 4096},
    {"M": 4096, "N": 8192},
    {"M": 4096, "N": 16384},
    {"M": 4096, "N": 32768},
]
SHAPES_SMOKE = _rows.SMOKE
DTYPES = _rows.DTYPES
TOLERANCE = _rows.TOLERANCE


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # Upcast half types to fp32 (float64 stays float64 for the oracle), as LLM code does.
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (y * weight.to(acc)).to(x.dtype)


def make_inputs(shape, dtype, device, generator):
    m, n = shape["M"], shape["N"]
    x = torch.randn(m, n, device=device, generator=generator) * 2.0
    weight = 1.0 + 0.1 * torch.randn(n, device=device, generator=generator)
    return x.to(dtype), weight.to(dtype)


def flops(shape) -> float:
    # square, sum, scale by rsqrt, scale by weight per element
    return 4.0 * shape["M"] * shape["N"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    m, n = shape["M"], shape["N"]
    return (2.0 * m * n + n) * torch.empty((), dtype=dtype).element_size()
