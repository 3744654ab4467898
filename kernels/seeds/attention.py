"""Seed causal attention, flash-attention style: one program per (query block, batch*head); it walks
the key blocks up to the diagonal (blocks above it are skipped) with an online softmax in fp32."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_M = 64  # tune: 16, 32, 64, 128
BLOCK_N = 64  # tune: 16, 32, 64, 128
NUM_WARPS = 4  # tune: 2, 4, 8
NUM_STAGES = 2  # tune: 1, 2, 3, 4


@triton.jit
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    n_heads,
    seq_len,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # read Q and write O once; K and V are re-read once per query block (the causal half)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    o_base = o_ptr + b * stride_ob + h * stride_oh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_mask = (offs_m[:, None] < seq_len) & d_mask[None, :]
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)

    # Every row sees key 0 in the first block, so m_i is finite after one step: no NaNs.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_in = cols < seq_len
        k = tl.load(
            k_base + cols[None, :] * stride_kn + offs_d[:, None],
            mask=kv_in[None, :] & d_mask[:, None],
            other=0.0,
        )
        # scores in log2 units: qk_scale = log2(e) / sqrt(D), so exp2 gives the softmax weights
        s = tl.dot(q, k) * qk_scale
        s = tl.where((offs_m[:, None] >= cols[None, :]) & kv_in[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_base + cols[:, None] * stride_vn + offs_d[None, :],
            mask=kv_in[:, None] & d_mask[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(
        o_base + offs_m[:, None] * stride_om + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=q_mask,
    )


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q = q.contiguous()
    k = k.contiguous()
    v = v.contiguous()
    batch, n_heads, seq_len, head_dim = q.shape
    o = torch.empty_like(q)
    qk_scale = 1.4426950408889634 / math.sqrt(head_dim)  # log2(e) / sqrt(D)
    grid = (triton.cdiv(seq_len, BLOCK_M), batch * n_heads)
    _attention_kernel[grid](
        q,
        k,
        v,
        o,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        n_heads,
        seq_len,
        qk_scale,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    return o
