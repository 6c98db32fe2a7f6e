#!/usr/bin/env bash
# cdp-gaussian, issue 20's question: does client-side elastic merging recover utility
# that the noisy global table loses? FedEM under cdp = FedAvg aggregation + EM on the
# client (--method fedmf --merge em), in the setting of benchmarks/specs/privacy/cdp_target.sh
# (ML-100K, strict, 40 rounds, q = 0.2, C = 50), 3 seeds, eps in {inf, 1};
# runs/cdp_target holds FedMF in the same setting.
# Resumable: a finished run directory is kept.
#   bash benchmarks/specs/privacy/cdp_fedem.sh && \
#   fedem-private report runs/cdp_fedem runs/cdp_target --out benchmarks/results/privacy/cdp_fedem
set -u
cd "$(dirname "$0")/../../.."
for SEED in 0 1 2; do for EPS in inf 1; do
  OUT=runs/cdp_fedem/seed$SEED-eps$EPS
  [ -f "$OUT/summary.json" ] && continue
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed $SEED --rounds 40 \
    --method fedmf --merge em --eval-every 10 --no-progress --privacy cdp-gaussian \
    --epsilon $EPS --delta 1e-5 --sample-rate 0.2 --clip 50 --out $OUT
done; done
