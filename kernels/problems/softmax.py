"""Row softmax over the last dimension: x [M, N] -> softmax(x, dim=-1), output dtype = x.dtype."""

from __future__ import annotations

import torch

from kernels.problems import _rows

SIGNATURE = "kernel(x)"
DESCRIPTION = "x [M, N]; softmax over the last dim; output dtype = x.dtype."
# Which input and axis each shape dim is read from, (input, axis): x [M, N].
DIMS = {"M": (0, 0), "N": (0, 1)}
RANKS = (2,)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "softmax"

# Rows x cols of attention probabilities, LM heads and MoE routers. Covers 65536 x 4096 and
# 4096 x 32768, non-powers of two, and a vocab-sized row.
SHAPES_FULL = [
    {"M": 1, "N": 4096},
    {"M": 128, "N": 4096},
    {"M": 4096, "N": 1000},
    {"M": 4096, "N": 4096},
    {"M": 8192, "N": 5120},
    {"M": 16384, "N": 4096},
    {"M": 65536, "N": 4096},
    {"M": 4096, "N": 8192},
    {"M": 4096, "N": 16384},
    {"M": 4096, "N": 32768},
    {"M": 256, "N": 128256},
]
SHAPES_SMOKE = _rows.SMOKE
DTYPES = _rows.DTYPES
TOLERANCE = _rows.TOLERANCE


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def make_inputs(shape, dtype, device, generator):
    x = torch.randn(shape["M"], shape["N"], device=device, generator=generator) * 3.0
    return (x.to(dtype),)


def flops(shape) -> float:
    # max, subtract, exp, sum, divide per element
    return 5.0 * shape["M"] * shape["N"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    return 2.0 * shape["M"] * shape["N"] * torch.empty((), dtype=dtype).element_size()
