"""The release library at run time: per-GPU, per-shape dispatch with fallback to the reference.

    from kernels.library import load
    softmax = load("softmax")            # or load("softmax", library_dir="/path/to/export")
    y = softmax(x)

A library directory (written by `python manage.py export_library`, or inside an exported
package) holds `manifest.json`, the released sources under `kernels/` and the references under
`references/`. For each call the dispatcher picks the best release for the inputs' GPU kind,
dtype and shape within the release's validated range; outside every range, on a device no
release was validated on, or with no release at all, it calls the reference.

A release also carries its per-shape table (`shapes` in the manifest): on each shape it was
re-validated on, whether the kernel beat the faster of eager and torch.compile beyond the
measured noise, and if not, which baseline serves. A call on such a shape goes where the table
says: the kernel, the reference ("eager"), or torch.compile of the reference ("compiled":
one compiled function per loaded kernel, made on the first such call; the reference if
compiling fails, e.g. on a machine without a C compiler). `route_of(*args)` says which; shapes
the table does not list run the release's kernel inside its range. Manifests written before
releases carried a table have no `shapes`: their calls dispatch by range alone.

Inside a model under torch.compile a call traces the reference inline by default, so Inductor
compiles and fuses it with the model's other ops exactly as it would without the library: a
release was measured against torch.compile of its op alone, and inside a compiled model it
would replace a kernel Inductor fuses with its neighbours (measured on the H200: a compiled
block with three releases ran at 0.85-0.99x the compiled plain block, docs/benchmarks/model.md).
`load(..., under_compile="kernel")` (or AUTOWEB_LIBRARY_UNDER_COMPILE=kernel) runs the releases
there too: the route is then decided while Dynamo traces the call, with no graph break, and a
release's kernel is traced as a user Triton kernel.

How a call's inputs give its shape is the problem's own declaration (its DIMS and RANKS), which
the export copies into the manifest's `problems` entry; with no manifest, inside autoweb, it is
read from the problem registry.

This file is copied into exported packages as their `__init__` (the wheel's docstring then
imports from the package, e.g. `from autoweb_kernels import load`), so it imports nothing but
the standard library and torch (lazily): never Django, never the rest of `kernels`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 1
ENV_DIR = "AUTOWEB_LIBRARY_DIR"
ENV_UNDER_COMPILE = "AUTOWEB_LIBRARY_UNDER_COMPILE"
UNDER_COMPILE = ("reference", "kernel")  # what a call traced by torch.compile runs
INTERPRET = "interpret"
# Same names as kernels.harness.device.KINDS (kept in step by a test).
_KINDS = {"H200": "h200", "H100": "h100", "B200": "b200", "A100": "a100", "L40S": "l40s"}


class LibraryError(ValueError):
    """A library directory or manifest that cannot be used; the message says why."""


def gpu_kind(name: str) -> str:
    for key, kind in _KINDS.items():
        if key in name.upper():
            return kind
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def default_dir() -> Path | None:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    return here if (here / MANIFEST).is_file() else None  # inside an exported package


def read_manifest(library_dir: str | Path) -> dict[str, Any]:
    path = Path(library_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LibraryError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LibraryError(f"{path} is not a format-{FORMAT} autoweb library manifest")
    return data


def in_range(shape: dict[str, int], shape_range: dict[str, list[int]]) -> bool:
    """Whether every dim of `shape` lies within [lo, hi] of the range (dims it omits: any)."""
    for dim, bounds in shape_range.items():
        value = shape.get(dim)
        if value is None or not bounds[0] <= value <= bounds[1]:
            return False
    return True


def _import_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LibraryError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Triton resolves a jitted function's module by name
    spec.loader.exec_module(mod)
    return mod


class Kernel:
    """The callable `load()` returns. Choices are cached per (shapes, strides, dtype, device) of
    the inputs, so a repeated call costs a tuple build and a dict lookup before the chosen
    function runs."""

    def __init__(
        self,
        problem: str,
        releases: list[dict[str, Any]],
        dims: dict[str, tuple[int, int]],
        reference: Callable[..., Any],
        library_dir: Path | None,
        ranks: list[int] | None = None,
        under_compile: str = "reference",
    ) -> None:
        self.problem = problem
        self.under_compile = under_compile
        self.releases = releases
        self.dims = {k: (int(v[0]), int(v[1])) for k, v in dims.items()}
        self.reference = reference
        self.library_dir = library_dir
        self.ranks = [int(r) for r in ranks] if ranks else None
        # key -> (function, the release whose kernel runs or None, route)
        self._cache: dict[tuple, tuple[Callable[..., Any], dict[str, Any] | None, str]] = {}
        self._modules: dict[str, Any] = {}
        self._compiled: _Compiled | None = None  # torch.compile of the reference, made lazily
        self._kinds: dict[int, str | None] = {}  # device index -> GPU kind
        self._lock = threading.Lock()
        self._id = id(self)
        _BY_ID[self._id] = self
        self._compiling = _compiling_probe()
        self.__name__ = problem
        self.__doc__ = f"autoweb library kernel for {problem}: {len(releases)} release(s)"

    def __repr__(self) -> str:
        return f"<autoweb kernel {self.problem}: {len(self.releases)} release(s)>"

    def __call__(self, *args: Any) -> Any:
        if self._compiling():
            return self._traced(args)
        # The hot path: shape, strides (so layout), dtype and device index of each input,
        # spelled out for one and two inputs because a generator costs a microsecond.
        n = len(args)
        if n == 1:
            a = args[0]
            key: tuple = (a.shape, a.stride(), a.dtype, a.get_device())
        elif n == 2:
            a, b = args
            key = (
                a.shape, a.stride(), a.dtype, a.get_device(),
                b.shape, b.stride(), b.dtype, b.get_device(),
            )  # fmt: skip
        else:
            key = _key(args)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._resolve(key)
        return hit[0](*args)

    def _traced(self, args: tuple) -> Any:
        """A call while torch.compile traces the caller (shapes are constants then). By default
        the reference, traced inline, so Inductor compiles and fuses it with the ops around it
        as torch.compile of the caller would without the library. With under_compile="kernel"
        the route is decided by `_route_while_tracing`, which Dynamo runs as plain Python and
        keeps as a constant, so the dispatcher puts no graph break in the caller's graph; a
        release's kernel is traced as the user Triton kernel it is, every other route traces
        the reference inline."""
        if self.under_compile == "reference":
            return self.reference(*args)
        route, rid = _route_while_tracing(self._id, _key(args))
        if route == "kernel":
            return self._modules[rid].kernel(*args)
        return self.reference(*args)

    def choose(self, *args: Any) -> dict[str, Any] | None:
        """The release whose kernel a call with these inputs would run (None: a baseline)."""
        key = _key(args)
        hit = self._cache.get(key) or self._resolve(key)
        return hit[1]

    def route_of(self, *args: Any) -> str:
        """What a call with these inputs runs: "kernel" (a release), "compiled" or "eager"
        (a release's table says that baseline is faster on this shape), or "reference" (no
        release covers the call)."""
        key = _key(args)
        hit = self._cache.get(key) or self._resolve(key)
        return hit[2]

    # -- choosing -------------------------------------------------------------------------------

    def _kind(self, device: int) -> str | None:
        """The GPU kind of a device index (`Tensor.get_device()`: -1 is the CPU; an index on a
        machine without CUDA is another accelerator, which no release was validated on)."""
        if device not in self._kinds:
            kind = None
            if device >= 0:
                import torch

                if torch.cuda.is_available():
                    kind = gpu_kind(torch.cuda.get_device_name(device))
            elif os.environ.get("TRITON_INTERPRET") == "1":
                kind = INTERPRET
            self._kinds[device] = kind
        return self._kinds[device]

    def shape_of(self, args: tuple) -> dict[str, int] | None:
        """The problem's named dims of a call's inputs, by its declaration (None: they do not
        fit it)."""
        return self._named_dims([a.shape for a in args])

    def _named_dims(self, shapes: list[tuple[int, ...]]) -> dict[str, int] | None:
        shape: dict[str, int] = {}
        for dim, (i, axis) in self.dims.items():
            if i >= len(shapes) or axis >= len(shapes[i]):
                return None
            value = int(shapes[i][axis])
            if shape.setdefault(dim, value) != value:
                return None
        return shape

    def _resolve(self, key: tuple) -> tuple[Callable[..., Any], dict | None, str]:
        with self._lock:
            choice, route = self._decide(key)
            if route == "kernel":
                hit = (self._function(choice), choice, route)
            elif route == "compiled":
                if self._compiled is None:
                    self._compiled = _Compiled(self.reference, _compiled_rows(self.releases))
                hit = (self._compiled.signature(), None, route)
            else:
                hit = (self.reference, None, route)
            self._cache[key] = hit
            return hit

    def _decide(self, key: tuple) -> tuple[dict[str, Any] | None, str]:
        """The release (or None) and the route for a call's key: everything is read from the
        key (shape, strides, dtype and device index of each input), never from the tensors,
        so that the same decision can be made while torch.compile traces the call."""
        choice = self._pick(key)
        if choice is None:
            return None, "reference"
        return choice, _served_by(choice, self._named_dims([key[i] for i in range(0, len(key), 4)]))

    def _pick(self, key: tuple) -> dict[str, Any] | None:
        inputs = [key[i : i + 4] for i in range(0, len(key), 4)]
        if not inputs or not all(_contiguous(shape, stride) for shape, stride, _, _ in inputs):
            return None  # releases were validated on the harness's contiguous inputs
        devices = {device for _, _, _, device in inputs}
        kind = self._kind(inputs[0][3]) if len(devices) == 1 else None
        shape = self._named_dims([shape for shape, _, _, _ in inputs])
        if kind is None or shape is None:
            return None
        dtype = str(inputs[0][2]).replace("torch.", "")
        if self.ranks is not None and [len(s) for s, _, _, _ in inputs] != self.ranks:
            return None
        best = None
        for rel in self.releases:
            if rel["kind"] != kind or rel.get("dtype", dtype) != dtype:
                continue
            if not in_range(shape, rel["shape_range"]):
                continue
            if best is None or _rank(rel) > _rank(best):
                best = rel
        return best

    def _function(self, release: dict[str, Any]) -> Callable[..., Any]:
        rid = str(release["id"])
        if rid not in self._modules:
            if self.library_dir is None:
                raise LibraryError("releases without a library directory")
            path = self.library_dir / release["file"]
            self._modules[rid] = _import_file(path, f"autoweb_release_{rid}")
        return self._modules[rid].kernel


def _served_by(release: dict[str, Any], shape: dict[str, int] | None) -> str:
    """ "kernel", "compiled" or "eager" for `shape` by the release's table; "kernel" for a
    shape the table does not list (the release's range covers it)."""
    for row in release.get("shapes") or ():
        if isinstance(row, dict) and row.get("shape") == shape:
            serve = row.get("serve")
            return serve if serve in ("kernel", "compiled", "eager") else "kernel"
    return "kernel"


def _compiled_rows(releases: list[dict[str, Any]]) -> int:
    """How many shapes the releases' tables give to torch.compile: the most distinct graphs
    (one per shape, `dynamic=False`) the compiled reference is asked for."""
    return sum(
        1
        for rel in releases
        for row in rel.get("shapes") or ()
        if isinstance(row, dict) and row.get("serve") == "compiled"
    )


class _Compiled:
    """torch.compile of the reference (`dynamic=False`, as re-validation timed it: a graph per
    shape), made once per loaded kernel on the first call a table sends to it.

    Dynamo keeps its graphs per code object and, past its recompile limit (8 by default),
    silently runs the function eagerly: a library whose tables give more shapes than that to
    torch.compile would run eager where they say compiled. So each input signature's first
    call, the one that compiles, runs with the limit raised to cover the tables' compiled
    shapes (for that call only; later calls find their graph without compiling). If compiling
    fails (e.g. no C compiler) every compiled shape runs the reference."""

    def __init__(self, reference: Callable[..., Any], shapes: int) -> None:
        self.reference = reference
        self.limit = max(64, 4 * shapes)
        self.fn: Callable[..., Any] | None = None
        self.failed: str | None = None

    def signature(self) -> _CompiledCall:
        return _CompiledCall(self)

    def first_call(self, args: tuple) -> Any:
        """Compile for these inputs (if not already) and run; the reference if that fails."""
        if self.failed is not None:
            return self.reference(*args)
        import torch
        import torch._dynamo

        if self.fn is None:
            self.fn = torch.compile(self.reference, dynamic=False)
        config = torch._dynamo.config
        # One name only: since torch 2.6 `cache_size_limit` is an alias of `recompile_limit`,
        # and patching both leaves dynamo's config without `recompile_limit` afterwards.
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        raised = {name: max(self.limit, getattr(config, name))}
        try:
            with config.patch(raised):
                return self.fn(*args)
        except Exception as e:  # noqa: BLE001 - any compiler failure: the reference serves
            self.failed = f"torch.compile failed: {type(e).__name__}: {e}"[:300]
            return self.reference(*args)


class _CompiledCall:
    """What one input signature routed to torch.compile runs: its first call compiles
    (`_Compiled.first_call`), later ones run the compiled function, or the reference if
    compiling failed."""

    def __init__(self, compiled: _Compiled) -> None:
        self.compiled = compiled
        self.run: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self.run is not None:
            return self.run(*args)
        out = self.compiled.first_call(args)
        self.run = self.compiled.reference if self.compiled.failed else self.compiled.fn
        return out


def _key(args: tuple) -> tuple:
    """The cache key `Kernel.__call__` builds inline (same tuple, any number of inputs)."""
    return tuple(x for a in args for x in (a.shape, a.stride(), a.dtype, a.get_device()))


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """`Tensor.is_contiguous()` from a shape and its strides (dims of size 1 have any stride)."""
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


# Kernels by id, for `_route_while_tracing`: Dynamo calls a constant-result function with
# constants only, so the kernel is named by its id.
_BY_ID: weakref.WeakValueDictionary[int, Kernel] = weakref.WeakValueDictionary()


def _route_while_tracing(kernel_id: int, key: tuple) -> tuple[str, str | None]:
    """The route and release id of a call traced by torch.compile. Dynamo runs this as plain
    Python while tracing and bakes its result into the graph (`assume_constant_result`, set on
    first use); the graph's guards on the inputs' shapes, strides and dtypes make it recompile
    for another key. The release's module is imported here, outside the traced code."""
    kernel = _BY_ID[kernel_id]
    with kernel._lock:
        choice, route = kernel._decide(key)
        if route == "kernel":
            kernel._function(choice)
    return route, (str(choice["id"]) if route == "kernel" else None)


def _compiling_probe() -> Callable[[], bool]:
    """`torch.compiler.is_compiling` (True only while Dynamo traces), with the route function
    marked as a constant for Dynamo; on a torch without them, never compiling."""
    global _route_while_tracing
    try:
        import torch

        is_compiling = torch.compiler.is_compiling
        mark = torch.compiler.assume_constant_result
    except (ImportError, AttributeError):
        return lambda: False
    if not getattr(_route_while_tracing, "_dynamo_marked_constant", False):
        _route_while_tracing = mark(_route_while_tracing)
    return is_compiling


def _rank(release: dict[str, Any]) -> tuple[float, str]:
    speedup = release.get("speedup_eager")
    return (float(speedup) if isinstance(speedup, int | float) else 0.0, str(release["id"]))


def _reference(problem: str, library_dir: Path | None) -> Callable[..., Any]:
    if library_dir is not None:
        path = library_dir / "references" / f"{problem}.py"
        if path.is_file():
            return _import_file(path, f"autoweb_reference_{problem}").reference
    try:  # inside autoweb: the problem registry is the source of truth
        from kernels import problems
    except ImportError as e:
        raise LibraryError(f"no reference for {problem!r} in {library_dir}") from e
    return problems.load(problem).module.reference


def _declared(problem: str) -> tuple[dict[str, Any] | None, list[int] | None]:
    """DIMS and RANKS from the problem registry, when running inside autoweb."""
    try:
        from kernels import problems
    except ImportError:
        return None, None
    try:
        p = problems.load(problem)
    except problems.ProblemError:
        return None, None
    return dict(p.dims), list(p.ranks)


def load(
    problem: str, library_dir: str | Path | None = None, *, under_compile: str | None = None
) -> Kernel:
    """The dispatching kernel for `problem` (the reference alone when no release is known).

    `under_compile`: what a call traced by torch.compile runs, "reference" (the default, or
    AUTOWEB_LIBRARY_UNDER_COMPILE) or "kernel" (the releases, as outside torch.compile)."""
    mode = under_compile or os.environ.get(ENV_UNDER_COMPILE) or "reference"
    if mode not in UNDER_COMPILE:
        raise LibraryError(
            f"under_compile must be one of {', '.join(UNDER_COMPILE)}, not {mode!r}"
            + ("" if under_compile else f" (from {ENV_UNDER_COMPILE})")
        )
    root = Path(library_dir) if library_dir is not None else default_dir()
    releases: list[dict[str, Any]] = []
    dims = ranks = None
    if root is not None:
        manifest = read_manifest(root)
        releases = [r for r in manifest.get("releases", []) if r.get("problem") == problem]
        entry = manifest.get("problems", {}).get(problem) or {}
        dims, ranks = entry.get("dims"), entry.get("ranks")
    if dims is None:  # no manifest, or one without this problem: autoweb's own declaration
        dims, declared_ranks = _declared(problem)
        ranks = ranks or declared_ranks
    if dims is None:
        raise LibraryError(f"unknown problem {problem!r}: no dims in the manifest")
    return Kernel(problem, releases, dims, _reference(problem, root), root, ranks, mode)
