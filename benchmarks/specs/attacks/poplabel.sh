#!/usr/bin/env bash
# poplabel (issue 44, item 5; docs/attacks.md "poplabel"): FedMF on ML-100K (strict), 20 rounds,
# the last round recorded for clients 0-99; no privacy, then cdp-gaussian (q = 0.2, C = 50),
# ldp-laplace (L1 clip 2500) and ldp-dpsgd at total eps 1, 16, 64 (delta 1e-5), seeds $SEEDS.
# Resumable: a finished run directory is kept. Then:
#   python -m benchmarks.poplabel_table runs/poplabel
#   (PYTHON: the interpreter, default python)
set -u
cd "$(dirname "$0")/../../.."
DATA=${DATA:-../shared/datasets/ml-100k}
for SEED in ${SEEDS:-0 1 2}; do
for SPEC in "none:" "cdp-gaussian:1" "cdp-gaussian:16" "cdp-gaussian:64" "ldp-laplace:1" \
            "ldp-laplace:16" "ldp-laplace:64" "ldp-dpsgd:1" "ldp-dpsgd:16" "ldp-dpsgd:64"; do
  MODE=${SPEC%%:*}; EPS=${SPEC#*:}
  OUT=runs/poplabel/seed$SEED-$MODE${EPS:+-eps$EPS}
  [ -f "$OUT/summary.json" ] && continue
  case $MODE in
    none) EXTRA="" ;;
    cdp-gaussian) EXTRA="--epsilon $EPS --delta 1e-5 --sample-rate 0.2 --clip 50" ;;
    ldp-laplace) EXTRA="--epsilon $EPS --clip 2500" ;;
    ldp-dpsgd) EXTRA="--epsilon $EPS --delta 1e-5" ;;
  esac
  OMP_NUM_THREADS=1 ${PYTHON:-python} -m fedem_private run --dataset ml-100k --data-dir "$DATA" \
    --protocol strict --seed "$SEED" --rounds 20 --method fedmf --eval-every 20 --no-progress \
    --privacy "$MODE" $EXTRA --record-rounds last --record-clients 100 --out "$OUT" --force \
    || exit $?
done; done
