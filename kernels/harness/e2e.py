"""End-to-end check: the model block (kernels.block) with the kernel in the place of the op
its problem declares (`BLOCK_OP`), against the same block with the references, both captured in
CUDA graphs and timed interleaved.

A kernel can be fast alone and still slow the model it lands in (a sync, a host read, a layout
copy, a graph it cannot be captured in, an L2 it thrashes). The block catches that: it must be
right, capture and replay in a graph, and not make the block slower beyond the measured noise.
A problem that declares no BLOCK_OP has no place in the block: re-validation reports the check
as not applicable instead of running it (kernels.revalidate).

Runs inside the sandboxed child (childrun calls it with the candidate's `kernel`); on the CPU
(tests) it checks correctness only, with a small configuration.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch

from kernels import block, problems

# bf16 through a whole block drifts more than one op does; a wrong kernel is far outside this.
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 2e-2, torch.float32: 1e-4, torch.float64: 1e-9}
GPU_CONFIG = block.Config(batch=2, seq=512, hidden=1024, heads=8, mlp=2816)
CPU_CONFIG = block.Config(batch=1, seq=12, hidden=64, heads=2, mlp=96)


def block_op(problem: problems.Problem | str) -> str:
    """The block op the problem's kernel stands in for; ValueError when it declares none."""
    if isinstance(problem, str):
        problem = problems.load(problem)
    if problem.block_op is None:
        raise ValueError(
            f"problem {problem.name!r} declares no BLOCK_OP: it has no place in the block"
        )
    return problem.block_op


def candidate_ops(op: str, kernel: Callable) -> dict[str, Callable]:
    ops = block.reference_ops()
    ops[op] = kernel
    return ops


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return math.inf
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def run(
    problem: problems.Problem | str,
    kernel: Callable,
    *,
    device: str,
    dtype: torch.dtype,
    seed: int,
    budget_s: float = 0.5,
    cfg: block.Config | None = None,
) -> dict:
    """{"passed", "detail", ...numbers}. passed False: wrong, breaks capture, or slows the block."""
    op = block_op(problem)
    cfg = (cfg or (GPU_CONFIG if device == "cuda" else CPU_CONFIG)).hosting(op)
    ref_ops, cand_ops = block.reference_ops(), candidate_ops(op, kernel)
    w = block.make_weights(cfg, dtype, device, seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)

    def new_x() -> torch.Tensor:
        return torch.randn(cfg.batch, cfg.seq, cfg.hidden, device=device, generator=gen).to(dtype)

    tol = TOLERANCE.get(dtype, 3e-2)
    where = f"block {cfg.label()}"
    out: dict = {"block": where, "slot": op, "tolerance": tol}
    with torch.no_grad():
        x = new_x()
        y_ref = block.prefill(cfg, w, x, ref_ops)
        y = block.prefill(cfg, w, x, cand_ops)
        err = rel_l2(y, y_ref)
        out["rel_l2_err"] = err
        if not err <= tol:
            return {
                **out,
                "passed": False,
                "failure": "incorrect",
                "detail": f"{where}: output off by rel. L2 {err:.3g} (tolerance {tol:g})",
            }
        if device != "cuda":
            return {
                **out,
                "passed": True,
                "detail": f"{where}: correct (graph and timing need CUDA)",
            }
        return _graphs(cfg, w, x, ref_ops, cand_ops, new_x, out, tol, budget_s, seed)


def _graphs(cfg, w, x, ref_ops, cand_ops, new_x, out, tol, budget_s, seed) -> dict:
    from kernels.harness import timing

    where = out["block"]
    graphs = {}
    for name, ops in (("reference", ref_ops), ("candidate", cand_ops)):
        try:
            g, outs = timing.capture([lambda ops=ops: block.prefill(cfg, w, x, ops)], reps=1)
        except Exception as e:  # capture refused: a sync, a host read, a side stream ...
            torch.cuda.synchronize()
            return {
                **out,
                "passed": False,
                "failure": "hack_suspected",
                "detail": f"{where}: the {name} block cannot be captured in a CUDA graph: "
                f"{type(e).__name__}: {e}"[:500],
            }
        graphs[name] = (g, outs[0])
    x.copy_(new_x())
    for g, _ in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    y_ref = block.prefill(cfg, w, x, ref_ops)
    err = rel_l2(graphs["candidate"][1], y_ref)
    out["graph_rel_l2_err"] = err
    if not err <= tol:
        return {
            **out,
            "passed": False,
            "failure": "hack_suspected",
            "detail": f"{where}: wrong under CUDA-graph replay (rel. L2 {err:.3g})",
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
            "detail": f"{where}: the kernel slows the block: {cand_ms:.4g} ms vs "
            f"{ref_ms:.4g} ms with the reference (noise {noise:.1%})",
        }
    return {
        **out,
        "passed": True,
        "detail": f"{where} in a CUDA graph: {cand_ms:.4g} ms vs {ref_ms:.4g} ms "
        f"with the reference ({ref_ms / cand_ms:.2f}x), output within rel. L2 {tol:g}",
    }
