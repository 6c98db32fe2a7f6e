#!/usr/bin/env bash
# The headline redone (issue 20): five methods under three privacy architectures.
#
#   bash benchmarks/specs/privacy/headline.sh                   # OUT=runs/headline2 JOBS=1 by default
#   ARCHS="laplace dpsgd_ml100k laplace_large" bash benchmarks/specs/privacy/headline.sh & ARCHS="cdp dpsgd" bash benchmarks/specs/privacy/headline.sh
#                                                 # two runners that never share a run
#   python -m benchmarks.keep_runs runs/headline2 benchmarks/results/privacy/headline2/kept   # keep
#   fedem-private report benchmarks/results/privacy/headline/results.csv \
#       benchmarks/results/privacy/ldp_large/results.csv benchmarks/results/privacy/ldp_large_filmtrust/results.csv \
#       benchmarks/results/privacy/dpsgd/results.csv benchmarks/results/privacy/dpsgd_fedem/results.csv \
#       benchmarks/results/privacy/dpsgd_pfedrec/results.csv runs/headline2 \
#       --variants fedmf,fedmf-em,fedem-em,pfedrec,pfedrec-em --out benchmarks/results/privacy/headline2
#
# Runs benchmarks/specs/privacy/headline_{laplace,laplace_large,dpsgd,dpsgd_ml100k,cdp}.toml seed by seed (seed
# 0 of all of them first, so a first full pass lands early), then each whole file
# once more (nothing left to run; it writes the file's sweep.toml and results.csv).
# Every step resumes: finished run directories are skipped, and the finished runs
# kept in git (benchmarks/results/privacy/headline2/kept, small files only, see
# benchmarks/keep_runs.py) are copied in first, so a fresh clone goes on where the
# last kept run stopped. It runs `python -m fedem_private`, so the code is the
# checkout's it runs in (a git worktree pins it), not whichever copy an editable
# install points the `fedem-private` command at.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-runs/headline2}
JOBS=${JOBS:-1}
ARCHS=${ARCHS:-laplace laplace_large dpsgd dpsgd_ml100k cdp}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ -d benchmarks/results/privacy/headline2/kept ]; then
  python -m benchmarks.keep_runs benchmarks/results/privacy/headline2/kept "$OUT"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for SEED in 0 1 2; do
  for A in $ARCHS; do
    sed "s/^seeds = .*/seeds = [$SEED]/" "benchmarks/specs/privacy/headline_$A.toml" > "$TMP/headline_$A.toml"
    python -m fedem_private sweep "$TMP/headline_$A.toml" --out "$OUT/$A" --jobs "$JOBS" --no-progress
  done
done
for A in $ARCHS; do
  python -m fedem_private sweep "benchmarks/specs/privacy/headline_$A.toml" --out "$OUT/$A" --jobs "$JOBS" --no-progress
done
