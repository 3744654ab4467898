from __future__ import annotations

from pathlib import Path

import pytest

import kernels
from kernels.knobs import (
    MAX_CHOICES,
    Knob,
    KnobError,
    config_key,
    parse_knobs,
    rewrite,
    settings,
    space_size,
)

SEEDS = Path(kernels.__file__).parent / "seeds"
SOFTMAX = (SEEDS / "softmax.py").read_text()

TYPED = """\
import math

MODE = "fast"  # tune: "fast", 'slow', "a, b"
USE_TMA = False  # tune: True, False
SCALE = 0.5  # tune: 0.25, 0.5, 1e-3
OFFSET = -1  # tune: -1, 0, 1
LABEL = "é"  # tune: "é", "ü"
"""


def _lines(source: str) -> list[str]:
    return source.splitlines(keepends=True)


def test_it_parses_the_softmax_seed() -> None:
    knobs = {knob.name: knob for knob in parse_knobs(SOFTMAX)}

    assert {"BLOCK_N", "NUM_WARPS"} <= set(knobs)
    lines = _lines(SOFTMAX)
    for knob in knobs.values():
        assert lines[knob.lineno - 1].startswith(f"{knob.name} = {knob.value!r}")
        assert knob.value in knob.choices
        assert isinstance(knob.choices, tuple)
        assert all(type(choice) is int for choice in knob.choices)


@pytest.mark.parametrize("seed", sorted(SEEDS.glob("*.py")), ids=lambda p: p.stem)
def test_every_seed_declares_knobs_that_round_trip(seed: Path) -> None:
    source = seed.read_text()
    knobs = parse_knobs(source)

    assert knobs, f"{seed.name} declares no '# tune:' knobs"
    # Move every knob to its last choice and back.
    last = {knob.name: knob.choices[-1] for knob in knobs}
    moved = rewrite(source, last)
    assert {k.name: k.value for k in parse_knobs(moved)} == last
    assert rewrite(moved, {knob.name: knob.value for knob in knobs}) == source


def test_rewrite_changes_only_the_value_literals() -> None:
    knobs = {knob.name: knob for knob in parse_knobs(SOFTMAX)}
    new = {"BLOCK_N": 2048, "NUM_WARPS": 8}

    out = rewrite(SOFTMAX, new)

    before, after = _lines(SOFTMAX), _lines(out)
    assert len(before) == len(after)
    changed = {i + 1 for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b}
    assert changed == {knobs["BLOCK_N"].lineno, knobs["NUM_WARPS"].lineno}
    for name, value in new.items():
        old_line = before[knobs[name].lineno - 1]
        old_text = repr(knobs[name].value)
        at = old_line.index(" = ") + len(" = ")
        assert old_line[at : at + len(old_text)] == old_text
        expected = old_line[:at] + repr(value) + old_line[at + len(old_text) :]
        assert after[knobs[name].lineno - 1] == expected


def test_rewrite_keeps_odd_spacing_crlf_and_unicode() -> None:
    source = '"""π ≈ 3.14"""\r\nX   =    4     #   tune:2,4,  8\r\nname = "ü"  # x = 4\r\n'

    out = rewrite(source, {"X": 8})

    assert out == '"""π ≈ 3.14"""\r\nX   =    8     #   tune:2,4,  8\r\nname = "ü"  # x = 4\r\n'
    assert parse_knobs(out) == [Knob("X", 8, (2, 4, 8), 2)]


def test_rewrite_to_the_current_values_is_the_identity() -> None:
    values = {knob.name: knob.value for knob in parse_knobs(SOFTMAX)}

    assert rewrite(SOFTMAX, values) == SOFTMAX
    assert rewrite(SOFTMAX, {}) == SOFTMAX


def test_it_reads_strings_bools_floats_and_negative_numbers() -> None:
    knobs = {knob.name: knob for knob in parse_knobs(TYPED)}

    assert knobs["MODE"].choices == ("fast", "slow", "a, b")
    assert knobs["USE_TMA"].value is False
    assert knobs["USE_TMA"].choices == (True, False)
    assert all(type(c) is bool for c in knobs["USE_TMA"].choices)
    assert knobs["SCALE"].choices == (0.25, 0.5, 0.001)
    assert knobs["OFFSET"].value == -1
    assert knobs["OFFSET"].choices == (-1, 0, 1)
    assert knobs["LABEL"].value == "é"


def test_rewrite_spells_values_as_the_comment_does() -> None:
    out = rewrite(
        TYPED,
        {"MODE": "slow", "USE_TMA": True, "SCALE": 0.001, "OFFSET": 1, "LABEL": "ü"},
    )

    assert "MODE = 'slow'  # tune:" in out
    assert "USE_TMA = True  # tune:" in out
    assert "SCALE = 1e-3  # tune:" in out
    assert "OFFSET = 1  # tune:" in out
    assert 'LABEL = "ü"  # tune:' in out
    assert rewrite(out, {"MODE": "a, b"}).count('MODE = "a, b"  # tune:') == 1
    values = {k.name: k.value for k in parse_knobs(out)}
    assert values == {"MODE": "slow", "USE_TMA": True, "SCALE": 0.001, "OFFSET": 1, "LABEL": "ü"}


PRELUDE = "import math\n\n"  # knob errors below are on line 3 or later


@pytest.mark.parametrize(
    ("body", "line", "fragment"),
    [
        ("A = 1  # tune: 1, 2\nA = 2  # tune: 1, 2\n", 4, "duplicate knob A"),
        ("A = 1  # tune:\n", 3, "empty choice list"),
        ("A = 1  # tune:    \n", 3, "empty choice list"),
        ("A = 1  # tune: 1, two, 3\n", 3, "unparsable choice 'two'"),
        ("A = 1  # tune: 1, 2 3\n", 3, "unparsable choice '2 3'"),
        ("A = 1  # tune: 1, , 2\n", 3, "empty choice"),
        ("A = 1  # tune: 1, (2, 3)\n", 3, "unparsable choice '(2, 3)'"),
        ("A = 1  # tune: 1, 1, 2\n", 3, "duplicate choice"),
        ("A = 3  # tune: 1, 2\n", 3, "not among its choices"),
        ("A = 1  # tune: 1, 2.0\n", 3, "mixed types"),
        ("A = 1  # tune: 1, 'x'\n", 3, "mixed types"),
        ("A = 1.0  # tune: 1, 2\n", 3, "mixed types"),
        ("A = 1  # tune: True, False\n", 3, "mixed types"),
        ("def f():\n    A = 1  # tune: 1, 2\n", 4, "top-level"),
        ("class C:\n    A = 1  # tune: 1, 2\n", 4, "top-level"),
        ("if True:\n    A = 1  # tune: 1, 2\n", 4, "top-level"),
        ("# tune: 1, 2\nA = 1\n", 3, "not on its own"),
        ("A, B = 1, 2  # tune: 1, 2\n", 3, "simple assignment"),
        ("A = B = 1  # tune: 1, 2\n", 3, "simple assignment"),
        ("A += 1  # tune: 1, 2\n", 3, "simple assignment"),
        ("A = 1 + 1  # tune: 2, 4\n", 3, "literal"),
        ("A = math.pi  # tune: 1.0, 2.0\n", 3, "literal"),
        ("A = None  # tune: 1, 2\n", 3, "literal"),
        ("A = (1)  # tune: 1, 2\n", 3, "single bare literal"),
        ("A = 1; B = 2  # tune: 1, 2\n", 3, "single statement"),
        ("A = 1  # tune: 1, 2\nA = 2\n", 4, "assigned again"),
        ("A = 1  # tune: 1, 2\n\n\nA += 1\n", 6, "assigned again"),
    ],
)
def test_bad_annotations_raise_knob_error_naming_the_line(
    body: str, line: int, fragment: str
) -> None:
    with pytest.raises(KnobError) as excinfo:
        parse_knobs(PRELUDE + body)

    message = str(excinfo.value)
    assert message.startswith(f"line {line}:"), message
    assert fragment in message, message
    assert isinstance(excinfo.value, ValueError)


def test_a_source_that_does_not_parse_is_a_knob_error() -> None:
    with pytest.raises(KnobError, match=r"^line 3: source does not parse"):
        parse_knobs(PRELUDE + "A = (1  # tune: 1, 2\n")


def test_rewrite_rejects_unknown_knobs_and_values_outside_the_choices() -> None:
    knobs = {knob.name: knob for knob in parse_knobs(SOFTMAX)}
    line = knobs["BLOCK_N"].lineno

    with pytest.raises(KnobError, match="unknown knob 'BLOCK_M'"):
        rewrite(SOFTMAX, {"BLOCK_M": 1024})
    with pytest.raises(KnobError, match=rf"^line {line}: 3000 is not a choice of BLOCK_N"):
        rewrite(SOFTMAX, {"BLOCK_N": 3000})
    with pytest.raises(KnobError, match=rf"^line {line}: 1024.0 is not a choice"):
        rewrite(SOFTMAX, {"BLOCK_N": 1024.0})
    with pytest.raises(KnobError, match=r"^line 6: True is not a choice of OFFSET"):
        rewrite(TYPED, {"OFFSET": True})


def test_space_size_is_the_product_of_choice_counts() -> None:
    knobs = parse_knobs(TYPED)

    assert space_size(knobs) == 3 * 2 * 3 * 3 * 2
    assert space_size([]) == 1


def test_config_key_is_canonical_and_type_exact() -> None:
    assert config_key({"A": 1, "B": "x"}) == config_key({"B": "x", "A": 1})
    assert len({config_key({"A": v}) for v in (1, 1.0, True, "1")}) == 4
    assert config_key({"A": 1, "B": 2}) != config_key({"A": 2, "B": 1})


def test_settings_lists_every_configuration_once_in_lexical_order() -> None:
    found = parse_knobs("A = 1  # tune: 1, 2\nB = 'x'  # tune: 'x', 'y', 'z'\n")
    every = list(settings(found))
    assert len(every) == space_size(found) == 6
    assert every[:2] == [{"A": 1, "B": "x"}, {"A": 1, "B": "y"}] and every[-1] == {"A": 2, "B": "z"}
    assert len({config_key(v) for v in every}) == 6


def test_a_knob_with_more_choices_than_a_search_needs_is_refused() -> None:
    many = ", ".join(str(i) for i in range(1, MAX_CHOICES + 2))
    with pytest.raises(KnobError, match=f"257 choices; a knob takes at most {MAX_CHOICES}"):
        parse_knobs(f"BLOCK_N = 1  # tune: {many}\n")
    fewer = many.rsplit(",", 1)[0]
    assert len(parse_knobs(f"BLOCK_N = 1  # tune: {fewer}\n")[0].choices) == MAX_CHOICES
