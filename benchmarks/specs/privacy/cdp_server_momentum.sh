#!/usr/bin/env bash
# cdp-gaussian with a server learning rate and momentum on the noisy aggregate
# (issue 20's knobs): ML-100K, strict, FedMF, 20 rounds, seed 0, q = 0.2,
# C in {10, 50}, eps in {inf (clip only), 1}, (server lr, momentum) in
# {(0.3, 0.9), (0.1, 0.9)}; (1, 0) is the first measurement's plain DP-FedAvg.
# Resumable: a finished run directory is kept.
#   bash benchmarks/specs/privacy/cdp_server_momentum.sh && \
#   fedem-private report runs/cdp_momentum --out benchmarks/results/privacy/cdp_momentum
set -u
cd "$(dirname "$0")/../../.."
for C in 10 50; do for EPS in inf 1; do for LM in "0.3 0.9" "0.1 0.9" "1 0"; do
  set -- $LM
  OUT=runs/cdp_momentum/C$C-eps$EPS-lr$1-m$2
  [ -f "$OUT/summary.json" ] && continue
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed 0 --rounds 20 \
    --method fedmf --eval-every 5 --no-progress --privacy cdp-gaussian --epsilon $EPS \
    --delta 1e-5 --sample-rate 0.2 --clip $C --server-lr $1 --server-momentum $2 --out $OUT
done; done; done
