#!/usr/bin/env bash
# The headline redone (issue 20): five methods under three privacy architectures.
#
#   bash benchmarks/headline.sh                   # OUT=runs/headline2 JOBS=1 by default
#   ARCHS="laplace dpsgd" bash benchmarks/headline.sh & ARCHS=cdp bash benchmarks/headline.sh
#                                                 # two runners that never share a run
#   fedem-private report benchmarks/results/headline/results.csv runs/headline2/laplace \
#       runs/headline2/dpsgd runs/dpsgd runs/headline2/cdp \
#       --variants fedmf,fedmf-em,fedem-em,pfedrec,pfedrec-em --out benchmarks/results/headline2
#
# Runs benchmarks/headline_{laplace,dpsgd,cdp}.toml seed by seed (seed 0 of all
# three first, so a first full pass lands early), then each whole file once more
# (nothing left to run; it writes the file's sweep.toml and results.csv). Every
# step resumes: finished run directories are skipped. The ML-100K PFedRec points
# of benchmarks/dpsgd_pfedrec.toml have the same configurations and are copied in
# first when runs/dpsgd_pfedrec exists. It runs `python -m fedem_private`, so the
# code is the checkout's it runs in (a git worktree pins it), not whichever copy
# an editable install points the `fedem-private` command at.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/headline2}
JOBS=${JOBS:-1}
ARCHS=${ARCHS:-laplace dpsgd cdp}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT/dpsgd"
if [ -d runs/dpsgd_pfedrec/ml-100k ]; then
  cp -rn runs/dpsgd_pfedrec/ml-100k "$OUT/dpsgd/"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for SEED in 0 1 2; do
  for A in $ARCHS; do
    sed "s/^seeds = .*/seeds = [$SEED]/" "benchmarks/headline_$A.toml" > "$TMP/headline_$A.toml"
    python -m fedem_private sweep "$TMP/headline_$A.toml" --out "$OUT/$A" --jobs "$JOBS" --no-progress
  done
done
for A in $ARCHS; do
  python -m fedem_private sweep "benchmarks/headline_$A.toml" --out "$OUT/$A" --jobs "$JOBS" --no-progress
done
