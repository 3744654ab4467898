"""Compare a candidate output with the float64 reference."""

from __future__ import annotations

import torch

CHUNK = 1 << 25  # elements per pass: bounds the comparison's temporary memory (~1 GiB)


def compare(out: torch.Tensor, ref: torch.Tensor, tol: dict[str, float]) -> dict:
    """Elementwise |out-ref| <= atol*scale + rtol*|ref|, ||out-ref|| <= l2*max(||ref||,
    scale*sqrt(n)), non-finite must match; scale = max(rms(ref), tol["rms_floor"] or 0).

    atol is scaled by the reference's RMS so one tolerance works for outputs of any magnitude;
    the elementwise bound catches skipped rows or tails, the L2 bound a systematic precision
    downgrade. A problem may declare `rms_floor`, the magnitude of its outputs: an output of a
    few elements can have an RMS far below it (one GELU deep in its tail), and the bounds would
    then be relative to that one value, tighter than the problem's own float32 arithmetic can
    meet. Works in chunks so a 65536 x 4096 output does not need gigabytes of temporaries.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return {
            "passed": False,
            "reason": f"shape {list(out.shape)} != reference {list(ref.shape)}",
        }
    o_flat = out.reshape(-1)
    r_flat = ref.reshape(-1)
    n = r_flat.numel()
    row_len = max(1, n // max(out.shape[0], 1)) if out.dim() > 1 else 1
    # The sums stay on the reference's device until the end: one synchronisation per pass
    # rather than several per chunk (on a GPU shared by many processes each one waits for
    # the others' work). The arithmetic is the same float64 as summing on the host.
    dev = r_flat.device
    ref_sq = torch.zeros((), dtype=torch.float64, device=dev)
    n_fin = torch.zeros((), dtype=torch.int64, device=dev)
    for s in range(0, n, CHUNK):
        r = r_flat[s : s + CHUNK]
        fin = torch.isfinite(r)
        n_fin += fin.sum()
        ref_sq += torch.where(fin, r, torch.zeros_like(r)).square().sum(dtype=torch.float64)
    rms_t = torch.sqrt(ref_sq / n_fin.clamp(min=1))
    floor = float(tol.get("rms_floor") or 0.0)
    atol_t = tol["atol"] * rms_t.clamp(min=floor)

    def bad_of(s: int) -> tuple[torch.Tensor, ...]:
        r = r_flat[s : s + CHUNK]
        o = o_flat[s : s + CHUNK].to(r.device, torch.float64)
        fin_r = torch.isfinite(r)
        fin_o = torch.isfinite(o)
        nonfinite_bad = (fin_r != fin_o) | (~fin_r & ~fin_o & ~((o == r) | (o.isnan() & r.isnan())))
        rf = torch.where(fin_r, r, torch.zeros_like(r))
        of = torch.where(fin_r & fin_o, o, rf)
        d = (of - rf).abs()
        bad = (d > atol_t + tol["rtol"] * rf.abs()) | nonfinite_bad
        return bad, nonfinite_bad, d

    n_bad_t = torch.zeros((), dtype=torch.int64, device=dev)
    n_nonfinite_t = torch.zeros((), dtype=torch.int64, device=dev)
    diff_sq_t = torch.zeros((), dtype=torch.float64, device=dev)
    max_abs_t = torch.zeros((), dtype=torch.float64, device=dev)
    for s in range(0, n, CHUNK):
        bad, nonfinite_bad, d = bad_of(s)
        n_bad_t += bad.sum()
        n_nonfinite_t += nonfinite_bad.sum()
        diff_sq_t += d.square().sum()
        if d.numel():
            max_abs_t = torch.maximum(max_abs_t, d.max())
        del bad, nonfinite_bad, d
    totals = [ref_sq, rms_t, n_bad_t, n_nonfinite_t, diff_sq_t, max_abs_t, n_fin]
    totals = [t.double() for t in totals]
    ref_sq_h, rms, n_bad_h, n_nonfinite_h, diff_sq, max_abs, n_fin_h = torch.stack(totals).tolist()
    n_bad, n_nonfinite = int(n_bad_h), int(n_nonfinite_h)
    first_bad: int | None = None
    bad_rows: set[int] = set()
    if n_bad:  # a failing output only: where, which rows (a third pass)
        for s in range(0, n, CHUNK):
            idx = torch.nonzero(bad_of(s)[0]).flatten()
            if idx.numel():
                if first_bad is None:
                    first_bad = s + int(idx[0])
                if len(bad_rows) < 1_000_000:
                    bad_rows.update(((idx + s) // row_len).unique().tolist())

    ref_norm = max(ref_sq_h**0.5, floor * n_fin_h**0.5)
    rel_l2 = diff_sq**0.5 / ref_norm if ref_norm > 0 else max_abs
    res = {
        "max_abs_err": max_abs,
        "rel_l2_err": rel_l2,
        "mismatched": n_bad,
        "mismatched_fraction": n_bad / max(n, 1),
        "nonfinite_mismatched": n_nonfinite,
        "ref_rms": rms,
        "tolerance": dict(tol),
    }
    passed = n_bad == 0 and rel_l2 <= tol["l2"]
    if not passed:
        if first_bad is not None:
            idx = list(torch.unravel_index(torch.tensor(first_bad), tuple(out.shape)))
            idx = [int(i) for i in idx]
            res["first_bad_index"] = idx
            res["first_bad"] = {"got": float(out[tuple(idx)]), "want": float(ref[tuple(idx)])}
            res["bad_rows"] = len(bad_rows)
        res["reason"] = (
            f"{n_bad} of {n} elements outside tolerance"
            + (f" ({n_nonfinite} NaN/Inf mismatches)" if n_nonfinite else "")
            + f", max abs err {max_abs:.3g}, rel L2 {rel_l2:.3g} (limit {tol['l2']:g})"
        )
    res["passed"] = passed
    return res
