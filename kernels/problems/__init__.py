"""Problem registry.

A problem is a plain module (built-in ones live in this package; more directories can be
added with ``AUTOWEB_PROBLEM_DIRS``, ``os.pathsep``-separated, or ``--problems-dir``).
It is the single source of truth for reference, inputs, shapes and tolerances: the harness,
the tests and the benchmarks all import it from here.

Module contract (see docs/problems.md):

    SIGNATURE: str                      # "kernel(x, weight)"
    DESCRIPTION: str
    DIMS: dict[str, tuple[int, int]]    # shape dim -> (input index, axis): {"M": (0, 0), ...}
    RANKS: tuple[int, ...]              # the rank of each input, in signature order
    def reference(*inputs) -> Tensor    # pure PyTorch: the eager baseline, and torch.compile'd
    def make_inputs(shape, dtype, device, generator) -> tuple[Tensor, ...]
    SHAPES_FULL: list[dict[str, int]]   # GPU sweep
    SHAPES_SMOKE: list[dict[str, int]]  # CPU interpreter sweep
    DTYPES: dict[str, torch.dtype]      # {"cuda": torch.bfloat16, "interpret": torch.float32}
    TOLERANCE: dict[torch.dtype, dict]  # {"atol", "rtol", "l2"}, optional "rms_floor";
                                        # atol is relative to max(rms(ref), rms_floor)
    def flops(shape) -> float
    def bytes(shape, dtype) -> float    # minimum DRAM traffic: inputs read once, output written
    def oracle(*inputs_fp64) -> Tensor  # optional; defaults to reference on float64 inputs
    BLOCK_OP: str                       # optional; the op of kernels/block.py it stands in for
    SEED: str                           # optional; its seed kernel, relative to the module
    COMPILED_ORACLE: bool               # optional, True; False: the oracle always runs eagerly
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a problem's tensors are made: the web imports
    import torch  # this registry for names, shapes and costs and never loads torch for it

BUILTIN_DIR = Path(__file__).resolve().parent
SEEDS_DIR = BUILTIN_DIR.parent / "seeds"
BUILTIN = (
    "softmax",
    "rmsnorm",
    "layernorm",
    "swiglu",
    "rope",
    "matmul",
    "matmul_bias_gelu",
    "attention",
)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_REQUIRED = (
    "SIGNATURE",
    "reference",
    "make_inputs",
    "SHAPES_FULL",
    "SHAPES_SMOKE",
    "DTYPES",
    "TOLERANCE",
    "flops",
    "bytes",
    "DIMS",
    "RANKS",
)


class ProblemError(ValueError):
    """A problem name or module that cannot be used; the message says why."""


def shape_label(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


@dataclass(frozen=True)
class Problem:
    name: str
    path: Path
    module: ModuleType = field(repr=False, compare=False)

    @property
    def signature(self) -> str:
        return self.module.SIGNATURE

    @property
    def arg_names(self) -> tuple[str, ...]:
        inner = self.signature[self.signature.index("(") + 1 : self.signature.rindex(")")]
        return tuple(a.strip() for a in inner.split(",") if a.strip())

    @property
    def description(self) -> str:
        return getattr(self.module, "DESCRIPTION", "")

    @property
    def builtin(self) -> bool:
        return self.path.parent == BUILTIN_DIR

    @property
    def dims(self) -> dict[str, tuple[int, int]]:
        """Shape dim -> (input index, axis): where a call's inputs hold each dim."""
        return {k: (int(v[0]), int(v[1])) for k, v in self.module.DIMS.items()}

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(int(r) for r in self.module.RANKS)

    @property
    def block_op(self) -> str | None:
        return getattr(self.module, "BLOCK_OP", None)

    @property
    def compiled_oracle(self) -> bool:
        """Whether the harness may compile the oracle (docs/problems.md); True by default."""
        return bool(getattr(self.module, "COMPILED_ORACLE", True))

    @property
    def seed_path(self) -> Path:
        own = getattr(self.module, "SEED", None)
        if own:
            return (self.path.parent / own).resolve()
        return SEEDS_DIR / f"{self.name}.py"

    def shapes(self, tier: str) -> list[dict[str, int]]:
        if tier == "full":
            return [dict(s) for s in self.module.SHAPES_FULL]
        if tier == "smoke":
            return [dict(s) for s in self.module.SHAPES_SMOKE]
        raise ProblemError(f"unknown shape tier {tier!r}: use 'smoke' or 'full'")

    def dtype(self, device_kind: str) -> torch.dtype:
        key = "interpret" if device_kind == "interpret" else "cuda"
        return self.module.DTYPES[key]

    def tolerance(self, dtype: torch.dtype) -> dict[str, float]:
        return dict(self.module.TOLERANCE[dtype])

    def make_inputs(
        self, shape: dict[str, int], dtype: torch.dtype, device: str, seed: int
    ) -> tuple[torch.Tensor, ...]:
        import torch

        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        inputs = self.module.make_inputs(shape, dtype, device, gen)
        return tuple(inputs)

    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.module.reference(*inputs)

    def oracle(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The reference in float64: what every candidate output is compared against."""
        import torch

        with torch.no_grad():
            return self.oracle_function()(*inputs)

    def oracle_function(self) -> Callable[..., torch.Tensor]:
        """A new function that upcasts its floating-point inputs to float64 and runs the
        problem's `oracle` (its reference where it has none) on them: what `oracle` runs, and
        what the harness compiles (kernels.harness.oracle)."""
        fn: Callable[..., torch.Tensor] = getattr(self.module, "oracle", self.module.reference)

        def upcast(*inputs: torch.Tensor) -> torch.Tensor:
            return fn(*(x.double() if x.is_floating_point() else x for x in inputs))

        return upcast

    def flops(self, shape: dict[str, int]) -> float:
        return float(self.module.flops(shape))

    def bytes(self, shape: dict[str, int], dtype: torch.dtype) -> float:
        return float(self.module.bytes(shape, dtype))

    def reference_source(self) -> str:
        return inspect.getsource(self.module.reference)

    def check_dims(self) -> None:
        """Build real inputs and check that DIMS and RANKS describe them: the library reads a
        call's shape through DIMS, so a wrong axis would dispatch releases on the wrong sizes.
        Uses the smoke shape with the most distinct sizes, so that swapped axes show."""
        shape = max(
            self.shapes("smoke"), key=lambda s: (len(set(s.values())), -math.prod(s.values()))
        )
        try:
            inputs = self.make_inputs(shape, self.dtype("interpret"), "cpu", 0)
        except Exception as e:
            raise ProblemError(
                f"problem {self.name!r}: make_inputs({shape_label(shape)}) raised "
                f"{type(e).__name__}: {e}"
            ) from e
        ranks = [x.dim() for x in inputs]
        if ranks != list(self.ranks):
            raise ProblemError(
                f"problem {self.name!r}: RANKS says {list(self.ranks)} but make_inputs"
                f"({shape_label(shape)}) gives inputs of ranks {ranks}"
            )
        for dim, (i, axis) in self.dims.items():
            got = int(inputs[i].shape[axis])
            if got != shape[dim]:
                raise ProblemError(
                    f"problem {self.name!r}: DIMS reads {dim} from input {i} axis {axis}, which "
                    f"is {got} for the shape {shape_label(shape)} ({dim}={shape[dim]})"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "signature": self.signature,
            "description": self.description,
            "path": str(self.path),
            "builtin": self.builtin,
            "dims": {k: list(v) for k, v in self.dims.items()},
            "ranks": list(self.ranks),
            "dtypes": {k: str(v).replace("torch.", "") for k, v in self.module.DTYPES.items()},
            "shapes": {
                "smoke": [shape_label(s) for s in self.shapes("smoke")],
                "full": [shape_label(s) for s in self.shapes("full")],
            },
        }


def problem_dirs(extra: list[str] | None = None) -> list[Path]:
    dirs = [BUILTIN_DIR]
    env = os.environ.get("AUTOWEB_PROBLEM_DIRS", "")
    for raw in [*env.split(os.pathsep), *(extra or [])]:
        if raw.strip():
            p = Path(raw).expanduser().resolve()
            if not p.is_dir():
                raise ProblemError(f"problem directory {raw!r} does not exist")
            dirs.append(p)
    return dirs


def _files(dirs: list[Path]) -> list[Path]:
    return [f for d in dirs for f in sorted(d.glob("*.py")) if not f.name.startswith("_")]


def _candidates(dirs: list[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for f in _files(dirs):
        found.setdefault(f.stem, f)  # built-ins win over a same-named user file
    return found


def sources(extra_dirs: list[str] | None = None) -> dict[str, Path]:
    """Name -> module file of every problem, in the order of `names()`."""
    found = _candidates(problem_dirs(extra_dirs))
    return {n: found[n] for n in names(extra_dirs)}


def shadowed(extra_dirs: list[str] | None = None) -> list[tuple[str, Path, Path]]:
    """(name, file, the file used instead) for each problem file hidden by a built-in or by an
    earlier directory of the same name: it is never loaded, and a user should be told."""
    dirs = problem_dirs(extra_dirs)
    found = _candidates(dirs)
    return [(f.stem, f, found[f.stem]) for f in _files(dirs) if found[f.stem] != f]


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"autoweb_problem_{name}", path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"cannot import problem {name!r} from {path}")
    mod = importlib.util.module_from_spec(spec)
    # Registered under its name: torch.compile (dynamo) looks a function's globals up by module
    # name, e.g. a reference's EPS; a module that fails to load is removed again.
    sys.modules[spec.name] = mod
    try:
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # the user's module: its own error, told as the problem's
            raise ProblemError(
                f"problem {name!r} ({path}) failed to import: {type(e).__name__}: {e}"[:500]
            ) from e
        missing = [a for a in _REQUIRED if not hasattr(mod, a)]
        if missing:
            raise ProblemError(f"problem {name!r} ({path}) lacks {', '.join(missing)}")
        _check_declarations(name, mod)
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    return mod


_SIGNATURE_RE = re.compile(r"^kernel\(\s*[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s*\)$")
_DIM_RE = re.compile(r"^[A-Za-z_]\w{0,31}$")
MAX_SHAPES = 256


def _check_declarations(name: str, mod: ModuleType) -> None:
    """A problem module is user code: refuse declarations the harness would trip over later
    (an empty sweep would accept any candidate having checked nothing)."""
    sig = mod.SIGNATURE
    if not isinstance(sig, str) or not _SIGNATURE_RE.match(sig.strip()):
        raise ProblemError(f"problem {name!r}: SIGNATURE must look like 'kernel(x, weight)'")
    for tier in ("SHAPES_FULL", "SHAPES_SMOKE"):
        shapes = getattr(mod, tier)
        if not isinstance(shapes, list | tuple) or not shapes:
            raise ProblemError(f"problem {name!r}: {tier} must be a non-empty list of shapes")
        if len(shapes) > MAX_SHAPES:
            raise ProblemError(f"problem {name!r}: {tier} has over {MAX_SHAPES} shapes")
        for i, shape in enumerate(shapes):
            if not isinstance(shape, dict) or not shape:
                raise ProblemError(
                    f"problem {name!r}: {tier}[{i}] must be a dict of sizes like "
                    f"{{'M': 4096, 'N': 1024}}; got {shape!r:.80}"
                )
            for dim, size in shape.items():
                if not isinstance(dim, str) or not _DIM_RE.match(dim):
                    raise ProblemError(f"problem {name!r}: {tier}[{i}] has a bad name {dim!r:.40}")
                if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                    raise ProblemError(
                        f"problem {name!r}: {tier}[{i}][{dim!r}] must be a positive integer; "
                        f"got {size!r:.40}"
                    )
    for key in ("DTYPES", "TOLERANCE"):
        if not isinstance(getattr(mod, key), dict):
            raise ProblemError(f"problem {name!r}: {key} must be a dict")
    _check_tolerance(name, mod.TOLERANCE)
    _check_dims(name, mod, sig)
    if not isinstance(getattr(mod, "COMPILED_ORACLE", True), bool):
        raise ProblemError(f"problem {name!r}: COMPILED_ORACLE must be True or False")


_TOLERANCE_KEYS = ("atol", "rtol", "l2")


def _check_tolerance(name: str, tolerance: dict) -> None:
    """Each dtype's bounds: atol, rtol and l2 (numbers, at least 0), and optionally rms_floor
    (docs/problems.md, "Tolerances and the oracle"). A misspelt key would otherwise be ignored
    or fail later."""
    for dtype, tol in tolerance.items():
        where = f"problem {name!r}: TOLERANCE[{dtype}]"
        if not isinstance(tol, dict):
            raise ProblemError(f"{where} must be a dict like {{'atol': 1e-2, 'rtol': 1e-2, ...}}")
        missing = [k for k in _TOLERANCE_KEYS if k not in tol]
        unknown = sorted(str(k) for k in tol if k not in (*_TOLERANCE_KEYS, "rms_floor"))
        if missing or unknown:
            raise ProblemError(
                f"{where} needs {', '.join(_TOLERANCE_KEYS)} (and may have rms_floor); "
                + (f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}")
            )
        for k, v in tol.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ProblemError(f"{where}[{k!r}] must be a number of at least 0; got {v!r:.40}")


def _check_dims(name: str, mod: ModuleType, sig: str) -> None:
    n_args = sig.count(",") + 1
    ranks = mod.RANKS
    if (
        not isinstance(ranks, list | tuple)
        or len(ranks) != n_args
        or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks)
    ):
        raise ProblemError(
            f"problem {name!r}: RANKS must give the rank of each of the {n_args} inputs of "
            f"{sig}, e.g. (2, 1); got {ranks!r:.80}"
        )
    dims = mod.DIMS
    if not isinstance(dims, dict) or not dims:
        raise ProblemError(
            f"problem {name!r}: DIMS must map each shape dim to (input index, axis), "
            f"e.g. {{'M': (0, 0), 'N': (0, 1)}}"
        )
    for dim, where in dims.items():
        ok = (
            isinstance(where, list | tuple)
            and len(where) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in where)
        )
        if not ok or not 0 <= where[0] < n_args or not 0 <= where[1] < ranks[where[0]]:
            raise ProblemError(
                f"problem {name!r}: DIMS[{dim!r}] must be (input index, axis) of an input of "
                f"{sig} with RANKS {tuple(ranks)}; got {where!r:.40}"
            )
    swept = {d for tier in ("SHAPES_FULL", "SHAPES_SMOKE") for s in getattr(mod, tier) for d in s}
    if swept != set(dims):
        raise ProblemError(
            f"problem {name!r}: DIMS names {sorted(dims)} but the sweeps use {sorted(swept)}; "
            "every shape dim needs one entry"
        )
    op = getattr(mod, "BLOCK_OP", None)
    if op is not None:
        from kernels.block import OPS

        if op not in OPS:
            raise ProblemError(
                f"problem {name!r}: BLOCK_OP {op!r:.40} is not an op of the model block "
                f"(one of {', '.join(OPS)})"
            )


_cache: dict[Path, Problem] = {}


def load(name: str, extra_dirs: list[str] | None = None) -> Problem:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ProblemError(f"invalid problem name {name!r}")
    found = _candidates(problem_dirs(extra_dirs))
    if name not in found:
        raise ProblemError(f"unknown problem {name!r}; known: {', '.join(sorted(found))}")
    path = found[name]
    if path not in _cache:
        _cache[path] = Problem(name=name, path=path, module=_import(name, path))
    return _cache[path]


def names(extra_dirs: list[str] | None = None) -> list[str]:
    found = _candidates(problem_dirs(extra_dirs))
    builtin = [n for n in BUILTIN if n in found]
    return builtin + sorted(n for n in found if n not in BUILTIN)


def all_problems(extra_dirs: list[str] | None = None) -> list[Problem]:
    return [load(n, extra_dirs) for n in names(extra_dirs)]


def load_all(extra_dirs: list[str] | None = None) -> tuple[list[Problem], list[str]]:
    """Every problem that loads, and why each of the others does not: one broken module in a
    problem directory does not hide the rest."""
    loaded, errors = [], []
    for n in names(extra_dirs):
        try:
            loaded.append(load(n, extra_dirs))
        except ProblemError as e:
            errors.append(str(e))
    return loaded, errors
