"""A user's own problem, kept outside the built-ins: softcapped token log-probabilities.

Gemma-2-style models cap their final logits (`z = cap * tanh(logits / cap)`, cap = 30) before
the softmax. Serving engines return the log-probability of each sampled token (an API's
`logprobs`), and RL rollouts need the same per generated token:

    logprob[m] = z[m, target[m]] - logsumexp(z[m, :])

One pass over a vocabulary-sized row per token: memory-bound, and torch.compile has to fuse a
tanh, a row max, a row sum of exponentials and a gather.

Register it with `AUTOWEB_PROBLEM_DIRS=benchmarks/user_problems` (or `--problems-dir`).
"""

from __future__ import annotations

import torch

SIGNATURE = "kernel(logits, target)"
DESCRIPTION = (
    "logits [M, V], target [M] int64; z = 30 * tanh(logits / 30); "
    "out[m] = z[m, target[m]] - logsumexp(z[m]); output [M] in the logits' dtype."
)
SEED = "seeds/token_logprobs.py"
CAP = 30.0
DIMS = {"M": (0, 0), "V": (0, 1)}
RANKS = (2, 1)

# Decode batches (1-256 tokens) and prefill / RL rollout chunks (1k-8k tokens) over the
# vocabularies of Llama 2 (32000), Llama 3 (128256) and Gemma (256000).
SHAPES_FULL = [
    {"M": 1, "V": 128256},
    {"M": 16, "V": 128256},
    {"M": 64, "V": 128256},
    {"M": 256, "V": 128256},
    {"M": 1024, "V": 128256},
    {"M": 2048, "V": 128256},
    {"M": 128, "V": 32000},
    {"M": 2048, "V": 32000},
    {"M": 8192, "V": 32000},
    {"M": 32, "V": 256000},
    {"M": 1024, "V": 256000},
]
# The interpreter: one element, odd sizes, and a row longer than any BLOCK_V knob value.
SHAPES_SMOKE = [
    {"M": 1, "V": 1},
    {"M": 37, "V": 257},
    {"M": 7, "V": 1000},
    {"M": 3, "V": 16500},
]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
# bf16 output: its own rounding is <= 2^-9 relative; fp32: a kernel computing in fp32 is
# ~1e-6 off (a sum over up to 256000 terms), one computing in bf16 is >= 1e-3 off.
TOLERANCE = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5},
}


def reference(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # fp32 math (fp64 when the oracle passes fp64)
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    z = CAP * torch.tanh(x / CAP)
    picked = z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return (picked - torch.logsumexp(z, dim=-1)).to(logits.dtype)


def make_inputs(shape, dtype, device, generator):
    m, v = shape["M"], shape["V"]
    # Logits of a trained LM head: a few units of spread, some far beyond the cap.
    logits = torch.randn(m, v, device=device, generator=generator) * 4.0
    target = torch.randint(0, v, (m,), device=device, generator=generator)
    return logits.to(dtype), target


def flops(shape) -> float:
    # tanh (~4), max, subtract, exp, add per element
    return 8.0 * shape["M"] * shape["V"]


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    elt = torch.empty((), dtype=dtype).element_size()
    return shape["M"] * shape["V"] * elt + shape["M"] * (8 + elt)
