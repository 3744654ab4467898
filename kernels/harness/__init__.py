"""The harness: the fixed ground truth every candidate is judged by."""

from kernels.harness.baselines import BaselineCache
from kernels.harness.evaluate import FAILURES, evaluate, retime, time_together

__all__ = ["FAILURES", "BaselineCache", "evaluate", "retime", "time_together"]
