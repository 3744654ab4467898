"""A Llama-style decoder block in plain PyTorch, written as calls to named ops.

    h = x + matmul(attention(rope(q), rope(k), v), Wo)   q, k, v = split(matmul(rmsnorm(x), Wqkv))
    y = h + matmul(swiglu(matmul(n, Wg), matmul(n, Wu)), Wd)                       n = rmsnorm(h)

Each op is looked up by name in an `ops` dict, and the names are the problems' names, so one
block definition serves three callers:
- the problems' references (`reference_ops()`): the eager block, and what torch.compile compiles;
- the release re-validation's end-to-end check (`kernels.harness.e2e`): the same block with a
  candidate kernel in the place of the op its problem declares (`BLOCK_OP`);
- the model benchmark (`benchmarks/model_block.py`): every op through `kernels.library.load`.

Three variants host the built-in problems that a Llama block does not call: `norm="layernorm"`
(with a bias), `mlp="matmul_bias_gelu"` (gelu(n @ Wg + b) instead of the SwiGLU pair) and
`attention="softmax"` (explicit scores, the softmax op, then p @ v). `Config.hosting(op)` picks
the variant that calls `op`.

Decode (`decode`) runs one new token per sequence against a KV cache. Its attention (one query
row over the whole cache) is no problem's signature, so it is the `decode_attention` op, a torch
call in every ops dict. Every input an op receives is contiguous, as the harness's are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

# The ops a problem may stand in for (its BLOCK_OP), i.e. the block's problem-shaped calls.
OPS = (
    "rmsnorm",
    "layernorm",
    "matmul",
    "matmul_bias_gelu",
    "swiglu",
    "rope",
    "attention",
    "softmax",
)
# Ops the block calls that no problem covers: always torch.
TORCH_OPS = ("decode_attention",)
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class Config:
    batch: int
    seq: int  # prefill: tokens per sequence; decode: the KV cache length, new token included
    hidden: int
    heads: int
    mlp: int
    norm: str = "rmsnorm"  # or "layernorm"
    mlp_op: str = "swiglu"  # or "matmul_bias_gelu"
    attention: str = "attention"  # or "softmax"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def hosting(self, op: str) -> Config:
        """This configuration in the variant whose forward pass calls `op`."""
        if op in ("rmsnorm", "layernorm"):
            return replace(self, norm=op)
        if op in ("swiglu", "matmul_bias_gelu"):
            return replace(self, mlp_op=op)
        if op in ("attention", "softmax"):
            return replace(self, attention=op)
        if op in ("matmul", "rope"):
            return self
        raise ValueError(f"{op!r} is not an op of the block (one of {', '.join(OPS)})")

    def ops_called(self, phase: str = "prefill") -> tuple[str, ...]:
        """The problem-shaped ops the forward pass calls, in call order."""
        attention = ("decode_attention",) if phase == "decode" else (self.attention,)
        mlp = ("matmul_bias_gelu",) if self.mlp_op == "matmul_bias_gelu" else ("swiglu",)
        return (self.norm, "matmul", "rope", *attention, *mlp)

    def label(self) -> str:
        return f"B={self.batch} S={self.seq} hidden={self.hidden} heads={self.heads} mlp={self.mlp}"


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q [B, H, 1, D] is the newest position: it sees every key in the cache, so no mask.
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def reference_ops() -> dict[str, Callable]:
    """Every op of the block as its problem's PyTorch reference (the eager block)."""
    from kernels import problems

    ops: dict[str, Callable] = {name: problems.load(name).module.reference for name in OPS}
    ops["decode_attention"] = _decode_attention
    return ops


def make_weights(
    cfg: Config,
    dtype: torch.dtype,
    device: str,
    seed: int,
    positions: int | None = None,
) -> dict[str, torch.Tensor]:
    """Random weights scaled so activations keep unit size, and rotary tables for `positions`
    (default cfg.seq) positions, computed in fp32 as models do."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    h, m, d = cfg.hidden, cfg.mlp, cfg.head_dim

    def rnd(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, device=device, generator=gen) * scale).to(dtype)

    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    pos = torch.arange(positions or cfg.seq, device=device, dtype=torch.float32)
    angles = pos[:, None] * inv_freq[None]
    return {
        "n1w": 1.0 + rnd(h, scale=0.1),
        "n1b": rnd(h, scale=0.1),
        "n2w": 1.0 + rnd(h, scale=0.1),
        "n2b": rnd(h, scale=0.1),
        "wqkv": rnd(h, 3 * h, scale=h**-0.5),
        "wo": rnd(h, h, scale=h**-0.5),
        "wg": rnd(h, m, scale=h**-0.5),
        "wu": rnd(h, m, scale=h**-0.5),
        "bg": rnd(m, scale=0.1),
        "wd": rnd(m, h, scale=m**-0.5),
        "cos": angles.cos().to(dtype).contiguous(),
        "sin": angles.sin().to(dtype).contiguous(),
    }


def make_cache(cfg: Config, dtype: torch.dtype, device: str, seed: int) -> dict[str, torch.Tensor]:
    """A KV cache [B, H, seq, D] holding seq - 1 earlier tokens (random keys and values)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    size = (cfg.batch, cfg.heads, cfg.seq, cfg.head_dim)
    return {
        "k": torch.randn(size, device=device, generator=gen).to(dtype),
        "v": torch.randn(size, device=device, generator=gen).to(dtype),
    }


def _norm(cfg: Config, ops: dict, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    if cfg.norm == "layernorm":
        return ops["layernorm"](x, w, b)
    return ops["rmsnorm"](x, w)


def _mlp(cfg: Config, ops: dict, n: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    if cfg.mlp_op == "matmul_bias_gelu":
        mid = ops["matmul_bias_gelu"](n, w["wg"], w["bg"])
    else:
        mid = ops["swiglu"](ops["matmul"](n, w["wg"]), ops["matmul"](n, w["wu"]))
    return ops["matmul"](mid.contiguous(), w["wd"])


def prefill(
    cfg: Config, w: dict[str, torch.Tensor], x: torch.Tensor, ops: dict[str, Callable]
) -> torch.Tensor:
    """The block on a whole sequence: x [B, S, hidden] -> [B, S, hidden], causal attention."""
    b, s, hid = x.shape
    heads, d = cfg.heads, cfg.head_dim
    x2 = x.reshape(b * s, hid)
    h = _norm(cfg, ops, x2, w["n1w"], w["n1b"])
    qkv = ops["matmul"](h, w["wqkv"])
    q, k, v = (t.contiguous().view(b, s, heads, d) for t in qkv.split(hid, dim=-1))
    cos, sin = w["cos"][:s], w["sin"][:s]
    q = ops["rope"](q, cos, sin)
    k = ops["rope"](k, cos, sin)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    if cfg.attention == "softmax":
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf")).contiguous()
        p = ops["softmax"](scores.view(b * heads * s, s)).view(b, heads, s, s)
        o = p @ v
    else:
        o = ops["attention"](q, k, v)
    o = o.transpose(1, 2).contiguous().view(b * s, hid)
    x1 = x2 + ops["matmul"](o, w["wo"])
    y = x1 + _mlp(cfg, ops, _norm(cfg, ops, x1, w["n2w"], w["n2b"]), w)
    return y.view(b, s, hid)


def decode(
    cfg: Config,
    w: dict[str, torch.Tensor],
    x: torch.Tensor,
    cache: dict[str, torch.Tensor],
    ops: dict[str, Callable],
) -> torch.Tensor:
    """One decode step: x [B, 1, hidden] is the token at position cfg.seq - 1; its key and value
    are written into the cache there (a fixed slot, so a CUDA graph replays the same step)."""
    b, one, hid = x.shape
    heads, d, pos = cfg.heads, cfg.head_dim, cfg.seq - 1
    x2 = x.reshape(b, hid)
    h = _norm(cfg, ops, x2, w["n1w"], w["n1b"])
    qkv = ops["matmul"](h, w["wqkv"])
    q, k, v = (t.contiguous().view(b, 1, heads, d) for t in qkv.split(hid, dim=-1))
    cos, sin = w["cos"][pos : pos + 1], w["sin"][pos : pos + 1]
    q = ops["rope"](q, cos, sin)
    k = ops["rope"](k, cos, sin)
    cache["k"][:, :, pos] = k[:, 0]
    cache["v"][:, :, pos] = v[:, 0]
    o = ops["decode_attention"](q.transpose(1, 2).contiguous(), cache["k"], cache["v"])
    o = o.transpose(1, 2).reshape(b, hid)
    x1 = x2 + ops["matmul"](o, w["wo"])
    y = x1 + _mlp(cfg, ops, _norm(cfg, ops, x1, w["n2w"], w["n2b"]), w)
    return y.view(b, one, hid)
