#!/usr/bin/env bash
# Scale-out proof (docs/benchmarks/multi-gpu.md): the same tuner searches (softmax and rmsnorm,
# a fixed trial budget) served by 1 worker, then by one worker per GPU, then by one worker per
# GPU with one of them SIGKILLed mid-search. `manage.py up` starts Redis, the web app, the
# orchestrators and the workers, each pinned to its GPU with CUDA_VISIBLE_DEVICES.
# Writes under $1 (default: ./out). Env: TRIALS per search (default 12), RUN_TIMEOUT (s, 540),
# N workers (default: every visible GPU), DEVICE (cuda; `interpret` runs the same proof with
# CPU-interpreter workers on a machine without GPUs).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Nothing here uses collective communication; keep NVLink multicast off all the same.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
N=${N:-$($PY -c "import torch;print(torch.cuda.device_count())")}
T=${TRIALS:-12}
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || nproc; uptime; } | tee "$OUT/env.txt"
run() {  # name, workers, extra args...
  local name=$1 workers=$2; shift 2
  $PY benchmarks/stack_proof.py --device "$DEVICE" --workers "$workers" --orchestrators 2 \
    --trials "$T" --timeout "${RUN_TIMEOUT:-540}" --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  $PY - "$OUT/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]}: workers {d['workers']}, {d['terminal']}/{d['trials']} judged, "
      f"{d['trials_per_min']:.2f} trials/min, unfinished {d.get('unfinished')}, "
      f"duplicates {d['duplicates']}, retried {d['retried']}, by worker {d['by_worker']}")
PY
}
run w1 1
run "w$N" "$N"
run "w${N}_kill" "$N" --kill-worker-after "$T"
$PY - "$OUT/w1.json" "$OUT/w$N.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
r = b["trials_per_min"] / a["trials_per_min"]
print(f"scaling: {r:.2f}x with {b['workers']} workers ({r / b['workers']:.2f} of linear)")
PY
