"""docs/architecture.md's import table, enforced on the source: every import statement of every
package is read with `ast` (module level and inside functions alike), and a web module is
imported in a fresh interpreter to show that torch never loads there."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WEB = ("autoweb", "core", "searches", "library")
# package -> the first-party packages it must never import (docs/architecture.md).
FORBIDDEN = {
    "kernels": {"autoweb", "core", "searches", "library", "django", "channels", "django_htmx"},
    "core": {"autoweb", "searches", "library"},
    "searches": {"library"},
    "library": set(),
    "autoweb": set(),
}
# The only modules of `searches` that `library` may import: what both apps need lives in `core`.
LIBRARY_USES_OF_SEARCHES = (
    "searches.models",
    "searches.hooks",
    "searches.reports",
    "searches.fleet",
    "searches.agent.notes",
)
# The GPU worker's entry point and what only it runs: a web module imports kernels.protocol and
# kernels.queues for the queues, never these.
WORKER_ONLY = (
    "kernels.worker",
    "kernels.harness.evaluation",
    "kernels.harness.verdict",
    "kernels.harness.oracle",
)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def arrows(package: str) -> list[tuple[str, str]]:
    return [
        (f"{path.relative_to(ROOT)}:{line}", name)
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, name in imports(path)
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_what_the_table_forbids(package):
    bad = [
        (where, name) for where, name in arrows(package) if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert not bad, f"{package} must not import {sorted(FORBIDDEN[package])}: {bad}"


def test_the_library_imports_only_the_parts_of_searches_it_builds_on():
    bad = [
        (where, name)
        for where, name in arrows("library")
        if name.split(".")[0] == "searches"
        and name != "searches"  # `from searches import x` is checked as searches.x
        and not any(name == m or name.startswith(m + ".") for m in LIBRARY_USES_OF_SEARCHES)
    ]
    assert not bad, f"library may import only {LIBRARY_USES_OF_SEARCHES} of searches: {bad}"


@pytest.mark.parametrize("package", WEB)
def test_no_web_module_imports_the_gpu_worker_or_the_harness_run(package):
    bad = [
        (where, name)
        for where, name in arrows(package)
        if any(name == m or name.startswith(m + ".") for m in WORKER_ONLY)
        or name in ("kernels.harness.run", "kernels.harness.evaluate")
    ]
    assert not bad, bad


def test_the_checker_sees_imports_inside_functions(tmp_path):
    # The import table would be toothless if a function-level import slipped past it.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from library import watch\n    import torch\n")
    assert {name for _, name in imports(module)} == {"library", "library.watch", "torch"}


IMPORT_ALL = """
import importlib, json, os, pkgutil, sys
import django
django.setup()
names = []
for package in {web!r}:
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
        if "torch" in sys.modules:
            break
print(json.dumps({{"imported": names, "torch": "torch" in sys.modules}}))
"""


@pytest.mark.slow
def test_importing_every_web_module_loads_no_torch():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "autoweb.settings"}
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL.format(web=WEB)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["torch"], f"torch was loaded by importing {result['imported'][-1]}"
    # Every app's modules were imported, views and management commands included.
    for module in (
        "autoweb.asgi",
        "core.control",
        "searches.views",
        "searches.orchestrator",
        "searches.management.commands.orchestrator",
        "library.services",
        "library.views",
    ):
        assert module in result["imported"]


def test_the_searches_templates_load_no_tag_and_include_no_template_of_the_library():
    """Templates count as imports: a searches page that loads a library tag or includes a
    library template would need the library app, the arrow the table forbids."""
    import re

    tags = {p.stem for p in (ROOT / "library").glob("templatetags/*.py")}
    own = {p.stem for app in ("core", "searches") for p in (ROOT / app).glob("templatetags/*.py")}
    pages = sorted((ROOT / "templates" / "searches").rglob("*.html"))
    assert pages and "trial_panels" in own  # the scan sees what it looks for
    for page in pages:
        text = page.read_text()
        for line in re.findall(r"{%\s*load\s+([^%]+)%}", text):
            loaded = set(line.split()) - {"static"}
            assert loaded <= own and not loaded & tags, f"{page.name} loads {sorted(loaded - own)}"
        assert not re.search(r"""{%\s*include\s+["']library/""", text), page.name
