"""The knob proposer (kernels.engine.proposers): strategy from the budget, a space-filling
order, determinism from the records alone, and skipped variants counted as tried."""

from __future__ import annotations

import pytest

from kernels.engine.proposers import EXHAUSTIVE, MODEL_BASED, KnobProposer, Tried
from kernels.knobs import KnobError, config_key

SOURCE = (
    "BLOCK_N = 1024  # tune: 256, 512, 1024, 2048, 4096, 8192, 16384\n"
    "NUM_WARPS = 4  # tune: 1, 2, 4, 8, 16\n"
)


def walk(proposer: KnobProposer, n: int, tried: list[Tried] | None = None) -> list[dict]:
    tried = list(tried or [])
    out = []
    for _ in range(n):
        proposal = proposer.next(tried)
        if proposal is None:
            break
        out.append(proposal.knob_values)
        tried.append(Tried(proposal.knob_values, 1.0, False))
    return out


def test_the_budget_picks_the_strategy_and_the_page_can_say_why() -> None:
    covering = KnobProposer(SOURCE, budget=35)
    below = KnobProposer(SOURCE, budget=24)
    unbounded = KnobProposer(SOURCE)

    assert covering.strategy == unbounded.strategy == EXHAUSTIVE
    assert "covers all 35 configurations" in covering.why
    assert below.strategy == MODEL_BASED
    assert below.why.startswith("the budget (24) is below the 35 configurations")


def test_a_budget_below_the_space_spans_it_instead_of_taking_the_lexical_head() -> None:
    # 24 of 35 in lexical order would stop at BLOCK_N=8192 and try 16384 last or never; the
    # first picks after the start must reach both ends of both knobs.
    first = walk(KnobProposer(SOURCE, budget=24, seed=0), 6)

    assert first[0] == {"BLOCK_N": 1024, "NUM_WARPS": 4}
    assert {v["BLOCK_N"] for v in first} >= {256, 16384}
    assert {v["NUM_WARPS"] for v in first} >= {1, 16}


def test_exhaustive_covers_every_configuration_once() -> None:
    seen = walk(KnobProposer(SOURCE, budget=100), 100)

    assert len(seen) == 35 == len({config_key(v) for v in seen})


def test_the_next_proposal_depends_only_on_the_records() -> None:
    # A restarted orchestrator rebuilds the proposer and must propose what the old one would.
    records = [
        Tried({"BLOCK_N": 1024, "NUM_WARPS": 4}, 1.0, False),
        Tried({"BLOCK_N": 16384, "NUM_WARPS": 16}, 0.9, False),
        Tried({"BLOCK_N": 256, "NUM_WARPS": 1}, None, True),
        Tried({"BLOCK_N": 4096, "NUM_WARPS": 2}, None, False, pending=True),
    ]

    a = KnobProposer(SOURCE, budget=10, seed=3).next(records)
    b = KnobProposer(SOURCE, budget=10, seed=3).next(list(reversed(records)))

    assert a is not None and b is not None
    assert a.knob_values == b.knob_values
    assert config_key(a.knob_values) not in {config_key(t.values) for t in records}


def test_a_skipped_variant_counts_as_tried_and_is_never_proposed_again() -> None:
    proposer = KnobProposer(SOURCE, budget=100)
    start = Tried({"BLOCK_N": 1024, "NUM_WARPS": 4}, 1.0, False)
    nxt = proposer.next([start])
    assert nxt is not None

    skipped = Tried(nxt.knob_values, None, False, skipped=True)
    after = proposer.next([start, skipped])

    assert after is not None and after.knob_values != nxt.knob_values


def test_tpe_takes_over_after_the_space_filling_start() -> None:
    proposer = KnobProposer(SOURCE, budget=20, seed=1)
    rationales = []
    tried: list[Tried] = []
    for _ in range(12):
        p = proposer.next(tried)
        assert p is not None
        rationales.append(p.rationale)
        ms = abs(p.knob_values["BLOCK_N"] - 4096) / 4096 + abs(p.knob_values["NUM_WARPS"] - 8)
        tried.append(Tried(p.knob_values, 1.0 + ms, False))

    assert "the starting kernel" in rationales[0]
    assert all("space-filling pick" in r for r in rationales[1 : proposer.startup])
    assert "optuna TPE" in rationales[proposer.startup]


def test_configurations_outside_the_annotated_choices_do_not_break_tpe() -> None:
    # An LLM's base config may carry values the annotation does not list.
    proposer = KnobProposer(SOURCE, budget=8, seed=0)
    tried = [Tried({"BLOCK_N": 3000, "NUM_WARPS": 3}, 1.0, False)] + [
        Tried(v, 1.0, False) for v in walk(proposer, 6)
    ]

    assert proposer.next(tried) is not None


def test_no_knobs_proposes_the_source_once_and_bad_annotations_raise() -> None:
    plain = KnobProposer("def kernel(x):\n    return x\n", budget=5)

    assert plain.next([]) is not None
    assert plain.next([Tried({}, 1.0, False)]) is None
    with pytest.raises(KnobError):
        KnobProposer("A = 3  # tune: 1, 2\n")


def test_configurations_one_knob_away_from_a_failure_come_last() -> None:
    # The user's token_logprobs seed: BLOCK_V=16384 with one warp runs out the 60 s compile
    # budget whatever the stage count. Once one of the four has failed, the other three wait
    # until everything not one knob away from a failure has been tried, so a search cut short
    # by time spends no more minutes on them (in plain space-filling order they were the 1st,
    # 5th, 26th and 42nd proposals after the start).
    source = (
        "BLOCK_V = 1024  # tune: 512, 1024, 2048, 4096, 8192, 16384\n"
        "NUM_WARPS = 4  # tune: 1, 2, 4, 8, 16\n"
        "NUM_STAGES = 1  # tune: 1, 2, 3, 4\n"
    )

    def fails(values: dict) -> bool:
        return values["BLOCK_V"] == 16384 and values["NUM_WARPS"] == 1

    proposer = KnobProposer(source, budget=120)
    tried: list[Tried] = []
    while (proposal := proposer.next(tried)) is not None:
        failed = fails(proposal.knob_values)
        tried.append(Tried(proposal.knob_values, None if failed else 1.0, failed))

    assert len(tried) == 120
    at = [i for i, t in enumerate(tried) if t.failed]
    assert len(at) == 4
    # Each failure has 12 neighbours one knob away; the last three failures are among them.
    assert all(i >= 120 - 12 for i in at[1:]), at
