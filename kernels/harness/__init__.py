"""The harness: the fixed ground truth every candidate is judged by."""

from kernels.harness.evaluate import FAILURES, evaluate, retime

__all__ = ["FAILURES", "evaluate", "retime"]
