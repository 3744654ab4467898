"""kernels.library: per-kind, per-shape dispatch with fallback to the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import library
from kernels.harness import device as devmod

ONES = "import torch\n\ndef kernel(x):\n    return torch.full_like(x, {value})\n"
HONEST = (Path(__file__).resolve().parents[1] / "fixtures/honest/softmax_tuned.py").read_text()


def write(root: Path, releases: list[dict], sources: dict[str, str]) -> Path:
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (root / name).write_text(text)
    manifest = {
        "format": library.FORMAT,
        "problems": {"softmax": {"dims": {"M": [0, 0], "N": [0, 1]}, "ranks": [2]}},
        "releases": releases,
    }
    (root / library.MANIFEST).write_text(json.dumps(manifest))
    return root


def release(rid: int, *, kind="interpret", dtype="float32", n=(1, 4096), m=(1, 1 << 20), s=1.5):
    return {
        "id": rid,
        "problem": "softmax",
        "kind": kind,
        "dtype": dtype,
        "shape_range": {"M": list(m), "N": list(n)},
        "file": f"kernels/r{rid}.py",
        "speedup_eager": s,
    }


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def lib(tmp_path):
    return write(
        tmp_path,
        [
            release(1, n=(1, 4096), s=1.5),
            release(2, n=(2048, 8192), s=2.0),  # overlaps 1 on 2048..4096 and is faster there
            release(3, kind="h200", dtype="bfloat16", n=(1, 1 << 20), s=3.0),
        ],
        {f"kernels/r{i}.py": ONES.format(value=float(i)) for i in (1, 2, 3)},
    )


def test_it_picks_the_release_whose_range_holds_the_shape(lib, interpret):
    kernel = library.load("softmax", library_dir=lib)
    assert kernel(torch.randn(3, 1000)).unique().tolist() == [1.0]
    assert kernel(torch.randn(3, 6000)).unique().tolist() == [2.0]
    assert kernel.choose(torch.randn(3, 6000))["id"] == 2


def test_where_ranges_overlap_the_faster_release_wins(lib, interpret):
    kernel = library.load("softmax", library_dir=lib)
    assert kernel(torch.randn(2, 3000)).unique().tolist() == [2.0]


def test_outside_every_range_it_falls_back_to_the_reference(lib, interpret):
    kernel = library.load("softmax", library_dir=lib)
    x = torch.randn(2, 9000)
    assert kernel.choose(x) is None
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(3, 1000, dtype=torch.float64),  # a dtype no release was validated on
        torch.randn(1000, 3).t(),  # not contiguous
        torch.randn(2, 3, 1000),  # another rank
    ],
    ids=["dtype", "non-contiguous", "rank"],
)
def test_inputs_unlike_the_validated_ones_fall_back(lib, interpret, x):
    kernel = library.load("softmax", library_dir=lib)
    assert kernel.choose(x) is None
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))


def test_without_a_gpu_or_the_interpreter_it_runs_the_reference(lib, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernel = library.load("softmax", library_dir=lib)
    x = torch.randn(3, 1000)
    assert kernel.choose(x) is None
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))


def test_no_library_at_all_is_the_reference(monkeypatch):
    monkeypatch.delenv(library.ENV_DIR, raising=False)
    kernel = library.load("softmax")
    assert kernel.releases == []
    x = torch.randn(4, 10)
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))


def test_the_library_dir_comes_from_the_environment(lib, interpret, monkeypatch):
    monkeypatch.setenv(library.ENV_DIR, str(lib))
    assert library.load("softmax")(torch.randn(1, 10)).unique().tolist() == [1.0]


def test_choices_are_cached_per_shape_and_the_module_loaded_once(lib, interpret):
    kernel = library.load("softmax", library_dir=lib)
    for _ in range(3):
        kernel(torch.randn(3, 1000))
        kernel(torch.randn(5, 1000))
    assert len(kernel._cache) == 2 and list(kernel._modules) == ["1"]
    kernel.choose(torch.randn(3, 1000))  # the same key as a call's
    assert len(kernel._cache) == 2


def test_a_real_triton_release_runs_on_the_interpreter(tmp_path):
    # In a process of its own: Triton reads TRITON_INTERPRET when it is imported.
    lib = write(tmp_path, [release(7, n=(1, 1 << 20))], {"kernels/r7.py": HONEST})
    script = (
        "import torch\n"
        "from kernels.library import load\n"
        f"k = load('softmax', library_dir={str(lib)!r})\n"
        "x = torch.randn(5, 300)\n"
        "assert k.choose(x)['id'] == 7\n"
        "torch.testing.assert_close(k(x), torch.softmax(x, -1), atol=1e-5, rtol=1e-5)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_bad_manifest_is_a_clear_error(tmp_path):
    (tmp_path / library.MANIFEST).write_text('{"format": 99}')
    with pytest.raises(library.LibraryError, match="manifest"):
        library.load("softmax", library_dir=tmp_path)


def test_gpu_kinds_match_the_harness():
    assert library._KINDS == devmod.KINDS
    for name in ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Some New GPU"):
        assert library.gpu_kind(name) == devmod.kind_of(name)


def test_the_loader_imports_no_django_nor_the_rest_of_kernels():
    import ast

    tree = ast.parse(Path(library.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "django" not in imported
    # `kernels` only for the in-autoweb fallback when a library has no references.
    assert imported <= {
        "__future__",
        "importlib",
        "json",
        "os",
        "re",
        "sys",
        "threading",
        "weakref",
        "collections",
        "pathlib",
        "typing",
        "torch",
        "kernels",
    }


# A manifest exactly as the export wrote it before problems declared their own dims (the dims
# then came from a table of built-in names in this module): it must keep loading.
OLD_MANIFEST = {
    "format": 1,
    "generated_at": "2026-12-03T10:00:00+00:00",
    "problems": {
        "softmax": {"dims": {"M": [0, 0], "N": [0, 1]}, "ranks": [2], "signature": "kernel(x)"}
    },
    "releases": [
        {
            "id": 4,
            "problem": "softmax",
            "kind": "interpret",
            "dtype": "float32",
            "shape_range": {"M": [1, 64], "N": [1, 4096]},
            "file": "kernels/softmax_interpret_4.py",
            "source_sha256": "0" * 64,
            "speedup_eager": 1.2,
            "speedup_compiled": None,
            "geomean_ms": 0.1,
            "trial": {"search": 1, "index": 3},
            "approver": "rev",
            "created_at": "2026-12-03T09:00:00+00:00",
        }
    ],
}


def test_a_manifest_written_before_problems_declared_dims_still_loads(tmp_path, interpret):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels/softmax_interpret_4.py").write_text(ONES.format(value=4.0))
    (tmp_path / library.MANIFEST).write_text(json.dumps(OLD_MANIFEST))
    kernel = library.load("softmax", library_dir=tmp_path)
    assert kernel.dims == {"M": (0, 0), "N": (0, 1)} and kernel.ranks == [2]
    assert kernel(torch.randn(3, 100)).unique().tolist() == [4.0]
    assert kernel.choose(torch.randn(100, 100)) is None  # M outside 1..64


def test_the_dispatcher_holds_no_table_of_built_in_problems():
    """Every problem's dims come from its own declaration (through the manifest, or the
    registry inside autoweb), so a user's problem dispatches like a built-in."""
    import ast

    from kernels import problems

    assert not hasattr(library, "DIMS") and not hasattr(library, "RANKS")
    tree = ast.parse(Path(library.__file__).read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert not strings & set(problems.BUILTIN)


USERS_PROBLEM = """
import torch

SIGNATURE = "kernel(x, y)"
DIMS = {"R": (0, 0), "C": (1, 1)}
RANKS = (2, 2)
SHAPES_FULL = [{"R": 64, "C": 64}]
SHAPES_SMOKE = [{"R": 3, "C": 5}, {"R": 7, "C": 300}]
DTYPES = {"cuda": torch.bfloat16, "interpret": torch.float32}
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5, "l2": 1e-5}}


def reference(x, y):
    return x @ y


def make_inputs(shape, dtype, device, generator):
    x = torch.randn(shape["R"], 8, device=device, generator=generator)
    y = torch.randn(8, shape["C"], device=device, generator=generator)
    return x.to(dtype), y.to(dtype)


def flops(shape):
    return 16.0 * shape["R"] * shape["C"]


def bytes(shape, dtype):  # noqa: A001
    return 4.0 * (8 * shape["R"] + 8 * shape["C"] + shape["R"] * shape["C"])
"""


def test_a_users_problem_dispatches_on_the_dims_it_declares(tmp_path, interpret, monkeypatch):
    (tmp_path / "probs").mkdir()
    (tmp_path / "probs/outer8.py").write_text(USERS_PROBLEM)
    monkeypatch.setenv("AUTOWEB_PROBLEM_DIRS", str(tmp_path / "probs"))
    # Without a library: the registry's declaration, and the reference.
    plain = library.load("outer8", library_dir=None)
    assert plain.dims == {"R": (0, 0), "C": (1, 1)} and plain.ranks == [2, 2]
    x, y = torch.randn(3, 8), torch.randn(8, 5)
    assert plain.shape_of((x, y)) == {"R": 3, "C": 5}
    torch.testing.assert_close(plain(x, y), x @ y)
    # With a library whose manifest carries the declaration (as the export writes it).
    (tmp_path / "lib/kernels").mkdir(parents=True)
    (tmp_path / "lib/kernels/r1.py").write_text(
        "import torch\n\ndef kernel(x, y):\n    return torch.full((x.shape[0], y.shape[1]), 9.0)\n"
    )
    manifest = {
        "format": library.FORMAT,
        "problems": {"outer8": {"dims": {"R": [0, 0], "C": [1, 1]}, "ranks": [2, 2]}},
        "releases": [
            {
                "id": 1,
                "problem": "outer8",
                "kind": "interpret",
                "dtype": "float32",
                "shape_range": {"R": [1, 4], "C": [1, 100]},
                "file": "kernels/r1.py",
            }
        ],
    }
    (tmp_path / "lib" / library.MANIFEST).write_text(json.dumps(manifest))
    kernel = library.load("outer8", library_dir=tmp_path / "lib")
    assert kernel(x, y).unique().tolist() == [9.0]
    assert kernel.choose(torch.randn(5, 8), y) is None  # R = 5 is outside 1..4
    assert kernel.choose(x, torch.randn(8, 5).t().contiguous().t()) is None  # not contiguous


def _table(rows: dict[tuple[int, int], str]) -> list[dict]:
    return [{"shape": {"M": m, "N": n}, "serve": serve} for (m, n), serve in rows.items()]


def test_a_releases_table_sends_each_shape_to_what_serves_it(tmp_path, interpret):
    rel = release(1) | {"shapes": _table({(3, 1000): "eager", (5, 1000): "kernel"})}
    root = write(tmp_path, [rel], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root)
    x = torch.randn(3, 1000)
    # A shape where a baseline was faster: the reference runs, not the release.
    assert kernel.route_of(x) == "eager" and kernel.choose(x) is None
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))
    # A shape the kernel won, and one the table does not list (inside the range): the kernel.
    for rows in (5, 6):
        y = torch.randn(rows, 1000)
        assert kernel.route_of(y) == "kernel" and kernel.choose(y)["id"] == 1
        assert kernel(y).unique().tolist() == [1.0]
    # Outside every range: the reference, whatever the table says.
    assert kernel.route_of(torch.randn(3, 5000)) == "reference"


def test_a_shape_served_by_torch_compile_runs_the_compiled_reference(tmp_path, interpret):
    rel = release(1) | {"shapes": _table({(4, 256): "compiled"})}
    root = write(tmp_path, [rel], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root)
    x = torch.randn(4, 256)
    assert kernel.route_of(x) == "compiled" and kernel.choose(x) is None
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))
    call = kernel._cache[library._key((x,))][0]
    assert call.compiled is kernel._compiled and call.run is kernel._compiled.fn
    assert kernel._compiled.fn is not None, "torch.compile was never asked"
    assert kernel._compiled.failed is None, kernel._compiled.failed


def test_more_compiled_shapes_than_dynamos_recompile_limit_each_get_a_graph(tmp_path, interpret):
    """Dynamo keeps graphs per function and, past its recompile limit, silently runs eagerly:
    one compiled reference per kernel must still compile every shape its table gives it."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    rows = {(m, 128): "compiled" for m in (2, 3, 4)}
    rel = release(1) | {"shapes": _table(rows)}
    root = write(tmp_path, [rel], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root)
    # dynamo's own patch (monkeypatch's undo of a config entry leaves it hidden afterwards)
    with config.patch({name: 1}):  # as if the table's shapes were past the default 8
        for m, n in rows:
            x = torch.randn(m, n)
            before = counters["stats"]["unique_graphs"]
            torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))
            assert counters["stats"]["unique_graphs"] == before + 1, f"M={m} ran without a graph"
            assert kernel.route_of(x) == "compiled"
        assert getattr(config, name) == 1, "the limit is raised for the compiling call only"
        assert kernel._compiled.failed is None, kernel._compiled.failed
        # Later calls find their graphs: nothing compiles again, and the limit is not met (it
        # would raise here rather than run eagerly).
        strict = {"fail_on_recompile_limit_hit": True}
        with config.patch(strict if hasattr(config, "fail_on_recompile_limit_hit") else {}):
            done = counters["stats"]["unique_graphs"]
            for m, n in rows:
                x = torch.randn(m, n)
                torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))
            assert counters["stats"]["unique_graphs"] == done


def test_a_failing_compile_serves_every_compiled_shape_with_the_reference(tmp_path, interpret):
    rows = {(m, 128): "compiled" for m in (2, 3)}
    rel = release(1) | {"shapes": _table(rows)}
    root = write(tmp_path, [rel], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root)
    calls = []

    def broken(*args):
        calls.append(args)
        raise RuntimeError("no C compiler")

    x = torch.randn(2, 128)
    kernel(torch.randn(1, 4))  # outside the table: its release's kernel; nothing compiled yet
    assert kernel._compiled is None
    kernel.route_of(x)
    kernel._compiled.fn = broken  # what torch.compile returns when its compiler is missing
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))
    assert "no C compiler" in kernel._compiled.failed
    y = torch.randn(3, 128)
    torch.testing.assert_close(kernel(y), torch.softmax(y, dim=-1))
    torch.testing.assert_close(kernel(x), torch.softmax(x, dim=-1))
    assert len(calls) == 1, "after one failure the compiler is not asked again"


@pytest.mark.parametrize(
    ("x", "route"),
    [
        (torch.randn(5, 1000), "kernel"),
        (torch.randn(3, 1000), "eager"),
        (torch.randn(4, 1000), "compiled"),
        (torch.randn(3, 5000), "reference"),  # outside the range
    ],
)
def test_under_torch_compile_the_dispatcher_puts_no_graph_break_in_the_callers_graph(
    tmp_path, interpret, x, route
):
    """With the releases run under torch.compile, the call is decided while Dynamo traces (a
    constant), on a cold cache too: the release's kernel is traced, and every baseline route
    traces the reference inline, so Inductor fuses it with the caller's ops as torch.compile
    without the library would (never the nested torch.compile of the compiled route)."""
    import torch._dynamo

    rel = release(1) | {"shapes": _table({(3, 1000): "eager", (4, 1000): "compiled"})}
    root = write(tmp_path, [rel], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root, under_compile="kernel")

    def block(t):
        return kernel(t * 2) + 1

    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x)

    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1
    assert kernel._compiled is None, "no nested torch.compile inside the caller's graph"
    want = torch.ones_like(x) if route == "kernel" else torch.softmax(x * 2, dim=-1)
    torch.testing.assert_close(torch.compile(block, backend="eager")(x), want + 1)
    assert kernel.route_of(x) == route


def test_a_compiled_caller_recompiles_for_a_shape_with_another_route(tmp_path, interpret):
    rel = release(1) | {"shapes": _table({(3, 1000): "eager"})}
    root = write(tmp_path, [rel], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root, under_compile="kernel")
    block = torch.compile(lambda t: kernel(t) * 3, backend="eager", dynamic=False)

    kept, eager = torch.randn(5, 1000), torch.randn(3, 1000)

    assert block(kept).unique().tolist() == [3.0]  # the release's kernel
    torch.testing.assert_close(block(eager), torch.softmax(eager, dim=-1) * 3)  # the reference
    assert block(torch.randn(5, 1000)).unique().tolist() == [3.0]


def test_by_default_a_compiled_caller_traces_the_reference_as_without_the_library(
    tmp_path, interpret, monkeypatch
):
    """Inside torch.compile a release would replace a kernel Inductor fuses with its
    neighbours: by default the call traces the reference, so the caller's graph is the one
    torch.compile makes without the library, while eager calls still run the release."""
    import torch._dynamo

    monkeypatch.delenv(library.ENV_UNDER_COMPILE, raising=False)
    root = write(tmp_path, [release(1)], {"kernels/r1.py": ONES.format(value=1.0)})
    kernel = library.load("softmax", library_dir=root)
    x = torch.randn(5, 1000)
    assert kernel.route_of(x) == "kernel" and kernel(x).unique().tolist() == [1.0]

    def with_library(t):
        return kernel(t * 2) + 1

    def without(t):
        return torch.softmax(t * 2, dim=-1) + 1

    torch._dynamo.reset()
    ours, plain = torch._dynamo.explain(with_library)(x), torch._dynamo.explain(without)(x)

    assert ours.graph_break_count == 0 and ours.graph_count == 1
    assert str(ours.graphs[0].code).count("softmax") == str(plain.graphs[0].code).count("softmax")
    torch.testing.assert_close(torch.compile(with_library, backend="eager")(x), without(x))
    monkeypatch.setenv(library.ENV_UNDER_COMPILE, "kernel")
    assert library.load("softmax", library_dir=root).under_compile == "kernel"


def test_an_unknown_under_compile_mode_is_a_clear_error(tmp_path, monkeypatch):
    root = write(tmp_path, [release(1)], {"kernels/r1.py": ONES.format(value=1.0)})
    with pytest.raises(library.LibraryError, match="under_compile must be one of"):
        library.load("softmax", library_dir=root, under_compile="kernels")
    monkeypatch.setenv(library.ENV_UNDER_COMPILE, "fast")
    with pytest.raises(library.LibraryError, match="AUTOWEB_LIBRARY_UNDER_COMPILE"):
        library.load("softmax", library_dir=root)
