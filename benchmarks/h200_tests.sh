#!/usr/bin/env bash
# The GPU-only tests on a CUDA host (see docs/benchmarks/h200.md): integrity fixtures on CUDA,
# the sandbox's confinement with the CUDA driver loaded, re-validation. Log under $1.
set -u
OUT=${1:-out}
mkdir -p "$OUT"
timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/kernels/test_sandbox_faults.py tests/kernels/test_integrity.py tests/kernels/test_revalidate.py \
  tests/kernels/test_timing_isolation.py \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -40
