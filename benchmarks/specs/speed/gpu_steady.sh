#!/usr/bin/env bash
# Issue 43's round targets on one H100, rounds 2-7 (the fourth GPU call of 2026-11-27,
# docs/speed.md): is round 2's miss the first merging round's warm-up or the steady state?
# Run from the repository root with OUT and FEDEM_DATA_ROOT set, as gpu_round.sh.
set -u
. benchmarks/specs/speed/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt"
timeout 60 python3 -m benchmarks.probes.profile_round --data ml-100k --device cuda \
  --chunks 1024 --budget-mb 65536 --timed 6 > "$OUT/ml100k.log" 2>&1
timeout 100 python3 -m benchmarks.probes.profile_round --data ml-1m-size --device cuda \
  --chunks 2048 --budget-mb 65536 --timed 6 > "$OUT/ml1m.log" 2>&1
