"""The harness: the fixed ground truth every candidate is judged by.

The public API is `run(request)` (one `kernels.protocol.EvaluationRequest` in, a report out)
and the helpers built on it: `evaluate`, `retime`, `time_together`. They are imported on first
use, so that importing a torch-free submodule (`kernels.harness.static`, `roofline`) loads no
torch: the web process imports those.
"""

from __future__ import annotations

import importlib
from typing import Any

from kernels.protocol import FAILURES

_LAZY = {
    "run": "kernels.harness.evaluate",
    "evaluate": "kernels.harness.evaluate",
    "retime": "kernels.harness.evaluate",
    "time_together": "kernels.harness.evaluate",
    "BaselineCache": "kernels.harness.baselines",
}

__all__ = ["FAILURES", "BaselineCache", "evaluate", "retime", "run", "time_together"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
