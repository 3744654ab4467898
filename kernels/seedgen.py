"""A naive Triton seed for a user's PyTorch function, where its op class allows one.

`classify` probes the function on small float64 inputs: it is *element-wise* when every input
has the output's shape and changing (or permuting) input elements changes (permutes) exactly
those output elements; *row-wise* when the output's rows (all dims but the last) depend only on
the same rows of the inputs shaped like the output, plus inputs shaped like one row (weights).

`seed_source` then traces the function into ATen ops (torch's own tracer and decompositions)
and writes each op as a Triton expression in fp32: a flat kernel over every element for the
element-wise class (knobs BLOCK_SIZE, NUM_WARPS), one program per row holding the whole row for
the row-wise class (knob NUM_WARPS; reductions over the last dim become masked `tl.sum` /
`tl.max` / `tl.min`). An op it cannot write, or any other class, gives a commented template
instead, with the reason. Whatever comes out is only a seed: the harness judges it like any
candidate.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

ELEMENTWISE = "elementwise"
ROWWISE = "rowwise"
GENERAL = "general"
_CLASS_NAMES = {ELEMENTWISE: "element-wise", ROWWISE: "row-wise", GENERAL: "general"}
_TIGHT = {"rtol": 1e-12, "atol": 1e-12}


@dataclass
class Probe:
    """What probing found: the op class, and how the output relates to the inputs."""

    op_class: str
    out_like: int | None  # an input with the output's shape and dtype (allocated like it)
    detail: str


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, equal_nan=True, **_TIGHT)


def classify(fn: Callable, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> Probe:
    """The op class of `fn` from its behaviour on `inputs` (float64, small, distinct sizes)."""
    full = [i for i, x in enumerate(inputs) if x.shape == out.shape]
    if not full or out.dim() == 0:
        return Probe(GENERAL, None, "no input has the output's shape")
    like = full[0]
    gen = torch.Generator().manual_seed(1)
    if len(full) == len(inputs) and _elementwise(fn, inputs, out, gen):
        return Probe(ELEMENTWISE, like, "each output element depends on that element only")
    n = out.shape[-1]
    others = [x for i, x in enumerate(inputs) if i not in full]
    if all(tuple(x.shape) == (n,) for x in others) and _rowwise(fn, inputs, full, out, gen):
        return Probe(ROWWISE, like, "each output row depends on the same input rows only")
    return Probe(GENERAL, like, "neither element-wise nor independent rows")


def _elementwise(fn, inputs, out, gen) -> bool:
    numel = out.numel()
    perm = torch.randperm(numel, generator=gen)
    permuted = [x.reshape(-1)[perm].reshape(x.shape) for x in inputs]
    if not _same(fn(*permuted), out.reshape(-1)[perm].reshape(out.shape)):
        return False
    for _ in range(3):
        pos = int(torch.randint(numel, (1,), generator=gen))
        for i in range(len(inputs)):
            changed = [x.clone() for x in inputs]
            changed[i].view(-1)[pos] += 1.0
            diff = fn(*changed).reshape(-1) != out.reshape(-1)
            diff[pos] = False
            if diff.any():
                return False
    return True


def _rowwise(fn, inputs, full, out, gen) -> bool:
    n = out.shape[-1]
    rows = out.numel() // n if n else 0
    if rows < 2:
        return False

    def as_rows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(rows, n)

    perm = torch.randperm(rows, generator=gen)
    permuted = [as_rows(x)[perm].reshape(x.shape) if i in full else x for i, x in enumerate(inputs)]
    if not _same(as_rows(fn(*permuted)), as_rows(out)[perm]):
        return False
    for _ in range(3):
        row = int(torch.randint(rows, (1,), generator=gen))
        for i in full:
            changed = [x.clone() for x in inputs]
            as_rows(changed[i])[row] += 1.0
            diff = (as_rows(fn(*changed)) != as_rows(out)).any(dim=1)
            diff[row] = False
            if diff.any():
                return False
    return True


# -- tracing into Triton ------------------------------------------------------------------------


class Unsupported(Exception):
    """An op or a shape the naive seed cannot express; the message names it."""


_UNARY = {
    "neg": "-{0}",
    "exp": "tl.exp({0})",
    "log": "tl.log({0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})",
    "sigmoid": "tl.sigmoid({0})",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
    "abs": "tl.abs({0})",
    "reciprocal": "(1.0 / {0})",
    "relu": "tl.maximum({0}, 0.0)",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
    "erf": "tl.erf({0})",
}
_BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "rsub": "({1} - {0})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "maximum": "tl.maximum({0}, {1})",
    "minimum": "tl.minimum({0}, {1})",
    "gt": "({0} > {1})",
    "lt": "({0} < {1})",
    "ge": "({0} >= {1})",
    "le": "({0} <= {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
}
# Ops that only move, cast or re-view data: the kernel computes in fp32 on its own layout.
_IDENTITY = {
    "_to_copy",
    "to",
    "clone",
    "alias",
    "detach",
    "lift_fresh_copy",
    "contiguous",
    "convert_element_type",
    "view",
    "_unsafe_view",
    "reshape",
    "unsqueeze",
    "squeeze",
    "expand",
}
# Names the generated code uses itself: an input may not take them.
RESERVED = frozenset(
    {"out", "mask", "offs", "cols", "row_start", "n_cols", "n_elements", "kernel"}
    | {"torch", "triton", "tl", "BLOCK_SIZE", "BLOCK_N", "NUM_WARPS"}
)
_REDUCE = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}
_PAD = {"tl.sum": "0.0", "tl.max": "-float('inf')", "tl.min": "float('inf')"}


@dataclass
class _Value:
    expr: str
    kind: str  # "vec": per element (of the row); "row": one per row; "const": a number


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    if isinstance(v, int | float):
        if math.isinf(v):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(float(v))
    raise Unsupported(f"a constant of type {type(v).__name__}")


def _trace(fn: Callable, inputs: Sequence[torch.Tensor]):
    from torch._decomp import core_aten_decompositions, get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    aten = torch.ops.aten
    table = {
        **core_aten_decompositions(),
        **get_decompositions(
            [aten._softmax, aten._log_softmax, aten.gelu, aten.silu, aten.native_layer_norm]
        ),
    }

    def call(*args):  # exactly the inputs given: parameters with defaults keep them
        return fn(*args)

    return make_fx(call, decomposition_table=table)(*[x.float() for x in inputs])


class _Writer:
    def __init__(self, op_class: str, out_shape: torch.Size, names: Sequence[str]) -> None:
        self.op_class = op_class
        self.out_shape = tuple(out_shape)
        self.names = names
        self.lines: list[str] = []
        self.values: dict[str, _Value | tuple[_Value, ...]] = {}

    def shape_kind(self, shape: Sequence[int]) -> str:
        shape = tuple(shape)
        if math.prod(shape) == 1 and shape != self.out_shape:
            return "row" if self.op_class == ROWWISE else "const"
        if self.op_class == ELEMENTWISE:
            if math.prod(shape) == math.prod(self.out_shape):
                return "vec"
        else:
            n = self.out_shape[-1]
            rows = math.prod(self.out_shape[:-1])
            if shape and shape[-1] == n and math.prod(shape) in (n, rows * n):
                return "vec"
            if math.prod(shape) == rows and (not shape or shape[-1] == 1 or n != 1):
                return "row"
        raise Unsupported(f"an intermediate of shape {list(shape)}")

    def arg(self, a) -> _Value:
        if isinstance(a, torch.fx.Node):
            v = self.values[a.name]
            if isinstance(v, tuple):
                raise Unsupported("a tuple used as a value")
            return v
        return _Value(_scalar(a), "const")

    def emit(self, node: torch.fx.Node, expr: str, kind: str) -> _Value:
        name = f"v{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        value = _Value(name, kind)
        self.values[node.name] = value
        return value

    def node(self, node: torch.fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            tup, index = node.args
            self.values[node.name] = self.values[tup.name][index]
            return
        op = getattr(target, "_opname", None) or str(target)
        args = list(node.args)
        if op in _IDENTITY:
            v = self.arg(args[0])
            val = node.meta.get("val")
            if val is not None and v.kind != "const":
                kind = self.shape_kind(val.shape)
                if kind != v.kind:
                    raise Unsupported(f"aten.{op} turning a {v.kind} into a {kind}")
            self.values[node.name] = v
            return
        if op in _UNARY:
            v = self.arg(args[0])
            self.emit(node, _UNARY[op].format(v.expr), v.kind)
            return
        if op in _BINARY:
            a, b = self.arg(args[0]), self.arg(args[1])
            alpha = node.kwargs.get("alpha")
            if alpha is not None and op in ("add", "sub", "rsub"):
                b = _Value(f"({_scalar(alpha)} * {b.expr})", b.kind)
            if node.kwargs.get("rounding_mode") is not None:
                raise Unsupported(f"aten.{op} with rounding_mode")
            self.emit(node, _BINARY[op].format(a.expr, b.expr), _join(a, b))
            return
        if op == "pow":
            return self.pow(node, args)
        if op == "where":
            c, a, b = (self.arg(x) for x in args[:3])
            kind = _join(_join(c, a), b)
            self.emit(node, f"tl.where({c.expr}, {a.expr}, {b.expr})", kind)
            return
        if op in ("clamp", "clamp_min", "clamp_max"):
            return self.clamp(node, op, args)
        if op in ("full", "scalar_tensor"):
            value = args[1] if op == "full" else args[0]
            self.values[node.name] = _Value(_scalar(value), "const")
            return
        if op in _REDUCE or op == "var_mean":
            return self.reduce(node, op, args)
        raise Unsupported(f"aten.{op}")

    def pow(self, node, args) -> None:
        base, exp = args[0], args[1]
        if not isinstance(base, torch.fx.Node) or isinstance(exp, torch.fx.Node):
            raise Unsupported("aten.pow other than tensor ** number")
        b = self.arg(base)
        if exp == 2:
            expr = f"({b.expr} * {b.expr})"
        elif exp == 1:
            expr = b.expr
        elif exp == 3:
            expr = f"({b.expr} * {b.expr} * {b.expr})"
        elif exp == 0.5:
            expr = f"tl.sqrt({b.expr})"
        elif exp == -0.5:
            expr = f"tl.rsqrt({b.expr})"
        elif exp == -1:
            expr = f"(1.0 / {b.expr})"
        else:
            raise Unsupported(f"aten.pow with exponent {exp!r}")
        self.emit(node, expr, b.kind)

    def clamp(self, node, op, args) -> None:
        v = self.arg(args[0])
        lo = args[1] if op in ("clamp", "clamp_min") else None
        hi = (
            args[2] if op == "clamp" and len(args) > 2 else (args[1] if op == "clamp_max" else None)
        )
        expr = v.expr
        if lo is not None:
            expr = f"tl.maximum({expr}, {self.arg(lo).expr})"
        if hi is not None:
            expr = f"tl.minimum({expr}, {self.arg(hi).expr})"
        self.emit(node, expr, v.kind)

    def reduce(self, node, op, args) -> None:
        if self.op_class != ROWWISE:
            raise Unsupported(f"aten.{op} in an element-wise op")
        src = args[0]
        v = self.arg(src)
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
        rank = len(src.meta["val"].shape)
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if v.kind != "vec" or [d % rank for d in dims] != [rank - 1]:
            raise Unsupported(f"aten.{op} over dims {dims} (only the last dim is written)")
        if op == "var_mean":
            correction = node.kwargs.get("correction", 1)
            mean = f"(tl.sum(tl.where(mask, {v.expr}, 0.0), axis=0) / n_cols)"
            m = self.emit(node, mean, "row")
            dev = f"tl.where(mask, {v.expr} - {m.expr}, 0.0)"
            var = f"(tl.sum({dev} * {dev}, axis=0) / (n_cols - {_scalar(correction)}))"
            name = f"v{len(self.lines)}"
            self.lines.append(f"{name} = {var}")
            self.values[node.name] = (_Value(name, "row"), m)
            return
        fn = _REDUCE[op]
        expr = f"{fn}(tl.where(mask, {v.expr}, {_PAD[fn]}), axis=0)"
        if op == "mean":
            expr = f"({expr} / n_cols)"
        self.emit(node, expr, "row")


def _join(a: _Value, b: _Value) -> str:
    kinds = {a.kind, b.kind}
    return "vec" if "vec" in kinds else ("row" if "row" in kinds else "const")


def _body(probe: Probe, fn, inputs, out, names) -> tuple[list[str], list[str], str]:
    """(load lines, compute lines, the output expression) of the kernel."""
    gm = _trace(fn, inputs)
    writer = _Writer(probe.op_class, out.shape, names)
    loads = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name, x in zip(placeholders, names, inputs, strict=True):
        if probe.op_class == ELEMENTWISE:
            offset = "offs"
        elif x.shape == out.shape:
            offset = "row_start + cols"
        else:
            offset = "cols"
        loads.append(
            f"{name} = tl.load({name}_ptr + {offset}, mask=mask, other=0.0).to(tl.float32)"
        )
        writer.values[node.name] = _Value(name, "vec")
    result = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            writer.node(node)
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, list | tuple) else [outs]
            if len(outs) != 1 or not isinstance(outs[0], torch.fx.Node):
                raise Unsupported("an output that is not one tensor")
            result = writer.arg(outs[0])
        elif node.op != "placeholder":
            raise Unsupported(f"a traced {node.op} ({node.target})")
    assert result is not None
    expr = result.expr
    if result.kind != "vec":  # a value constant along the row, stored to every element
        zeros = "BLOCK_SIZE" if probe.op_class == ELEMENTWISE else "BLOCK_N"
        expr = f"({expr} + tl.zeros([{zeros}], tl.float32))"
    return loads, writer.lines, expr


# -- the seed source ----------------------------------------------------------------------------


def seed_source(
    name: str,
    where: str,
    fn: Callable,
    inputs: Sequence[torch.Tensor],
    names: Sequence[str],
    probe: Probe,
) -> tuple[str, str]:
    """(source, note): a Triton seed for the op class, or a commented template and why."""
    out = fn(*inputs)
    if probe.op_class in (ELEMENTWISE, ROWWISE):
        try:
            loads, lines, expr = _body(probe, fn, inputs, out, names)
        except Unsupported as e:
            note = f"{_CLASS_NAMES[probe.op_class]}, but the naive seed cannot write {e}: a "
            "commented template"
            return template(name, where, names, probe, str(e)), note
        except Exception as e:  # tracing a user's function can fail in many ways
            note = f"tracing failed ({type(e).__name__}: {e}): a commented template"
            return template(name, where, names, probe, note), note
        if probe.op_class == ELEMENTWISE:
            return _elementwise_source(name, where, names, probe, loads, lines, expr), (
                "element-wise: a flat Triton kernel with BLOCK_SIZE and NUM_WARPS knobs"
            )
        return _rowwise_source(name, where, names, probe, loads, lines, expr), (
            "row-wise over the last dim: one program per row, NUM_WARPS knob"
        )
    return template(name, where, names, probe, probe.detail), (
        f"{probe.detail}: no naive seed for this class, a commented template"
    )


def _alloc(names: Sequence[str], probe: Probe) -> str:
    return f"torch.empty_like({names[probe.out_like or 0]})"


def _header(name: str, where: str, what: str) -> str:
    return (
        f'"""Seed for {name}: {what}\n\nWritten by `python -m kernels new-problem` from {where}; '
        "a starting point for\nthe tuner and the agent, judged by the harness like any "
        'candidate."""\n\n'
        "from __future__ import annotations\n\nimport torch\nimport triton\n"
        "import triton.language as tl\n\n"
    )


def _indent(lines: Sequence[str], n: int = 4) -> str:
    return "".join(" " * n + line + "\n" for line in lines)


def _elementwise_source(name, where, names, probe, loads, lines, expr) -> str:
    ptrs = ", ".join(f"{n}_ptr" for n in names)
    args = ", ".join(names)
    return (
        _header(name, where, "a flat kernel, each element computed in fp32.")
        + "BLOCK_SIZE = 1024  # tune: 256, 512, 1024, 2048, 4096\n"
        "NUM_WARPS = 4  # tune: 1, 2, 4, 8\n\n\n"
        "@triton.jit\n"
        f"def _{name}_kernel({ptrs}, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):\n"
        "    # read each input once, write the output once\n"
        "    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n"
        "    mask = offs < n_elements\n"
        + _indent(loads)
        + _indent(lines)
        + f"    tl.store(out_ptr + offs, {expr}.to(out_ptr.dtype.element_ty), mask=mask)\n\n\n"
        f"def kernel({args}):\n"
        + _indent([f"{n} = {n}.contiguous()" for n in names])
        + f"    out = {_alloc(names, probe)}\n"
        "    n_elements = out.numel()\n"
        "    if n_elements:\n"
        f"        _{name}_kernel[(triton.cdiv(n_elements, BLOCK_SIZE),)](\n"
        + _indent([f"{a}," for a in names] + ["out,", "n_elements,"], 12)
        + "            BLOCK_SIZE=BLOCK_SIZE,\n"
        "            num_warps=NUM_WARPS,\n"
        "        )\n"
        "    return out\n"
    )


def _rowwise_source(name, where, names, probe, loads, lines, expr) -> str:
    ptrs = ", ".join(f"{n}_ptr" for n in names)
    args = ", ".join(names)
    like = names[probe.out_like or 0]
    return (
        _header(name, where, "one program per row, the whole row in registers, fp32 math.")
        + "NUM_WARPS = 4  # tune: 1, 2, 4, 8, 16\n\n\n"
        "@triton.jit\n"
        f"def _{name}_kernel({ptrs}, out_ptr, n_cols, BLOCK_N: tl.constexpr):\n"
        "    # read each row once (and each per-column input once per row), write M*N\n"
        "    row_start = tl.program_id(0).to(tl.int64) * n_cols\n"
        "    cols = tl.arange(0, BLOCK_N)\n"
        "    mask = cols < n_cols\n"
        + _indent(loads)
        + _indent(lines)
        + f"    tl.store(out_ptr + row_start + cols, {expr}.to(out_ptr.dtype.element_ty), "
        "mask=mask)\n\n\n"
        f"def kernel({args}):\n"
        + _indent([f"{n} = {n}.contiguous()" for n in names])
        + f"    out = {_alloc(names, probe)}\n"
        f"    n_cols = {like}.shape[-1]\n"
        "    if out.numel():\n"
        f"        _{name}_kernel[(out.numel() // n_cols,)](\n"
        + _indent([f"{a}," for a in names] + ["out,", "n_cols,"], 12)
        + "            BLOCK_N=triton.next_power_of_2(n_cols),\n"
        "            num_warps=NUM_WARPS,\n"
        "        )\n"
        "    return out\n"
    )


def template(name: str, where: str, names: Sequence[str], probe: Probe, why: str) -> str:
    args = ", ".join(names)
    ptrs = ", ".join(f"{n}_ptr" for n in names)
    return (
        f'"""Template for {name}: no naive seed could be written ({why}).\n\n'
        f"Written by `python -m kernels new-problem` from {where}. Fill in the kernel, then\n"
        f"`python -m kernels evaluate --problem {name} --candidate THIS_FILE`. The problem's\n"
        "reference defines the result; docs/problems.md and the built-in seeds in kernels/seeds/\n"
        'are worked examples."""\n\n'
        "from __future__ import annotations\n\nimport torch\nimport triton\n"
        "import triton.language as tl\n\n"
        "# Module-level constants marked `# tune:` are what the tuner searches, e.g.\n"
        "BLOCK_SIZE = 1024  # tune: 256, 512, 1024, 2048, 4096\n"
        "NUM_WARPS = 4  # tune: 1, 2, 4, 8\n\n\n"
        "@triton.jit\n"
        f"def _{name}_kernel({ptrs}, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):\n"
        "    # Load the inputs with masks (`tl.load(ptr + offs, mask=offs < n, other=0.0)`),\n"
        "    # compute in fp32, store the output with the same mask.\n"
        "    pass\n\n\n"
        f"def kernel({args}):\n"
        "    # Allocate the output (torch.empty / torch.empty_like), launch the kernel over a\n"
        "    # grid that covers it, return it. Computing it with torch ops instead is caught as\n"
        "    # library fallback.\n"
        f'    raise NotImplementedError("write the {name} kernel: see the comments above")\n'
    )
