"""The knob sweep: a parallel-coordinates figure of a search's timed trials, built with
plotly's graph_objects and served with the search's other charts."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from kernels.knobs import Knob
from searches import charts
from searches.charts_knobs import knob_sweep
from tests.web.domain import accepted, interpreted, judge, propose

BLOCK = Knob("BLOCK_N", 1024, (256, 512, 1024), 1)
MODE = Knob("MODE", "fast", ("fast", "exact"), 2)


def test_one_axis_per_knob_and_one_for_the_speedup():
    rows = [
        {"index": 2, "values": {"BLOCK_N": 512, "MODE": "exact"}, "speedup_eager": 1.5},
        {"index": 1, "values": {"BLOCK_N": 256, "MODE": "fast"}, "speedup_eager": 0.8},
    ]
    figure = knob_sweep([BLOCK, MODE], rows)
    assert not charts.is_empty(figure)
    (trace,) = figure["data"]
    assert trace["type"] == "parcoords"
    block, mode, speed = trace["dimensions"]
    assert block["label"] == "BLOCK_N" and block["values"] == [512.0, 256.0]
    assert block["tickvals"] == [256, 512, 1024]
    # A string knob is an axis of its choices in declared order.
    assert mode["values"] == [1, 0] and mode["ticktext"] == ["fast", "exact"]
    assert speed["values"] == [1.5, 0.8]
    assert trace["line"]["color"] == [1.5, 0.8]
    json.dumps(figure)  # plain JSON for the page


def test_trials_off_the_knobs_choices_or_untimed_are_left_out_and_counted():
    rows = [
        {"index": 3, "values": {"BLOCK_N": 333, "MODE": "fast"}, "speedup_eager": 2.0},
        {"index": 2, "values": {"MODE": "fast"}, "speedup_eager": 2.0},
        {"index": 1, "values": {"BLOCK_N": 256, "MODE": "fast"}, "speedup_eager": 1.1},
    ]
    figure = knob_sweep([BLOCK, MODE], rows)
    assert figure["layout"]["meta"]["lines"] == 1
    assert figure["layout"]["meta"]["left_out"] == 2
    assert "2 left out" in figure["layout"]["annotations"][0]["text"]


def test_no_knobs_or_no_timed_trial_says_why():
    assert "declares no # tune: knobs" in knob_sweep([], [])["layout"]["meta"]["message"]
    empty = knob_sweep([BLOCK], [{"index": 1, "values": {"BLOCK_N": 256}, "speedup_eager": None}])
    assert "CPU interpreter are not timed" in empty["layout"]["meta"]["message"]


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_url")
def test_the_search_charts_carry_the_sweep_of_its_timed_trials(engineer_client, search):
    judge(propose(search, 1, knob_values={"BLOCK_N": 512, "NUM_WARPS": 4}), accepted(ms=0.5))
    judge(propose(search, 2, knob_values={"BLOCK_N": 2048, "NUM_WARPS": 8}), accepted(ms=0.3))
    judge(propose(search, 3, knob_values={"BLOCK_N": 256, "NUM_WARPS": 4}), interpreted())
    url = reverse("searches:search_charts", args=[search.pk])
    figures = engineer_client.get(url, {"format": "json"}).json()["charts"]
    (trace,) = figures["chart-knobs"]["data"]
    labels = [d["label"] for d in trace["dimensions"]]
    assert labels == ["BLOCK_N", "NUM_WARPS", "vs eager (×)"]  # the softmax seed's knobs
    assert trace["dimensions"][0]["values"] == [2048.0, 512.0]  # newest first; untimed left out
    html = engineer_client.get(url).content.decode()
    assert 'id="chart-knobs"' in html and "Knob sweep" in html
