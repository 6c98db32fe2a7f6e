#!/usr/bin/env bash
# Issue 43's GPU checks as one script for a lent GPU machine (run from the repository root).
# Parts 1-2 took about 3 minutes on one H100 (2026-11-26, docs/speed.md). Part 3 keeps
# the per-client state in bfloat16: 100,000 x 18,523 kept items x 16 x 2 bytes is 59 GB,
# which an H200 (139 GiB) holds and an H100 (78 GiB) may not.
# OUT: where logs go (default runs/gpu). Needs the package's dependencies that the image lacks
# as wheels in .whl/ (dp-accounting, dm-tree, opacus) and ML-100K under $FEDEM_DATA_ROOT.
#   OUT=/tmp/gpu FEDEM_DATA_ROOT=.data bash benchmarks/specs/speed/gpu_round.sh
set -u
. benchmarks/specs/speed/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, numpy; print(sys.version.split()[0], torch.__version__, numpy.__version__, torch.cuda.get_device_name())"
  nproc; } > "$OUT/gpu.txt" 2>&1
# 1. rounds on the GPU with its utilisation: ML-1M-size FedEM, ML-100K FedEM and FedMF
timeout 100 python3 -m benchmarks.probes.profile_round --data ml-1m-size --device cuda \
  --chunks 2048 --budget-mb 65536 --profile > "$OUT/ml1m.log" 2>&1
timeout 80 python3 -m benchmarks.probes.profile_round --data ml-100k --device cuda \
  --chunks 1024 --budget-mb 65536 > "$OUT/ml100k.log" 2>&1
timeout 60 python3 -m benchmarks.probes.profile_round --data ml-100k --method fedmf \
  --device cuda --chunks 1024 --budget-mb 65536 >> "$OUT/ml100k.log" 2>&1
# 2. the keyed draws agree on CPU and GPU; every part's rounds agree and stay on the device
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_rng_keyed.py \
  tests/test_device.py tests/test_plan.py > "$OUT/tests.log" 2>&1
# 3. FedMF at 100,000 clients x 20,000 items (about 50 interactions each), its state in
#    bfloat16; preparing the data took 43 s on the development machine's CPU (2026-11-27)
timeout 300 python3 -m benchmarks.probes.profile_round --data 100k-clients --method fedmf \
  --device cuda --chunks 8192 --budget-mb 65536 --set 'train.state_dtype="bfloat16"' \
  --set "data.synthetic.n_items=${SCALE_ITEMS:-20000}" > "$OUT/scale.log" 2>&1
echo done >> "$OUT/gpu.txt"
