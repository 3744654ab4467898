"""LayerNorm over the last dim: x [M, N], weight [N], bias [N]; eps = 1e-5, biased variance."""

from __future__ import annotations

import torch

from kernels.problems import _rows

SIGNATURE = "kernel(x, weight, bias)"
DESCRIPTION = (
    "x [M, N], weight [N], bias [N]; y = (x - mean) * rsqrt(var + eps) * weight + bias over the "
    "last dim, biased variance, eps = 1e-5, fp32 math; output dtype = x.dtype."
)
# Which input and axis each shape dim is read from, (input, axis): x [M, N], weight and bias [N].
DIMS = {"M": (0, 0), "N": (0, 1)}
RANKS = (2, 1, 1)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "layernorm"
EPS = 1e-5

# Tokens x width of transformer LayerNorms: ViT/BERT widths (768, 1024, 1280), GPT-style 4096 to
# 32768-wide rows, decode batches, and non-powers of two (1000, 5120, 6144 + odd rows).
SHAPES_FULL = [
    {"M": 1, "N": 4096},
    {"M": 128, "N": 4096},
    {"M": 65536, "N": 768},
    {"M": 32768, "N": 1024},
    {"M": 16384, "N": 1280},
    {"M": 4096, "N": 1000},
    {"M": 4096, "N": 4096},
    {"M": 8192, "N": 5120},
    {"M": 65536, "N": 4096},
    {"M": 3000, "N": 6144},
    {"M": 4096, "N": 8192},
    {"M": 4096, "N": 16384},
    {"M": 4096, "N": 32768},
]
SHAPES_SMOKE = _rows.SMOKE
DTYPES = _rows.DTYPES
TOLERANCE = _rows.TOLERANCE


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # What models call (nn.LayerNorm); on half types it reduces in fp32 internally.
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, EPS)


def make_inputs(shape, dtype, device, generator):
    m, n = shape["M"], shape["N"]
    # A non-zero mean, so a kernel must centre the row before squaring.
    x = torch.randn(m, n, device=device, generator=generator) * 2.0 + 0.5
    weight = 1.0 + 0.1 * torch.randn(n, device=device, generator=generator)
    bias = 0.1 * torch.randn(n, device=device, generator=generator)
    return x.to(dtype), weight.to(dtype), bias.to(dtype)


def flops(shape) -> float:
    # sum, subtract mean, square, sum, scale by rstd, multiply weight, add bias per element
    return 7.0 * shape["M"] * shape["N"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    m, n = shape["M"], shape["N"]
    return (2.0 * m * n + 2.0 * n) * torch.empty((), dtype=dtype).element_size()
