"""SwiGLU gate: a, b [M, N] -> silu(a) * b, output dtype = a.dtype."""

from __future__ import annotations

import torch

SIGNATURE = "kernel(a, b)"
DESCRIPTION = (
    "a, b [M, N] (same shape); y = silu(a) * b = a * sigmoid(a) * b; output dtype = a.dtype."
)

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
# Interpreter sweep: a single element, odd sizes, and a row longer than any BLOCK_N knob value.
SHAPES_SMOKE = [
    {"M": 1, "N": 1},
    {"M": 37, "N": 1000},
    {"M": 19, "N": 2500},
    {"M": 3, "N": 16500},
]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
# bf16: the output's own rounding is <= 2^-9 relative; fp32: an fp32 kernel is ~1e-7 off, while
# one computing in bf16/fp16 is >= 1e-4 off and must fail.
TOLERANCE = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5},
}


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
