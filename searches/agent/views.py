"""Pages of the agent: the search page's LLM panel (model switch, per-model results, notes for
the agent) and the context packs (list, read, edit as a new version)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core import roles
from core.errors import DomainError
from searches import selectors
from searches.agent import endpoints, notes, packs, stats
from searches.agent.step import current_model
from searches.agent.switch import set_llm
from searches.models import LLMChange, Search, SearchNote

PANEL = "searches/partials/llm_panel.html"
TRIALS_PER_PAGE = 50


class LLMForm(forms.Form):
    model = forms.CharField(max_length=200)
    llm_endpoint = forms.ChoiceField(
        label="Endpoint",
        required=False,
        error_messages={"invalid_choice": "Unknown endpoint %(value)s: choose one from the list."},
    )
    base_url = forms.CharField(
        label="Custom base URL",
        max_length=500,
        required=False,
        help_text=(
            "With 'custom URL': OpenAI-compatible, e.g. https://llm.example.com/v1; blank keeps "
            "the search's custom URL."
        ),
    )
    api_key = forms.CharField(
        label="API key",
        max_length=500,
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text=(
            "Write-only: never shown again. Blank keeps the current key, unless the endpoint "
            "changes: a key never follows the search to another endpoint."
        ),
    )
    clear_key = forms.BooleanField(label="drop this search's own key", required=False)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fields["llm_endpoint"].choices = endpoints.choices()
        self.custom_allowed = endpoints.custom_allowed()


class NoteForm(forms.Form):
    text = forms.CharField(label="Note for the agent", widget=forms.Textarea(attrs={"rows": 2}))


class PackForm(forms.Form):
    name = forms.CharField(max_length=64, required=False)
    title = forms.CharField(max_length=200, required=False)
    body = forms.CharField(
        label="Markdown", strip=False, widget=forms.Textarea(attrs={"rows": 24, "class": "code"})
    )


def panel_context(search: Search, user: Any = None, **extra) -> dict:
    target = endpoints.target_of(search)
    return {
        "search": search,
        "current_model": current_model(search),
        "endpoint": target,
        "key_set": bool(search.llm_api_key),
        "may_steer": roles.may_steer(user, search),
        "model_stats": stats.per_model(search),
        "llm_form": extra.pop("llm_form", None)
        or LLMForm(
            # The URL is not typed in again: blank with "custom" keeps the one it has.
            initial={"model": current_model(search), "llm_endpoint": target.name}
        ),
        "llm_changes": list(
            LLMChange.objects.filter(search=search).select_related("changed_by")[:20]
        ),
        "note_form": extra.pop("note_form", None) or NoteForm(),
        "notes": list(SearchNote.objects.filter(search=search)[:10]),
        **extra,
    }


def _add_errors(form: forms.Form, exc: DomainError) -> None:
    if hasattr(exc, "error_dict"):
        for name, msgs in exc.message_dict.items():
            form.add_error(name if name in form.fields else None, msgs)
    else:
        form.add_error(None, exc)


def _respond(request: HttpRequest, search: Search, status: int = 200, **extra) -> HttpResponse:
    if getattr(request, "htmx", False):  # htmx swaps 2xx only: the panel with its errors
        return render(request, PANEL, panel_context(search, request.user, **extra))
    if status != 200:  # no JS: the search page, the errors next to what was typed
        form = extra.get("llm_form") or extra.get("note_form")
        if not search.idea.model_name and form is not None:  # no panel to show them in
            for error in form.non_field_errors():
                messages.error(request, error)
        context = panel_context(search, request.user, **extra)
        context["page"] = selectors.trials_page(search, 1, TRIALS_PER_PAGE)
        return render(request, "searches/search.html", context, status=status)
    return redirect("searches:search", pk=search.pk)


@require_http_methods(["GET", "POST"])
def search_llm(request: HttpRequest, pk: int) -> HttpResponse:
    search = selectors.search_for_user(request.user, pk)
    if request.method == "GET":
        return render(request, PANEL, panel_context(search, request.user))
    # Checked before the form: whoever may not steer learns nothing from its validation.
    if not roles.may_steer(request.user, search):
        raise PermissionDenied(
            "Only the search's owner, a reviewer or staff may change its model or endpoint."
        )
    form = LLMForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            search = set_llm(
                search=search,
                user=request.user,
                model=data["model"],
                endpoint=data["llm_endpoint"],
                base_url=data["base_url"],
                api_key=data["api_key"] or None,
                clear_key=data["clear_key"],
            )
        except DomainError as exc:
            _add_errors(form, exc)
        else:
            messages.success(request, f"Next proposals come from {search.model}.")
            return _respond(request, search, llm_saved=True)
    return _respond(request, search, status=400, llm_form=form)


@require_POST
def search_note(request: HttpRequest, pk: int) -> HttpResponse:
    search = selectors.search_for_user(request.user, pk)
    if not roles.is_engineer(request.user) and not roles.is_reviewer(request.user):
        raise PermissionDenied("Only engineers and reviewers may write notes for the agent.")
    form = NoteForm(request.POST)
    if form.is_valid():
        try:
            notes.add_note(search=search, text=form.cleaned_data["text"], author=request.user)
        except DomainError as exc:
            _add_errors(form, exc)
        else:
            return _respond(request, search)
    return _respond(request, search, status=400, note_form=form)


# -- context packs --------------------------------------------------------------------------------


@require_GET
def pack_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "searches/packs.html",
        {"hardware": packs.available("hardware"), "models": packs.available("model")},
    )


@require_http_methods(["GET", "POST"])
def pack_edit(request: HttpRequest, kind: str, name: str = "") -> HttpResponse:
    if kind not in packs.KINDS:
        raise Http404("no such kind of pack")
    pack = packs.get(kind, name) if name else None
    if name and pack is None:
        raise Http404("no such pack")
    if request.method == "POST":
        if not roles.is_engineer(request.user):
            raise PermissionDenied("Only engineers may edit context packs.")
        form = PackForm(request.POST)
        if form.is_valid():
            try:
                saved = packs.save_pack(
                    kind=kind,
                    name=name or form.cleaned_data["name"],
                    title=form.cleaned_data["title"],
                    body=form.cleaned_data["body"],
                    author=request.user,
                )
            except DomainError as exc:
                _add_errors(form, exc)
            else:
                messages.success(request, f"Saved {saved.kind} pack {saved.name} v{saved.version}.")
                return redirect("searches:pack", kind=kind, name=saved.name)
        status = 400
    else:
        initial = {"name": name}
        if pack is not None:
            initial.update(title=pack.title, body=pack.body)
        form = PackForm(initial=initial)
        status = 200
    return render(
        request,
        "searches/pack_edit.html",
        {"form": form, "pack": pack, "kind": kind, "engineer": roles.is_engineer(request.user)},
        status=status,
    )
