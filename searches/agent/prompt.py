"""Prompt assembly: a pure function from `PromptInput` to the chat messages.

Nothing here reads the database or the clock, so the same input gives the same prompt (the tests
pin that). The budget is in estimated tokens; when the whole history does not fit, older trials
are summarised as counts and the newest kept in detail, error excerpts are shortened and, last,
model packs are left out by name. Code (the incumbent, the starting kernel, the reference) is
never cut: a half file would teach the model to write half files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

CHARS_PER_TOKEN = 4
DETAIL_STEPS = (None, 20, 10, 5, 2, 0)  # newest trials shown in detail; None = all
EXCERPT_STEPS = (600, 240, 120)
MAX_NOTES = 10

ROLE = (
    "You are a GPU kernel engineer writing Triton kernels. You work in a verified search loop: "
    "every candidate you write is compiled, checked against a PyTorch reference on a full shape "
    "sweep, checked for cheating, and benchmarked against eager PyTorch and torch.compile on the "
    "target GPU. Faster and correct candidates are kept; everything else is reverted. Most "
    "proposals fail (about 80% in practice): read the failures below and do not repeat them. "
    "Find the bottleneck first (memory, compute or launch latency) and change the structure "
    "to attack it; the built-in tuner searches your `# tune:` knobs afterwards, so do not spend "
    "your proposal on block-size tweaks alone."
)

OUTPUT_FORMAT = """\
Reply in exactly this form:
1. One fenced code block tagged `python` holding the COMPLETE candidate file (not a diff, not a \
fragment, no `...`). It defines `{signature}` and returns a new tensor of the reference's shape \
and dtype. It may define `@triton.jit` functions and helpers.
2. After the block, a short rationale (at most five sentences): what you changed, which \
bottleneck it attacks and what you expect.
No other code blocks. Mark tunable module-level constants with their search space, e.g.
```
BLOCK_N = 1024  # tune: 256, 512, 1024, 2048, 4096
NUM_WARPS = 4   # tune: 2, 4, 8, 16
```"""


@dataclass(frozen=True)
class ShapeFloor:
    label: str
    floor_ms: float | None  # the roofline's lower bound on the target GPU; None: no ceilings
    bound: str | None  # memory | compute | latency


@dataclass(frozen=True)
class ProblemInfo:
    name: str
    signature: str
    description: str
    reference_source: str
    dtype: str
    tier: str  # the shape sweep candidates are judged on: smoke or full
    shapes: list[ShapeFloor]


@dataclass(frozen=True)
class PackText:
    name: str
    version: int
    title: str
    body: str


@dataclass(frozen=True)
class Incumbent:
    index: int
    source: str
    speedup_eager: float | None
    speedup_compiled: float | None
    geomean_ms: float | None
    bottleneck: str
    shapes: list[str]  # one line per shape


# Every kernel pays a launch, however little it moves: the floor of a tiny shape is its roofline
# time plus this. 1.2 us is the fastest any kernel ran in the harness on the H200 (eager
# softmax of a 1x1 input, timed as CUDA-graph replays, where host launch cost is already
# amortised; the Triton candidate took 1.45 us): docs/benchmarks/h200/profile-softmax-c.json.
# Outside a graph a launch costs more (a few us), so this stays a lower bound.
LAUNCH_LATENCY_US = 1.2


@dataclass(frozen=True)
class TrialNote:
    index: int
    proposer: str
    model: str | None
    status: str
    failure: str | None
    reason: str
    speedup_eager: float | None = None
    knobs: str = ""
    rationale: str = ""  # the proposer's own words: the model's, or the tuner's one line


@dataclass(frozen=True)
class PromptInput:
    idea_title: str
    idea_description: str
    problem: ProblemInfo
    gpu_kind: str
    hardware: PackText | None
    ceilings: dict[str, float] | None  # measured on this search's workers
    harness_prohibitions: list[tuple[str, str]]
    search_prohibitions: list[str]
    model_packs: list[PackText] = field(default_factory=list)
    incumbent: Incumbent | None = None
    start_source: str = ""  # the sketch or the seed, when there is no incumbent yet
    history: list[TrialNote] = field(default_factory=list)  # oldest first
    notes: list[tuple[str, str]] = field(default_factory=list)  # (veto|note, text), newest first


@dataclass(frozen=True)
class Prompt:
    system: str
    user: str
    tokens: int  # estimated
    over_budget: bool  # even the parts never cut exceed the budget
    omitted: list[str]  # what was summarised or left out for the budget

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    @property
    def text(self) -> str:
        """The prompt as stored on the trial and shown on its page."""
        return f"### system\n\n{self.system}\n\n### user\n\n{self.user}"


def estimate_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + 1


def excerpt(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` characters, cut at a word where possible."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut + "…"


def _fence(source: str) -> str:
    return f"```python\n{source.rstrip()}\n```"


def _num(value: float | None, unit: str = "", digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}{unit}"


# -- sections -------------------------------------------------------------------------------------


def system_text(inp: PromptInput) -> str:
    rules = "\n".join(f"- {text}" for _name, text in inp.harness_prohibitions)
    parts = [
        ROLE,
        "## Output format\n\n" + OUTPUT_FORMAT.format(signature=inp.problem.signature),
        "## Prohibitions enforced by the harness (a violation fails the trial)\n\n" + rules,
    ]
    if inp.search_prohibitions:
        own = "\n".join(f"- {p}" for p in inp.search_prohibitions)
        parts.append("## Prohibitions set by the engineers for this search\n\n" + own)
    return "\n\n".join(parts)


def _idea(inp: PromptInput) -> str:
    text = f"## The idea: {inp.idea_title}\n\n"
    return text + (inp.idea_description.strip() or "(no description)")


def _problem(inp: PromptInput) -> str:
    p = inp.problem
    rows = "\n".join(
        f"| {s.label} | {_num(s.floor_ms, ' ms', 3)} | {s.bound or 'n/a'} |" for s in p.shapes
    )
    return (
        f"## The problem: {p.name}\n\n{p.description.strip()}\n\n"
        f"Signature: `{p.signature}` · dtype on this target: {p.dtype} · "
        f"judged on the {p.tier} shape sweep, every shape.\n\n"
        f"Reference (the ground truth; compute in Triton, do not call it):\n\n"
        f"{_fence(p.reference_source)}\n\n"
        "Shape sweep with the floor on the target GPU: the roofline time plus "
        f"{LAUNCH_LATENCY_US:g} us of kernel launch latency, which dominates tiny shapes (no "
        "correct kernel is faster than the floor; a result beyond it is treated as a hack):\n\n"
        f"| shape | roofline floor | bound |\n|---|---|---|\n{rows}"
    )


def _hardware(inp: PromptInput) -> str:
    head = f"## Target GPU: {inp.gpu_kind}\n\n"
    body = (
        f"(context pack {inp.hardware.name} v{inp.hardware.version})\n\n{inp.hardware.body.strip()}"
        if inp.hardware
        else "No hardware context pack for this kind."
    )
    if inp.ceilings:
        c = inp.ceilings
        body += (
            "\n\nCeilings measured on this search's worker (the roofline uses these): copy "
            f"bandwidth {_num(c.get('copy_gbps'), ' GB/s', 4)}, bf16 matmul "
            f"{_num(c.get('matmul_tflops_bf16'), ' TFLOP/s', 4)}."
        )
    else:
        body += "\n\nNo ceilings measured on this kind yet: floors use the datasheet, if any."
    return head + body


def _pack(pack: PackText) -> str:
    return (
        f"## Model context: {pack.title} (pack {pack.name} v{pack.version})\n\n{pack.body.strip()}"
    )


def _incumbent(inp: PromptInput) -> str:
    inc = inp.incumbent
    if inc is None:
        return (
            "## Starting point\n\nNo correct candidate yet. The starting kernel "
            "(the engineer's sketch, or the problem's seed):\n\n" + _fence(inp.start_source)
        )
    shapes = "\n".join(f"- {line}" for line in inc.shapes) or "- (no per-shape timings)"
    return (
        f"## The incumbent (trial {inc.index}): beat it\n\n"
        f"Speedup vs eager {_num(inc.speedup_eager, 'x')}, vs torch.compile "
        f"{_num(inc.speedup_compiled, 'x')}, geomean {_num(inc.geomean_ms, ' ms')}. "
        f"Bottleneck: {inc.bottleneck}.\n\nPer shape:\n{shapes}\n\n{_fence(inc.source)}"
    )


def _trial_line(t: TrialNote, limit: int) -> str:
    who = t.model or t.proposer
    what = t.status + (f" ({t.failure})" if t.failure else "")
    extra = f", {_num(t.speedup_eager, 'x')} vs eager" if t.speedup_eager else ""
    knobs = f" [{t.knobs}]" if t.knobs else ""
    reason = f": {excerpt(t.reason, limit)}" if t.reason else ""
    why = f"\n  rationale: {excerpt(t.rationale, limit)}" if t.rationale.strip() else ""
    return f"- trial {t.index} by {who}{knobs}: {what}{extra}{reason}{why}"


def summarise(trials: list[TrialNote]) -> str:
    """Older trials as counts: outcomes, failure categories, the best one."""
    status = Counter(t.status for t in trials)
    failures = Counter(t.failure for t in trials if t.failure)
    best = max(
        (t for t in trials if t.speedup_eager is not None),
        key=lambda t: t.speedup_eager or 0.0,
        default=None,
    )
    parts = [", ".join(f"{n} {s}" for s, n in sorted(status.items()))]
    if failures:
        parts.append("failures: " + ", ".join(f"{n} {f}" for f, n in failures.most_common()))
    if best is not None:
        parts.append(f"best: trial {best.index} at {_num(best.speedup_eager, 'x')} vs eager")
    first, last = trials[0].index, trials[-1].index
    return f"- trials {first}-{last} (summarised): " + "; ".join(parts)


def _history(inp: PromptInput, detail: int | None, limit: int) -> str:
    trials = inp.history
    if not trials:
        return "## History\n\nNo trial yet: this is the first proposal."
    shown = trials if detail is None else trials[len(trials) - detail :] if detail else []
    older = trials[: len(trials) - len(shown)]
    lines = [summarise(older)] if older else []
    lines += [_trial_line(t, limit) for t in shown]
    return "## History (oldest first): learn from the failures\n\n" + "\n".join(lines)


def _notes(inp: PromptInput, limit: int) -> str:
    if not inp.notes:
        return ""
    lines = [
        f"- {'VETO' if kind == 'veto' else 'note'}: {excerpt(text, limit)}"
        for kind, text in inp.notes[:MAX_NOTES]
    ]
    return "## What the reviewers said (follow it)\n\n" + "\n".join(lines)


def assemble(inp: PromptInput, budget_tokens: int) -> Prompt:
    """The prompt for the next proposal, within `budget_tokens` where the never-cut parts allow."""
    system = system_text(inp)
    fixed_head = [_idea(inp), _problem(inp), _hardware(inp)]
    tail = "Write the next candidate now, in the output format above."
    packs = list(inp.model_packs)
    omitted: list[str] = []

    def build(detail: int | None, limit: int, packs: list[PackText]) -> str:
        sections = [*fixed_head, *(_pack(p) for p in packs), _incumbent(inp)]
        sections += [_history(inp, detail, limit), _notes(inp, limit), tail]
        return "\n\n".join(s for s in sections if s)

    def fits(user: str) -> bool:
        return estimate_tokens(system) + estimate_tokens(user) <= budget_tokens

    while True:
        for detail in DETAIL_STEPS:
            for limit in EXCERPT_STEPS:
                user = build(detail, limit, packs)
                if fits(user):
                    if detail is not None and detail < len(inp.history):
                        omitted.append(
                            f"history: {len(inp.history) - detail} older trials summarised"
                        )
                    return Prompt(system, user, _tokens(system, user), False, omitted)
        if not packs:
            break
        dropped = packs.pop()
        omitted.append(f"model pack {dropped.name} v{dropped.version} left out")
    user = build(0, EXCERPT_STEPS[-1], [])
    if inp.history:
        omitted.append(f"history: all {len(inp.history)} trials summarised")
    return Prompt(system, user, _tokens(system, user), True, omitted)


def _tokens(system: str, user: str) -> int:
    return estimate_tokens(system) + estimate_tokens(user)
