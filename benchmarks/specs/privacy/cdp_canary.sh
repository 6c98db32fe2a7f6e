#!/usr/bin/env bash
# The one-shot canary audit (Andrew et al., ICLR 2024; --canaries) on the cdp-gaussian
# target setting of benchmarks/specs/privacy/cdp_target.toml: FedMF, ML-100K strict, 40 rounds, q = 0.2,
# clip C = 50, total eps 1 (delta 1e-5), 50 canaries inserted and 50 held out; seeds 0-2.
# Resumable: a finished run directory is kept.
#   bash benchmarks/specs/privacy/cdp_canary.sh
set -u
cd "$(dirname "$0")/../../.."
for SEED in 0 1 2; do
  OUT=runs/cdp_canary/seed$SEED-eps1
  [ -f "$OUT/summary.json" ] && continue
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed $SEED --rounds 40 \
    --method fedmf --eval-every 10 --no-progress --privacy cdp-gaussian --epsilon 1 \
    --delta 1e-5 --sample-rate 0.2 --clip 50 --canaries 50 --out $OUT
done
