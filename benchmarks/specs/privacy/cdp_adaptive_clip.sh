#!/usr/bin/env bash
# cdp-gaussian with adaptive clipping (issue 20's knob; Andrew et al. 2021, geometric
# rule, lr 0.2, count noise q n / 20): ML-100K, strict, FedMF, 20 rounds, seed 0,
# q = 0.2, first clip C = 50 (the best fixed clip of the momentum runs), target
# quantile in {0.5, 0.9}, eps in {inf (clip only), 1}. Same setting as
# benchmarks/specs/privacy/cdp_server_momentum.sh, whose plain rows are the fixed-clip comparison.
# Resumable: a finished run directory is kept.
#   bash benchmarks/specs/privacy/cdp_adaptive_clip.sh && \
#   fedem-private report runs/cdp_adaptive --out benchmarks/results/privacy/cdp_adaptive
set -u
cd "$(dirname "$0")/../../.."
for Q in 0.5 0.9; do for EPS in inf 1; do
  OUT=runs/cdp_adaptive/C50-eps$EPS-quantile$Q
  [ -f "$OUT/summary.json" ] && continue
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed 0 --rounds 20 \
    --method fedmf --eval-every 5 --no-progress --privacy cdp-gaussian --epsilon $EPS \
    --delta 1e-5 --sample-rate 0.2 --clip 50 --clip-quantile $Q --out $OUT
done; done
