"""The idea form. It parses what the browser sent; `services.create_idea` decides what is valid
(the sketch's syntax, contract and imports, the budgets' caps) and its errors land on the same
fields, so the user sees every mistake next to what they typed."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from searches.models import (
    LLM_PREFIX,
    MAX_GPU_MINUTES_CAP,
    MAX_TOKENS_CAP,
    MAX_TRIALS_CAP,
    MAX_WALL_MINUTES_CAP,
    TUNER,
)
from searches.services import MAX_DESCRIPTION, MAX_TITLE

# GPU kinds offered even when no worker of that kind is online (the search then waits for one).
KNOWN_KINDS = ("interpret", "h200", "h100", "b200", "a100", "l40s")
KIND_LABELS = {"interpret": "interpret (CPU, correctness only)"}
PROPOSERS = [(TUNER, "Built-in tuner (searches the sketch's # tune: knobs)")]
OTHER_MODEL = "llm:other"


def proposer_choices(models: Iterable[str] = ()) -> list[tuple[str, str]]:
    """The tuner, the configured LLM models, and "another model" (typed in `llm_model`)."""
    seen = []
    for model in models:
        if model and model not in seen:
            seen.append(model)
    llms = [(f"{LLM_PREFIX}{m}", f"LLM agent: {m} (the tuner then tunes its knobs)") for m in seen]
    return PROPOSERS + llms + [(OTHER_MODEL, "LLM agent: another model (type its name below)")]


def kind_choices(online_kinds: Iterable[str] = ()) -> list[tuple[str, str]]:
    kinds = list(KNOWN_KINDS) + sorted(set(online_kinds) - set(KNOWN_KINDS))
    online = set(online_kinds)
    return [(k, KIND_LABELS.get(k, k) + (" · online" if k in online else "")) for k in kinds]


TUNER_IGNORES_TEXT = (
    "The built-in tuner does not read this text: it searches the # tune: knobs of the sketch "
    "(or of the problem's seed). The text is for the people reading the idea."
)


def _within(value: str, what: str, limit: int) -> str:
    if len(value) > limit:
        raise ValidationError(
            f"The {what} is {len(value):,} characters; keep it within {limit:,}.", code="too_long"
        )
    return value


class IdeaForm(forms.Form):
    # The lengths are checked by clean_* (and by the service), never by a maxlength attribute:
    # a browser cuts pasted text at maxlength without a word, and the user would not know.
    title = forms.CharField()
    description = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text=(
            f"Markdown, up to {MAX_DESCRIPTION:,} characters. What to try and why: an LLM "
            "agent reads it in its prompt."
        ),
    )
    problem = forms.ChoiceField(
        error_messages={"invalid_choice": "Unknown problem %(value)s: choose one from the list."},
    )
    target_kinds = forms.MultipleChoiceField(
        label="Target GPU kinds",
        widget=forms.CheckboxSelectMultiple,
        error_messages={
            "required": "Choose at least one target GPU kind.",
            "invalid_choice": "%(value)s is not a GPU kind offered here.",
        },
    )
    proposer = forms.ChoiceField(choices=PROPOSERS, initial=TUNER)
    llm_model = forms.CharField(
        label="Other model",
        max_length=190,
        required=False,
        help_text="With 'another model': its name at your endpoint, e.g. qwen2.5-coder:32b.",
    )
    llm_endpoint = forms.ChoiceField(
        label="LLM endpoint",
        required=False,
        help_text="Where an LLM agent's requests go; the server's key for it stays on the server.",
        error_messages={"invalid_choice": "Unknown endpoint %(value)s: choose one from the list."},
    )
    llm_base_url = forms.CharField(
        label="Custom base URL",
        max_length=500,
        required=False,
        help_text="With 'custom URL': OpenAI-compatible, e.g. https://llm.example.com/v1.",
    )
    llm_api_key = forms.CharField(
        label="API key",
        max_length=500,
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text=(
            "Optional; write-only. Used only by searches you start. A custom URL gets this key "
            "or none, never the server's."
        ),
    )
    context_packs = forms.MultipleChoiceField(
        label="Model context packs",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Model-family context the LLM's prompt carries (see Context packs).",
    )
    start_anyway = forms.BooleanField(
        label="Submit even if no worker of a chosen kind is online",
        required=False,
        help_text="Its search then waits until one starts, and says so.",
    )
    max_trials = forms.IntegerField(
        label="Max trials", min_value=1, max_value=MAX_TRIALS_CAP, initial=50
    )
    max_gpu_minutes = forms.IntegerField(
        label="Max GPU minutes", min_value=1, max_value=MAX_GPU_MINUTES_CAP, initial=30
    )
    max_wall_minutes = forms.IntegerField(
        label="Max wall-clock minutes", min_value=1, max_value=MAX_WALL_MINUTES_CAP, initial=60
    )
    max_tokens = forms.IntegerField(
        label="Max LLM tokens",
        min_value=1,
        max_value=MAX_TOKENS_CAP,
        required=False,
        help_text="Prompt and reply tokens for the whole search; blank: no limit.",
    )
    sketch_source = forms.CharField(
        label="Kernel sketch",
        required=False,
        strip=False,  # the user's code, exactly as typed
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false", "class": "code"}),
        help_text=(
            "Optional. A candidate file defining kernel(...) with the problem's signature; "
            "mark tunable constants, e.g. BLOCK_N = 1024  # tune: 512, 1024, 2048."
        ),
    )
    prohibitions = forms.CharField(
        label="Extra prohibitions",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One per line, e.g. no fp16 accumulation.",
    )

    def __init__(
        self,
        *args: Any,
        problems: Iterable[str] = (),
        user_problems: Iterable[str] = (),
        broken_problems: Iterable[str] = (),
        online_kinds: Iterable[str] = (),
        online_known: bool = True,
        models: Iterable[str] = (),
        packs: Iterable[str] = (),
        endpoints: Iterable[tuple[str, str]] = (),
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.fields["llm_endpoint"].choices = list(endpoints)
        # A typed base URL is offered only where the operator allows one ("custom").
        self.custom_allowed = any(value == "custom" for value, _ in endpoints)
        builtin = [(name, name) for name in problems]
        users = [(name, name) for name in user_problems]
        # Listed so that choosing one says why it cannot be used (the service refuses it).
        broken = [(name, f"{name} (failed to load)") for name in broken_problems]
        # The user's own problems (from AUTOWEB_PROBLEM_DIRS) in groups of their own.
        groups = [("Your problems", users), ("Failed to load", broken)]
        groups = [(label, choices) for label, choices in groups if choices]
        self.fields["problem"].choices = [("Built-in", builtin), *groups] if groups else builtin
        online = sorted(set(online_kinds))
        # Unknown (Redis unreachable): no kind is called offline, nothing asked.
        self.offline_checked = online_known
        self.online = frozenset(online)
        self.fields["target_kinds"].choices = kind_choices(online)
        self.fields["target_kinds"].help_text = (
            f"Workers online now: {', '.join(online)}. " if online else "No worker is online now. "
        ) + "A search for a kind with no worker online waits until one starts, and says so."
        # The form's script asks before submitting for a kind with no worker online.
        if online_known:
            self.fields["target_kinds"].widget.attrs["data-online"] = " ".join(online)
        if not self.is_bound and len(online) == 1:
            self.initial.setdefault("target_kinds", online)  # the only kind that can run now
        self.fields["proposer"].choices = proposer_choices(models)
        self.fields["context_packs"].choices = [(name, name) for name in packs]

    tuner_note = TUNER_IGNORES_TEXT  # shown under the description while the tuner is chosen

    def clean_title(self) -> str:
        return _within(self.cleaned_data["title"], "title", MAX_TITLE)

    def clean_description(self) -> str:
        return _within(self.cleaned_data["description"], "description", MAX_DESCRIPTION)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        offline = [k for k in data.get("target_kinds") or [] if k not in self.online]
        if self.offline_checked and offline and not data.get("start_anyway"):
            # Asked, not refused: a search aimed at a kind with no worker would wait unseen.
            self.add_error(
                "target_kinds",
                f"No {', '.join(offline)} worker is online now: a search for it waits until "
                "one starts. Tick “Submit even if no worker of a chosen kind is online” to "
                "submit it anyway.",
            )
        if data.get("proposer") == OTHER_MODEL:
            model = (data.get("llm_model") or "").strip()
            if not model:
                self.add_error("llm_model", "Type the model's name, or choose one from the list.")
            else:
                data["proposer"] = f"{LLM_PREFIX}{model}"
        return data

    def add_domain_error(self, error: ValidationError) -> None:
        """Put a DomainError's messages on the fields they name (the rest above the form)."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for name, messages in error.message_dict.items():
            self.add_error(name if name in self.fields else None, messages)

    def idea_kwargs(self) -> dict[str, Any]:
        """The cleaned data as `services.create_idea` takes it."""
        data = self.cleaned_data
        return {
            "title": data["title"],
            "description": data["description"],
            "problem": data["problem"],
            "target_kinds": list(data["target_kinds"]),
            "proposer": data["proposer"],
            "sketch_source": data["sketch_source"],
            "prohibitions": data["prohibitions"],
            "max_trials": data["max_trials"],
            "max_gpu_minutes": data["max_gpu_minutes"],
            "max_wall_minutes": data["max_wall_minutes"],
            "max_tokens": data.get("max_tokens"),
            "context_packs": list(data.get("context_packs") or []),
            "llm_endpoint": data.get("llm_endpoint") or None,
            "llm_base_url": data.get("llm_base_url") or None,
            "llm_api_key": data.get("llm_api_key") or None,
        }


class TrialFilterForm(forms.Form):
    """The search page's trial table: filter by status, speedup and knob values, and sort.

    A GET form: its fields are the page's query string, kept by every pager link. One field per
    `# tune:` knob of the search's start source (``knob.NAME``), offering that knob's choices.
    Bad values get an error next to the field and the table shows every trial.
    """

    status = forms.ChoiceField(required=False)
    min_speedup = forms.FloatField(
        label="min speedup vs eager", required=False, min_value=0, max_value=1e6
    )
    sort = forms.ChoiceField(required=False)

    def __init__(self, data: Any, *, knobs: Iterable[Any] = ()) -> None:
        from searches.selectors import TRIAL_SORTS, TRIAL_STATUS_FILTERS

        super().__init__(data)
        self.knobs = list(knobs)
        self.fields["status"].choices = [("", "any status")] + [
            (key, label) for key, (label, _) in TRIAL_STATUS_FILTERS.items()
        ]
        sorts = [(key, label) for key, (label, _) in TRIAL_SORTS.items()]
        for knob in self.knobs:
            sorts += [
                (f"knob:{knob.name}", f"{knob.name} ascending"),
                (f"-knob:{knob.name}", f"{knob.name} descending"),
            ]
        self.fields["sort"].choices = sorts
        for knob in self.knobs:
            # Values travel as JSON (1024, true, "fast"): the type the trial's knob_values holds.
            choices = [(json.dumps(value), str(value)) for value in knob.choices]
            self.fields[self.knob_field(knob.name)] = forms.ChoiceField(
                label=knob.name, required=False, choices=[("", "any")] + choices
            )

    @staticmethod
    def knob_field(name: str) -> str:
        return f"knob.{name}"

    @property
    def knob_fields(self) -> list[Any]:
        return [self[self.knob_field(knob.name)] for knob in self.knobs]

    def query(self) -> Any:
        """The selectors.TrialQuery these fields ask for (an invalid form: the default)."""
        from searches.selectors import TrialQuery

        if not self.is_valid():
            return TrialQuery()
        data = self.cleaned_data
        knobs = {
            knob.name: json.loads(data[self.knob_field(knob.name)])
            for knob in self.knobs
            if data.get(self.knob_field(knob.name))
        }
        return TrialQuery(
            status=data.get("status") or "",
            min_speedup=data.get("min_speedup"),
            knobs=knobs,
            sort=data.get("sort") or "newest",
        )

    def querystring(self) -> str:
        """The filters as a query string (no page): what a pager link carries."""
        if not self.is_valid():
            return ""
        from urllib.parse import urlencode

        pairs = [(name, self.data.get(name)) for name in self.fields if self.data.get(name)]
        return urlencode(pairs)
