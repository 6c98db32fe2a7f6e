#!/usr/bin/env bash
# Issue 43's round targets on one H100 (the third GPU call of 2026-11-27, docs/speed.md):
# the timed rounds alone, and the 100,000-client FedMF round with a memory budget that
# keeps the peak under an H100's 80 GB. Run from the repository root with OUT and
# FEDEM_DATA_ROOT set, as gpu_round.sh.
set -u
. benchmarks/specs/speed/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt"
timeout 60 python3 -m benchmarks.probes.profile_round --data ml-100k --device cuda \
  --chunks 1024 --budget-mb 65536 > "$OUT/ml100k.log" 2>&1
timeout 90 python3 -m benchmarks.probes.profile_round --data ml-1m-size --device cuda \
  --chunks 2048 --budget-mb 65536 > "$OUT/ml1m.log" 2>&1
timeout 170 python3 -m benchmarks.probes.profile_round --data 100k-clients --method fedmf \
  --device cuda --chunks 8192 --budget-mb 12000 --set 'train.state_dtype="bfloat16"' \
  --set data.synthetic.n_items=20000 > "$OUT/scale.log" 2>&1
