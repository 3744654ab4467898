"""Scripted model replies (real Triton candidates: good, wrong, malformed, hacked) and fixtures
for the agent's tests; the endpoint is the local server in tests/web/openai_server.py."""

from __future__ import annotations

from typing import Any

import pytest

from searches import services
from searches.models import Search
from tests.web.domain import SOFTMAX_SEED, idea_kwargs
from tests.web.openai_server import OpenAIServer

# The seed with a two-value knob space: the hybrid tuner has exactly one configuration to try.
GOOD = (
    SOFTMAX_SEED.replace(
        "BLOCK_N = 1024  # tune: 256, 512, 1024, 2048, 4096, 8192",
        "BLOCK_N = 1024  # tune: 512, 1024",
    ).replace("NUM_WARPS = 4  # tune: 1, 2, 4, 8, 16", "NUM_WARPS = 4  # tune: 4")
    + "\n# llm: a single pass would need the row in registers; keep two passes\n"
)
# Compiles and runs, wrong by a factor of two.
WRONG = SOFTMAX_SEED.replace("y = tl.exp(x - m) / l_sum", "y = tl.exp(x - m) / (l_sum * 2.0)")
# Reward hacking: patches the benchmark's timer; the harness's static checks reject it.
HACKED = SOFTMAX_SEED + "\ntorch.cuda.Event.elapsed_time = lambda self, other: 1e-6\n"
WRONG_SIGNATURE = SOFTMAX_SEED.replace("def kernel(x: torch.Tensor)", "def kernel(x, y)")


def fenced(source: str, rationale: str = "Keeps the row in registers; memory bound.") -> str:
    return f"Here is the candidate.\n\n```python\n{source.rstrip()}\n```\n\n{rationale}\n"


MALFORMED = "I would use a single pass over the row with an online softmax. (No code, sorry.)"
TWO_FILES = fenced(GOOD) + "\nOr this one:\n\n" + fenced(WRONG)


@pytest.fixture
def llm_server(settings):
    with OpenAIServer() as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = "sk-test-secret-key-0123456789"
        settings.AUTOWEB_DEFAULT_MODEL = ""
        settings.AUTOWEB_LLM_BACKOFF_MS = 1
        settings.AUTOWEB_LLM_ATTEMPTS = 3
        settings.AUTOWEB_LLM_TIMEOUT_S = 5
        settings.AUTOWEB_LLM_TUNE_TRIALS = 8
        settings.AUTOWEB_LLM_PRICES = {"model-a": (1.0, 2.0)}
        yield server


def llm_search(engineer: Any, model: str = "model-a", **overrides: Any) -> Search:
    """A running search with an LLM proposer on softmax (interpret kind)."""
    kwargs = idea_kwargs(
        engineer,
        proposer=f"llm:{model}",
        target_kinds=["interpret"],
        context_packs=["deepseek-mla-sparse"],
    )
    kwargs.update(overrides)
    idea = services.create_idea(**kwargs)
    search = services.start_search(idea=idea, user=engineer, seed=3)
    return services.begin_search(search=search)
