#!/usr/bin/env bash
# Issue 43's round targets on one H100, rounds 2-7 (the fourth GPU call of 2026-11-27,
# docs/speed.md): is round 2's miss the first merging round's warm-up or the steady state?
# Run from the repository root with OUT and FEDEM_DATA_ROOT set, as gpu_round.sh.
set -u
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt"
timeout 60 python3 -m benchmarks.probes.profile_round --data ml-100k --device cuda \
  --chunks 1024 --budget-mb 65536 --timed 6 > "$OUT/ml100k.log" 2>&1
timeout 100 python3 -m benchmarks.probes.profile_round --data ml-1m-size --device cuda \
  --chunks 2048 --budget-mb 65536 --timed 6 > "$OUT/ml1m.log" 2>&1
