"""Export releases as a library directory or a standalone wheel.

Directory layout (read by kernels.library.load(..., library_dir=DIR) or AUTOWEB_LIBRARY_DIR):

    manifest.json             format; problems (dims, signature); releases (range, kind, ...)
    kernels/<problem>_<kind>_<id>.py   released sources, exactly as approved
    references/<problem>.py   each problem's PyTorch reference, for every problem exported
                              (with or without a release): the fallback

The wheel holds the same files inside a package (default `autoweb_kernels`) whose __init__ is
kernels/library.py itself, so `import autoweb_kernels; autoweb_kernels.load("softmax")` works
with only torch (and triton, for the releases) installed: no autoweb, no Django.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import inspect
import io
import json
import re
import types
import zipfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import kernels.library as runtime
from kernels import problems as registry
from library.models import Release

PACKAGE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
VERSION_RE = re.compile(r"^\d+(\.\d+)*$")


class ExportError(ValueError):
    pass


def reference_module(problem: str) -> str:
    """A standalone module with the problem's `reference`: its source plus what it names from
    the problem module, followed through the helpers it calls: module-level constants, modules
    (imported by name), functions defined there (copied) and functions imported from elsewhere
    (imported from where they live, which must then be importable where the library runs)."""
    mod = registry.load(problem).module
    header = ["from __future__ import annotations", "", "import math", "", "import torch", ""]
    copied: list[str] = []
    seen: set[str] = set()

    def names_of(code: types.CodeType) -> set[str]:
        found = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found |= names_of(const)
        return found

    def follow(fn: types.FunctionType) -> None:
        for name in sorted(names_of(fn.__code__)):
            if name in seen or name not in vars(mod) or name in ("torch", "math"):
                continue
            seen.add(name)
            value = vars(mod)[name]
            if isinstance(value, types.ModuleType):
                header.append(f"import {value.__name__} as {name}")
            elif isinstance(value, bool | int | float | str):
                header.append(f"{name} = {value!r}")
            elif isinstance(value, types.FunctionType) and value.__module__ == mod.__name__:
                copied.append(inspect.getsource(value))
                follow(value)
            elif callable(value) and _importable(value):
                header.append(f"from {value.__module__} import {value.__qualname__} as {name}")
            else:
                raise ExportError(
                    f"problem {problem!r}: its reference uses {name!r} "
                    f"({type(value).__name__}), which the export cannot carry into the package"
                )

    follow(mod.reference)
    body = [*copied, inspect.getsource(mod.reference)]
    return "\n".join(header) + "\n\n" + "\n\n".join(body)


def _importable(value: object) -> bool:
    """A function or class that `from its module import its name` gives back."""
    module = getattr(value, "__module__", None) or ""
    qualname = getattr(value, "__qualname__", "") or ""
    if not module or module.startswith("autoweb_problem_") or "." in qualname or "<" in qualname:
        return False
    try:
        return getattr(importlib.import_module(module), qualname, None) is value
    except ImportError:
        return False


def problem_entry(problem: str) -> dict:
    """The manifest's entry for a problem: its declared DIMS and RANKS (checked against the
    inputs it makes), which is all the dispatcher needs to read a call's shape."""
    try:
        p = registry.load(problem)
        p.check_dims()
    except registry.ProblemError as e:
        raise ExportError(f"cannot export {problem!r}: {e}") from e
    return {
        "dims": {k: list(v) for k, v in p.dims.items()},
        "ranks": list(p.ranks),
        "signature": p.signature,
    }


def manifest(releases: list[Release]) -> dict:
    probs = sorted({r.problem for r in releases})
    return {
        "format": runtime.FORMAT,
        "generated_at": datetime.now(UTC).isoformat(),
        "problems": {p: problem_entry(p) for p in probs},
        "releases": [r.manifest_entry() for r in releases],
    }


def select(problems: Iterable[str] = (), kinds: Iterable[str] = ()) -> list[Release]:
    rows = Release.objects.filter(revoked_at__isnull=True).select_related("approver", "trial")
    problems, kinds = list(problems), list(kinds)
    if problems:
        rows = rows.filter(problem__in=problems)
    if kinds:
        rows = rows.filter(kind__in=kinds)
    return list(rows.order_by("problem", "kind", "pk"))


def files(releases: list[Release], extra_problems: Iterable[str] = ()) -> dict[str, str]:
    """Path -> text of a library directory holding `releases` (active ones only)."""
    releases = [r for r in releases if r.active]
    data = manifest(releases)
    # A problem with no release still gets its reference, so `load(p)` always works: the ones
    # asked for, or with no filter every problem that loads (a user's problem that fails to
    # load has no reference to carry; the problems page says why).
    wanted = list(extra_problems)
    for p in wanted or registry.names():
        if p in data["problems"]:
            continue
        try:
            data["problems"][p] = problem_entry(p)
        except ExportError:
            if wanted:
                raise
    out = {runtime.MANIFEST: json.dumps(data, indent=2) + "\n"}
    for rel, entry in zip(releases, data["releases"], strict=True):
        out[entry["file"]] = rel.source
    for p in data["problems"]:
        out[f"references/{p}.py"] = reference_module(p)
    return out


def write_dir(releases: list[Release], out: Path, extra_problems: Iterable[str] = ()) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files(releases, extra_problems).items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return out


def package_init(package: str) -> str:
    """kernels/library.py as the package's __init__, its docstring naming the package's import."""
    text = Path(runtime.__file__).read_text()
    usage = "from kernels.library import load"
    if usage not in text:
        raise ExportError(f"kernels/library.py no longer shows {usage!r}: update the export")
    return text.replace(usage, f"from {package} import load", 1)


def wheel_bytes(
    releases: list[Release],
    *,
    package: str = "autoweb_kernels",
    version: str = "0.1.0",
    extra_problems: Iterable[str] = (),
) -> tuple[str, bytes]:
    """(filename, bytes) of a pure-Python wheel: the library directory as a package."""
    if not PACKAGE_RE.match(package):
        raise ExportError(f"{package!r} is not a package name (lowercase, digits, _)")
    if not VERSION_RE.match(version):
        raise ExportError(f"{version!r} is not a version (e.g. 0.1.0)")
    contents = {f"{package}/{k}": v for k, v in files(releases, extra_problems).items()}
    contents[f"{package}/__init__.py"] = package_init(package)
    dist = f"{package}-{version}.dist-info"
    contents[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        "Summary: Kernels released by autoweb, dispatched per GPU and shape with fallback\n"
        "Requires-Python: >=3.10\n"
    )
    contents[f"{dist}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: autoweb\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in sorted(contents.items()):
            raw = text.encode()
            zf.writestr(name, raw)
            digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(raw)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return f"{package}-{version}-py3-none-any.whl", buf.getvalue()
