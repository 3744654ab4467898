#!/usr/bin/env bash
# The search engine on one GPU host (docs/benchmarks/search.md): one output's round trip through
# a file, screening throughput before and after the baseline cache, then a tune of the user's
# problem in benchmarks/user_problems from its naive seed, ending with the per-shape table.
# Writes under $1 (default: ./out).
# Env: JOBS (on the GPU, 8), AHEAD (more compiling meanwhile, 4), LINGER (a compile past it gives
# its place in flight to the next, 20 s; 0: never), TRIALS (120), TUNE_MINUTES
# (4), BEFORE (6), THROUGHPUT (48), ROUNDTRIP (1; 0 skips the round trip of one output).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import torch,triton,optuna;print('torch',torch.__version__,'triton',triton.__version__,'optuna',optuna.__version__)" | tee -a "$OUT/env.txt"
# One output's way from the sandboxed child to the verdict (file write, read, hash, copy).
if [ "${ROUNDTRIP:-1}" != 0 ]; then
  timeout 120 python3 benchmarks/output_roundtrip.py --device cuda --json "$OUT/roundtrip.json" \
    2>&1 | tee "$OUT/roundtrip.log"
fi
timeout "${SEARCH_TIMEOUT:-560}" python3 benchmarks/search_proof.py --out "$OUT/search.json" \
  --problems-dir benchmarks/user_problems --problem token_logprobs --jobs "${JOBS:-8}" \
  --ahead "${AHEAD:-4}" --linger "${LINGER:-20}" --before "${BEFORE:-6}" --throughput "${THROUGHPUT:-48}" --trials "${TRIALS:-120}" \
  --tune-minutes "${TUNE_MINUTES:-4}" 2>&1 | tee "$OUT/search.log" | tail -60
