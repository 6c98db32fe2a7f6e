#!/usr/bin/env bash
# ldp-dpsgd (issue 20): is the default step (local lr 4, per-positive clip C = 1) a good
# one? lr in {1, 4 (the default), 16} at C = 1, C = 4 at lr 1, C = 0.25 at lr 4 and 16.
# ML-100K strict FedMF,
# eps 16 (delta 1e-5), 20 rounds, seeds 0-2; utility only. Resumable.
#   bash benchmarks/specs/privacy/dpsgd_lr.sh && \
#   fedem-private report runs/dpsgd_lr --out benchmarks/results/privacy/dpsgd_lr
set -u
cd "$(dirname "$0")/../../.."
for SEED in 0 1 2; do for LC in "4 1" "1 1" "16 1" "1 4" "4 0.25" "16 0.25"; do set -- $LC; LR=$1; C=$2
  OUT=runs/dpsgd_lr/seed$SEED-lr$LR-C$C-eps16
  [ -f "$OUT/summary.json" ] && continue
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed $SEED --rounds 20 \
    --method fedmf --eval-every 20 --no-progress --privacy ldp-dpsgd --epsilon 16 \
    --delta 1e-5 --clip $C --dpsgd-lr $LR --out $OUT || exit $?
done; done
