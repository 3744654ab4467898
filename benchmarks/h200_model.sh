#!/usr/bin/env bash
# The model block with releases from real searches, on one GPU host (docs/benchmarks/model.md).
#   benchmarks/h200_model.sh release OUT   tuner searches on the block's ops through the whole
#                                          stack, approve what waits for review, re-validate,
#                                          export the library to var/library (and, with the
#                                          database, to OUT/library.tgz)
#   benchmarks/h200_model.sh block OUT     the block with var/library against eager and
#                                          torch.compile (both phases), report in OUT
#   benchmarks/h200_model.sh all OUT       both, in one run
# Env: PROBLEMS (rmsnorm,swiglu,rope), TRIALS (16), SEARCH_S (300), PHASES (prefill decode),
# RELEASE_S (560), REVAL_S (150), BLOCK_S (580): time limits of the steps,
# SKETCHES (a folder of <problem>_tuned.py sketches to start the ideas from; default: the seeds),
# WORKERS (worker processes on the GPU; default: what `manage.py up` starts).
set -u
MODE=${1:?release, block or all}
OUT=${2:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env-$MODE.txt"
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" | tee -a "$OUT/env-$MODE.txt"
release() {
  rm -rf var/library
  timeout "${RELEASE_S:-560}" python3 benchmarks/stack_proof.py --device cuda --warm-baselines \
    --problems "${PROBLEMS:-rmsnorm,swiglu,rope}" --trials "${TRIALS:-16}" ${SKETCHES:+--sketches "$SKETCHES"} ${WORKERS:+--workers "$WORKERS"} \
    --timeout "${SEARCH_S:-300}" --release var/library --release-timeout "${REVAL_S:-150}" \
    --out "$OUT/stack-release.json" --keep-db var/stack.sqlite3 > "$OUT/stack-release.log" 2>&1
  echo "stack_proof exit $?"
  grep -v '^  up|' "$OUT/stack-release.log" | tail -40
  tar czf "$OUT/library.tgz" -C var library stack.sqlite3 && tar tzf "$OUT/library.tgz"
}
block() {
  # A later run on a fresh machine: the library (and database) from the release step's tarball.
  [ -d var/library ] || { mkdir -p var && tar xzf "${LIBRARY_TGZ:-.model/library.tgz}" -C var; }
  timeout "${BLOCK_S:-580}" python3 benchmarks/model_block.py --library var/library --phases ${PHASES:-prefill decode} \
    --json "$OUT/h200-block.json" 2>&1 | tee "$OUT/h200-block.txt" | tail -80
}
case "$MODE" in
release) release ;;
block) block ;;
all) release; block ;;
*) echo "unknown mode $MODE" >&2; exit 2 ;;
esac
