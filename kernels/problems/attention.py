"""Causal attention: q, k, v [B, H, S, D] -> softmax(q k^T / sqrt(D) + causal mask) v."""

from __future__ import annotations

import math

import torch

SIGNATURE = "kernel(q, k, v)"
DESCRIPTION = (
    "q, k, v [B, H, S, D]; causal self-attention (query i sees keys 0..i), scale 1/sqrt(D), "
    "fp32 softmax and accumulation; output [B, H, S, D], dtype = q.dtype."
)
# Which input and axis each shape dim is read from, (input, axis): q, k, v [B, H, S, D].
DIMS = {"B": (0, 0), "H": (0, 1), "S": (0, 2), "D": (0, 3)}
RANKS = (4, 4, 4)  # of each input, in signature order
# The op of the model block (kernels/block.py) this kernel stands in for.
BLOCK_OP = "attention"

# Prefill attention of 7B-70B-class models, head dims 128 and 64, S from 512 to 32768 with B*H
# reduced as S grows (q, k, v, out stay <= 64 MiB each); S = 1500 and 3000 divide no tile.
SHAPES_FULL = [
    {"B": 8, "H": 32, "S": 512, "D": 128},
    {"B": 4, "H": 32, "S": 1024, "D": 128},
    {"B": 4, "H": 16, "S": 1500, "D": 128},
    {"B": 2, "H": 32, "S": 2048, "D": 128},
    {"B": 1, "H": 32, "S": 3000, "D": 128},
    {"B": 1, "H": 32, "S": 4096, "D": 128},
    {"B": 1, "H": 32, "S": 8192, "D": 128},
    {"B": 1, "H": 16, "S": 16384, "D": 128},
    {"B": 1, "H": 8, "S": 32768, "D": 128},
    {"B": 16, "H": 16, "S": 512, "D": 64},
    {"B": 4, "H": 16, "S": 2048, "D": 64},
    {"B": 1, "H": 16, "S": 8192, "D": 64},
    {"B": 1, "H": 8, "S": 32768, "D": 64},
]
# Interpreter sweep: a single token, odd lengths, a non-power-of-two head dim (48), and S longer
# than any BLOCK_M / BLOCK_N knob value (300 > 128) with a ragged tail.
SHAPES_SMOKE = [
    {"B": 1, "H": 1, "S": 1, "D": 16},
    {"B": 2, "H": 3, "S": 37, "D": 64},
    {"B": 1, "H": 2, "S": 300, "D": 48},
    {"B": 1, "H": 1, "S": 130, "D": 128},
]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
# bf16: a correct kernel (fp32 softmax, P rounded to bf16 for P @ V, like FlashAttention and
# eager SDPA) has ~2e-3 absolute error in its first rows; on the H200 sweep that needs atol up to
# ~1.2e-2 of rms(out) at S = 32768 (the same for SDPA, the seed and the tuned kernel): 2e-2.
# fp32: the interpreter's tl.dot is exact, but exp2 of scores that reach ~12 leaves the output up
# to ~6e-6 * rms(out) off (0.29 of a 2e-5 bound), hence 5e-5; l2 stays 1e-5 (fp32 kernels
# measure <= 6e-7), which tf32/fp16 (>= 1.4e-4) and bf16 math fail by far.
TOLERANCE = {
    torch.bfloat16: {"atol": 2e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float32: {"atol": 5e-5, "rtol": 5e-5, "l2": 1e-5},
}

# Elements of one block of scores in the oracle: 2^25 float64 = 256 MiB, so the scores, their
# exponentials and the mask stay well under ~1 GiB at S = 32768.
_ORACLE_CHUNK = 1 << 25
LOGIT_STD = 3.0


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Explicit causal softmax attention in the inputs' dtype (float64), chunked over heads and
    query blocks so that the S x S scores never exist at once."""
    b, h, s, d = q.shape
    qf, kf, vf = (t.reshape(b * h, s, d) for t in (q, k, v))
    out = torch.empty_like(qf)
    scale = 1.0 / math.sqrt(d)
    rows = max(1, min(s, _ORACLE_CHUNK // s))
    for q0 in range(0, s, rows):
        q1 = min(s, q0 + rows)
        # causal: queries q0..q1-1 see keys 0..q1-1 only
        keep = (
            torch.arange(q0, q1, device=q.device)[:, None]
            >= torch.arange(q1, device=q.device)[None, :]
        )
        heads = max(1, _ORACLE_CHUNK // ((q1 - q0) * q1))
        for h0 in range(0, b * h, heads):
            h1 = min(b * h, h0 + heads)
            scores = torch.matmul(qf[h0:h1, q0:q1], kf[h0:h1, :q1].transpose(-1, -2)) * scale
            scores.masked_fill_(~keep, float("-inf"))
            scores -= scores.amax(dim=-1, keepdim=True)
            p = scores.exp_()
            p /= p.sum(dim=-1, keepdim=True)
            out[h0:h1, q0:q1] = torch.matmul(p, vf[h0:h1, :q1])
    return out.reshape(b, h, s, d)


def make_inputs(shape, dtype, device, generator):
    size = (shape["B"], shape["H"], shape["S"], shape["D"])
    # Peaked rows, as trained heads have: q and k ~ N(0, LOGIT_STD) give q.k / sqrt(D) a std of
    # LOGIT_STD, so a row attends to a few keys and the output keeps an O(1) size at every S.
    # With unit q, k a row averages thousands of values and rms(out) shrinks like
    # sqrt(log(S) / S) (0.03 at S = 32768), far below the ~2e-3 absolute noise a correct bf16
    # kernel has in its first rows (P rounded to bf16): no atol relative to rms(out) would fit.
    qk_std = LOGIT_STD**0.5
    q = torch.randn(size, device=device, generator=generator) * qk_std
    k = torch.randn(size, device=device, generator=generator) * qk_std
    v = torch.randn(size, device=device, generator=generator)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def flops(shape) -> float:
    b, h, s, d = shape["B"], shape["H"], shape["S"], shape["D"]
    # q k^T and p v over the S(S+1)/2 causal (query, key) pairs, 2 flops per multiply-add each
    return 4.0 * b * h * d * (s * (s + 1) / 2.0)


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    b, h, s, d = shape["B"], shape["H"], shape["S"], shape["D"]
    return 4.0 * b * h * s * d * torch.empty((), dtype=dtype).element_size()
