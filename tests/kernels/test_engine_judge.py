"""The judge every path shares (kernels.engine.judge): noise gating, confirmation, and the
cases where a number is missing."""

from __future__ import annotations

import pytest

from kernels.engine.judge import (
    CONFIRM,
    KEPT,
    REVERTED,
    UNTIMED_ON_INTERPRETER,
    Numbers,
    Verdict,
    confirm,
    screen,
    unconfirmed,
)

INCUMBENT = Numbers(0.412, 0.02, "h200")


@pytest.mark.parametrize(
    ("challenger", "incumbent", "status", "says"),
    [
        (Numbers(0.5, 0.01, "h200"), None, KEPT, "first correct candidate"),
        # inside the combined noise (2.9% faster, 3.5% noise): reverted, nothing to confirm
        (Numbers(0.400, 0.015, "h200"), INCUMBENT, REVERTED, "not faster beyond noise"),
        # beyond it: a screening win, never kept on screening numbers alone
        (Numbers(0.390, 0.015, "h200"), INCUMBENT, CONFIRM, "to be confirmed"),
        (Numbers(0.5, 0.01, "h200"), INCUMBENT, REVERTED, "not faster beyond noise"),
        (
            Numbers(None, None, "interpret"),
            Numbers(None, None, "interpret"),
            REVERTED,
            UNTIMED_ON_INTERPRETER,
        ),  # fmt: skip
        (Numbers(None, None, "h200"), INCUMBENT, REVERTED, "correct but untimed"),
        (
            Numbers(0.3, 0.01, "h200"),
            Numbers(None, None, "interpret"),
            KEPT,
            "replaces an untimed incumbent",
        ),  # fmt: skip
        (Numbers(0.1, 0.01, "a100"), INCUMBENT, REVERTED, "not comparable"),
        (Numbers(0.1, None, "h200"), INCUMBENT, REVERTED, "noise not measured"),
    ],
)
def test_screening_gates_on_noise_and_sends_wins_to_confirmation(
    challenger: Numbers, incumbent: Numbers | None, status: str, says: str
) -> None:
    verdict = screen(challenger, incumbent)

    assert verdict.status == status
    assert says in verdict.reason


def test_a_screening_win_is_kept_only_when_the_interleaved_retime_confirms_it() -> None:
    screened = screen(Numbers(0.390, 0.015, "h200"), INCUMBENT)
    assert screened.status == CONFIRM

    kept = confirm(
        screened, [{"geomean_ms": 0.412, "noise": 0.01}, {"geomean_ms": 0.380, "noise": 0.01}]
    )
    refuted = confirm(
        screened, [{"geomean_ms": 0.400, "noise": 0.01}, {"geomean_ms": 0.395, "noise": 0.01}]
    )

    assert kept.status == KEPT
    assert kept.reason == (
        "0.39 ms vs incumbent 0.412 ms (noise 3.5%): faster beyond noise; "
        "re-timed interleaved: 0.38 ms vs 0.412 ms: confirmed"
    )
    assert refuted.status == REVERTED
    assert refuted.reason.endswith("re-timed interleaved: 0.395 ms vs 0.4 ms: not confirmed")


@pytest.mark.parametrize(
    "pair",
    [
        None,
        [],
        [{"geomean_ms": 0.4, "noise": 0.01}],
        {"error": "worker lost"},
        # a challenger whose re-timed outputs were wrong has no time: no win to show
        [{"geomean_ms": 0.412, "noise": 0.01}, {"geomean_ms": None, "noise": None}],
        ["not", "numbers"],
    ],
)
def test_a_confirmation_without_usable_numbers_reverts(pair) -> None:
    screened = Verdict(CONFIRM, "0.39 ms vs incumbent 0.412 ms (noise 3.5%): faster beyond noise")

    assert confirm(screened, pair).status == REVERTED


def test_unconfirmed_wins_say_why_without_the_pending_suffix() -> None:
    screened = screen(Numbers(0.390, 0.015, "h200"), INCUMBENT)

    verdict = unconfirmed(screened, "re-time failed: worker lost")

    assert verdict == Verdict(
        REVERTED,
        "0.39 ms vs incumbent 0.412 ms (noise 3.5%): faster beyond noise; re-time failed: "
        "worker lost",
    )


def test_numbers_are_read_from_a_report_defensively() -> None:
    report = {
        "summary": {"geomean_ms": 0.5, "noise": float("nan")},
        "device": {"kind": "h200"},
    }

    assert Numbers.of(report) == Numbers(0.5, None, "h200")
    assert Numbers.of(None) == Numbers(None, None, "")
    assert Numbers.of({"summary": "garbage", "device": []}) == Numbers(None, None, "")
