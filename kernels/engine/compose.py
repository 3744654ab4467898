"""A search's result: a per-shape dispatch table, never slower than what the user has.

Different shapes prefer different kernels, and on some shapes no kernel beats torch.compile.
So a search does not end with one winner: the best few candidates are re-timed together with
both baselines, interleaved on every shape in one process on one GPU (`kernels.harness.
time_together`), and each shape is served by the fastest candidate only when it beats the
faster of eager and torch.compile beyond both measured noises. Otherwise that baseline serves
it. By construction the table is at least 1.0x the best baseline on every shape it measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kernels.engine.judge import number

KERNEL, COMPILED, EAGER = "kernel", "compiled", "eager"
MAX_KERNELS = 4  # candidates re-timed for the table: the time grows with each


def pick_candidates(reports: Sequence[Mapping[str, Any]], limit: int = MAX_KERNELS) -> list[int]:
    """Which screened candidates (indices into `reports`) to re-time for the table: on each
    shape the fastest accepted one, those covering the most shapes first, then the best geomean,
    at most `limit`."""
    accepted = [
        i
        for i, r in enumerate(reports)
        if r.get("verdict") == "accepted" and number((r.get("summary") or {}).get("geomean_ms"))
    ]
    if not accepted:
        return []
    n_shapes = min(len(reports[i].get("shapes") or []) for i in accepted)
    wins: dict[int, int] = {}
    for s in range(n_shapes):
        times = [
            (number(reports[i]["shapes"][s].get("candidate_ms")) or math.inf, i) for i in accepted
        ]
        best = min(times)[1]
        wins[best] = wins.get(best, 0) + 1
    by_geomean = sorted(accepted, key=lambda i: reports[i]["summary"]["geomean_ms"])
    chosen = sorted(wins, key=lambda i: (-wins[i], by_geomean.index(i)))[:limit]
    if by_geomean[0] not in chosen:  # the best single kernel is always re-timed
        chosen = [*chosen[: limit - 1], by_geomean[0]]
    return chosen


def build(
    labels: Sequence[str],
    shapes: Sequence[Mapping[str, int]],
    kernels: Sequence[Any],
    kernel_stats: Sequence[Sequence[Mapping[str, Any] | None]],
    baseline_stats: Sequence[Mapping[str, Any] | None],
) -> dict[str, Any]:
    """The table from one interleaved run.

    `kernels` names the candidates (trial indices, config descriptions); `kernel_stats[k][s]`
    is {"median", "spread", "passed"} for kernel k on shape s (None: not timed or wrong there);
    `baseline_stats[s]` is {"eager": stats, "compiled": stats} (either may be None).
    """
    rows = []
    for s, label in enumerate(labels):
        base = baseline_stats[s] or {}
        eager, compiled = base.get(EAGER) or {}, base.get(COMPILED) or {}
        e_ms, c_ms = number(eager.get("median")), number(compiled.get("median"))
        e_sp, c_sp = number(eager.get("spread")) or 0.0, number(compiled.get("spread")) or 0.0
        options = [(ms, name, sp) for ms, name, sp in ((c_ms, COMPILED, c_sp), (e_ms, EAGER, e_sp))]
        options = [o for o in options if o[0] is not None and o[0] > 0]
        best_base = min(options) if options else None
        timed = []
        for k in range(len(kernels)):
            st = kernel_stats[k][s] if s < len(kernel_stats[k]) else None
            ms = number((st or {}).get("median"))
            if st and st.get("passed", True) and ms is not None and ms > 0:
                timed.append((ms, k, number(st.get("spread")) or 0.0))
        best_kernel = min(timed) if timed else None
        serve, ms, kernel, margin = None, None, None, None
        if best_kernel is not None and best_base is not None:
            margin = best_kernel[2] + best_base[2]
            if best_kernel[0] < best_base[0] * (1 - margin):
                serve, ms, kernel = KERNEL, best_kernel[0], kernels[best_kernel[1]]
        if serve is None and best_base is not None:
            serve, ms = best_base[1], best_base[0]
        elif serve is None and best_kernel is not None:  # no baseline timed on this shape
            serve, ms, kernel = KERNEL, best_kernel[0], kernels[best_kernel[1]]
        rows.append(
            {
                "label": label,
                "shape": dict(shapes[s]),
                "serve": serve,
                "kernel": kernel,
                "ms": ms,
                "best_kernel": kernels[best_kernel[1]] if best_kernel else None,
                "best_kernel_ms": best_kernel[0] if best_kernel else None,
                "eager_ms": e_ms,
                "compiled_ms": c_ms,
                "margin": margin,
                "speedup_compiled": c_ms / ms if c_ms and ms else None,
                "speedup_eager": e_ms / ms if e_ms and ms else None,
            }
        )
    singles = []
    for k, name in enumerate(kernels):
        per = [
            number((kernel_stats[k][s] or {}).get("median")) if s < len(kernel_stats[k]) else None
            for s in range(len(labels))
        ]
        singles.append(
            {
                "kernel": name,
                "geomean_speedup_compiled": _geomean_ratio([r["compiled_ms"] for r in rows], per),
                "geomean_speedup_eager": _geomean_ratio([r["eager_ms"] for r in rows], per),
                "shapes_faster_than_compiled": sum(
                    1
                    for r, ms in zip(rows, per, strict=True)
                    if ms and r["compiled_ms"] and ms < r["compiled_ms"]
                ),
            }
        )
    best_single = max(
        (s for s in singles if s["geomean_speedup_compiled"] is not None),
        key=lambda s: s["geomean_speedup_compiled"],
        default=None,
    )
    return {
        "shapes": rows,
        "kernels": list(kernels),
        "shapes_total": len(rows),
        "shapes_on_kernels": sum(1 for r in rows if r["serve"] == KERNEL),
        "shapes_at_or_above_compiled": sum(
            1
            for r in rows
            if r["compiled_ms"] is not None and r["ms"] is not None and r["ms"] <= r["compiled_ms"]
        ),
        "shapes_with_compiled": sum(1 for r in rows if r["compiled_ms"] is not None),
        "geomean_speedup_compiled": _geomean([r["speedup_compiled"] for r in rows]),
        "geomean_speedup_eager": _geomean([r["speedup_eager"] for r in rows]),
        "singles": singles,
        "best_single": best_single,
    }


def _geomean(xs: Sequence[float | None]) -> float | None:
    if not xs or any(x is None or x <= 0 for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _geomean_ratio(base: Sequence[float | None], ms: Sequence[float | None]) -> float | None:
    return _geomean([b / m if b and m else None for b, m in zip(base, ms, strict=True)])
