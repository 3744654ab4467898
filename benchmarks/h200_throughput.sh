#!/usr/bin/env bash
# Both throughput figures of docs/benchmarks/search.md in one invocation, on the user's problem in
# benchmarks/user_problems: screening evaluations per GPU-minute (search_proof.py: the baselines
# measured once, then THROUGHPUT distinct configurations of the seed, JOBS on the GPU and AHEAD
# more loading and compiling meanwhile, a compile past LINGER seconds giving its place to the
# next, the first JOBS let onto the GPU one every STAGGER seconds; run_phases.py's table of
# where its evaluations spent their time, and what the timing phases waited for from the GPU
# lock's trace locks.txt, in phases.txt), then
# the whole stack (stack_proof.py: `manage.py up` with WORKERS CUDA workers, two
# tuner searches from the seed for a WINDOW-second window). `nvidia-smi dmon` samples the GPU
# each second during each: power and temperature, utilisation, clocks, and the seconds it was
# held back by its power or thermal limit, and `vmstat` the host's CPUs (so that two runs' rates
# can be told apart by clocks or by a busy host).
# First, what a sandboxed child's start costs (boot.json). Writes under $1 (default: ./out).
# Needs redis-server on PATH for the stack.
# Env: PARTS ("search stack": either or both), JOBS (12), AHEAD (4), LINGER (20; 0: never),
# STAGGER (0: all at once), THROUGHPUT (96), WORKERS (8), WINDOW (140), SEARCH_TIMEOUT (200),
# STACK_TIMEOUT (320), REUSE_BASELINES (set: the screening takes the baselines an earlier run
# on this host cached), POOL_IDLE (set: the screening keeps that many warm sandboxes idle once
# its first evaluations have taken theirs; by default as `kernels tune` keeps them, AHEAD + 2).
# AUTOWEB_CUDA_SYNC and, for the stack, AUTOWEB_GPU_SLOTS reach the sandboxes and the workers
# (docs/deploy.md).
set -u
OUT=${1:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" \
  | tee -a "$OUT/env.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/env.txt"

# What one sandboxed child's start costs on this host, and the bytecode compiled first for
# packages that came without it (benchmarks/child_boot.py): the start-ups take most of a
# screening host's CPU.
python3 benchmarks/child_boot.py --device cuda --children 2 --repeats 1 --json "$OUT/boot.json" \
  > /dev/null 2> "$OUT/boot.log"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); c=d['children']; \
print('child start-up: median', c['median_wall_s'], 's,', c['median_cpu_s'], 'CPU s; compiled first:', \
d['compiled_first'].get('compiled') or 'nothing')" "$OUT/boot.json" | tee -a "$OUT/env.txt"

sample_gpu() {
  nvidia-smi dmon -s pucv -d 1 > "$OUT/dmon-$1.txt" 2>&1 &
  DMON=$!
  if command -v vmstat > /dev/null; then vmstat -t 1 > "$OUT/vmstat-$1.txt" 2>&1 & VMSTAT=$!; fi
}

if [[ " ${PARTS:-search stack} " == *" search "* ]]; then
  sample_gpu search
  rm -f "$OUT/locks.txt"
  AUTOWEB_GPU_LOCK_TRACE="$OUT/locks.txt" \
  timeout "${SEARCH_TIMEOUT:-200}" python3 benchmarks/search_proof.py --out "$OUT/search.json" \
    --problems-dir benchmarks/user_problems --problem token_logprobs --jobs "${JOBS:-12}" \
    --ahead "${AHEAD:-4}" --linger "${LINGER:-20}" --stagger "${STAGGER:-0}" --before 0 \
    --throughput "${THROUGHPUT:-96}" --trials 0 ${POOL_IDLE:+--pool-idle "$POOL_IDLE"} \
    ${REUSE_BASELINES:+--reuse-baselines} > "$OUT/search.log" 2>&1
  echo "search_proof exit $?"
  kill "$DMON" ${VMSTAT:-} 2>/dev/null
  tail -6 "$OUT/search.log"
  # Each step's median seconds and CPU seconds, and the share of the run spent timing alone.
  # With the GPU lock's trace (locks.txt): how long each kind of hold lasted, and what each
  # timing phase waited for.
  python3 benchmarks/run_phases.py "$OUT/search.json" --locks "$OUT/locks.txt" | tee "$OUT/phases.txt"
fi

if [[ " ${PARTS:-search stack} " == *" stack "* ]]; then
  sample_gpu stack
  timeout "${STACK_TIMEOUT:-320}" python3 benchmarks/stack_proof.py --device cuda --warm-baselines \
    --workers "${WORKERS:-8}" --problems-dir benchmarks/user_problems --problems token_logprobs \
    --sketches benchmarks/user_problems/seeds --searches 2 --trials 60 \
    --timeout "${WINDOW:-140}" --out "$OUT/stack.json" > "$OUT/stack.log" 2>&1
  echo "stack_proof exit $?"
  kill "$DMON" ${VMSTAT:-} 2>/dev/null
  grep -E '"(trials_per_min|wall_s|terminal|eval_s_median|busy_fraction|timed_out)"' "$OUT/stack.log"
fi
