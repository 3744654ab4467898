"""End-to-end check: a small transformer block with the kernel in its slot, against the same
block with the reference, both captured in CUDA graphs and timed interleaved.

A kernel can be fast alone and still slow the model it lands in (a sync, a host read, a layout
copy, a graph it cannot be captured in, an L2 it thrashes). The block catches that: it must be
right, capture and replay in a graph, and not make the block slower beyond the measured noise.

Runs inside the sandboxed child (childrun calls it with the candidate's `kernel`); on the CPU
(tests) it checks correctness only, with a small configuration.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import problems

# bf16 through a whole block drifts more than one op does; a wrong kernel is far outside this.
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 2e-2, torch.float32: 1e-4, torch.float64: 1e-9}
# The op each problem replaces in the block.
SLOTS = {
    "softmax": "softmax",
    "rmsnorm": "norm",
    "layernorm": "norm",
    "swiglu": "act",
    "rope": "rope",
    "matmul": "linear",
    "matmul_bias_gelu": "up",
    "attention": "attn",
}


@dataclass(frozen=True)
class Config:
    batch: int = 2
    seq: int = 512
    hidden: int = 1024
    heads: int = 8
    mlp: int = 2816


GPU_CONFIG = Config()
CPU_CONFIG = Config(batch=1, seq=12, hidden=64, heads=2, mlp=96)


def _ref(name: str) -> Callable:
    return problems.load(name).module.reference


def reference_ops(problem: str) -> dict[str, Callable]:
    rms, ln = _ref("rmsnorm"), _ref("layernorm")
    gelu = _ref("matmul_bias_gelu")
    norm = (lambda x, w, b: ln(x, w, b)) if problem == "layernorm" else (lambda x, w, b: rms(x, w))
    return {
        "norm": norm,
        "linear": _ref("matmul"),
        "up": lambda x, w, b: gelu(x, w, b),
        "act": _ref("swiglu"),
        "rope": _ref("rope"),
        "attn": _ref("attention"),
        "softmax": _ref("softmax"),
    }


def candidate_ops(problem: str, kernel: Callable) -> dict[str, Callable]:
    ops = reference_ops(problem)
    slot = SLOTS.get(problem)
    if slot is None:
        raise ValueError(f"no end-to-end block slot for problem {problem!r}")
    if slot == "norm" and problem == "rmsnorm":
        ops["norm"] = lambda x, w, b: kernel(x, w)
    else:
        ops[slot] = kernel
    return ops


def make_block(cfg: Config, dtype: torch.dtype, device: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    h, m = cfg.hidden, cfg.mlp

    def rnd(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, device=device, generator=gen) * scale).to(dtype)

    d = h // cfg.heads
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    angles = torch.arange(cfg.seq, device=device, dtype=torch.float32)[:, None] * inv_freq[None]
    return {
        "n1w": 1.0 + rnd(h, scale=0.1),
        "n1b": rnd(h, scale=0.1),
        "n2w": 1.0 + rnd(h, scale=0.1),
        "n2b": rnd(h, scale=0.1),
        "wqkv": rnd(h, 3 * h, scale=h**-0.5),
        "wo": rnd(h, h, scale=h**-0.5),
        "wg": rnd(h, m, scale=h**-0.5),
        "wu": rnd(h, m, scale=h**-0.5),
        "b1": rnd(m, scale=0.1),
        "w2": rnd(m, h, scale=m**-0.5),
        "cos": angles.cos().to(dtype).contiguous(),
        "sin": angles.sin().to(dtype).contiguous(),
    }


def forward(
    problem: str, cfg: Config, w: dict[str, torch.Tensor], x: torch.Tensor, ops: dict
) -> torch.Tensor:
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)). Every kernel input contiguous."""
    b, s, hid = x.shape
    heads, d = cfg.heads, hid // cfg.heads
    x2 = x.reshape(b * s, hid)
    h = ops["norm"](x2, w["n1w"], w["n1b"])
    qkv = ops["linear"](h, w["wqkv"])
    q, k, v = (t.contiguous().view(b, s, heads, d) for t in qkv.split(hid, dim=-1))
    q = ops["rope"](q, w["cos"], w["sin"])
    k = ops["rope"](k, w["cos"], w["sin"])
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    if problem == "softmax":
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf")).contiguous()
        p = ops["softmax"](scores.view(b * heads * s, s)).view(b, heads, s, s)
        o = p @ v
    else:
        o = ops["attn"](q, k, v)
    o = o.transpose(1, 2).contiguous().view(b * s, hid)
    x1 = x2 + ops["linear"](o, w["wo"])
    h2 = ops["norm"](x1, w["n2w"], w["n2b"])
    if problem == "matmul_bias_gelu":
        mid = ops["up"](h2, w["wg"], w["b1"])
    else:
        mid = ops["act"](ops["linear"](h2, w["wg"]), ops["linear"](h2, w["wu"]))
    y = x1 + ops["linear"](mid.contiguous(), w["w2"])
    return y.view(b, s, hid)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return math.inf
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def run(
    problem: str,
    kernel: Callable,
    *,
    device: str,
    dtype: torch.dtype,
    seed: int,
    budget_s: float = 0.5,
    cfg: Config | None = None,
) -> dict:
    """{"passed", "detail", ...numbers}. passed False: wrong, breaks capture, or slows the block."""
    cfg = cfg or (GPU_CONFIG if device == "cuda" else CPU_CONFIG)
    ref_ops, cand_ops = reference_ops(problem), candidate_ops(problem, kernel)
    w = make_block(cfg, dtype, device, seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)

    def new_x() -> torch.Tensor:
        return torch.randn(cfg.batch, cfg.seq, cfg.hidden, device=device, generator=gen).to(dtype)

    tol = TOLERANCE.get(dtype, 3e-2)
    block = f"block B={cfg.batch} S={cfg.seq} hidden={cfg.hidden} heads={cfg.heads} mlp={cfg.mlp}"
    out: dict = {"block": block, "slot": SLOTS.get(problem), "tolerance": tol}
    with torch.no_grad():
        x = new_x()
        y_ref = forward(problem, cfg, w, x, ref_ops)
        y = forward(problem, cfg, w, x, cand_ops)
        err = rel_l2(y, y_ref)
        out["rel_l2_err"] = err
        if not err <= tol:
            return {
                **out,
                "passed": False,
                "failure": "incorrect",
                "detail": f"{block}: output off by rel. L2 {err:.3g} (tolerance {tol:g})",
            }
        if device != "cuda":
            return {
                **out,
                "passed": True,
                "detail": f"{block}: correct (graph and timing need CUDA)",
            }
        return _graphs(problem, cfg, w, x, ref_ops, cand_ops, new_x, out, tol, budget_s, seed)


def _graphs(problem, cfg, w, x, ref_ops, cand_ops, new_x, out, tol, budget_s, seed) -> dict:
    from kernels.harness import timing

    block = out["block"]
    graphs = {}
    for name, ops in (("reference", ref_ops), ("candidate", cand_ops)):
        try:
            g, outs = timing.capture([lambda ops=ops: forward(problem, cfg, w, x, ops)], reps=1)
        except Exception as e:  # capture refused: a sync, a host read, a side stream ...
            torch.cuda.synchronize()
            return {
                **out,
                "passed": False,
                "failure": "hack_suspected",
                "detail": f"{block}: the {name} block cannot be captured in a CUDA graph: "
                f"{type(e).__name__}: {e}"[:500],
            }
        graphs[name] = (g, outs[0])
    x.copy_(new_x())
    for g, _ in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    y_ref = forward(problem, cfg, w, x, ref_ops)
    err = rel_l2(graphs["candidate"][1], y_ref)
    out["graph_rel_l2_err"] = err
    if not err <= tol:
        return {
            **out,
            "passed": False,
            "failure": "hack_suspected",
            "detail": f"{block}: wrong under CUDA-graph replay (rel. L2 {err:.3g})",
        }
    samplers = {name: timing.graph_sampler(g) for name, (g, _) in graphs.items()}
    stats = timing.interleaved(
        samplers,
        per_call_divisor={n: 1 for n in samplers},
        budget_s=budget_s,
        rng=random.Random(seed),
    )
    ref_ms, cand_ms = stats["reference"]["median"], stats["candidate"]["median"]
    noise = (stats["reference"].get("spread") or 0.0) + (stats["candidate"].get("spread") or 0.0)
    out.update(
        reference_ms=ref_ms,
        candidate_ms=cand_ms,
        noise=noise,
        speedup=ref_ms / cand_ms if cand_ms else None,
    )
    if cand_ms > ref_ms * (1 + noise):
        return {
            **out,
            "passed": False,
            "failure": "hack_suspected",
            "detail": f"{block}: the kernel slows the block: {cand_ms:.4g} ms vs "
            f"{ref_ms:.4g} ms with the reference (noise {noise:.1%})",
        }
    return {
        **out,
        "passed": True,
        "detail": f"{block} in a CUDA graph: {cand_ms:.4g} ms vs {ref_ms:.4g} ms "
        f"with the reference ({ref_ms / cand_ms:.2f}x), output within rel. L2 {tol:g}",
    }
