#!/usr/bin/env bash
# Issue 43's second GPU call of 2026-11-27 (after the negatives and the adapter's batches
# moved to the device): the rounds of gpu_round.sh part 1 (ML-100K FedEM profiled too),
# the device tests with the new GPU-equals-CPU ones, and part 3 again. Run from the
# repository root with OUT and FEDEM_DATA_ROOT set, as gpu_round.sh.
set -u
. benchmarks/specs/speed/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 100 python3 -m benchmarks.probes.profile_round --data ml-1m-size --device cuda \
  --chunks 2048 --budget-mb 65536 --profile > "$OUT/ml1m.log" 2>&1
timeout 80 python3 -m benchmarks.probes.profile_round --data ml-100k --device cuda \
  --chunks 1024 --budget-mb 65536 --profile > "$OUT/ml100k.log" 2>&1
timeout 60 python3 -m benchmarks.probes.profile_round --data ml-100k --method fedmf \
  --device cuda --chunks 1024 --budget-mb 65536 >> "$OUT/ml100k.log" 2>&1
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_rng_keyed.py \
  tests/test_device.py tests/test_plan.py tests/test_holdout.py \
  "tests/test_backbones.py::test_negatives_drawn_on_the_gpu_are_the_cpu_draw" \
  > "$OUT/tests.log" 2>&1
timeout 200 python3 -m benchmarks.probes.profile_round --data 100k-clients --method fedmf \
  --device cuda --chunks 8192 --budget-mb 65536 --set 'train.state_dtype="bfloat16"' \
  --set "data.synthetic.n_items=20000" > "$OUT/scale.log" 2>&1
echo done >> "$OUT/gpu.txt"
