"""The harness: the fixed ground truth every candidate is judged by.

The public API: `run(request)` (one `kernels.protocol.EvaluationRequest` in, the report out;
`request_for` builds the request for a loaded problem) and what is built on it: `evaluate`,
`measure_baselines`, `retime`, `time_together` (all in `kernels.harness.evaluation`; the
verdict rules in `kernels.harness.verdict`). They are imported on first use, so that importing
a torch-free submodule (`kernels.harness.static`, `roofline`) loads no torch: the web process
imports those.
"""

from __future__ import annotations

import importlib
from typing import Any

from kernels.protocol import FAILURES

_LAZY = {
    "run": "kernels.harness.evaluation",
    "request_for": "kernels.harness.evaluation",
    "evaluate": "kernels.harness.evaluation",
    "measure_baselines": "kernels.harness.evaluation",
    "retime": "kernels.harness.evaluation",
    "time_together": "kernels.harness.evaluation",
    "BaselineCache": "kernels.harness.baselines",
}

__all__ = [
    "FAILURES",
    "BaselineCache",
    "evaluate",
    "measure_baselines",
    "request_for",
    "retime",
    "run",
    "time_together",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
