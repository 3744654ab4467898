"""Tunable knobs: module-level constants annotated with their search space.

    BLOCK_N = 1024  # tune: 256, 512, 1024, 2048
    NUM_WARPS = 4  # tune: 2, 4, 8

`parse_knobs` reads them (at most MAX_CHOICES choices a knob); `rewrite` changes only the value
literals, so every tuner proposal is plain source with a one-token-per-knob diff.
"""

from __future__ import annotations

import ast
import io
import itertools
import json
import math
import re
import tokenize
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from kernels import pysource

KnobValue = int | float | bool | str

_TUNE_RE = re.compile(r"#\s*tune\s*:(?P<choices>.*)\Z", re.DOTALL)
_LITERAL_TYPES = (bool, int, float, str)
# Choices of one knob: far more than any tuning needs, few enough that reading a sketch stays
# instant (each choice is checked against the others).
MAX_CHOICES = 256


class KnobError(ValueError):
    """A `# tune:` annotation that cannot be used; the message names the line."""


@dataclass(frozen=True)
class Knob:
    name: str
    value: KnobValue
    choices: tuple[KnobValue, ...]
    lineno: int


@dataclass(frozen=True)
class _Site:
    knob: Knob
    # Character positions (tokenize's (row, col)) of the value literal, end exclusive.
    start: tuple[int, int]
    end: tuple[int, int]
    # The choices as written in the comment, so a rewrite keeps the author's spelling
    # ("fast" vs 'fast', 1e-3 vs 0.001).
    choice_texts: tuple[str, ...]


def parse_knobs(source: str) -> list[Knob]:
    """Return the knobs declared in `source`, in source order."""
    return [site.knob for site in _scan(source)]


def rewrite(source: str, values: Mapping[str, object]) -> str:
    """Return `source` with the named knobs set to `values`; every other character is kept."""
    sites = {site.knob.name: site for site in _scan(source)}
    edits: list[tuple[_Site, str]] = []
    for name, value in values.items():
        site = sites.get(name)
        if site is None:
            known = ", ".join(sites) or "none"
            raise KnobError(f"unknown knob {name!r} (knobs in this source: {known})")
        index = _index_of(site.knob.choices, value)
        if index is None:
            raise KnobError(
                f"line {site.knob.lineno}: {value!r} is not a choice of {name} "
                f"(choices: {_format_choices(site.knob.choices)})"
            )
        if not _same(value, site.knob.value):
            edits.append((site, site.choice_texts[index]))

    lines = io.StringIO(source).readlines()
    # Right to left, so earlier positions stay valid while later ones are replaced.
    for site, text in sorted(edits, key=lambda edit: edit[0].start, reverse=True):
        # _scan only accepts one-line assignments, so the literal starts and ends on one row.
        (row, col), (_, end_col) = site.start, site.end
        line = lines[row - 1]
        lines[row - 1] = line[:col] + text + line[end_col:]
    return "".join(lines)


def space_size(knobs: Iterable[Knob]) -> int:
    """Number of configurations: the product of each knob's choice count."""
    return math.prod(len(knob.choices) for knob in knobs)


def settings(knobs: Iterable[Knob]) -> Iterator[dict[str, KnobValue]]:
    """Every configuration of `knobs`, in lexical order of their choices."""
    found = list(knobs)
    for values in itertools.product(*(k.choices for k in found)):
        yield dict(zip((k.name for k in found), values, strict=True))


def config_key(values: Mapping[str, object]) -> str:
    """Canonical, order-independent key of a configuration (1, 1.0 and True stay distinct)."""
    return json.dumps(dict(values), sort_keys=True, separators=(",", ":"))


def _scan(source: str) -> list[_Site]:
    try:
        tree = pysource.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except SyntaxError as exc:
        raise KnobError(f"line {exc.lineno}: source does not parse: {exc.msg}") from exc
    except tokenize.TokenError as exc:
        raise KnobError(f"source does not tokenize: {exc.args[0]}") from exc

    comments = {
        tok.start[0]: tok
        for tok in tokens
        if tok.type == tokenize.COMMENT and _TUNE_RE.match(tok.string)
    }
    statements: dict[int, list[ast.stmt]] = {}  # line -> top-level statements touching it
    for stmt in tree.body:
        for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
            statements.setdefault(line, []).append(stmt)

    sites: list[_Site] = []
    first_line: dict[str, int] = {}
    for lineno in sorted(comments):
        comment = comments[lineno]
        stmt = _knob_statement(statements.get(lineno, []), lineno)
        name = stmt.targets[0].id if isinstance(stmt, ast.Assign) else stmt.target.id
        value = ast.literal_eval(stmt.value)
        choices, texts = _parse_choices(_TUNE_RE.match(comment.string)["choices"], lineno)
        _check_types(name, value, choices, lineno)
        if _index_of(choices, value) is None:
            raise KnobError(
                f"line {lineno}: value {value!r} of {name} is not among its choices "
                f"({_format_choices(choices)})"
            )
        if name in first_line:
            raise KnobError(
                f"line {lineno}: duplicate knob {name} (first declared on line {first_line[name]})"
            )
        first_line[name] = lineno
        start, end = _value_span(tokens, stmt, lineno, name)
        sites.append(_Site(Knob(name, value, choices, lineno), start, end, texts))

    _check_not_reassigned(tree, first_line)
    return sites


def _knob_statement(candidates: list[ast.stmt], lineno: int) -> ast.Assign | ast.AnnAssign:
    where = f"line {lineno}: a '# tune:' comment"
    if not candidates:
        raise KnobError(f"{where} must sit on a top-level constant assignment, not on its own")
    if len(candidates) > 1:
        raise KnobError(f"{where} must sit on a line with a single statement")
    stmt = candidates[0]
    if isinstance(stmt, ast.Assign):
        simple = len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
    elif isinstance(stmt, ast.AnnAssign):
        simple = isinstance(stmt.target, ast.Name) and stmt.value is not None
    else:
        simple = False
    if not simple:
        kind = type(stmt).__name__
        found = f"inside a {kind} block" if hasattr(stmt, "body") else f"on a {kind} statement"
        raise KnobError(
            f"{where} must sit on a top-level simple assignment `NAME = literal`, not {found}"
        )
    if not _is_literal(stmt.value):
        raise KnobError(f"{where} needs a literal int, float, bool or str value")
    if stmt.lineno != stmt.end_lineno:
        raise KnobError(f"{where} must be on a one-line assignment")
    return stmt


def _is_literal(node: ast.expr | None) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    return isinstance(node, ast.Constant) and type(node.value) in _LITERAL_TYPES


def _parse_choices(text: str, lineno: int) -> tuple[tuple[KnobValue, ...], tuple[str, ...]]:
    if not text.strip():
        raise KnobError(f"line {lineno}: empty choice list in '# tune:' comment")
    try:
        # Parsed as one tuple so that commas inside quoted strings are not separators.
        tree = pysource.parse(f"({text},)", mode="eval")
    except SyntaxError:
        raise KnobError(f"line {lineno}: {_first_bad_choice(text)}") from None
    if not isinstance(tree.body, ast.Tuple):
        raise KnobError(f"line {lineno}: cannot read choices {text.strip()!r}")
    if len(tree.body.elts) > MAX_CHOICES:
        raise KnobError(
            f"line {lineno}: {len(tree.body.elts)} choices; a knob takes at most {MAX_CHOICES}"
        )
    source = f"({text},)"
    choices: list[KnobValue] = []
    texts: list[str] = []
    for node in tree.body.elts:
        item = ast.get_source_segment(source, node) or ""
        if not _is_literal(node):
            raise KnobError(
                f"line {lineno}: unparsable choice {item!r} "
                "(choices are int, float, True/False or quoted string literals)"
            )
        value = ast.literal_eval(node)
        if _index_of(choices, value) is not None:
            raise KnobError(f"line {lineno}: duplicate choice {item!r}")
        choices.append(value)
        texts.append(item)
    return tuple(choices), tuple(texts)


def _first_bad_choice(text: str) -> str:
    for item in text.split(","):
        if not item.strip():
            return f"empty choice in {text.strip()!r}"
        try:
            ast.literal_eval(item.strip())
        except (ValueError, SyntaxError):
            return f"unparsable choice {item.strip()!r}"
    return f"cannot read choices {text.strip()!r}"


def _check_types(name: str, value: object, choices: tuple[KnobValue, ...], lineno: int) -> None:
    types = {type(choice).__name__ for choice in choices}
    if len(types) > 1:
        raise KnobError(
            f"line {lineno}: mixed types in the choices of {name} ({', '.join(sorted(types))})"
        )
    (kind,) = types
    if type(value).__name__ != kind:
        raise KnobError(
            f"line {lineno}: mixed types: {name} = {value!r} is {type(value).__name__} "
            f"but its choices are {kind}"
        )


def _value_span(
    tokens: list[tokenize.TokenInfo], stmt: ast.stmt, lineno: int, name: str
) -> tuple[tuple[int, int], tuple[int, int]]:
    line_tokens = [
        tok
        for tok in tokens
        if tok.start[0] == lineno
        and tok.type not in (tokenize.COMMENT, tokenize.NEWLINE, tokenize.NL)
        and tok.type not in (tokenize.INDENT, tokenize.DEDENT)
    ]
    depth = 0
    for i, tok in enumerate(line_tokens):
        if tok.type == tokenize.OP and tok.string in ("(", "[", "{"):
            depth += 1
        elif tok.type == tokenize.OP and tok.string in (")", "]", "}"):
            depth -= 1
        elif tok.type == tokenize.OP and tok.string == "=" and depth == 0:
            value_tokens = line_tokens[i + 1 :]
            break
    else:
        raise KnobError(f"line {lineno}: cannot find the value of {name}")
    # A bare literal is one token, or two for a signed number; parentheses or implicit string
    # concatenation would make a rewrite touch more than the value.
    signed = (
        len(value_tokens) == 2
        and value_tokens[0].type == tokenize.OP
        and value_tokens[0].string in ("-", "+")
        and value_tokens[1].type == tokenize.NUMBER
    )
    if len(value_tokens) != 1 and not signed:
        raise KnobError(f"line {lineno}: the value of {name} must be a single bare literal")
    return value_tokens[0].start, value_tokens[-1].end


def _check_not_reassigned(tree: ast.Module, first_line: dict[str, int]) -> None:
    # A later top-level assignment would silently override the tuned value.
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            targets = [stmt.target]
        else:
            continue
        for target in targets:
            for node in ast.walk(target):
                if (
                    isinstance(node, ast.Name)
                    and node.id in first_line
                    and stmt.lineno != first_line[node.id]
                ):
                    raise KnobError(
                        f"line {stmt.lineno}: knob {node.id} (declared on line "
                        f"{first_line[node.id]}) is assigned again"
                    )


def _same(a: object, b: object) -> bool:
    # True == 1 == 1.0 in Python; a knob value must match its choice's type too.
    return type(a) is type(b) and a == b


def _index_of(choices: Iterable[object], value: object) -> int | None:
    for i, choice in enumerate(choices):
        if _same(choice, value):
            return i
    return None


def _format_choices(choices: Iterable[object]) -> str:
    return ", ".join(repr(choice) for choice in choices)
