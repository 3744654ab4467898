"""The one rule that keeps or reverts a candidate.

A screened candidate is compared with the incumbent on its geomean time. A win must exceed
both sides' measured noise, and a claimed win is never kept on screening numbers alone: it is
confirmed by re-timing challenger and incumbent interleaved in one process on one GPU
(`confirm`). The CLI tuner, the web searches and the LLM hybrid all call these functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEPT, REVERTED, FAILED = "kept", "reverted", "failed"
CONFIRM = "confirm"  # a screening win, to be confirmed by an interleaved re-time
INTERPRET = "interpret"
UNTIMED_ON_INTERPRETER = "timings not meaningful on the interpreter"


@dataclass(frozen=True)
class Numbers:
    """What the judge reads of a report: its geomean time, relative noise and GPU kind."""

    geomean_ms: float | None
    noise: float | None
    kind: str = ""

    @classmethod
    def of(cls, report: Mapping[str, Any] | None) -> Numbers:
        summary = (report or {}).get("summary")
        summary = summary if isinstance(summary, Mapping) else {}
        device = (report or {}).get("device")
        kind = device.get("kind") if isinstance(device, Mapping) else ""
        return cls(number(summary.get("geomean_ms")), number(summary.get("noise")), str(kind or ""))

    def as_dict(self) -> dict[str, float | None]:
        return {"geomean_ms": self.geomean_ms, "noise": self.noise}


@dataclass(frozen=True)
class Verdict:
    status: str  # kept | reverted | confirm
    reason: str


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def is_improvement(challenger: Mapping[str, Any], incumbent: Mapping[str, Any]) -> bool:
    """True when the challenger is faster than the incumbent by more than both noises together.

    Both sides are {"geomean_ms", "noise"} with noise a relative spread (0.02 = 2%); a missing
    or non-finite number means the win cannot be shown, so it is not an improvement.
    """
    c_ms, c_noise = number(challenger.get("geomean_ms")), number(challenger.get("noise"))
    i_ms, i_noise = number(incumbent.get("geomean_ms")), number(incumbent.get("noise"))
    if c_ms is None or c_noise is None or i_ms is None or i_noise is None:
        return False
    if c_noise < 0 or i_noise < 0 or c_ms <= 0 or i_ms <= 0:
        return False
    return c_ms < i_ms * (1 - (c_noise + i_noise))


def ms(value: object) -> str:
    n = number(value)
    return "? ms" if n is None else f"{n:.4g} ms"


def screen(challenger: Numbers, incumbent: Numbers | None) -> Verdict:
    """Judge an accepted candidate's screening numbers against the incumbent's."""
    if incumbent is None:
        return Verdict(KEPT, "first correct candidate: the starting incumbent")
    if challenger.geomean_ms is None:
        if INTERPRET in (challenger.kind, incumbent.kind):
            return Verdict(REVERTED, UNTIMED_ON_INTERPRETER)
        return Verdict(REVERTED, "correct but untimed: cannot be ranked against the incumbent")
    if incumbent.geomean_ms is None:
        return Verdict(KEPT, "first timed correct candidate: replaces an untimed incumbent")
    if challenger.kind != incumbent.kind:
        return Verdict(
            REVERTED,
            f"timed on {challenger.kind or '?'} but the incumbent on {incumbent.kind or '?'}: "
            "not comparable",
        )
    if challenger.noise is None or incumbent.noise is None:
        return Verdict(REVERTED, "noise not measured: a win must exceed the measured noise")
    margin = challenger.noise + incumbent.noise
    versus = (
        f"{ms(challenger.geomean_ms)} vs incumbent {ms(incumbent.geomean_ms)} (noise {margin:.1%})"
    )
    if not is_improvement(challenger.as_dict(), incumbent.as_dict()):
        return Verdict(REVERTED, f"{versus}: not faster beyond noise")
    return Verdict(CONFIRM, f"{versus}: faster beyond noise{PENDING}")


PENDING = ", to be confirmed"


def unconfirmed(screened: Verdict, why: str) -> Verdict:
    """A screening win whose confirmation could not run: reverted (not shown, not won)."""
    return Verdict(REVERTED, f"{screened.reason.removesuffix(PENDING)}; {why}")


def confirm(screened: Verdict, pair: Any) -> Verdict:
    """Keep or revert a screening win from its interleaved re-time: `pair` is
    [incumbent, challenger], each {"geomean_ms", "noise"} from one process on one GPU."""
    versus = screened.reason.removesuffix(", to be confirmed")
    if (
        not isinstance(pair, list | tuple)
        or len(pair) != 2
        or not all(isinstance(p, Mapping) for p in pair)
    ):
        return Verdict(REVERTED, f"{versus}; re-time returned no usable result")
    incumbent, challenger = pair
    c_ms, i_ms = ms(challenger.get("geomean_ms")), ms(incumbent.get("geomean_ms"))
    again = f"re-timed interleaved: {c_ms} vs {i_ms}"
    if not is_improvement(challenger, incumbent):
        return Verdict(REVERTED, f"{versus}; {again}: not confirmed")
    return Verdict(KEPT, f"{versus}; {again}: confirmed")
