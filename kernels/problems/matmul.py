"""Matrix multiply: a [M, K] @ b [K, N] with fp32 accumulation; output dtype = a.dtype."""

from __future__ import annotations

import torch

SIGNATURE = "kernel(a, b)"
DESCRIPTION = (
    "a [M, K], b [K, N] (both row-major); c = a @ b, fp32 accumulation, output dtype = a.dtype."
)
# Which input and axis each shape dim is read from, (input, axis): a [M, K], b [K, N].
DIMS = {"M": (0, 0), "K": (0, 1), "N": (1, 1)}
RANKS = (2, 2)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "matmul"

# Squares 1024..8192; LLM projections with K, N in {4096, 11008, 14336}: decode (M = 1, 16, 128)
# and prefill (M = 4096..16384); odd sizes that divide no tile.
SHAPES_FULL = [
    {"M": 1024, "N": 1024, "K": 1024},
    {"M": 2048, "N": 2048, "K": 2048},
    {"M": 4096, "N": 4096, "K": 4096},
    {"M": 8192, "N": 8192, "K": 8192},
    {"M": 1, "N": 4096, "K": 4096},
    {"M": 1, "N": 14336, "K": 4096},
    {"M": 16, "N": 14336, "K": 4096},
    {"M": 128, "N": 14336, "K": 4096},
    {"M": 128, "N": 4096, "K": 14336},
    {"M": 4096, "N": 14336, "K": 4096},
    {"M": 4096, "N": 4096, "K": 14336},
    {"M": 8192, "N": 11008, "K": 4096},
    {"M": 8192, "N": 4096, "K": 11008},
    {"M": 16384, "N": 14336, "K": 4096},
    {"M": 3000, "N": 1000, "K": 5120},
    {"M": 1023, "N": 1027, "K": 1025},
]
# Interpreter sweep: 1x1x1, a decode row, odd sizes, and every dimension larger than any block
# knob value (M, N > 256, K > 128) with tails that divide no block.
SHAPES_SMOKE = [
    {"M": 1, "N": 1, "K": 1},
    {"M": 1, "N": 300, "K": 200},
    {"M": 37, "N": 45, "K": 70},
    {"M": 300, "N": 270, "K": 150},
]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
# bf16: the output's own rounding (<= 2^-9 relative) dominates an fp32-accumulating kernel.
# fp32: the interpreter's tl.dot is exact fp32 (~1e-7 off); tf32 (~3e-4), fp16 (~3e-4) and bf16
# (~3e-3) inputs must fail.
TOLERANCE = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5},
}


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def make_inputs(shape, dtype, device, generator):
    m, n, k = shape["M"], shape["N"], shape["K"]
    a = torch.randn(m, k, device=device, generator=generator)
    # Scaled so that c has unit variance whatever K is.
    b = torch.randn(k, n, device=device, generator=generator) * k**-0.5
    return a.to(dtype), b.to(dtype)


def flops(shape) -> float:
    return 2.0 * shape["M"] * shape["N"] * shape["K"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    m, n, k = shape["M"], shape["N"], shape["K"]
    return (1.0 * m * k + k * n + m * n) * torch.empty((), dtype=dtype).element_size()
