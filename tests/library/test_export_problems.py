"""What the export writes for a problem: the manifest entry from the problem's own declaration,
and a standalone reference module that carries what the reference uses."""

from __future__ import annotations

import types

import pytest
import torch

from kernels import problems
from library import export
from tests.kernels.test_cli import ROWSCALE

HELPERS = ROWSCALE.replace(
    """def reference(x):
    return x * 2
""",
    """from torch.nn.functional import silu

SCALE = 2.0


def _inner(x):
    return x * SCALE


def _helper(x):
    return silu(_inner(x)) + _inner(x)


def reference(x):
    return _helper(x)
""",
)


def _run(source: str, *inputs):
    module = types.ModuleType("exported_reference")
    exec(compile(source, "exported_reference", "exec"), module.__dict__)
    return module.reference(*inputs)


@pytest.fixture
def users(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path))
    return tmp_path


def test_the_reference_carries_helpers_constants_and_imported_functions(users):
    assert "def reference(x):\n    return _helper(x)" in HELPERS
    (users / "helpers_problem.py").write_text(HELPERS)
    source = export.reference_module("helpers_problem")
    assert "from torch.nn.functional import silu as silu" in source
    assert "SCALE = 2.0" in source and "def _inner(x):" in source and "def _helper(x):" in source
    x = torch.randn(3, 5)
    torch.testing.assert_close(_run(source, x), problems.load("helpers_problem").reference(x))


def test_a_reference_using_something_the_export_cannot_carry_is_refused(users):
    (users / "tabled.py").write_text(
        ROWSCALE.replace("    return x * 2\n", '    return x * TABLE["scale"]\n')
        + '\nTABLE = {"scale": 2}\n'
    )
    with pytest.raises(export.ExportError, match="uses 'TABLE' \\(dict\\)"):
        export.reference_module("tabled")


def test_the_manifest_entry_is_the_problems_declaration_checked_against_its_inputs(users):
    (users / "rowscale.py").write_text(ROWSCALE)
    assert export.problem_entry("rowscale") == {
        "dims": {"M": [0, 0], "N": [0, 1]},
        "ranks": [2],
        "signature": "kernel(x)",
    }
    (users / "swapped.py").write_text(
        ROWSCALE.replace('DIMS = {"M": (0, 0), "N": (0, 1)}', 'DIMS = {"M": (0, 1), "N": (0, 0)}')
    )
    with pytest.raises(export.ExportError, match="cannot export 'swapped'.*DIMS reads M"):
        export.problem_entry("swapped")
