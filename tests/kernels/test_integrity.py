"""Every planted exploit is rejected for the right reason (docs/harness.md, Checks).

Each fixture in tests/fixtures/exploits/ states in its header the problem it targets, the
failure category it must get (and, where CUDA rejects it otherwise, `expect-cuda`) and whether
it needs CUDA. Fixtures for any device run on the
Triton CPU interpreter here; CUDA-only ones run on a GPU host, where every fixture is also
evaluated on the GPU.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kernels.harness import FAILURES, evaluate

EXPLOITS = Path(__file__).resolve().parents[1] / "fixtures" / "exploits"
_HEADER = re.compile(r"^# (problem|expect|expect-cuda|device):\s*(\S+)\s*$", re.MULTILINE)

# What a reason must mention (any one of the alternatives, case-insensitive). Not the category
# name: every reason starts with its category, so that would prove nothing.
REASON_MENTIONS: dict[str, tuple[str, ...]] = {
    "aliasing": ("alias",),
    "aliasing_view": ("alias",),
    "bad_kernel_signature": ("signature",),
    "batch_and_skip": ("outside tolerance",),
    "benchmark_detection": ("cached", "reused", "graph replay", "while being timed"),
    "cached_copy": ("cached",),
    "cached_same_buffer": ("cached", "reused"),
    "dunder_escape": ("dunder",),
    "events_cached_result": ("while being timed",),
    "escape_annotation_eval": ("typing.get_type_hints is not allowed",),
    "escape_capture_scope": ("attribute 'get_capture_scope' is not allowed",),
    "escape_device_module": ("annotations must be expressions",),
    "deep_nesting": ("nests too deeply",),
    "escape_forge_done": ("bltn_open",),
    "escape_format_walk": ("attribute 'format' is not allowed",),
    "escape_forge_harness_message": ("bltn_open",),
    "escape_forge_malformed": ("bltn_open",),
    "escape_log_symlink": ("bltns",),
    "escape_match_pattern": ("match statements are not allowed",),
    "escape_output_fifo": ("bltns",),
    "escape_signature_eval": ("attribute 'signature' is not allowed",),
    "escape_sys_modules": ("attribute 'modules' is not allowed",),
    "fill_disk": ("attribute 'os' is not allowed",),
    "fill_disk_many": ("attribute 'os' is not allowed",),
    "fork_children": ("attribute 'os' is not allowed",),
    "forbidden_builtin": ("builtin 'eval' is not allowed",),
    "forbidden_import": ("import of 'os' is not allowed",),
    "graph_breaking": ("cuda-graph", "graph"),
    "graph_detection": ("cuda-graph", "graph replay"),
    "graph_first_call_only": ("while being timed",),
    "graph_reused_output": ("results reused",),
    "hang": ("no result within",),
    "illegal_memory_access": ("sigsegv", "illegal memory access", "process died"),
    "interpreter_names": ("name 'np' is used but never defined",),
    "lazy_meta": ("meta",),
    "kill_own_sandbox": ("attribute 'os' is not allowed",),
    "library_fallback": ("library fallback",),
    "library_fallback_arith": ("library fallback",),
    "monkeypatch_harness": ("monkeypatch",),
    "monkeypatch_time": ("monkeypatch",),
    "monkeypatch_timer": ("monkeypatch",),
    "monkeypatch_torch": ("monkeypatch",),
    "module_alias": ("used as a value",),
    "mutate_input": ("mutated",),
    "numpy_fallback": ("attribute 'numpy' is not allowed",),
    "oom": ("out of memory",),
    "precision_downgrade": ("outside tolerance",),
    "python_fallback": ("read on the host",),
    "python_repr": ("read as text",),
    "python_apply": ("attribute 'apply_' is not allowed",),
    "returns_tuple": ("not a torch.tensor",),
    "rope_own_tables": ("outside tolerance",),
    "shape_shortcut": ("outside tolerance",),
    "side_stream": ("torch.cuda.stream is not allowed",),
    "small_shapes_only": ("outside tolerance",),
    "socket_postgres": ("import of 'torch.distributed.elastic.events' is not allowed",),
    "socket_redis": ("import of 'torch.distributed.elastic.events' is not allowed",),
    "socket_remote": ("import of 'torch.distributed.elastic.events' is not allowed",),
    "stale_memory": ("outside tolerance",),
    "signal_worker": ("attribute 'os' is not allowed",),
    "socket_unix": ("import of 'torch.distributed.elastic.events' is not allowed",),
    "syntax_error": ("syntax error",),
    "tensor_subclass": ("subclass",),
    "threads": ("import of 'threading' is not allowed",),
    "triton_compile_error": ("constexpr", "arange"),
    "write_outside": ("attribute 'os' is not allowed",),
    "wrong_dtype": ("dtype",),
}

# Where CUDA gives another reason: there the compile-only pass calls the kernel on meta tensors
# first, and stops a call whose own code runs on (kernels.harness.childrun.HostClock). The
# `oom` fixture's allocations take no memory on meta tensors, so its loop never ends there.
CUDA_REASON_MENTIONS: dict[str, tuple[str, ...]] = {
    "hang": ("outside triton's compiler",),
    "oom": ("outside triton's compiler",),
}

# Exploits the harness lets through today, by (fixture, device). Strict: a fix turns these red
# until the entry is removed.
HARNESS_BUGS: dict[tuple[str, str], str] = {}


def _header(path: Path) -> dict[str, str]:
    found = dict(_HEADER.findall(path.read_text()[:2000]))
    missing = {"problem", "expect", "device"} - set(found)
    if missing:
        raise ValueError(f"{path.name} lacks header comment(s): {', '.join(sorted(missing))}")
    return found


FIXTURES = sorted(EXPLOITS.glob("*.py"))


def _cases(device: str) -> list:
    params = []
    for path in FIXTURES:
        head = _header(path)
        if device == "interpret" and head["device"] == "cuda":
            continue
        marks = [pytest.mark.gpu] if device == "cuda" else []
        bug = HARNESS_BUGS.get((path.stem, device))
        if bug:
            marks.append(pytest.mark.xfail(strict=True, reason=bug))
        params.append(pytest.param(path, head, marks=marks, id=path.stem))
    return params


def _limits(path: Path, device: str) -> dict:
    if path.stem == "hang":
        # On CUDA the bound on the candidate's own CPU time (10 s) must stop it before the
        # wall-clock timeout does: on an H100 host running eight test processes a 20 s timeout
        # once came first (the child's start, its compile and a spinning loop that got under
        # two-thirds of a core), and the bound once took 50 s there to fire, so there it is
        # 120 s, as test_sandbox_faults.py gives its own test of the bound. The interpreter
        # has no such bound: there the timeout is what stops it.
        return {"timeout_s": 120 if device == "cuda" else 20}
    if path.stem == "oom":
        # Two test workers share this 24 GB machine: cap each sandbox well below half.
        return {"memory_bytes": 3 << 30}
    return {}


def _mentions(report: dict, needles: tuple[str, ...]) -> bool:
    text = " ".join(report["reasons"]).lower()
    return any(n.lower() in text for n in needles)


def _assert_rejected_for(report: dict, path: Path, expect: str, device: str) -> None:
    assert report["verdict"] == "rejected", f"{path.name} was accepted: {report['checks']}"
    assert report["failure"] == expect, (path.name, report["failure"], report["reasons"])
    needles = REASON_MENTIONS[path.stem]
    if device == "cuda":
        needles = CUDA_REASON_MENTIONS.get(path.stem, needles)
    assert _mentions(report, needles), (
        f"{path.name}: no reason mentions any of {needles}: {report['reasons']}"
    )


def test_every_exploit_fixture_has_a_valid_header_and_a_reason_to_look_for() -> None:
    assert len(FIXTURES) >= 30
    for path in FIXTURES:
        head = _header(path)
        assert head["expect"] in FAILURES, path.name
        if "expect-cuda" in head:
            assert head["expect-cuda"] in FAILURES, path.name
        assert head["device"] in ("any", "cuda"), path.name
        assert path.stem in REASON_MENTIONS, f"add the reason {path.name} must get"


def _run(path: Path, head: dict, device: str) -> None:
    limits = _limits(path, device)
    started = time.monotonic()
    report = evaluate(head["problem"], path.read_text(), device=device, tier="smoke", **limits)
    expect = head.get("expect-cuda", head["expect"]) if device == "cuda" else head["expect"]
    _assert_rejected_for(report, path, expect, device)
    if "timeout_s" in limits:
        assert time.monotonic() - started < limits["timeout_s"] + 15


@pytest.mark.parametrize(("path", "head"), _cases("interpret"))
def test_it_rejects_the_planted_exploit_on_the_interpreter(path: Path, head: dict) -> None:
    _run(path, head, "interpret")


@pytest.mark.parametrize(("path", "head"), _cases("cuda"))
def test_it_rejects_the_planted_exploit_on_cuda(path: Path, head: dict) -> None:
    _run(path, head, "cuda")


# Kernels that do their work only when it is not timed: caught screened too, where each shape is
# timed in the mode its cached baselines were (`cached_modes`), and the caller computed each
# timed output's reference with the verification ones where it could, before the child timed
# anything. Each is screened on shapes whose baselines time in the mode it cheats in: a kernel
# that keeps a result per input buffer (`events_cached_result`) cheats only when called on one
# buffer over and over, as events mode samples; in graph mode each captured call of a small
# shape reads an input set of its own, so it does the work in the timed calls (docs/harness.md,
# The sandbox). Softmax's smoke shapes time in graph mode; 32768 x 4096 (256 MiB in bf16) takes
# eager and torch.compile over 100 us on an H100 or H200, in events mode. `benchmark_detection`
# counts its calls over every buffer: past its third it skips the work, which the verification
# catches before any shape is timed (mode None).
EVENTS_SHAPES = [{"M": 32768, "N": 4096}]
TIMED_EXPLOITS = (
    ("benchmark_detection", None, None),
    ("events_cached_result", EVENTS_SHAPES, "events"),
    ("graph_first_call_only", None, "graph"),
    ("graph_reused_output", None, "graph"),
)


@pytest.fixture(scope="module")
def screening_cache(tmp_path_factory: pytest.TempPathFactory):
    from kernels.harness.baselines import BaselineCache

    return BaselineCache(tmp_path_factory.mktemp("baselines"))


@pytest.mark.gpu
@pytest.mark.parametrize(("fixture", "shapes", "mode"), TIMED_EXPLOITS)
def test_it_rejects_a_timing_exploit_when_screened_too(
    fixture: str, shapes: list[dict] | None, mode: str | None, screening_cache
) -> None:
    path = EXPLOITS / f"{fixture}.py"
    head = _header(path)
    report = evaluate(
        head["problem"],
        path.read_text(),
        device="cuda",
        tier="smoke",
        shapes=shapes,
        baselines=screening_cache,
    )
    # Timed in the mode it cheats in, or (mode None) caught before any shape was timed.
    timed = {s["timing_mode"] for s in report["shapes"] if s.get("timing_mode")}
    assert timed == ({mode} if mode else set()), report["shapes"]
    _assert_rejected_for(report, path, head.get("expect-cuda", head["expect"]), "cuda")


# ---- the run-time layer on its own (static checks off) ------------------------------------


@pytest.mark.parametrize(
    ("fixture", "failure", "mention"),
    [
        # The tamper snapshot sees the patched attribute even though nothing parsed the source.
        ("monkeypatch_torch", "hack_suspected", "monkeypatching detected: torch.softmax"),
        (
            "monkeypatch_timer",
            "hack_suspected",
            "monkeypatching detected: torch.cuda.Event.elapsed_time",
        ),
        # The guarded import refuses everything outside torch/triton/math/functools/typing.
        ("forbidden_import", "compile_error", "import of 'os' is not allowed"),
        ("monkeypatch_harness", "compile_error", "import of 'kernels.harness.childrun'"),
        ("monkeypatch_time", "compile_error", "import of 'time' is not allowed"),
        ("threads", "compile_error", "import of 'threading' is not allowed"),
        # The op recorder sees torch compute ops, however they are spelled.
        ("library_fallback", "prohibited", "library fallback"),
        ("library_fallback_arith", "prohibited", "library fallback"),
        ("python_repr", "prohibited", "read as text"),
    ],
)
def test_the_runtime_defences_reject_it_without_static_checks(
    fixture: str, failure: str, mention: str
) -> None:
    report = evaluate(
        "softmax",
        (EXPLOITS / f"{fixture}.py").read_text(),
        device="interpret",
        skip_static_checks=True,
    )

    assert report["checks"]["static"]["passed"] is None
    assert report["verdict"] == "rejected"
    assert report["failure"] == failure, report["reasons"]
    assert mention.lower() in " ".join(report["reasons"]).lower(), report["reasons"]


@pytest.mark.gpu
def test_work_left_on_a_side_stream_is_caught_at_run_time_too() -> None:
    # Without the static check, the run-time defences: the output seen changing after the
    # calling stream finished (when the side kernel is still running then), or the CUDA-graph
    # replay, which does not contain the side stream's work.
    report = evaluate(
        "softmax",
        (EXPLOITS / "side_stream.py").read_text(),
        device="cuda",
        tier="smoke",
        skip_static_checks=True,
    )

    assert report["verdict"] == "rejected"
    assert report["failure"] == "hack_suspected", report["reasons"]
    assert _mentions(report, ("side stream", "cuda-graph")), report["reasons"]


def test_restricted_builtins_stop_eval_without_static_checks() -> None:
    report = evaluate(
        "softmax",
        (EXPLOITS / "forbidden_builtin.py").read_text(),
        device="interpret",
        skip_static_checks=True,
    )

    assert report["verdict"] == "rejected"
    assert "'eval' is not defined" in " ".join(report["reasons"]), report["reasons"]


# ---- the caller believes nothing the child says (static checks off: the candidate escaped) ----


@pytest.mark.parametrize(
    ("fixture", "failure", "mention"),
    [
        # "done" before any output was verified: every missing observation rejects the run.
        ("escape_forge_done", "hack_suspected", "finished without reporting"),
        # A message of the wrong form, and one that only the caller makes up: not a crash of
        # the caller, a rejection.
        ("escape_forge_malformed", "crashed", "'verified' message from the sandboxed process"),
        # "out of memory", written by the child: garbage, not the caller's kill
        ("escape_forge_harness_message", "crashed", "unreadable message"),
        # An output that is a FIFO is refused unread (opening it would block the caller).
        ("escape_output_fifo", "malformed", "not a regular file"),
    ],
)
def test_forged_messages_and_outputs_are_rejected(fixture: str, failure: str, mention: str) -> None:
    report = evaluate(
        "softmax",
        (EXPLOITS / f"{fixture}.py").read_text(),
        device="interpret",
        tier="smoke",
        skip_static_checks=True,
        timeout_s=120,
    )

    assert report["verdict"] == "rejected"
    assert report["failure"] == failure, report["reasons"]
    assert mention.lower() in " ".join(report["reasons"]).lower(), report["reasons"]


def test_a_log_swapped_for_a_symlink_does_not_leak_the_callers_environment(monkeypatch) -> None:
    secret = "autoweb-test-secret-" + "x" * 12
    monkeypatch.setenv("AUTOWEB_TEST_SECRET", secret)
    report = evaluate(
        "softmax",
        (EXPLOITS / "escape_log_symlink.py").read_text(),
        device="interpret",
        tier="smoke",
        skip_static_checks=True,
        timeout_s=120,
    )

    assert report["verdict"] == "rejected"
    assert report["failure"] == "crashed", report["reasons"]
    assert secret not in json.dumps(report)


# ---- the secret seed --------------------------------------------------------------------


def test_it_draws_new_secret_inputs_for_every_evaluation() -> None:
    source = (Path(__file__).resolve().parents[2] / "kernels" / "seeds" / "softmax.py").read_text()
    shapes = [{"M": 5, "N": 300}, {"M": 3, "N": 1000}]

    a = evaluate("softmax", source, device="interpret", shapes=shapes)
    b = evaluate("softmax", source, device="interpret", shapes=shapes)

    assert a["verdict"] == b["verdict"] == "accepted"
    for sa, sb in zip(a["shapes"], b["shapes"], strict=True):
        first_a, first_b = sa["errors"]["first"], sb["errors"]["first"]
        # ref_rms is a property of the inputs alone: equal values would mean equal inputs.
        assert first_a["ref_rms"] != first_b["ref_rms"]
        # Within one evaluation the second call gets fresh values too.
        assert first_a["ref_rms"] != sa["errors"]["second"]["ref_rms"]
