# Shared steps of the resumable grid scripts (paper_code_tables.sh, em_agg10.sh,
# fedrap_filmtrust_lr.sh). Source it from the checkout's root after setting JOBS; it sets
# OUT, KEEP, OMP_NUM_THREADS and a TMP folder removed on exit, and defines:
#
#   restore KEPT OUTDIR        copy a grid's kept runs (benchmarks/keep_runs.py) into its
#                              run folder, so finished points are skipped
#   step LABEL TOML OUTDIR KEPT  one sweep, then keep what finished at once (a failed
#                              point is reported on stderr, not fatal)
set -euo pipefail
OUT=${OUT:-runs}
KEEP=${KEEP:-benchmarks/results}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

restore() {
  if [ -d "$1" ]; then python -m benchmarks.keep_runs "$1" "$2"; fi
}

step() {
  python -m fedem_private sweep "$2" --out "$3" --jobs "$JOBS" --no-progress \
    || echo "$1: sweep exited $?" >&2
  mkdir -p "$4"
  python -m benchmarks.keep_runs "$3" "$4"
}
