#!/usr/bin/env bash
# The whole-stack proof on one GPU host (see docs/benchmarks/stack.md): `manage.py up` with the
# CUDA workers, tuner searches on softmax and rmsnorm with a fixed trial budget; first one
# worker, then two workers sharing the GPU with one of them SIGKILLed mid-search.
# Writes under $1 (default: ./out). Env: TRIALS (per search, default 6), RUN_TIMEOUT (s, 200).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/stack_env.txt"
python3 -c "import torch,triton,django,rq;print('torch',torch.__version__,'triton',triton.__version__,'django',django.__version__,'rq',rq.__version__)" | tee -a "$OUT/stack_env.txt"
T=${TRIALS:-6}
python3 benchmarks/stack_proof.py --device cuda --workers 1 --trials "$T" \
  --timeout "${RUN_TIMEOUT:-200}" --out "$OUT/stack_w1.json" > "$OUT/stack_w1.log" 2>&1
grep -v "^  up|" "$OUT/stack_w1.log" | tail -45
python3 benchmarks/stack_proof.py --device cuda --workers 2 --trials "$T" --kill-worker-after 3 \
  --timeout "${RUN_TIMEOUT:-200}" --out "$OUT/stack_w2_kill.json" > "$OUT/stack_w2_kill.log" 2>&1
grep -v "^  up|" "$OUT/stack_w2_kill.log" | tail -45
