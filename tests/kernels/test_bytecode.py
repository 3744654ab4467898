"""kernels.harness.bytecode: a package installed without bytecode is compiled once, by the
caller, before any sandboxed child (which writes none) starts; real files, a real compileall."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernels.harness import bytecode


@pytest.fixture
def package(tmp_path: Path, monkeypatch) -> Path:
    """An installed package without bytecode, as uv installs one: sources only."""
    root = tmp_path / "site"
    pkg = root / "nobytecode_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("def f():\n    return 2\n")
    (pkg / "py2_only.py").write_text("print 'a test file for another Python'\n")
    monkeypatch.syspath_prepend(str(root))
    return pkg


def _pyc(source: Path) -> Path:
    return source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def test_a_package_without_bytecode_is_found_and_compiled(package: Path) -> None:
    assert bytecode.missing(("nobytecode_pkg", "no_such_package_at_all")) == [package]

    done = bytecode.compile_missing(("nobytecode_pkg",), allowed=True)

    assert done["compiled"] == [str(package)] and done["still_missing"] == []
    for src in ("__init__.py", "sub/__init__.py", "sub/deep.py"):
        assert _pyc(package / src).exists(), src
    # A file that does not compile keeps its source only, and stops nothing else.
    assert not _pyc(package / "py2_only.py").exists()
    assert bytecode.missing(("nobytecode_pkg",)) == []
    assert bytecode.compile_missing(("nobytecode_pkg",)) == {}


def test_turned_off_it_compiles_nothing_and_says_what_to_run(
    package: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("AUTOWEB_COMPILE_BYTECODE", "0")
    monkeypatch.setattr(bytecode, "PACKAGES", ("nobytecode_pkg",))
    monkeypatch.setattr(bytecode, "_checked", False)

    done = bytecode.ensure()

    assert done["not_writable"] == [str(package)] and done["compiled"] == []
    assert not _pyc(package / "__init__.py").exists()
    err = capsys.readouterr().err
    assert f"-m compileall -q -j 0 {package}" in err and "every sandboxed child" in err
    assert bytecode.ensure() == {}  # once per process


def test_before_the_first_child_it_compiles_once_and_says_so(
    package: Path, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("AUTOWEB_COMPILE_BYTECODE", raising=False)
    monkeypatch.setattr(bytecode, "PACKAGES", ("nobytecode_pkg",))
    monkeypatch.setattr(bytecode, "_checked", False)

    done = bytecode.ensure()

    assert done["compiled"] == [str(package)]
    assert _pyc(package / "sub" / "deep.py").exists()
    assert f"compiled the bytecode of {package}" in capsys.readouterr().err
