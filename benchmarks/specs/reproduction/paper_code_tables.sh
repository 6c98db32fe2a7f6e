#!/usr/bin/env bash
# The FedEM paper's Tables 1-4 under the authors' code's preset (issue 17, item 4), seed by
# seed: benchmarks/specs/reproduction/{table3,table2,table4}_paper_code.toml, seed 0 of every grid first, then
# seed 1, then seed 2, so that one full pass lands before the next seed starts.
#
#   bash benchmarks/specs/reproduction/paper_code_tables.sh                 # OUT=runs JOBS=2 by default
#   GRIDS="table2 table4" SEEDS="0" bash benchmarks/specs/reproduction/paper_code_tables.sh
#   KEEP=/path/to/checkout/benchmarks/results bash benchmarks/specs/reproduction/paper_code_tables.sh
#                                                        # from a worktree: keep into the checkout
#
# Every step resumes: the finished runs kept in git (benchmarks/results/reproduction/<grid>_paper_code/kept,
# small files only, see benchmarks/keep_runs.py) are copied in first, finished run
# directories are skipped, and each finished sweep step is kept again at once, so an
# interrupted session loses at most the points in flight. It runs `python -m fedem_private`,
# so the code is the checkout's it runs in (a git worktree pins it). The report and table
# commands are in each grid file's comment.
set -euo pipefail
cd "$(dirname "$0")/../../.."
JOBS=${JOBS:-2}
GRIDS=${GRIDS:-table3 table2 table4}
SEEDS=${SEEDS:-0 1 2}
source benchmarks/specs/reproduction/grid_steps.sh
for G in $GRIDS; do
  restore "$KEEP/reproduction/${G}_paper_code/kept" "$OUT/${G}_paper_code"
done
for SEED in $SEEDS; do
  for G in $GRIDS; do
    sed "s/^seeds = .*/seeds = [$SEED]/" "benchmarks/specs/reproduction/${G}_paper_code.toml" > "$TMP/${G}_paper_code.toml"
    step "paper_code_tables: $G seed $SEED" "$TMP/${G}_paper_code.toml" "$OUT/${G}_paper_code" \
      "$KEEP/reproduction/${G}_paper_code/kept"
  done
done
