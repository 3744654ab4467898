"""Context packs: versioned markdown the prompt carries, per GPU kind (hardware) and per model
family (model). Shipped packs live in `context/<kind>/<name>.md` with a small front matter
(`name`, `title`, `version`, and for hardware the datasheet ceilings); a version saved in the UI
(a `ContextPack` row) takes over from the shipped file, keeping every older version."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import Max

from core.errors import DomainError
from searches.models import ContextPack

CONTEXT_DIR = Path(__file__).resolve().parent / "context"
KINDS = ("hardware", "model")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MAX_BODY = 60_000


@dataclass(frozen=True)
class Pack:
    kind: str
    name: str
    version: int
    title: str
    body: str
    meta: dict[str, str] = field(default_factory=dict)
    edited: bool = False  # saved in the UI, not the shipped file

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def number(self, key: str) -> float | None:
        try:
            return float(self.meta[key])
        except (KeyError, ValueError):
            return None

    def datasheet_ceilings(self) -> dict[str, float] | None:
        copy, rate = self.number("copy_gbps"), self.number("matmul_tflops_bf16")
        if copy is None or rate is None:
            return None
        ceilings = {"copy_gbps": copy, "matmul_tflops_bf16": rate}
        l2 = self.number("l2_bytes")
        if l2 is not None:
            ceilings["l2_bytes"] = l2
        return ceilings


def parse(text: str) -> tuple[dict[str, str], str]:
    """Front matter (`key: value` lines between `---` lines) and the body."""
    meta: dict[str, str] = {}
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        for i, line in enumerate(lines[1:], start=1):
            if line.strip() == "---":
                return meta, "\n".join(lines[i + 1 :]).strip() + "\n"
            key, sep, value = line.partition(":")
            if sep:
                meta[key.strip()] = value.strip()
    return {}, text.strip() + "\n"


def _shipped(kind: str) -> dict[str, Pack]:
    folder = CONTEXT_DIR / ("hardware" if kind == "hardware" else "models")
    packs = {}
    for path in sorted(folder.glob("*.md")):
        meta, body = parse(path.read_text())
        name = meta.get("name", path.stem)
        try:
            version = int(meta.get("version", "1"))
        except ValueError:
            version = 1
        packs[name] = Pack(kind, name, version, meta.get("title", name), body, meta)
    return packs


def available(kind: str) -> dict[str, Pack]:
    """Every pack of `kind` by name: the newest UI version, else the shipped file."""
    packs = _shipped(kind)
    newest = {}
    for row in ContextPack.objects.filter(kind=kind).order_by("name", "-version"):
        newest.setdefault(row.name, row)
    for name, row in newest.items():
        meta = dict(packs[name].meta) if name in packs else {}
        packs[name] = Pack(kind, name, row.version, row.title or name, row.body, meta, edited=True)
    return dict(sorted(packs.items()))


def get(kind: str, name: str) -> Pack | None:
    return available(kind).get(name)


def hardware_for(gpu_kind: str) -> Pack | None:
    """The hardware pack of a worker kind (`h200`), else the one named by its part before `-`."""
    packs = available("hardware")
    if gpu_kind in packs:
        return packs[gpu_kind]
    return packs.get(gpu_kind.split("-")[0])


@transaction.atomic
def save_pack(*, kind: str, name: str, title: str, body: str, author: Any) -> ContextPack:
    """A new version of the pack `name` (a new pack when the name is new)."""
    errors: dict[str, list[str]] = {}
    if kind not in KINDS:
        errors["kind"] = [f"A pack's kind is one of {', '.join(KINDS)}; got {kind!r}."]
    name = (name or "").strip()
    if not NAME_RE.match(name):
        errors["name"] = [
            "A pack name is 1 to 64 lowercase letters, digits, '.', '_' or '-' "
            "(e.g. deepseek-mla-sparse)."
        ]
    title = (title or "").strip()
    if len(title) > 200:
        errors["title"] = ["Keep the title within 200 characters."]
    body = (body or "").replace("\r\n", "\n")
    if not body.strip():
        errors["body"] = ["The pack is empty: write the markdown the agent should read."]
    elif len(body) > MAX_BODY or "\x00" in body:
        errors["body"] = [f"Markdown without NUL bytes, at most {MAX_BODY:,} characters."]
    if errors:
        raise DomainError(errors)
    _meta, body = parse(body)  # front matter pasted from a shipped file is not part of the body
    last = ContextPack.objects.filter(kind=kind, name=name).aggregate(v=Max("version"))["v"]
    shipped = _shipped(kind).get(name)
    version = max(last or 0, shipped.version if shipped else 0) + 1
    return ContextPack.objects.create(
        kind=kind, name=name, version=version, title=title or name, body=body, author=author
    )
