"""Seed RoPE (rotate-half): one program per token; it loads that position's cos/sin once and
rotates the token's heads BLOCK_H at a time."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H = 4  # tune: 1, 2, 4, 8, 16, 32
NUM_WARPS = 4  # tune: 1, 2, 4, 8


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    y_ptr,
    seq_len,
    n_heads,
    stride_xb,
    stride_xs,
    stride_xh,
    stride_yb,
    stride_ys,
    stride_yh,
    stride_cs,
    stride_ss,
    HALF_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # read x once and one cos/sin row per token, write x's size
    tok = tl.program_id(0)
    b = (tok // seq_len).to(tl.int64)
    s = (tok % seq_len).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HALF_D
    cos = tl.load(cos_ptr + s * stride_cs + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + s * stride_ss + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    x_tok = x_ptr + b * stride_xb + s * stride_xs
    y_tok = y_ptr + b * stride_yb + s * stride_ys
    for h0 in range(0, n_heads, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask = (offs_h[:, None] < n_heads) & d_mask[None, :]
        x1_ptrs = x_tok + offs_h[:, None] * stride_xh + offs_d[None, :]
        y1_ptrs = y_tok + offs_h[:, None] * stride_yh + offs_d[None, :]
        x1 = tl.load(x1_ptrs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x1_ptrs + HALF_D, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * cos[None, :] - x2 * sin[None, :]
        y2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(y1_ptrs, y1.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y1_ptrs + HALF_D, y2.to(y_ptr.dtype.element_ty), mask=mask)


def kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    cos = cos.contiguous()
    sin = sin.contiguous()
    batch, seq_len, n_heads, head_dim = x.shape
    half = head_dim // 2
    y = torch.empty_like(x)
    _rope_kernel[(batch * seq_len,)](
        x,
        cos,
        sin,
        y,
        seq_len,
        n_heads,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        y.stride(0),
        y.stride(1),
        y.stride(2),
        cos.stride(0),
        sin.stride(0),
        HALF_D=half,
        BLOCK_D=triton.next_power_of_2(half),
        BLOCK_H=BLOCK_H,
        num_warps=NUM_WARPS,
    )
    return y
