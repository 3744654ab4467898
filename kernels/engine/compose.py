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
        timed = []
        for k in range(len(kernels)):
            st = kernel_stats[k][s] if s < len(kernel_stats[k]) else None
            ms = number((st or {}).get("median"))
            if st and st.get("passed", True) and ms is not None and ms > 0:
                timed.append((ms, k, number(st.get("spread")) or 0.0))
        best_kernel = min(timed) if timed else None
        serve, ms, margin = choose(
            best_kernel and (best_kernel[0], best_kernel[2]),
            (e_ms, number(eager.get("spread"))),
            (c_ms, number(compiled.get("spread"))),
        )
        kernel = kernels[best_kernel[1]] if serve == KERNEL and best_kernel else None
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


Timing = tuple[float | None, float | None]  # (median ms, relative spread)


def choose(
    kernel: Timing | None, eager: Timing | None, compiled: Timing | None
) -> tuple[str | None, float | None, float | None]:
    """Who serves one shape: (KERNEL, COMPILED or EAGER, its ms, the margin used).

    The faster baseline serves unless the kernel beats it by more than both measured spreads
    together; with no baseline timed the kernel serves; with nothing timed, nobody (None).
    The one rule for the search's table, the release's table and the library's routing."""
    options = [
        (ms, name, sp or 0.0)
        for (ms, sp), name in ((compiled or (None, None), COMPILED), (eager or (None, None), EAGER))
        if ms is not None and ms > 0
    ]
    best_base = min(options) if options else None
    k_ms, k_sp = kernel or (None, None)
    if k_ms is None or k_ms <= 0:
        return (best_base[1], best_base[0], None) if best_base else (None, None, None)
    if best_base is None:
        return KERNEL, k_ms, None
    margin = (k_sp or 0.0) + best_base[2]
    if k_ms < best_base[0] * (1 - margin):
        return KERNEL, k_ms, margin
    return best_base[1], best_base[0], margin


def serve_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A report's per-shape row (candidate_ms/_spread, eager_ms/_spread, compiled_ms/_spread)
    as a dispatch entry: the shape, the three times and who serves it (`choose`)."""
    k_ms, e_ms, c_ms = (number(row.get(f"{n}_ms")) for n in ("candidate", "eager", "compiled"))
    serve, ms, margin = choose(
        (k_ms, number(row.get("candidate_spread"))),
        (e_ms, number(row.get("eager_spread"))),
        (c_ms, number(row.get("compiled_spread"))),
    )
    return {
        "label": row.get("label"),
        "shape": dict(row.get("shape") or {}),
        "serve": serve,
        "ms": ms,
        "kernel_ms": k_ms,
        "eager_ms": e_ms,
        "compiled_ms": c_ms,
        "margin": margin,
    }


def _geomean(xs: Sequence[float | None]) -> float | None:
    if not xs or any(x is None or x <= 0 for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _geomean_ratio(base: Sequence[float | None], ms: Sequence[float | None]) -> float | None:
    return _geomean([b / m if b and m else None for b, m in zip(base, ms, strict=True)])
