"""Compare a candidate output with the float64 reference."""

from __future__ import annotations

import torch


def compare(out: torch.Tensor, ref: torch.Tensor, tol: dict[str, float]) -> dict:
    """Elementwise |out-ref| <= atol*rms(ref) + rtol*|ref|, rel-L2 <= l2, non-finite must match.

    atol is scaled by the reference's RMS so one tolerance works for outputs of any magnitude;
    the elementwise bound catches skipped rows or tails, the L2 bound a systematic precision
    downgrade.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return {
            "passed": False,
            "reason": f"shape {list(out.shape)} != reference {list(ref.shape)}",
        }
    o = out.to(ref.device, torch.float64)
    r = ref
    fin_r = torch.isfinite(r)
    fin_o = torch.isfinite(o)
    both = fin_r & fin_o
    nonfinite_bad = (fin_r != fin_o) | (~fin_r & ~fin_o & ~((o == r) | (o.isnan() & r.isnan())))
    rf = torch.where(fin_r, r, torch.zeros_like(r))
    of = torch.where(both, o, rf)
    diff = (of - rf).abs()
    n = max(int(fin_r.sum()), 1)
    rms = float((rf.square().sum() / n).sqrt())
    bound = tol["atol"] * rms + tol["rtol"] * rf.abs()
    bad = (diff > bound) | nonfinite_bad
    n_bad = int(bad.sum())
    ref_norm = float(rf.norm())
    rel_l2 = (
        float((of - rf).norm()) / ref_norm
        if ref_norm > 0
        else float(diff.max() if diff.numel() else 0.0)
    )
    res = {
        "max_abs_err": float(diff.max()) if diff.numel() else 0.0,
        "rel_l2_err": rel_l2,
        "mismatched": n_bad,
        "mismatched_fraction": n_bad / max(bad.numel(), 1),
        "nonfinite_mismatched": int(nonfinite_bad.sum()),
        "ref_rms": rms,
        "tolerance": dict(tol),
    }
    passed = n_bad == 0 and rel_l2 <= tol["l2"]
    if not passed:
        if n_bad:
            idx = torch.nonzero(bad.reshape(bad.shape), as_tuple=False)[0].tolist()
            res["first_bad_index"] = idx
            res["first_bad"] = {"got": float(o[tuple(idx)]), "want": float(r[tuple(idx)])}
            rows = bad.reshape(bad.shape[0], -1).any(dim=1) if bad.dim() > 1 else bad
            res["bad_rows"] = int(rows.sum())
        res["reason"] = (
            f"{n_bad} of {bad.numel()} elements outside tolerance"
            + (
                f" ({res['nonfinite_mismatched']} NaN/Inf mismatches)"
                if res["nonfinite_mismatched"]
                else ""
            )
            + f", max abs err {res['max_abs_err']:.3g}, rel L2 {rel_l2:.3g} (limit {tol['l2']:g})"
        )
    res["passed"] = passed
    return res
