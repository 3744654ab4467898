"""A model's reply -> one candidate file and its rationale, or the reason it is malformed."""

from __future__ import annotations

import re
from dataclasses import dataclass

# An opening fence (``` or more, with an optional language tag) at the start of a line.
_FENCE = re.compile(r"^(?P<fence>`{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n", re.M)
PYTHON_TAGS = {"python", "py", "python3", ""}
MAX_RATIONALE = 4000


@dataclass(frozen=True)
class Parsed:
    source: str | None
    rationale: str
    error: str | None  # why the reply holds no usable candidate

    @property
    def ok(self) -> bool:
        return self.error is None


def _blocks(text: str) -> tuple[list[tuple[str, str, int, int]], bool]:
    """(lang, body, start, end) of each fenced block, and whether a block was left unclosed."""
    blocks = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            return blocks, False
        fence = m.group("fence")
        close = re.compile(rf"^{fence}`*[ \t]*$", re.M)
        end = close.search(text, m.end())
        if end is None:
            return blocks, True
        blocks.append((m.group("lang").lower(), text[m.end() : end.start()], m.start(), end.end()))
        pos = end.end()


def parse_reply(text: str) -> Parsed:
    """Exactly one python block with a `kernel` is a candidate; the prose around it the rationale.

    Untagged blocks count as python when they define something; blocks in other languages (a
    shell command, a table) are prose.
    """
    if not isinstance(text, str) or not text.strip():
        return Parsed(None, "", "the reply is empty")
    blocks, unclosed = _blocks(text)
    code = [
        b
        for b in blocks
        if b[0] in PYTHON_TAGS and (b[0] or re.search(r"^\s*(def|import)\b", b[1], re.M))
    ]
    if not code:
        if unclosed:
            return Parsed(None, "", "the code block is never closed (was the reply cut off?)")
        return Parsed(None, "", "no fenced python code block: send the complete candidate file")
    if len(code) > 1:
        return Parsed(
            None,
            "",
            f"{len(code)} python code blocks: send exactly one block holding the whole file",
        )
    lang, body, start, end = code[0]
    source = body.rstrip() + "\n"
    if not re.search(r"^def kernel\s*\(", source, re.M):
        return Parsed(None, "", "the code block defines no top-level `def kernel(...)`")
    prose = (text[:start] + "\n" + text[end:]).strip()
    return Parsed(source, prose[:MAX_RATIONALE], None)
