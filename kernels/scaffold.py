"""`python -m kernels new-problem`: a problem module and a seed kernel from a user's PyTorch
function.

    python -m kernels new-problem add_rmsnorm --reference mymodel.ops:add_rmsnorm \\
        --inputs "x:M,N residual:M,N weight:N" --shapes "M=1,N=4096 M=4096,N=4096"

Everything is checked before anything is written: the function imports and runs on small inputs
of the declared dims (and on meta tensors, which size `bytes` and `flops`), returns one tensor of
its inputs' dtype, the shapes parse and name exactly the declared dims, and the name is free (not
a built-in, not a problem already found, no file in the way). Then it writes `DIR/NAME.py` and
`DIR/seeds/NAME.py` (see kernels.seedgen for the seed).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels import problems, seedgen

_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# Distinct, even, non-power-of-two sizes for probing: a dim is recognised by its size, and
# ops that halve a dim (rotary embeddings) still work.
PROBE_SIZES = (6, 10, 14, 18, 22, 26, 30, 34)
CUDA_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# bf16 / fp16: about 4x the output's own rounding (2^-9 and 2^-11 relative); fp32: tight enough
# that a kernel computing in bf16 or fp16 (>= 1e-4 off) fails.
TOLERANCES = {
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2, "l2": 1e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3, "l2": 2e-3},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5},
}
# Names the generated problem module defines itself.
_MODULE_NAMES = frozenset(
    {"sys", "torch", "FlopCounterMode", "reference", "make_inputs", "flops", "bytes", "_on_meta"}
)


class ScaffoldError(ValueError):
    """Bad input to new-problem; the message says what and how to fix it."""


@dataclass
class Scaffold:
    name: str
    problem_path: Path
    seed_path: Path
    problem_source: str
    seed_source: str
    op_class: str
    note: str
    files: list[Path] = field(default_factory=list)

    def write(self) -> list[Path]:
        self.seed_path.parent.mkdir(parents=True, exist_ok=True)
        self.problem_path.write_text(self.problem_source)
        self.seed_path.write_text(self.seed_source)
        self.files = [self.problem_path, self.seed_path]
        return self.files


def parse_reference(text: str) -> tuple[str, str]:
    module, sep, function = text.partition(":")
    if not sep or not _DOTTED.match(module) or not _IDENT.match(function):
        raise ScaffoldError(
            f"--reference {text!r}: expected MODULE:FUNCTION, e.g. mymodel.ops:add_rmsnorm"
        )
    return module, function


def parse_inputs(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """ "x:M,N weight:N" -> [("x", ("M", "N")), ("weight", ("N",))]."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for token in text.split():
        name, sep, dims = token.partition(":")
        dim_names = tuple(d.strip() for d in dims.split(",") if d.strip())
        if not sep or not _IDENT.match(name) or not dim_names:
            raise ScaffoldError(
                f"--inputs: {token!r} is not NAME:DIM,DIM (e.g. x:M,N); each input needs a "
                "name and at least one dim"
            )
        bad = [d for d in dim_names if not problems._DIM_RE.match(d)]
        if bad:
            raise ScaffoldError(f"--inputs: {bad[0]!r} in {token!r} is not a dim name")
        if name in seedgen.RESERVED or name in _MODULE_NAMES or re.match(r"^v\d+$", name):
            raise ScaffoldError(f"--inputs: {name!r} is a name the generated code uses itself")
        if any(name == n for n, _ in out):
            raise ScaffoldError(f"--inputs: {name!r} is given twice")
        out.append((name, dim_names))
    if not out:
        raise ScaffoldError('--inputs is empty: give each input as NAME:DIMS, e.g. "x:M,N w:N"')
    return out


def parse_shapes(text: str, dims: list[str], flag: str = "--shapes") -> list[dict[str, int]]:
    """ "M=1,N=4096 M=4096,N=4096" (or ;-separated) -> [{"M": 1, "N": 4096}, ...]."""
    shapes = []
    for token in re.split(r"[;\s]+", text.strip()):
        if not token:
            continue
        shape: dict[str, int] = {}
        for part in token.split(","):
            dim, sep, size = part.partition("=")
            if not sep or not re.fullmatch(r"[0-9]+", size.strip()) or int(size) < 1:
                raise ScaffoldError(
                    f"{flag}: {part!r} in {token!r} is not DIM=SIZE with a positive integer size "
                    "(e.g. M=4096,N=1024)"
                )
            shape[dim.strip()] = int(size)
        if set(shape) != set(dims):
            raise ScaffoldError(
                f"{flag}: {token!r} gives dims {sorted(shape)}, but the inputs use {sorted(dims)}"
            )
        shapes.append({d: shape[d] for d in dims})
    if not shapes:
        raise ScaffoldError(f"{flag} is empty: give at least one shape, e.g. M=4096,N=1024")
    if len(shapes) > problems.MAX_SHAPES:
        raise ScaffoldError(f"{flag}: over {problems.MAX_SHAPES} shapes")
    return shapes


def import_function(module: str, function: str) -> tuple[Callable, str]:
    """The function, and the sys.path entry its module was found under."""
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `python -c`: the current directory first
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise ScaffoldError(
            f"--reference: cannot import {module!r}: {type(e).__name__}: {e}"
        ) from e
    fn = getattr(mod, function, None)
    if not callable(fn):
        raise ScaffoldError(f"--reference: {module!r} has no function {function!r}")
    path = Path(getattr(mod, "__file__", "") or "")
    depth = module.count(".") + (2 if path.name == "__init__.py" else 1)
    root = path.resolve().parents[depth - 1] if path.name else Path.cwd()
    return fn, str(root)


def default_smoke(dims: list[str], last: str, full: list[dict[str, int]]) -> list[dict[str, int]]:
    """A single element, odd sizes, and the last dim longer than any block knob value (capped
    at each dim's largest size in the GPU sweep)."""
    hi = {d: max(s[d] for s in full) for d in dims}
    others = [d for d in dims if d != last]
    odd = (37, 19, 7, 5, 3, 3, 3, 3)
    shapes = [
        {d: 1 for d in dims},
        {**{d: min(hi[d], odd[i]) for i, d in enumerate(others)}, last: min(hi[last], 1000)},
        {**{d: min(hi[d], 3) for d in others}, last: min(hi[last], 16500)},
    ]
    unique: list[dict[str, int]] = []
    for s in shapes:
        s = {d: s[d] for d in dims}
        if s not in unique:
            unique.append(s)
    return unique


def _inputs(spec, shape: dict[str, int], dtype: torch.dtype, device: str = "cpu"):
    gen = torch.Generator().manual_seed(0) if device == "cpu" else None
    try:
        return [
            torch.randn([shape[d] for d in dims], generator=gen, device=device).to(dtype)
            for _, dims in spec
        ]
    except (RuntimeError, MemoryError) as e:  # a shape too large for this machine's memory
        raise ScaffoldError(
            f"cannot make the inputs of shape {problems.shape_label(shape)} here: "
            f"{type(e).__name__}: {e}"[:300]
        ) from e


def _call(fn: Callable, inputs, what: str):
    try:
        with torch.no_grad():
            out = fn(*inputs)
    except Exception as e:
        raise ScaffoldError(f"the function raised on {what}: {type(e).__name__}: {e}") from e
    if type(out) is not torch.Tensor:
        raise ScaffoldError(
            f"the function returned {type(out).__name__} on {what}; a problem's reference "
            "returns one tensor"
        )
    return out


def build(
    name: str,
    reference: str,
    inputs: str,
    shapes: str,
    *,
    smoke: str | None = None,
    out_dir: str | Path | None = None,
    cuda_dtype: str = "bfloat16",
) -> Scaffold:
    """Check everything and build both sources; writes nothing (see Scaffold.write)."""
    if not problems._NAME_RE.match(name or ""):
        raise ScaffoldError(
            f"{name!r} is not a problem name: lowercase letters, digits and _, starting with a "
            "letter"
        )
    if name in problems.BUILTIN:
        raise ScaffoldError(f"{name!r} is a built-in problem: choose another name")
    if out_dir is None:
        dirs = problems.problem_dirs()[1:]
        if not dirs:
            raise ScaffoldError("say where to write it: --dir DIR, or set AUTOWEB_PROBLEM_DIRS")
        out_dir = dirs[0]
    out_dir = Path(out_dir).expanduser().resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise ScaffoldError(f"--dir {str(out_dir)!r} is not a directory")
    problem_path, seed_path = out_dir / f"{name}.py", out_dir / "seeds" / f"{name}.py"
    for path in (problem_path, seed_path):
        if path.exists():
            raise ScaffoldError(f"{path} already exists: choose another name or remove it")
    try:
        known = problems.sources()
    except problems.ProblemError:
        known = {}
    if name in known:
        raise ScaffoldError(f"a problem {name!r} already exists ({known[name]})")
    if cuda_dtype not in CUDA_DTYPES:
        raise ScaffoldError(f"--dtype {cuda_dtype!r}: one of {', '.join(CUDA_DTYPES)}")

    module, function = parse_reference(reference)
    spec = parse_inputs(inputs)
    dims = list(dict.fromkeys(d for _, ds in spec for d in ds))
    full = parse_shapes(shapes, dims)
    fn, root = import_function(module, function)
    if function in _MODULE_NAMES or function in {n for n, _ in spec}:
        raise ScaffoldError(f"the function's name {function!r} clashes with a generated name")
    try:
        inspect.signature(fn).bind(*range(len(spec)))
    except TypeError as e:
        raise ScaffoldError(
            f"{module}.{function} cannot take the {len(spec)} inputs given by --inputs: {e}"
        ) from e
    except ValueError:
        pass  # no signature to read (a builtin): the probe below finds out

    probe_shape = {d: PROBE_SIZES[i % len(PROBE_SIZES)] for i, d in enumerate(dims)}
    probe_in = _inputs(spec, probe_shape, torch.float64)
    label = problems.shape_label(probe_shape)
    out = _call(fn, probe_in, f"float64 inputs of {label}")
    for dtype in (torch.float32, torch.bfloat16):
        got = _call(fn, _inputs(spec, probe_shape, dtype), f"{dtype} inputs of {label}").dtype
        if got != dtype:
            raise ScaffoldError(
                f"the function returns {got} for {dtype} inputs; a problem's output has its "
                "inputs' dtype: cast inside the function or wrap it"
            )
    probe = seedgen.classify(fn, probe_in, out)
    last = _last_dim(spec, probe, out, probe_shape) or dims[-1]
    smoke_shapes = (
        parse_shapes(smoke, dims, "--smoke") if smoke else default_smoke(dims, last, full)
    )
    for s in smoke_shapes:
        _call(fn, _inputs(spec, s, torch.float32), f"the smoke shape {problems.shape_label(s)}")
    for s in full:
        try:
            _call(fn, _inputs(spec, s, torch.float32, "meta"), "meta tensors")
        except ScaffoldError as e:
            raise ScaffoldError(
                f"{e} (shape {problems.shape_label(s)}); bytes and flops are sized by running "
                "the function on meta tensors, which it must allow"
            ) from e

    where = f"{module}.{function}"
    names = [n for n, _ in spec]
    seed, note = seedgen.seed_source(name, where, fn, probe_in, names, probe)
    source = problem_source(
        name=name,
        module=module,
        function=function,
        root=root,
        spec=spec,
        full=full,
        smoke=smoke_shapes,
        cuda_dtype=CUDA_DTYPES[cuda_dtype],
        probe=probe,
    )
    return Scaffold(name, problem_path, seed_path, source, seed, probe.op_class, note)


def _last_dim(spec, probe, out, probe_shape) -> str | None:
    """The dim the output's last axis has (by its probe size)."""
    if out.dim() == 0:
        return None
    by_size = {v: d for d, v in probe_shape.items()}
    return by_size.get(int(out.shape[-1]))


def _shape_list(shapes: list[dict[str, int]]) -> str:
    return "".join(f"    {s!r},\n" for s in shapes)


def problem_source(*, name, module, function, root, spec, full, smoke, cuda_dtype, probe) -> str:
    args = ", ".join(n for n, _ in spec)
    dims: dict[str, tuple[int, int]] = {}
    for i, (_, ds) in enumerate(spec):
        for axis, d in enumerate(ds):
            dims.setdefault(d, (i, axis))
    shapes_of = ", ".join(f"{n} [{', '.join(ds)}]" for n, ds in spec)
    like = spec[probe.out_like][0] if probe.out_like is not None else None
    description = f"{module}.{function}({shapes_of})" + (
        f"; output shaped like {like}" if like else ""
    )
    dtype_name = str(cuda_dtype).replace("torch.", "")
    tolerance = "".join(
        f"    torch.{str(dt).replace('torch.', '')}: {TOLERANCES[dt]!r},\n"
        for dt in dict.fromkeys((cuda_dtype, torch.float32))
    )
    inputs = "".join(f"    {n!r}: {ds!r},\n" for n, ds in spec)
    return f'''"""{name}: {module}.{function} as a problem.

Written by `python -m kernels new-problem`. Op class, as probed: {probe.op_class}
({probe.detail}). The shapes and tolerances below are
starting points; docs/problems.md says how to choose them.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

try:
    from {module} import {function}
except ImportError:  # the harness's sandboxed process inherits neither PYTHONPATH nor the cwd
    sys.path.append({root!r})
    from {module} import {function}

SIGNATURE = "kernel({args})"
DESCRIPTION = {description!r}
# The dims of each input, in signature order; DIMS says where a call's inputs hold each dim.
INPUTS = {{
{inputs}}}
DIMS = {dims!r}
RANKS = {tuple(len(ds) for _, ds in spec)!r}
SEED = "seeds/{name}.py"

SHAPES_FULL = [
{_shape_list(full)}]
# Interpreter sweep: a single element, odd sizes, and the last dim longer than any block knob
# value (each capped at the GPU sweep's largest size).
SHAPES_SMOKE = [
{_shape_list(smoke)}]
DTYPES = {{"cuda": torch.{dtype_name}, "interpret": torch.float32}}
# bf16 / fp16: about 4x the output's own rounding; fp32: tight enough that a kernel computing in
# bf16 or fp16 (>= 1e-4 off) fails.
TOLERANCE = {{
{tolerance}}}


def reference({args}):
    return {function}({args})


def make_inputs(shape, dtype, device, generator):
    return tuple(
        torch.randn([shape[d] for d in dims], device=device, generator=generator).to(dtype)
        for dims in INPUTS.values()
    )


def _on_meta(shape, dtype=torch.float32):
    inputs = make_inputs(shape, dtype, "meta", None)
    with FlopCounterMode(display=False) as counter:
        out = reference(*inputs)
    return inputs, out, counter.get_total_flops()


def flops(shape) -> float:
    # matrix-class flops as torch counts them (mm, bmm, attention), plus one per output element
    _, out, counted = _on_meta(shape)
    return float(counted + out.numel())


def bytes(shape, dtype) -> float:  # noqa: A001 - the contract's name
    # the minimum traffic: every input read once, the output written once
    inputs, out, _ = _on_meta(shape, dtype)
    return float(sum(t.numel() * t.element_size() for t in (*inputs, out)))
'''
