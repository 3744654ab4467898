"""The search engine: what to try next (proposers), whether to keep it (the judge), and the
per-shape dispatch table a search ends with (compose).

One engine for every path: `python -m kernels tune` drives it headless (`kernels.engine.tuner`),
the web app's orchestrator drives it one recorded trial at a time, and the LLM hybrid tunes a
model's knobs with the same proposer. Each path calls the same judge, so the same reports get
the same keep/revert everywhere.
"""
