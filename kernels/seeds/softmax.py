"""Seed softmax: one program per row, online max/sum over column blocks, then a normalising pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 1024  # tune: 256, 512, 1024, 2048, 4096, 8192
NUM_WARPS = 4  # tune: 1, 2, 4, 8, 16


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, stride_xm, stride_ym, n_cols, BLOCK_N: tl.constexpr):
    # read M*N twice (stats pass + normalise pass), write M*N
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    y_row = y_ptr + row.to(tl.int64) * stride_ym
    offs = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_i, x)
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m_i - m_new))
        l_i = l_i * scale + tl.where(m_new == float("-inf"), 0.0, tl.exp(x - m_new))
        m_i = m_new
    m = tl.max(m_i, axis=0)
    l_sum = tl.sum(tl.where(m_i == float("-inf"), 0.0, l_i * tl.exp(m_i - m)), axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m) / l_sum
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    _softmax_kernel[(n_rows,)](
        x, y, x.stride(0), y.stride(0), n_cols, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS
    )
    return y
