#!/usr/bin/env bash
# The GPU-only tests on a CUDA host (see docs/benchmarks/h200.md): integrity fixtures on CUDA,
# the sandbox's confinement with the CUDA driver loaded, re-validation, timing isolation, GPU
# memory. Logs under $1. JOBS=N spreads all but the timing-isolation and GPU-memory tests over
# N pytest processes (each test's candidates run in their own sandboxed children); those then
# run alone, on an otherwise idle GPU (the GPU-memory tests fill most of it).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
PYTEST=(python3 -m pytest -q -m gpu -p no:cacheprovider -p no:django)
timeout "${TESTS_TIMEOUT:-540}" "${PYTEST[@]}" ${JOBS:+-n "$JOBS"} \
  tests/kernels/test_sandbox_faults.py tests/kernels/test_integrity.py tests/kernels/test_revalidate.py \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -40
timeout "${ISOLATION_TIMEOUT:-300}" "${PYTEST[@]}" tests/kernels/test_timing_isolation.py tests/kernels/test_gpu_memory.py \
  2>&1 | tee "$OUT/gpu-tests-isolation.log" | tail -20
