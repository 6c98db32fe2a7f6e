#!/usr/bin/env bash
# cdp-gaussian (issue 20, docs/design.md section 6): the item attacks on what the server sees under
# secure aggregation, the released aggregate. The issue-20 target setting (ML-100K strict,
# FedMF, 40 rounds, q = 0.2, clip C = 50, delta 1e-5), eps in {inf (clip only), 16, 4, 1},
# three seeds; the last round recorded for the first 200 clients. Each item attack is scored on
# the recorded clients who took part in that round and, as a control, on those who sat it
# out (what the aggregate says about a client it does not contain).
# Resumable: a finished run directory (and its attacks.json) is kept.
#   bash benchmarks/specs/attacks/cdp_attacks.sh
#   fedem-private report runs/cdp_attacks --out benchmarks/results/attacks/cdp_attacks
#   python -m benchmarks.control_table benchmarks/results/attacks/cdp_attacks/results.csv
set -u
cd "$(dirname "$0")/../../.."
for SEED in 0 1 2; do for EPS in inf 16 4 1; do
  OUT=runs/cdp_attacks/seed$SEED-eps$EPS
  if [ ! -f "$OUT/summary.json" ]; then
    OMP_NUM_THREADS=1 python -m fedem_private run --dataset ml-100k \
      --data-dir ../shared/datasets/ml-100k --protocol strict --seed $SEED --rounds 40 \
      --method fedmf --eval-every 40 --no-progress --privacy cdp-gaussian --epsilon $EPS \
      --delta 1e-5 --sample-rate 0.2 --clip 50 --record-rounds last --record-clients 200 \
      --out $OUT || exit $?
  fi
  [ -f "$OUT/attacks.json" ] || OMP_NUM_THREADS=1 python -m fedem_private attack $OUT \
    --attacks projection,support,imia || exit $?
done; done
