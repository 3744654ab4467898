"""Static checks on candidate source, before anything runs.

These are the harness's enforced rules; `PROHIBITIONS` states them in words (the agent's
prompt and the docs quote it). The sandboxed runner enforces the same allow-lists again at
run time (restricted builtins and imports), so a rule slipping past the parser still fails.
"""

from __future__ import annotations

import ast
import functools
import types
from dataclasses import dataclass, field

from kernels import pysource

MAX_SOURCE_BYTES = 256 * 1024

ALLOWED_IMPORTS = (
    "torch",
    "triton",
    "triton.language",
    "math",
    "functools",
    "typing",
    "__future__",
)
# Submodules of triton.language (libdevice fast math lives in triton.language.extra).
ALLOWED_IMPORT_PREFIXES = ("triton.language.",)
# The modules a candidate may reach through attributes (`torch.cuda`, `tl.extra.cuda`). Every
# module imports others (torch.serialization imports tarfile, whose `bltn_open` is the real
# `open`), so an attribute path that passes through any other module is rejected: the checker
# follows each path from an imported name on the real modules, as the candidate would.
ALLOWED_MODULES = frozenset(
    {
        "torch",
        "torch.cuda",
        "torch.nn",
        "torch.nn.functional",
        "math",
        "functools",
        "typing",
    }
)
# In these, only the names listed: the rest of typing and functools evaluates annotation strings
# as code (typing.get_type_hints, functools.singledispatch) with the real builtins.
ALLOWED_NAMES = {
    "typing": frozenset(
        {
            "TYPE_CHECKING",
            "Any",
            "Callable",
            "Dict",
            "Final",
            "Iterable",
            "List",
            "Literal",
            "Optional",
            "Sequence",
            "Tuple",
            "Union",
            "cast",
        }
    ),
    "functools": frozenset({"cache", "lru_cache", "partial", "reduce", "wraps"}),
}
ALLOWED_MODULE_PREFIXES = ("triton",)  # triton, triton.language and its submodules, but ...
FORBIDDEN_MODULE_PREFIXES = (  # ... not triton's compiler, runtime, tools or backends
    "triton.runtime",
    "triton.compiler",
    "triton.backends",
    "triton.tools",
    "triton.testing",
    "triton.profiler",
    "triton.knobs",
    "triton._",
)

FORBIDDEN_BUILTINS = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "input",
        "breakpoint",
        "memoryview",
        "exit",
        "quit",
        "help",
        "object",
        "type",
        "super",
        "classmethod",
        "staticmethod",
        "property",
    }
)
# Frame, code and generator internals reach the harness's own objects.
FORBIDDEN_ATTRS = frozenset(
    {
        "f_globals",
        "f_locals",
        "f_back",
        "f_builtins",
        "f_code",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "func_globals",
        "data",
        "grad",
        "set_",
        "untyped_storage",
        "storage",
        # modules that allowed modules happen to import (torch.os, typing.sys, ...)
        "os",
        "sys",
        "subprocess",
        "ctypes",
        "inspect",
        "gc",
        "threading",
        "importlib",
        "builtins",
        "io",
        "shutil",
        "socket",
        "pickle",
        "multiprocessing",
        "signal",
        "platform",
        "glob",
        "pathlib",
        "tempfile",
        "types",
        "weakref",
        "traceback",
        "warnings",
        "contextlib",
        "atexit",
        "resource",
        "select",
        "mmap",
        "marshal",
        "code",
        "pty",
        "runpy",
        "sysconfig",
        "linecache",
        "tokenize",
        "dis",
        "copyreg",
        "pkgutil",
        "environ",
        "system",
        "popen",
        "spawn",
        "fork",
        "execv",
        "dlopen",
        "CDLL",
        "cdll",
        "cudart",
        "Path",
        "concurrent",
        "asyncio",
        "urllib",
        "http",
        "requests",
        # what other modules call the real builtins, and the ways out of torch into numpy
        "bltns",
        "bltn_open",
        "tarfile",
        "numpy",
        "from_numpy",
        "from_dlpack",
        "to_dlpack",
        "tolist",
        "tofile",
        "fromfile",
        "frombuffer",
        "from_file",
        # the import machinery a module leaves behind (triton.language.extra holds sys.modules
        # as `modules`), introspection that evaluates strings, format strings that walk
        # attributes, Triton's hooks on a jitted function, Python callbacks over tensor elements
        "modules",
        "spec",
        "loader",
        "module_finder",
        "module_from_spec",
        "signature",
        "from_callable",
        "format",
        "format_map",
        "rewrite",
        "rewriter",
        "rewritten_fn",
        "add_pre_run_hook",
        "pre_run_hooks",
        "device_caches",
        "create_binder",
        "preload",
        "get_capture_scope",
        "used_global_vals",
        "nonlocals",
        # a call that returns a module (torch.get_device_module("cpu") is torch.cpu, whose
        # `.torch` is all of torch), and the allowed modules reached again under their names
        "get_device_module",
        "torch",
        "triton",
        "functools",
        "typing",
        "singledispatch",
        "singledispatchmethod",
        "get_type_hints",
        "apply_",
        "map_",
        "map2_",
        # the forbidden builtins, reached as attributes of a module that holds them
        "eval",
        "exec",
        "open",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
        "memoryview",
    }
)
# torch / triton namespaces that change global state, time things, launch work on other
# streams, or reach compiled libraries by the back door.
FORBIDDEN_TORCH_ATTRS = frozenset(
    {
        "backends",
        "ops",
        "library",
        "overrides",
        "compile",
        "jit",
        "autograd",
        "utils",
        "multiprocessing",
        "distributed",
        "Stream",
        "stream",
        "ExternalStream",
        "Event",
        "set_stream",
        "current_stream",
        "default_stream",
        "synchronize",
        "graph",
        "graphs",
        "CUDAGraph",
        "make_graphed_callables",
        "testing",
        "profiler",
        "random",
        "manual_seed",
        "seed",
        "hub",
        "fx",
        "export",
        "package",
        "cpp_extension",
        "load_inline",
        "Generator",
        "memory",
        "empty_cache",
        "caching_allocator_alloc",
        "mps",
        "xpu",
        "futures",
        "classes",
        "load",
        "save",
        "from_file",
    }
)
FORBIDDEN_TRITON_ATTRS = frozenset(
    {
        "testing",
        "runtime",
        "compiler",
        "knobs",
        "autotune",
        "compile",
        "backends",
        "tools",
        "profiler",
        "Config",
    }
)

PROHIBITIONS: list[tuple[str, str]] = [
    (
        "imports",
        "Import only torch, triton, triton.language, math, functools, typing and "
        "__future__. No os, sys, subprocess, ctypes, inspect, gc, threading, time, numpy.",
    ),
    (
        "builtins",
        "No eval, exec, compile, open, __import__, globals, locals, vars, getattr, "
        "setattr, delattr, input, breakpoint, type, object, super.",
    ),
    (
        "private",
        "No private or dunder attributes (anything starting with '_'), no frame or "
        "code objects, no .data / .grad / .storage.",
    ),
    (
        "modules",
        "Use a module only through its attributes (torch.empty, tl.load; never T = torch). "
        "Reach no module but torch, torch.cuda, torch.nn.functional, triton.language (and "
        "its extra libdevice), math, functools and typing; of functools only cache, "
        "lru_cache, partial, reduce, wraps; of typing only annotations and cast. No "
        ".numpy(), from_numpy, dlpack, .tolist(), .apply_()/.map_(), str.format (use "
        "f-strings) or .signature; no match statements, no assigning to attributes, no "
        "annotations written as strings. Every name you use is defined or imported in the file.",
    ),
    (
        "monkeypatch",
        "Never assign to or delete attributes of torch, triton, math or any "
        "imported module: monkeypatching timers, torch, triton or the harness is rejected.",
    ),
    (
        "library",
        "Compute in Triton kernels. Calling torch compute ops (matmul, softmax, "
        "exp, arithmetic on tensors, torch.nn.functional ...) is library fallback and is "
        "rejected, and so is reading tensor values on the host (.item(), float(t)) to compute "
        "in Python. Allocation (torch.empty*), views, .contiguous() and copies are fine.",
    ),
    (
        "streams",
        "No streams, events, synchronisation, CUDA graphs, torch.compile, "
        "triton.autotune, triton.testing or global settings (torch.backends, set_*).",
    ),
    (
        "output",
        "Return a new plain torch.Tensor of the reference's shape, dtype and device; "
        "never an input, a view of one, or a buffer reused across calls; never write inputs.",
    ),
    (
        "honesty",
        "Compute every element for every shape: no caching results across calls, "
        "no shape-specific shortcuts, no detecting the benchmark. Outputs produced while "
        "being timed and under CUDA-graph replay are verified too.",
    ),
    (
        "precision",
        "Keep the problem's precision: accumulate in fp32; a downgrade past the "
        "tolerance is incorrect.",
    ),
]


@dataclass
class StaticResult:
    failure: str | None = None  # None, "compile_error", "prohibited", "malformed"
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None


def _import_allowed(mod: str) -> bool:
    return mod in ALLOWED_IMPORTS or mod.startswith(ALLOWED_IMPORT_PREFIXES)


_ROOTS = frozenset(m.split(".")[0] for m in ALLOWED_IMPORTS if m != "__future__")


def _module_allowed(name: str) -> bool:
    if any(part.startswith("_") for part in name.split(".")):
        return False
    if name in ALLOWED_MODULES:
        return True
    return name.startswith(ALLOWED_MODULE_PREFIXES) and not name.startswith(
        FORBIDDEN_MODULE_PREFIXES
    )


_UNRESOLVED = object()
# Where the types of the interpreter's own machinery live: import state, frames, signatures.
_MACHINERY_MODULES = ("importlib", "_frozen_importlib", "inspect", "sys", "types", "_thread")


def _machinery(obj: object) -> bool:
    """True for what leads out of the allowed modules without a module on the way: the import
    system's state (sys.modules is a dict of every module), specs and loaders, frames, code,
    signatures (`from_callable(eval_str=True)` evaluates strings), a container of modules."""
    import sys

    if obj is sys.modules or isinstance(
        obj, types.FrameType | types.CodeType | types.TracebackType | types.GeneratorType
    ):
        return True
    if type(obj).__module__.split(".")[0] in _MACHINERY_MODULES and not isinstance(
        obj, types.ModuleType | types.FunctionType | types.BuiltinFunctionType | type
    ):
        return True
    if isinstance(obj, dict | list | set | frozenset | tuple | types.MappingProxyType):
        values = obj.values() if isinstance(obj, dict | types.MappingProxyType) else obj
        kinds = types.ModuleType | types.FrameType | types.CodeType
        return any(isinstance(v, kinds) for v in list(values)[:10000])
    return False


def _origin(obj: object) -> str:
    return str(getattr(obj if isinstance(obj, type) else type(obj), "__module__", "") or "")


def _from_refused_triton(obj: object) -> bool:
    """A class, or an object, that triton's allowed modules re-export from its runtime or
    compiler (triton.JITFunction, a driver): they hold those modules' globals. Functions stay
    allowed (triton.jit, triton.cdiv) and so do jitted functions (tl.sum), whose dangerous
    attributes are refused by name."""
    if isinstance(obj, types.FunctionType | types.BuiltinFunctionType | types.ModuleType):
        return False
    origin = _origin(obj)
    if not origin.startswith("triton"):
        return False
    if not isinstance(obj, type) and callable(obj):  # a jitted function, a tl builtin
        return False
    return not _module_allowed(origin)


@functools.cache
def _dangerous_builtins() -> frozenset[int]:
    """ids of the forbidden builtins, and of what typing and functools define beyond the
    allowed names, wherever a module re-exports them."""
    import builtins
    import importlib
    import io

    found = [getattr(builtins, n, None) for n in FORBIDDEN_BUILTINS] + [io.open, builtins]
    for mod in (importlib.import_module(m) for m in ALLOWED_NAMES):
        for n in dir(mod):
            v = getattr(mod, n)
            if (
                n not in ALLOWED_NAMES[mod.__name__]
                and getattr(v, "__module__", None) == mod.__name__
            ):
                found.append(v)
    return frozenset(id(v) for v in found if v is not None)


def _resolve(dotted: str) -> object:
    """The object `dotted` (an allowed module, then attributes) names, by importing the module
    and following the attributes, importing a submodule where no attribute is found (the
    sandboxed process may have imported it); _UNRESOLVED when some step does not exist there
    either (the candidate's own code would fail at that step too). A submodule outside the
    allowed ones is found but not imported."""
    import importlib
    import importlib.util

    parts = dotted.split(".")
    if parts[0] not in _ROOTS:  # only what a candidate may import is ever imported here
        return _UNRESOLVED
    try:
        obj = importlib.import_module(parts[0])
    except Exception:
        return _UNRESOLVED
    missing = object()
    for k, part in enumerate(parts[1:], start=1):
        if isinstance(obj, types.ModuleType):
            # A module's own names only: its __getattr__ (torch's lazy submodules) would import.
            found = vars(obj).get(part, missing)
        else:
            try:
                found = getattr(obj, part)
            except Exception:
                return _UNRESOLVED
        if found is not missing:
            obj = found
            continue
        name = ".".join(parts[: k + 1])
        try:
            if importlib.util.find_spec(name) is None:
                return _UNRESOLVED
        except Exception:
            return _UNRESOLVED
        if not _module_allowed(name):
            # Named, not imported: the candidate chooses the name, and importing runs code here.
            return types.ModuleType(name)
        try:
            obj = importlib.import_module(name)
        except (Exception, SystemExit):
            return _UNRESOLVED
    return obj


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _module_path(node: ast.AST, module_names: dict[str, str]) -> str | None:
    """`torch.cuda.empty` for the expression `torch.cuda.empty` (or `tl.load` with `tl` the
    import name of triton.language: `triton.language.load`); None unless the expression is
    plain attributes on an imported name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in module_names:
        return None
    return ".".join([module_names[node.id], *reversed(parts)])


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)[:80]
    except Exception:  # pragma: no cover - unparse handles every parsed node
        return "<expr>"


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        # local name -> the module (or module attribute) it is bound to
        self.module_names: dict[str, str] = {}
        # nodes that are the object of an attribute access (`torch` in `torch.empty`)
        self.bases: set[int] = set()
        self._dangerous = _dangerous_builtins()

    def _reach(self, node: ast.AST, dotted: str, bound: bool = False) -> None:
        """Reject a path from an imported name that reaches a module outside the allowed ones
        or a forbidden builtin, or that hands a module to anything but an attribute access
        (`T = torch` would let `T.<anything>` past these rules). `bound`: a name an import
        statement binds, which is how a module gets a name."""
        owner, _, name = dotted.rpartition(".")
        parent = _resolve(owner) if owner else _UNRESOLVED
        allowed = ALLOWED_NAMES.get(getattr(parent, "__name__", None) or "")
        if isinstance(parent, types.ModuleType) and allowed is not None and name not in allowed:
            listed = ", ".join(sorted(allowed))
            self._bad(node, f"{dotted} is not allowed (of {parent.__name__}, only: {listed})")
            return
        obj = _resolve(dotted)
        if obj is _UNRESOLVED:
            return
        if isinstance(obj, types.ModuleType):
            if not _module_allowed(obj.__name__):
                how = "is" if obj.__name__ == dotted else "goes through"
                self._bad(node, f"{dotted} {how} the module {obj.__name__!r}, which is not allowed")
            elif id(node) not in self.bases and not bound:
                self._bad(
                    node,
                    f"module {dotted} used as a value; only its attributes may be used "
                    "(import it under a name instead)",
                )
        elif id(obj) in self._dangerous:
            self._bad(node, f"{dotted} is a forbidden builtin")
        elif _machinery(obj):
            self._bad(
                node, f"{dotted} is or holds the interpreter's machinery ({type(obj).__name__})"
            )
        elif _from_refused_triton(obj):
            self._bad(node, f"{dotted} comes from {_origin(obj)!r}, which is not allowed")

    def _forbidden(self, root: str | None, attr: str) -> bool:
        mod = self.module_names.get(root or "", "")
        if mod.startswith("torch"):
            return attr in FORBIDDEN_TORCH_ATTRS
        if mod.startswith("triton"):
            return attr in FORBIDDEN_TRITON_ATTRS
        return False

    def _bad(self, node: ast.AST, msg: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {msg}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not _import_allowed(alias.name):
                self._bad(node, f"import of {alias.name!r} is not allowed")
            if alias.asname:
                self.module_names[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.module_names[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level:
            self._bad(node, "relative imports are not allowed")
        elif not _import_allowed(mod):
            self._bad(node, f"import from {mod!r} is not allowed")
        for alias in node.names:
            if alias.name == "*":
                self._bad(node, "star imports are not allowed")
            elif alias.name.startswith("_") and mod != "__future__":
                self._bad(node, f"importing private name {alias.name!r} is not allowed")
            elif mod != "__future__":
                full = f"{mod}.{alias.name}"
                if (
                    self._forbidden(mod.split(".")[0], alias.name)
                    or (mod.startswith("torch") and alias.name in FORBIDDEN_TORCH_ATTRS)
                    or (mod.startswith("triton") and alias.name in FORBIDDEN_TRITON_ATTRS)
                ):
                    self._bad(node, f"{full} is not allowed")
                elif _import_allowed(mod):
                    self._reach(node, full, bound=True)
                self.module_names[alias.asname or alias.name] = full
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.module_names and isinstance(node.ctx, ast.Load):
            self._reach(node, self.module_names[node.id])
        if node.id in FORBIDDEN_BUILTINS:
            self._bad(node, f"use of builtin {node.id!r} is not allowed")
        elif node.id.startswith("__") and node.id.endswith("__"):
            self._bad(node, f"dunder name {node.id!r} is not allowed")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        root = _root_name(node)
        self.bases.add(id(node.value))
        dotted = _module_path(node, self.module_names)
        if attr.startswith("_"):
            self._bad(node, f"private or dunder attribute {attr!r} is not allowed")
        elif attr in FORBIDDEN_ATTRS:
            self._bad(node, f"attribute {attr!r} is not allowed")
        elif self._forbidden(root, attr):
            self._bad(node, f"{_dotted(node)} is not allowed")
        elif root in self.module_names and attr.startswith("set_"):
            self._bad(node, f"{_dotted(node)} changes global state and is not allowed")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            # Through any name: `T = torch.Tensor; T.x = ...` patches torch all the same.
            what = "(monkeypatching) " if root in self.module_names else ""
            self._bad(node, f"assigning to the attribute {_dotted(node)} {what}is not allowed")
        elif dotted is not None and not attr.startswith("_"):
            self._reach(node, dotted)
        self.generic_visit(node)

    def _string_annotation(self, ann: ast.expr | None) -> None:
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            self._bad(
                ann,
                "annotations must be expressions, not strings "
                "(introspection evaluates annotation strings as code)",
            )

    def visit_arg(self, node: ast.arg) -> None:
        self._string_annotation(node.annotation)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._string_annotation(node.returns)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._string_annotation(node.annotation)
        self.generic_visit(node)

    def visit_Match(self, node: ast.Match) -> None:
        # A class pattern reads the attributes it names (`case C(__globals__=g)`), and they are
        # strings to the parser, not attribute nodes these rules see.
        self._bad(node, "match statements are not allowed")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg == "eval_str":
            self._bad(node, "eval_str= (evaluating annotation strings) is not allowed")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self._bad(node, "global statements are not allowed (no state across calls)")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self._bad(node, "nonlocal statements are not allowed (no state across calls)")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._bad(node, "class definitions are not allowed (no tensor subclasses or state)")
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._bad(node, "async code is not allowed")
        self.generic_visit(node)


def check_source(source: str, arg_names: tuple[str, ...]) -> StaticResult:
    """Syntax, contract (a `kernel` with the problem's signature) and prohibitions."""
    if not isinstance(source, str):
        return StaticResult("malformed", ["candidate source must be text"])
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        return StaticResult(
            "malformed", [f"candidate source is over {MAX_SOURCE_BYTES // 1024} KiB"]
        )
    if "\x00" in source:
        return StaticResult("malformed", ["candidate source contains a NUL byte"])
    try:
        tree = pysource.parse(source, filename="candidate.py")
    except SyntaxError as e:
        return StaticResult("compile_error", [f"syntax error at line {e.lineno}: {e.msg}"])
    except (RecursionError, MemoryError):
        return StaticResult("malformed", ["candidate source nests too deeply to check"])

    kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "kernel"]
    if not kernels:
        return StaticResult("malformed", ["no top-level `def kernel(...)`"])
    if len(kernels) > 1:
        return StaticResult("malformed", ["`kernel` is defined more than once"])
    fn = kernels[0]
    a = fn.args
    params = [p.arg for p in a.posonlyargs + a.args]
    n_required = len(params) - len(a.defaults)
    if a.vararg or a.kwarg or a.kwonlyargs:
        return StaticResult("malformed", ["kernel() must take plain positional arguments"])
    if not (n_required <= len(arg_names) <= len(params)):
        return StaticResult(
            "malformed",
            [
                f"kernel({', '.join(params)}) does not match the problem's "
                f"signature kernel({', '.join(arg_names)})"
            ],
        )

    v = _Visitor()
    try:
        v.visit(tree)
        problems = v.problems + _undefined_globals(source)
    except (RecursionError, MemoryError):
        return StaticResult("malformed", ["candidate source nests too deeply to check"])
    if problems:
        return StaticResult("prohibited", problems)
    return StaticResult()


def _undefined_globals(source: str) -> list[str]:
    """Names read as globals that the candidate never defines and that are no allowed builtin.
    Other code can put names into a module's namespace (Triton's interpreter copies its own,
    numpy and inspect among them, into the module of every function it runs), and the rules
    above only see names the candidate binds."""
    import builtins
    import symtable

    top = symtable.symtable(source, "candidate.py", "exec")
    defined = {
        s.get_name()
        for s in top.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    allowed = defined | {n for n in vars(builtins) if n not in FORBIDDEN_BUILTINS}
    bad: set[str] = set()
    stack = [top]
    while stack:
        table = stack.pop()
        stack.extend(table.get_children())
        for sym in table.get_symbols():
            name = sym.get_name()
            if not sym.is_referenced() or name in allowed or name.startswith("__"):
                continue
            if table is top or sym.is_global():
                bad.add(name)
    return [f"name {n!r} is used but never defined (nor an allowed builtin)" for n in sorted(bad)]
