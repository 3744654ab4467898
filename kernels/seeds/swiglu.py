"""Seed SwiGLU: a 2-D grid of (row, column block) programs, silu(a) * b in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 1024  # tune: 128, 256, 512, 1024, 2048, 4096
NUM_WARPS = 4  # tune: 1, 2, 4, 8


@triton.jit
def _swiglu_kernel(
    a_ptr, b_ptr, y_ptr, stride_am, stride_bm, stride_ym, n_cols, BLOCK_N: tl.constexpr
):
    # read a and b once, write y once: 3*M*N elements, purely bandwidth-bound
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    a = tl.load(a_ptr + row * stride_am + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_bm + cols, mask=mask, other=0.0).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a = a.contiguous()
    b = b.contiguous()
    n_rows, n_cols = a.shape
    y = torch.empty_like(a)
    grid = (n_rows, triton.cdiv(n_cols, BLOCK_N))
    _swiglu_kernel[grid](
        a,
        b,
        y,
        a.stride(0),
        b.stride(0),
        y.stride(0),
        n_cols,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
    )
    return y
