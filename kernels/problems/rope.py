"""Rotary position embedding, rotate-half (NeoX/Llama) layout: x [B, S, H, D], cos/sin [S, D/2]."""

from __future__ import annotations

import torch

SIGNATURE = "kernel(x, cos, sin)"
DESCRIPTION = (
    "x [B, S, H, D], cos/sin [S, D/2]; rotate-half (NeoX style): with x1 = x[..., :D/2], "
    "x2 = x[..., D/2:], out[..., :D/2] = x1*cos - x2*sin, out[..., D/2:] = x2*cos + x1*sin "
    "(cos/sin broadcast over B and H); output dtype = x.dtype."
)
# Which input and axis each shape dim is read from, (input, axis): x [B, S, H, D], cos/sin [S, D/2].
DIMS = {"B": (0, 0), "S": (0, 1), "H": (0, 2), "D": (0, 3)}
RANKS = (4, 2, 2)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "rope"
ROPE_THETA = 10000.0
MAX_START = 32768  # positions of a table start below this

# Queries (H = 32, 40, 28) and grouped KV heads (H = 8) of Llama/Qwen-style models, head dims
# 128, 64 and Phi-3's 96, decode (S = 1) to 32768-token prefill; S = 2000 and H = 28 are odd.
SHAPES_FULL = [
    {"B": 64, "S": 1, "H": 32, "D": 128},
    {"B": 1, "S": 4096, "H": 32, "D": 128},
    {"B": 4, "S": 4096, "H": 32, "D": 128},
    {"B": 8, "S": 4096, "H": 8, "D": 128},
    {"B": 8, "S": 2048, "H": 32, "D": 128},
    {"B": 1, "S": 8192, "H": 40, "D": 128},
    {"B": 3, "S": 2000, "H": 28, "D": 128},
    {"B": 1, "S": 32768, "H": 32, "D": 128},
    {"B": 1, "S": 32768, "H": 8, "D": 128},
    {"B": 4, "S": 8192, "H": 32, "D": 64},
    {"B": 2, "S": 16384, "H": 16, "D": 64},
    {"B": 2, "S": 4096, "H": 32, "D": 96},
]
# Interpreter sweep: one token, a non-power-of-two head dim (96), more heads than any BLOCK_H
# knob value (40 > 32) with a ragged tail, odd sequence lengths and batches.
SHAPES_SMOKE = [
    {"B": 1, "S": 1, "H": 1, "D": 8},
    {"B": 2, "S": 37, "H": 5, "D": 96},
    {"B": 1, "S": 19, "H": 40, "D": 64},
    {"B": 3, "S": 13, "H": 8, "D": 128},
]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
# bf16: an fp32-math kernel is only the output's rounding off (<= 2^-9 relative): 0.26 of this
# bound on the H200 sweep. The eager reference (bf16 math, as in HF transformers) rounds x1*cos
# and x2*sin before they cancel, up to ~2^-9 * 2 * max|x| where out is near zero: 0.58-0.74 of
# this bound, but 1.2-1.5x over an atol of 1e-2. fp32: an fp32 kernel is ~1e-7 off, while one
# computing in bf16/fp16 is >= 1e-4 off and must fail.
TOLERANCE = {
    torch.bfloat16: {"atol": 2e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5},
}


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def make_inputs(shape, dtype, device, generator):
    b, s, h, d = shape["B"], shape["S"], shape["H"], shape["D"]
    x = torch.randn(b, s, h, d, device=device, generator=generator)
    # Real rotary tables: angle = position * theta^(-2i/D), computed in fp32 as models do. The
    # positions start at a random offset (a chunk of a longer sequence, as in chunked prefill):
    # the tables differ from one set of inputs to the next, so a kernel that computes its own
    # from position 0 instead of reading cos and sin is wrong.
    start = 0
    if generator is not None:
        start = int(torch.randint(0, MAX_START, (1,), generator=generator, device=device).item())
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    pos = torch.arange(start, start + s, device=device, dtype=torch.float32)
    angles = pos[:, None] * inv_freq[None, :]
    return x.to(dtype), angles.cos().to(dtype), angles.sin().to(dtype)


def flops(shape) -> float:
    # two multiplies and an add per output element
    return 3.0 * shape["B"] * shape["S"] * shape["H"] * shape["D"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    b, s, h, d = shape["B"], shape["S"], shape["H"], shape["D"]
    # x read and out written once; cos and sin are [S, D/2] each
    return (2.0 * b * s * h * d + s * d) * torch.empty((), dtype=dtype).element_size()
