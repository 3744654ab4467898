"""A naive first kernel for token_logprobs: one program per token, one pass over its row of
logits with an online max and sum of exponentials, the softcap applied on the fly, then the
target's logit read once more."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024  # tune: 512, 1024, 2048, 4096, 8192, 16384
NUM_WARPS = 4  # tune: 1, 2, 4, 8, 16
NUM_STAGES = 1  # tune: 1, 2, 3, 4
CAP = 30.0


@triton.jit
def _softcap(x, cap):
    # cap * tanh(x / cap), with tanh(y) = 2 sigmoid(2y) - 1
    return cap * (2.0 * tl.sigmoid(2.0 * x / cap) - 1.0)


@triton.jit
def _token_logprob_kernel(
    x_ptr, t_ptr, y_ptr, stride_xm, n_cols, cap, BLOCK_V: tl.constexpr, NUM_STAGES: tl.constexpr
):
    # read M*V once, plus the target logit; write M
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    offs = tl.arange(0, BLOCK_V)
    m_i = tl.full([BLOCK_V], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_V], tl.float32)
    for start in tl.range(0, n_cols, BLOCK_V, num_stages=NUM_STAGES):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        z = tl.where(mask, _softcap(x, cap), float("-inf"))
        m_new = tl.maximum(m_i, z)
        alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m_i - m_new))
        l_i = l_i * alpha + tl.where(m_new == float("-inf"), 0.0, tl.exp(z - m_new))
        m_i = m_new
    m = tl.max(m_i, axis=0)
    total = tl.sum(tl.where(m_i == float("-inf"), 0.0, l_i * tl.exp(m_i - m)), axis=0)
    t = tl.load(t_ptr + row)
    zt = _softcap(tl.load(x_row + t).to(tl.float32), cap)
    tl.store(y_ptr + row, (zt - m - tl.log(total)).to(y_ptr.dtype.element_ty))


def kernel(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    logits = logits.contiguous()
    n_rows, n_cols = logits.shape
    out = torch.empty(n_rows, dtype=logits.dtype, device=logits.device)
    _token_logprob_kernel[(n_rows,)](
        logits,
        target,
        out,
        logits.stride(0),
        n_cols,
        CAP,
        BLOCK_V=BLOCK_V,
        NUM_STAGES=NUM_STAGES,
        num_warps=NUM_WARPS,
    )
    return out
