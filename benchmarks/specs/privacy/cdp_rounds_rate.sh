#!/usr/bin/env bash
# cdp-gaussian, issue 20's remaining knobs at eps 1: the number of rounds for the budget
# (40 instead of 20) and the client sampling rate (q = 0.5 instead of 0.2), each with
# the fixed clip C = 50 and with adaptive clipping to the median (first clip 50), and
# clip only (eps inf) beside them. ML-100K, strict, FedMF, seed 0.
# Resumable: a finished run directory is kept.
#   bash benchmarks/specs/privacy/cdp_rounds_rate.sh && \
#   fedem-private report runs/cdp_rounds_rate --out benchmarks/results/privacy/cdp_rounds_rate
set -u
cd "$(dirname "$0")/../../.."
for RQ in "40 0.2" "20 0.5"; do set -- $RQ; R=$1; Q=$2
for CLIP in fixed adaptive; do for EPS in inf 1; do
  OUT=runs/cdp_rounds_rate/T$R-q$Q-$CLIP-eps$EPS
  [ -f "$OUT/summary.json" ] && continue
  EXTRA=""; [ $CLIP = adaptive ] && EXTRA="--clip-quantile 0.5"
  OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
    --data-dir ../shared/datasets/ml-100k --protocol strict --seed 0 --rounds $R \
    --method fedmf --eval-every 5 --no-progress --privacy cdp-gaussian --epsilon $EPS \
    --delta 1e-5 --sample-rate $Q --clip 50 $EXTRA --out $OUT
done; done; done
