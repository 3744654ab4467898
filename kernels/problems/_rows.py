"""Shared by the row-wise problems (softmax, rmsnorm, layernorm, swiglu)."""

from __future__ import annotations

import torch

# Interpreter sweep: a single element, odd sizes, rows crossing program boundaries and a row
# longer than any BLOCK_N knob value, so looping kernels cross blocks with a ragged tail.
SMOKE = [
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
