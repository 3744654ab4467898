"""Re-validation of an approved kernel before release, on one GPU kind.

Three things an ordinary trial does not prove:
- the full shape sweep (within the approved range) on fresh secret seeds, not the sweep the
  search optimised against;
- CUDA-graph capture and replay (the harness's `cuda_graph` check, required here, not optional);
- an end-to-end check: the model block (`kernels.block`) with the kernel in the place of its
  problem's BLOCK_OP, captured in a CUDA graph and timed against the same block with the
  reference (`kernels.harness.e2e`), so a kernel that is fast alone but slows the block is
  caught. A problem with no BLOCK_OP (a user's op the block does not call) has no such check:
  the report says it is not applicable.
On the CPU interpreter the graph and block timing cannot run: correctness over the sweep is
checked, the rest is reported as skipped. Django-free: the GPU worker runs it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from kernels import problems
from kernels.harness import device as devmod
from kernels.harness import request_for, run
from kernels.harness.sandbox import Pool
from kernels.protocol import rejected_report

# The interpreter sweep: the smoke sweep plus every full-sweep shape whose size (product of its
# dims) is within this many times the largest smoke shape's, so re-validation on the CPU still
# covers shapes the search never saw.
INTERPRET_SIZE_FACTOR = float(os.environ.get("AUTOWEB_REVALIDATE_INTERPRET_FACTOR", "8"))
REQUIRED_ON_GPU = ("cuda_graph", "end_to_end")


class RevalidationError(ValueError):
    pass


def _size(shape: dict[str, int]) -> int:
    return math.prod(int(v) for v in shape.values())


def in_range(shape: dict[str, int], shape_range: dict[str, list[int]] | None) -> bool:
    if not shape_range:
        return True
    return all(dim in shape and lo <= shape[dim] <= hi for dim, (lo, hi) in shape_range.items())


def sweep(
    problem: problems.Problem, device: str, shape_range: dict[str, list[int]] | None
) -> list[dict[str, int]]:
    """The shapes re-validation runs: the full sweep on a GPU; on the interpreter the smoke
    sweep and the full-sweep shapes small enough to interpret. Only shapes inside the range."""
    if device == "cuda":
        shapes = problem.shapes("full")
    else:
        smoke = problem.shapes("smoke")
        cap = INTERPRET_SIZE_FACTOR * max(_size(s) for s in smoke)
        shapes = smoke + [s for s in problem.shapes("full") if _size(s) <= cap and s not in smoke]
    chosen = [s for s in shapes if in_range(s, shape_range)]
    if not chosen:
        raise RevalidationError(
            f"no shape of the {problem.name} sweep lies in the approved range {shape_range}"
        )
    return chosen


def revalidate(
    problem: problems.Problem | str,
    source: str,
    *,
    device: str = "auto",
    shape_range: dict[str, list[int]] | None = None,
    pool: Pool | None = None,
    on_event: Callable[[dict], None] | None = None,
    timeout_s: float | None = None,
    budget_s: float = 0.5,
) -> dict:
    """The harness report of a re-validation run, with `revalidation` = {passed, reasons}."""
    if isinstance(problem, str):
        problem = problems.load(problem)
    dev = devmod.resolve(device)
    try:
        shapes = sweep(problem, dev, shape_range)
    except RevalidationError as e:
        return _refused(problem, dev, str(e))
    request = request_for(
        problem,
        [source],
        device=dev,
        tier="revalidate",
        shapes=tuple(shapes),
        timeout_s=timeout_s,
        budget_s=budget_s,
        baselines_compiled=True,
        extra={"e2e": problem.block_op is not None},
    )
    report = run(request, on_event=on_event, pool=pool)
    checks = report.setdefault("checks", {})
    required = REQUIRED_ON_GPU
    if problem.block_op is None:
        required = tuple(n for n in REQUIRED_ON_GPU if n != "end_to_end")
        checks["end_to_end"] = {
            "passed": None,
            "detail": f"not applicable: {problem.name} declares no BLOCK_OP, so it has no place "
            "in the model block",
        }
    elif dev != "cuda":
        checks.setdefault("end_to_end", {"passed": None, "detail": "skipped: needs CUDA"})
    reasons = list(report.get("reasons") or [])
    if report.get("verdict") == "accepted" and dev == "cuda":
        for name in required:
            check = checks.get(name) or {}
            if check.get("passed") is not True:
                reasons.append(f"{name}: {check.get('detail') or 'not run'}")
    passed = report.get("verdict") == "accepted" and not reasons
    report["revalidation"] = {
        "passed": passed,
        "reasons": reasons,
        "shape_range": shape_range or {},
        "shapes": [problems.shape_label(s) for s in shapes],
    }
    return report


def _refused(problem: problems.Problem, dev: str, why: str) -> dict:
    return rejected_report(
        "malformed",
        [f"malformed: {why}"],
        problem=problem.name,
        device=devmod.info(dev, measure_ceilings=False),
        tier="revalidate",
        revalidation={"passed": False, "reasons": [why], "shapes": []},
    )
