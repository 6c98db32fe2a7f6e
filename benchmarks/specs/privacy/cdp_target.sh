#!/usr/bin/env bash
# cdp-gaussian, issue 20's target (FedMF keeps >= 75% of its clip-only HR@10 at total
# eps = 1, delta 1e-5, ML-100K strict), with the setting benchmarks/specs/privacy/cdp_rounds_rate.sh
# found: 40 rounds, q = 0.2, fixed clip C = 50. Three seeds, eps in {inf (clip only), 1}.
# Resumable: a finished run directory is kept.
#   bash benchmarks/specs/privacy/cdp_target.sh && \
#   fedem-private report runs/cdp_target --out benchmarks/results/privacy/cdp_target
set -u
cd "$(dirname "$0")/../../.."
for SEED in 0 1 2; do for EPS in inf 1; do
  OUT=runs/cdp_target/seed$SEED-eps$EPS
  [ -f "$OUT/summary.json" ] && continue
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed $SEED --rounds 40 \
    --method fedmf --eval-every 10 --no-progress --privacy cdp-gaussian --epsilon $EPS \
    --delta 1e-5 --sample-rate 0.2 --clip 50 --out $OUT
done; done
