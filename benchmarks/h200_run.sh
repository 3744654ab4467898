#!/usr/bin/env bash
# The H200 proof run (see docs/benchmarks/h200.md). Writes under $1 (default: ./out).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" | tee -a "$OUT/env.txt"
timeout 100 python3 -m kernels profile --problem softmax --json "$OUT/profile_softmax.json" 2>&1 | tail -25
timeout "${PROOF_TIMEOUT:-420}" python3 benchmarks/gpu_proof.py --out "$OUT/proof.json" \
  ${PROOF_FLAGS:---exploits --throughput 32} --trials "${TRIALS:-6}" --parallel "${PARALLEL:-4}" \
  --problems "${PROBLEMS:-softmax,rmsnorm,layernorm,swiglu,rope,matmul,matmul_bias_gelu,attention}" 2>&1 | tee "$OUT/proof.log" | grep -v "^..:..:.. exploit" | tail -70
