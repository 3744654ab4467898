"""Prompt assembly (pure) and reply parsing."""

from __future__ import annotations

import re

import pytest

from kernels.harness.static import PROHIBITIONS
from searches.agent import packs
from searches.agent.prompt import (
    Incumbent,
    PackText,
    ProblemInfo,
    PromptInput,
    ShapeFloor,
    TrialNote,
    assemble,
    estimate_tokens,
)
from searches.agent.reply import parse_reply
from tests.web.agent_helpers import GOOD, MALFORMED, TWO_FILES, WRONG, fenced

REFERENCE = "def reference(x):\n    return torch.softmax(x.float(), dim=-1).to(x.dtype)\n"


def _pack(kind: str, name: str) -> PackText:
    p = packs._shipped(kind)[name]
    return PackText(p.name, p.version, p.title, p.body)


def _input(history: int = 0, notes=(), model_packs=("deepseek-mla-sparse",)) -> PromptInput:
    return PromptInput(
        idea_title="Single-pass softmax",
        idea_description="Keep the row in registers when it fits.",
        problem=ProblemInfo(
            name="softmax",
            signature="kernel(x)",
            description="softmax over the last dim",
            reference_source=REFERENCE,
            dtype="bfloat16",
            tier="full",
            shapes=[
                ShapeFloor("M=4096,N=1000", 0.0042, "memory"),
                ShapeFloor("M=1,N=7", None, None),
            ],
        ),
        gpu_kind="h200",
        hardware=_pack("hardware", "h200"),
        ceilings={"copy_gbps": 4270.0, "matmul_tflops_bf16": 688.0},
        harness_prohibitions=list(PROHIBITIONS),
        search_prohibitions=["no fp16 accumulation", "no torch.softmax"],
        model_packs=[_pack("model", n) for n in model_packs],
        incumbent=Incumbent(
            index=3,
            source=GOOD,
            speedup_eager=1.7,
            speedup_compiled=1.1,
            geomean_ms=0.02,
            bottleneck="memory bound on 8 of 8 shapes",
            shapes=["M=4096,N=1000, 0.0061 ms, 1.8x vs eager, 69% of roofline, memory bound"],
        ),
        history=[
            TrialNote(
                index=i,
                proposer="llm:model-a",
                model="model-a",
                status="failed" if i % 3 else "reverted",
                failure=("incorrect" if i % 2 else "compile_error") if i % 3 else None,
                reason=f"max abs error 0.{i} at shape M=4097,N=1000 " + "detail " * 60,
            )
            for i in range(1, history + 1)
        ],
        notes=list(notes),
    )


def test_the_prompt_carries_role_format_prohibitions_packs_problem_and_incumbent():
    p = assemble(_input(history=3, notes=[("veto", "it only handled N <= 1024")]), 24_000)
    assert "GPU kernel engineer" in p.system
    assert "One fenced code block tagged `python`" in p.system and "kernel(x)" in p.system
    for _name, rule in PROHIBITIONS:
        assert rule in p.system
    assert "no fp16 accumulation" in p.system and "set by the engineers" in p.system
    assert "NVIDIA H200" in p.user and "(context pack h200 v1)" in p.user
    assert "4270 GB/s" in p.user  # the worker's measured ceiling
    assert "kv_lora_rank" in p.user and "pack deepseek-mla-sparse v1" in p.user
    assert REFERENCE.strip() in p.user
    assert "| M=4096,N=1000 | 0.0042 ms | memory |" in p.user
    assert "The incumbent (trial 3)" in p.user and "memory bound on 8 of 8 shapes" in p.user
    assert GOOD.strip() in p.user
    assert "VETO: it only handled N <= 1024" in p.user
    assert "trial 1 by model-a: failed (incorrect)" in p.user
    assert not p.over_budget and p.omitted == []
    assert p.messages[0]["role"] == "system" and p.messages[1]["content"] == p.user
    assert p.text.startswith("### system") and p.user in p.text


def test_the_same_input_gives_the_same_prompt():
    assert assemble(_input(history=5), 20_000) == assemble(_input(history=5), 20_000)


@pytest.mark.parametrize("budget", [3_500, 5_000, 8_000])
def test_a_long_history_is_summarised_under_the_budget_and_code_is_never_cut(budget):
    p = assemble(_input(history=300), budget)
    assert p.tokens <= budget and not p.over_budget
    assert estimate_tokens(p.system) + estimate_tokens(p.user) == p.tokens
    assert "(summarised)" in p.user and any("summarised" in o for o in p.omitted)
    assert re.search(r"trials 1-\d+ \(summarised\): \d+ failed, \d+ reverted; failures: ", p.user)
    assert GOOD.strip() in p.user and REFERENCE.strip() in p.user  # whole files
    assert p.user.count("```") % 2 == 0  # every fence closed
    assert "trial 300 by model-a" in p.user  # the newest stay in detail


def test_model_packs_go_before_the_code_when_even_a_summary_does_not_fit():
    p = assemble(_input(history=50), 2_600)
    assert "kv_lora_rank" not in p.user
    assert "model pack deepseek-mla-sparse v1 left out" in p.omitted
    assert GOOD.strip() in p.user  # the incumbent stays whole, over budget or not


def test_the_first_prompt_shows_the_starting_kernel():
    inp = _input()
    inp = PromptInput(**{**inp.__dict__, "incumbent": None, "start_source": WRONG})
    p = assemble(inp, 24_000)
    assert "No correct candidate yet" in p.user and WRONG.strip() in p.user
    assert "No trial yet: this is the first proposal." in p.user


def test_every_shipped_hardware_pack_has_its_specs():
    hw = packs._shipped("hardware")
    for kind in ("h200", "h100", "b200", "a100", "l40s"):
        body = hw[kind].body
        for fact in (
            "SMs",
            "shared memory per SM",
            "registers per SM",
            "L2",
            "TMA",
            "wgmma",
            "fp4",
            "NVLink",
            "bf16",
            "fp8",
        ):
            assert fact in body, (kind, fact)
        assert hw[kind].datasheet_ceilings()["copy_gbps"] > 0
    assert "no: PCIe" in hw["l40s"].body and "NO: Hopper's wgmma is gone" in hw["b200"].body


# -- replies --------------------------------------------------------------------------------------


def test_a_reply_with_one_block_is_a_candidate_and_the_prose_its_rationale():
    parsed = parse_reply(fenced(GOOD, "Two passes; memory bound."))
    assert parsed.ok and parsed.source == GOOD.rstrip() + "\n"
    assert "Two passes; memory bound." in parsed.rationale and "```" not in parsed.rationale


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (MALFORMED, "no fenced python code block"),
        (TWO_FILES, "2 python code blocks"),
        ("```python\n" + GOOD[:200], "never closed"),
        ("```python\nimport torch\nx = 1\n```", "no top-level `def kernel(...)`"),
        ("   ", "empty"),
    ],
)
def test_a_malformed_reply_says_why(text, why):
    parsed = parse_reply(text)
    assert not parsed.ok and parsed.source is None and why in parsed.error


def test_blocks_in_other_languages_are_prose():
    text = "Run it with\n```bash\npython -m kernels evaluate\n```\n" + fenced(GOOD)
    parsed = parse_reply(text)
    assert parsed.ok and parsed.source.startswith('"""Seed softmax')


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_url")
def test_the_history_carries_the_models_own_knob_values_and_rationale(engineer):
    from searches.agent.context import gather
    from searches.agent.prompt import assemble as assemble_prompt
    from tests.web.agent_helpers import llm_search
    from tests.web.domain import judge, propose, rejected

    search = llm_search(engineer)
    trial = propose(
        search,
        1,
        proposer="llm:model-a",
        model="model-a",
        rationale="Keep the row in registers; one pass over memory.",
        knob_values={"BLOCK_N": 2048, "NUM_WARPS": 8},
    )
    judge(trial, rejected("incorrect"))
    (note,) = gather(search, "h200").history
    assert note.knobs == "BLOCK_N=2048 NUM_WARPS=8"
    assert note.rationale == "Keep the row in registers; one pass over memory."
    user = assemble_prompt(gather(search, "h200"), 24_000).user
    line = user[user.index("- trial 1 by model-a") :].split("\n- ")[0]
    assert "[BLOCK_N=2048 NUM_WARPS=8]" in line
    assert "rationale: Keep the row in registers; one pass over memory." in line


def test_the_floor_of_a_tiny_shape_includes_launch_latency():
    from searches.agent.context import problem_info
    from searches.agent.prompt import LAUNCH_LATENCY_US

    ceilings = {"copy_gbps": 4270.0, "matmul_tflops_bf16": 688.0}
    shapes = {s.label: s for s in problem_info("softmax", "h200", ceilings).shapes}
    tiny = min(shapes.values(), key=lambda s: s.floor_ms)
    assert tiny.floor_ms >= LAUNCH_LATENCY_US * 1e-3
    assert tiny.bound == "launch latency"
    big = max(shapes.values(), key=lambda s: s.floor_ms)
    assert big.bound == "memory"  # a large shape is still bound by its bytes
    user = assemble(_input(), 24_000).user
    assert f"plus {LAUNCH_LATENCY_US:g} us of kernel launch latency" in user
