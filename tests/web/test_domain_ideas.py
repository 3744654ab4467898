from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from core.errors import DomainError
from searches import services
from searches.models import MAX_TRIALS_CAP, Idea
from tests.web.domain import SOFTMAX_SEED, idea_kwargs

pytestmark = pytest.mark.django_db


def _refused(author, field: str, match: str, **overrides) -> DomainError:
    with pytest.raises(DomainError) as caught:
        services.create_idea(**idea_kwargs(author, **overrides))
    assert field in caught.value.message_dict, caught.value.message_dict
    assert match in " ".join(caught.value.message_dict[field])
    assert Idea.objects.count() == 0
    return caught.value


def test_an_idea_is_saved_with_every_field(engineer):
    idea = services.create_idea(
        **idea_kwargs(
            engineer,
            title="  Bigger blocks  ",
            target_kinds=["h200", "interpret", "h200"],
            sketch_source=SOFTMAX_SEED.replace("\n", "\r\n"),
            max_tokens=200_000,
        )
    )
    stored = Idea.objects.get()
    assert stored.pk == idea.pk
    assert stored.title == "Bigger blocks"
    assert stored.problem == "softmax"
    assert stored.target_kinds == ["h200", "interpret"]  # de-duplicated, order kept
    assert stored.proposer == "tuner"
    assert stored.sketch_source == SOFTMAX_SEED  # browser line endings normalised
    assert stored.prohibition_list == ["no torch.softmax", "no fp16 accumulation"]
    assert (stored.max_trials, stored.max_gpu_minutes, stored.max_wall_minutes) == (50, 30, 60)
    assert stored.max_tokens == 200_000
    assert stored.author == engineer
    assert stored.to_dict()["author"] == "ada"
    assert stored.to_dict()["prohibitions"] == ["no torch.softmax", "no fp16 accumulation"]


def test_budgets_given_as_form_strings_are_accepted(engineer):
    idea = services.create_idea(
        **idea_kwargs(engineer, max_trials="10", max_gpu_minutes=" 5 ", max_tokens="")
    )
    assert (idea.max_trials, idea.max_gpu_minutes, idea.max_tokens) == (10, 5, None)


def test_an_llm_proposer_names_its_model(engineer):
    idea = services.create_idea(**idea_kwargs(engineer, proposer="llm:qwen2.5-coder:32b"))
    assert idea.model_name == "qwen2.5-coder:32b"
    assert Idea.objects.get().proposer == "llm:qwen2.5-coder:32b"


def test_an_llm_idea_may_sketch_a_kernel_without_knobs(engineer):
    no_knobs = SOFTMAX_SEED.replace("  # tune: 256, 512, 1024, 2048, 4096, 8192", "").replace(
        "  # tune: 1, 2, 4, 8, 16", ""
    )
    assert "tune:" not in no_knobs
    services.create_idea(**idea_kwargs(engineer, proposer="llm:gpt-4o", sketch_source=no_knobs))
    assert Idea.objects.count() == 1


@pytest.mark.parametrize(
    ("field", "overrides", "match"),
    [
        ("title", {"title": "   "}, "title"),
        ("title", {"title": "x" * 201}, "within 200"),
        ("problem", {"problem": "softmaxx"}, "Unknown problem 'softmaxx'; choose one of: softmax"),
        ("problem", {"problem": "../etc/passwd"}, "Unknown problem"),
        ("target_kinds", {"target_kinds": []}, "at least one"),
        ("target_kinds", {"target_kinds": "h200"}, "list of GPU kinds"),
        ("target_kinds", {"target_kinds": ["H200"]}, "'H200' is not a GPU kind"),
        ("target_kinds", {"target_kinds": ["h200", "gpu 0"]}, "'gpu 0' is not a GPU kind"),
        ("target_kinds", {"target_kinds": [f"k{i}" for i in range(9)]}, "At most 8"),
        ("proposer", {"proposer": "gpt"}, 'use "tuner" or "llm:<model>"'),
        ("proposer", {"proposer": "llm:"}, "not a model name"),
        ("proposer", {"proposer": "llm:rm -rf /"}, "not a model name"),
        ("max_trials", {"max_trials": 0}, "from 1 to 100,000"),
        ("max_trials", {"max_trials": -5}, "got -5"),
        ("max_trials", {"max_trials": MAX_TRIALS_CAP + 1}, "from 1 to 100,000"),
        ("max_trials", {"max_trials": "ten"}, "got 'ten'"),
        ("max_trials", {"max_trials": 2.5}, "whole number"),
        ("max_trials", {"max_trials": True}, "whole number"),
        ("max_trials", {"max_trials": None}, "Set a budget of trials"),
        ("max_gpu_minutes", {"max_gpu_minutes": 10**6}, "GPU minutes"),
        ("max_wall_minutes", {"max_wall_minutes": 0}, "wall-clock minutes"),
        ("max_tokens", {"max_tokens": 0}, "tokens must be a whole number"),
        ("description", {"description": "a\x00b"}, "NUL"),
        ("prohibitions", {"prohibitions": "x" * 100_001}, "within 100,000"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message_and_nothing_saved(
    engineer, field, overrides, match
):
    _refused(engineer, field, match, **overrides)


@pytest.mark.parametrize(
    ("sketch", "match"),
    [
        ("def kernel(x):\n    return x +\n", "compile_error): syntax error at line 2"),
        (
            "import os\n\ndef kernel(x):\n    return x\n",
            "(prohibited)",
        ),
        ("def kernel(a, b):\n    return a\n", "does not match the problem's signature kernel(x)"),
        ("def helper(x):\n    return x\n", "no top-level `def kernel(...)`"),
        (
            SOFTMAX_SEED.replace("BLOCK_N = 1024  # tune:", "BLOCK_N = 1000  # tune:"),
            "line 9: value 1000 of BLOCK_N is not among its choices",
        ),
        (
            SOFTMAX_SEED.replace("# tune: 1, 2, 4, 8, 16", "# tune: 1, 2, 4, 8, 16, 4"),
            "line 10",
        ),
    ],
)
def test_a_bad_sketch_is_refused_naming_what_and_where(engineer, sketch, match):
    _refused(engineer, "sketch_source", match, sketch_source=sketch)


def test_the_tuner_needs_a_knob_in_the_sketch(engineer):
    _refused(
        engineer,
        "sketch_source",
        "declares none",
        sketch_source="def kernel(x):\n    return x.clone()\n",
    )


def test_every_mistake_is_reported_at_once(engineer):
    error = _refused(
        engineer, "title", "title", title="", problem="nope", target_kinds=[], max_trials=0
    )
    assert {"title", "problem", "target_kinds", "max_trials"} <= set(error.message_dict)


def test_only_engineers_submit_ideas(outsider):
    with pytest.raises(PermissionDenied, match="Only engineers"):
        services.create_idea(**idea_kwargs(outsider))
    assert Idea.objects.count() == 0


def test_a_reviewer_or_superuser_may_submit_ideas(reviewer, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-42-long!")
    services.create_idea(**idea_kwargs(reviewer))
    services.create_idea(**idea_kwargs(root))
    assert Idea.objects.count() == 2
