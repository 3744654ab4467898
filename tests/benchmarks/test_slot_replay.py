"""benchmarks/slot_replay.py: the model that replays a screening run's timelines through GPU
slots. Checked on timelines small enough to work out by hand, and on a recorded run, which it
must give back within a few percent with nothing compiling ahead."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchmarks import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import slot_replay  # noqa: E402


def test_without_compiling_ahead_each_evaluation_holds_its_place_from_start_to_end() -> None:
    # Two in flight, four evaluations of 1 s compiling + 2 s on the GPU: two rounds of 3 s.
    evals = [(1.0, 2.0)] * 4
    assert slot_replay.replay(evals, jobs=2, ahead=0) == pytest.approx(4 / (6 / 60))


def test_compiling_ahead_hides_compiles_behind_the_gpu_stages() -> None:
    # Two more compile meanwhile: after the first compile the slots never wait, 1 + 2 + 2 s.
    evals = [(1.0, 2.0)] * 4
    assert slot_replay.replay(evals, jobs=2, ahead=2) == pytest.approx(4 / (5 / 60))


def test_a_compile_that_runs_out_its_budget_holds_no_slot_when_others_compile_ahead() -> None:
    # One slot. A 10 s compile that never reaches the GPU, then three of 1 s + 1 s. With one in
    # flight they wait for it: 10 + 3 x 2 s. With two more ahead they run beside it, one after
    # another on the slot (done at 2, 3 and 4 s), and the run ends when the slow one gives up.
    evals = [(10.0, None), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]
    assert slot_replay.replay(evals, jobs=1, ahead=0) == pytest.approx(4 / (16 / 60))
    assert slot_replay.replay(evals, jobs=1, ahead=2) == pytest.approx(4 / (10 / 60))


def test_a_compile_past_linger_gives_its_place_to_the_next() -> None:
    # The same, one place and one slot, and a compile still going at 2 s gives its place up:
    # the three others run one after another from then (done at 4, 6 and 8 s), the slow one
    # still ends at 10 s.
    evals = [(10.0, None), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]
    assert slot_replay.replay(evals, jobs=1, ahead=0, linger=2.0, spare=1) == pytest.approx(
        4 / (10 / 60)
    )


def test_no_more_than_spare_compiles_give_their_places_up() -> None:
    # Two slow compiles first. With two spares both give their places up (at 2 and 4 s) and
    # the four quick ones run from 4 s (done at 6, 8, 10, 12). With one, the second must wait
    # for the first to end at 10 s: the quick ones run from 10 s (done at 12, 14, 16, 18).
    evals = [(10.0, None), (10.0, None)] + [(1.0, 1.0)] * 4
    assert slot_replay.replay(evals, jobs=1, ahead=0, linger=2.0, spare=2) == pytest.approx(
        6 / (12 / 60)
    )
    assert slot_replay.replay(evals, jobs=1, ahead=0, linger=2.0, spare=1) == pytest.approx(
        6 / (18 / 60)
    )


def test_a_run_made_with_slots_has_its_slot_waits_taken_out_of_the_gpu_stages() -> None:
    run = {
        "timelines": [{"want_gpu": 1.0, "done": 6.0}, None],
        "seconds_each": [6.0, 60.0],
        "gpu_wait": [{"slot_s": 2.0}, None],
    }
    assert slot_replay.stages(run) == [(1.0, 3.0), (60.0, None)]


def test_it_gives_back_the_recorded_run_with_nothing_ahead() -> None:
    run = json.loads((ROOT / "docs/benchmarks/search/search-2026-12-05-g.json").read_text())
    replayed = slot_replay.replay(slot_replay.stages(run["after"]), jobs=12, ahead=0)
    assert replayed == pytest.approx(run["after"]["per_minute"], rel=0.03)


def test_the_command_line_replays_a_recorded_run() -> None:
    from tests.benchmarks import run_script

    res = run_script(
        "slot_replay.py",
        "docs/benchmarks/search/search-2026-12-05-g.json",
        *("--ahead", "0", "4", "--linger", "20"),
        timeout=120,
    )

    assert res.returncode == 0, res.stderr
    assert "measured: 50.3 evaluations per minute, 12 in flight" in res.stdout
    assert "replayed: --jobs 12 --ahead 4 --linger 20:" in res.stdout
