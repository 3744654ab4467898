"""SwiGLU gate: a, b [M, N] -> silu(a) * b, output dtype = a.dtype."""

from __future__ import annotations

import torch

from kernels.problems import _rows

SIGNATURE = "kernel(a, b)"
DESCRIPTION = (
    "a, b [M, N] (same shape); y = silu(a) * b = a * sigmoid(a) * b; output dtype = a.dtype."
)
# Which input and axis each shape dim is read from, (input, axis): a, b [M, N].
DIMS = {"M": (0, 0), "N": (0, 1)}
RANKS = (2, 2)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "swiglu"

# Tokens x MLP intermediate size: Llama-3-8B 14336, Llama-2-7B 11008, Llama-2-13B 13824,
# Qwen2-7B 18944, Llama-70B 28672; decode batches; plus 65536 x 4096, 4096 x 32768 and N = 1000.
SHAPES_FULL = [
    {"M": 1, "N": 14336},
    {"M": 128, "N": 14336},
    {"M": 4096, "N": 1000},
    {"M": 4096, "N": 5120},
    {"M": 4096, "N": 11008},
    {"M": 4096, "N": 13824},
    {"M": 4096, "N": 14336},
    {"M": 16384, "N": 14336},
    {"M": 2048, "N": 18944},
    {"M": 4096, "N": 28672},
    {"M": 65536, "N": 4096},
    {"M": 4096, "N": 32768},
]
SHAPES_SMOKE = _rows.SMOKE
DTYPES = _rows.DTYPES
TOLERANCE = _rows.TOLERANCE


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def make_inputs(shape, dtype, device, generator):
    m, n = shape["M"], shape["N"]
    a = torch.randn(m, n, device=device, generator=generator) * 2.0
    b = torch.randn(m, n, device=device, generator=generator)
    return a.to(dtype), b.to(dtype)


def flops(shape) -> float:
    # sigmoid (negate, exp, add, divide), times a, times b per element
    return 6.0 * shape["M"] * shape["N"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    return 3.0 * shape["M"] * shape["N"] * torch.empty((), dtype=dtype).element_size()
