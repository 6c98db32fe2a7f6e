#!/usr/bin/env bash
# LastFM-2K's cells of the FedEM paper's Tables 1-4 on one GPU machine (issue 17, items 3-4).
# Four grid files, benchmarks/specs/reproduction/lastfm_gpu_{tables,table4,em,paper}.toml, in two lanes run side
# by side: "tables" then "em" (JOBS_A points at once), "table4" then "paper" (JOBS_B). Each point
# is its own process; a GPU round on this catalogue is mostly CPU-side bookkeeping, so the
# processes share the GPU well (one CPU core each). A FedEM-sized point holds 6-13 GiB of GPU
# memory at the default memory budget: 16 at once overfilled an H200's 139 GiB (6 points
# failed out of memory, BENCHMARKS.md), hence JOBS_A + JOBS_B = 12. Every finished point is kept into $KEEP
# (small files, benchmarks/keep_runs.py) every 20 s and at the end; with SNAP set, a tar of
# $KEEP and the sweep logs is refreshed with it (for a machine that may be taken back).
#
#   bash benchmarks/specs/reproduction/lastfm_gpu.sh                        # defaults below
#   LIMIT=500 SNAP=$OUT/lastfm_gpu.tgz bash benchmarks/specs/reproduction/lastfm_gpu.sh   # stop all at 500 s
#   LANE_A="em em" LANE_B= JOBS_A=10 bash benchmarks/specs/reproduction/lastfm_gpu.sh      # only the EM rows,
#                                      # a second pass rerunning what failed (out of memory)
#
# Resumes: run it again with the same RUNS and finished points are skipped.
set -uo pipefail
cd "$(dirname "$0")/../../.."
RUNS=${RUNS:-runs}         # root of the run folders (not OUT: the GPU tool sets that)
KEEP=${KEEP:-benchmarks/results/reproduction/lastfm_gpu/kept}
LIMIT=${LIMIT:-0}            # seconds from the start for everything; 0: no limit
JOBS_A=${JOBS_A:-10}
JOBS_B=${JOBS_B:-2}
SNAP=${SNAP:-}
PY=${PYTHON:-python}         # the interpreter (python3 on the GPU machines)
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
START=$(date +%s)
LANE_A=${LANE_A-tables em}   # grids run one after another in each lane
LANE_B=${LANE_B-table4 paper}
GRIDS=$(printf '%s\n' $LANE_A $LANE_B | sort -u | tr '\n' ' ')

left() {  # seconds left before LIMIT (a large number without one)
  if [ "$LIMIT" -eq 0 ]; then echo 999999; else echo $((START + LIMIT - $(date +%s))); fi
}

sweep() {  # sweep G JOBS
  local t; t=$(left)
  if [ "$t" -le 10 ]; then echo "lastfm_gpu: no time left for $1" >&2; return; fi
  mkdir -p "$RUNS/lastfm_gpu_$1"
  timeout --signal=TERM "$t" "$PY" -m fedem_private sweep "benchmarks/specs/reproduction/lastfm_gpu_$1.toml" \
    --out "$RUNS/lastfm_gpu_$1" --jobs "$2" --no-progress >> "$RUNS/lastfm_gpu_$1.log" 2>&1
  echo "lastfm_gpu: $1 exited $? at $(( $(date +%s) - START )) s" >&2
}

snapshot() {
  mkdir -p "$KEEP"
  for G in $GRIDS; do
    if [ -d "$RUNS/lastfm_gpu_$G" ]; then
      "$PY" -m benchmarks.keep_runs "$RUNS/lastfm_gpu_$G" "$KEEP" >/dev/null
    fi
  done
  if [ -n "$SNAP" ]; then
    tar czf "$SNAP.tmp" "$KEEP" "$RUNS"/lastfm_gpu_*.log 2>/dev/null && mv "$SNAP.tmp" "$SNAP"
  fi
}

(for G in $LANE_A; do sweep "$G" "$JOBS_A"; done) &
A=$!
(for G in $LANE_B; do sweep "$G" "$JOBS_B"; done) &
B=$!
while kill -0 "$A" 2>/dev/null || kill -0 "$B" 2>/dev/null; do sleep 20; snapshot; done
wait
snapshot
echo "lastfm_gpu: done at $(( $(date +%s) - START )) s"
