"""Render tables for docs/benchmarks/ from a proof JSON written by benchmarks/gpu_proof.py.

python benchmarks/render.py docs/benchmarks/h200/proof-....json
"""

from __future__ import annotations

import json
import sys


def f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def shape_table(rep: dict) -> list[str]:
    rows = [
        "| shape | ok | ms | eager ms | x eager | GB/s | TFLOP/s | roofline | bound | mode |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rep["shapes"]:
        cells = [
            s["label"],
            "yes" if s.get("passed") else "NO",
            f(s.get("candidate_ms"), ".4f"),
            f(s.get("eager_ms"), ".4f"),
            f(s.get("speedup_eager")),
            f(s.get("gbps"), ".0f"),
            f(s.get("tflops"), ".1f"),
            f(s.get("roofline_fraction")),
            s.get("bound", "-"),
            s.get("timing_mode", "-"),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(path: str) -> None:
    with open(path) as fh:
        r = json.load(fh)
    c = r["ceilings"]
    print(
        f"Ceilings: copy {c['copy_gbps']:.0f} GB/s, bf16 matmul {c['matmul_tflops_bf16']:.0f} "
        f"TFLOP/s, L2 {c['l2_bytes'] >> 20} MiB\n"
    )
    print(
        "| problem | kernel | verdict | geomean x eager | min x eager | best roofline "
        "(large shapes) | shapes won vs eager |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, p in r.get("problems", {}).items():
        for key in ("seed", "best"):
            rep = p.get(key)
            if not rep:
                continue
            sm = rep["summary"]
            big = [s.get("roofline_fraction") for s in rep["shapes"] if s.get("roofline_fraction")]
            verdict = rep["verdict"] + (f" ({rep['failure']})" if rep["failure"] else "")
            print(
                f"| {name} | {key} | {verdict} "
                f"| {f(sm['geomean_speedup_eager'])} | {f(sm['min_speedup_eager'])} "
                f"| {f(max(big) if big else None)} | {sm['wins_eager']}/{sm['shapes']} |"
            )
    for name, p in r.get("problems", {}).items():
        for key in ("seed", "best"):
            rep = p.get(key)
            if rep:
                print(f"\n#### {name}: {key}\n")
                print("\n".join(shape_table(rep)))


if __name__ == "__main__":
    main(sys.argv[1])
