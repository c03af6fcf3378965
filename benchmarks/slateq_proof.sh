#!/usr/bin/env bash
# The SlateQ proof runs of the README: SlateQ at (N, n) = (100, 10) on ChocKaleSlate-v0 (3 seeds,
# default hyperparameters), and single-seed diagnostics on ChocKaleLongTerm-v0. The 3-seed SlateQ
# variants on ChocKaleLongTerm-v0 (gamma 0.9, gamma 0, with the consumption memory) are contenders
# of `fedrec bench longterm` (results/longterm/). Writes run directories under $OUT (default
# runs/benchmarks/slateq_proof/; the committed runs: OUT=results/slateq ... --overwrite) and prints
# the tables. Run directories or plots of an earlier run are replaced only with --overwrite.
# Usage: [OUT=DIR] bash benchmarks/slateq_proof.sh [--overwrite] [SEEDS...]   (default seeds 0 1 2)
set -euo pipefail
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
FEDREC=${FEDREC:-.venv/bin/fedrec}
OUT=${OUT:-runs/benchmarks/slateq_proof}
OVERWRITE=0
if [[ "${1:-}" == "--overwrite" ]]; then
  OVERWRITE=1
  shift
fi
SEEDS=("${@:-0 1 2}")
# Refuse before any training to replace what an earlier run wrote.
TARGETS=()
for seed in ${SEEDS[@]}; do
  TARGETS+=("$OUT/slate-100x10/slateq-seed$seed")
done
TARGETS+=("$OUT/longterm-10x3/slateq-gamma0.99-seed0"
  "$OUT/longterm-10x3/slateq-gamma0-memory0.9-seed0"
  "$OUT/longterm-10x3-observed/slateq-gamma0.9-seed0"
  "$OUT/slate-100x10/learning_curves.png" "$OUT/longterm-10x3/learning_curves.png")
if [[ $OVERWRITE == 0 ]]; then
  for target in "${TARGETS[@]}"; do
    if [[ -e $target ]]; then
      echo "error: $target exists (written by an earlier run): pass --overwrite to replace it," \
        "or choose another OUT" >&2
      exit 1
    fi
  done
fi
for seed in ${SEEDS[@]}; do
  $FEDREC train slateq --env fedrec/ChocKaleSlate-v0 --env-kwarg num_candidates=100 \
    --env-kwarg slate_size=10 --episodes 5000 --seed "$seed" --no-progress \
    --out "$OUT/slate-100x10/slateq-seed$seed"
done
# Diagnostics on seed 0: gamma 0.99; myopic with memory; satisfaction observed without noise.
$FEDREC train slateq --env fedrec/ChocKaleLongTerm-v0 --episodes 3000 --seed 0 --gamma 0.99 \
  --no-progress --out "$OUT/longterm-10x3/slateq-gamma0.99-seed0"
$FEDREC train slateq --env fedrec/ChocKaleLongTerm-v0 --episodes 3000 --seed 0 --gamma 0 \
  --memory-decay 0.9 --no-progress --out "$OUT/longterm-10x3/slateq-gamma0-memory0.9-seed0"
$FEDREC train slateq --env fedrec/ChocKaleLongTerm-v0 --episodes 3000 --seed 0 --gamma 0.9 \
  --env-kwarg satisfaction_noise_stddev=0.0 --no-progress \
  --out "$OUT/longterm-10x3-observed/slateq-gamma0.9-seed0"
$FEDREC eval "$OUT"/slate-100x10/slateq-* --out "$OUT/slate-100x10/learning_curves.png"
$FEDREC eval results/longterm/10x3/slateq/seed0 "$OUT"/longterm-10x3/slateq-* \
  "$OUT"/longterm-10x3-observed/slateq-* --paper none --out "$OUT/longterm-10x3/learning_curves.png"
