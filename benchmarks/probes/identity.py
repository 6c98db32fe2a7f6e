"""Moving code changes no result: a git revision against the working tree, value by value.

    python -m benchmarks.probes.identity --before REV [--ml100k DIR] [--work DIR]

Runs, with the code of revision REV (a temporary git worktree) and with the
code of this checkout, the same jobs:

- FedMF, FedSim and FedEM on ML-100K, 3 rounds, `paper` and `strict`, seed 0;
- the built-in quick sweep (synthetic, 18 runs) and its report's results.csv;
- the neighbour-world harness's cover of compositions (about 50 short synthetic runs in
  which every privacy mechanism, backbone, merge, codec, aggregator, protocol, share
  rule and size setting occurs, each value with every mode it can meet:
  :func:`fedem_private.experiments.neighbours.covering`), written as config files by
  this checkout and run by both sides;

then compares every value of every metrics.csv row and of results.csv,
leaving out only timings (columns whose name contains "seconds") and
columns that exist on one side only (listed). Exit 1 if any value differs.
Every run uses one torch thread, so results do not depend on the machine's
load. Takes about 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = [(m, p) for p in ("paper", "strict") for m in ("fedmf", "fedsim", "fedem")]


def cover_configs(folder: Path) -> list[str]:
    """Write the harness's cover of compositions as config files; their names."""
    from dataclasses import replace

    from fedem_private.experiments.neighbours import accepted, config_of, covering
    from fedem_private.simulation.config import to_dict, to_toml

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, combo in enumerate(covering(accepted())):
        name = f"cover{i:02d}"
        cfg = config_of(combo)
        small = replace(cfg.data.synthetic, n_users=60, n_items=80, mean_activity=10.0)
        cfg = replace(cfg, data=replace(cfg.data, synthetic=small))
        (folder / f"{name}.toml").write_text(to_toml(to_dict(cfg)))
        names.append(name)
    return names


def _jobs(code: Path, out: Path, ml100k: Path, configs: Path, cover: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)}
    cli = [sys.executable, "-m", "fedem_private"]
    for name in cover:
        subprocess.run([*cli, "run", "--config", str(configs / f"{name}.toml"),
                        "--out", str(out / name), "--no-progress", "--force"],
                       cwd=code, env=env, check=True, capture_output=True)
    for method, protocol in RUNS:
        subprocess.run([*cli, "run", "--dataset", "ml-100k", "--data-dir", str(ml100k),
                        "--method", method, "--rounds", "3", "--protocol", protocol,
                        "--seed", "0", "--out", str(out / f"{method}-{protocol}"),
                        "--no-progress", "--force"],
                       cwd=code, env=env, check=True, capture_output=True)
    subprocess.run([*cli, "sweep", "--out", str(out / "quick"), "--jobs", "1", "--no-progress"],
                   cwd=code, env=env, check=True, capture_output=True)
    subprocess.run([*cli, "report", str(out / "quick")], cwd=code, env=env, check=True,
                   capture_output=True)


def _rows(path: Path, key: str | None) -> tuple[dict[str, dict[str, str]], list[str]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"identity: {path} is empty")
    keyed = {(r[key] if key else str(i)): r for i, r in enumerate(rows)}
    return keyed, list(rows[0])


def _same(x: str, y: str) -> bool:
    """Equal as text, or as numbers written differently ("15" and "15.0": a column that
    gained empty cells is written as floats); never within a tolerance."""
    if x == y:
        return True
    try:
        return float(x) == float(y)
    except ValueError:
        return False


def compare(before: Path, after: Path, key: str | None) -> tuple[int, int, list[str], int]:
    """(values compared, values differing, columns on one side only, rows added after).

    Every row of ``before`` must exist after; rows only after (a grid that grew on purpose,
    e.g. the quick sweep's references) are counted, not compared."""
    a, ca = _rows(before, key)
    b, cb = _rows(after, key)
    if set(a) - set(b):
        raise SystemExit(f"identity: {after.name}: rows gone after "
                         f"({sorted(set(a) - set(b))[:3]} ...)")
    cols = [c for c in ca if c in cb and "seconds" not in c]
    diff = sum(not _same(a[k][c], b[k][c]) for k in a for c in cols)
    return len(a) * len(cols), diff, sorted(set(ca) ^ set(cb)), len(set(b) - set(a))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision whose results are the reference")
    ap.add_argument("--ml100k", default=str(ROOT.parent / "shared" / "datasets" / "ml-100k"))
    ap.add_argument("--work", help="folder for the runs (default: a temporary one)")
    args = ap.parse_args()
    ml100k = Path(args.ml100k).resolve()
    if not (ml100k / "u.data").is_file():
        print(f"identity: no ML-100K at {ml100k} (give --ml100k)", file=sys.stderr)
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="identity-")).resolve()
    cover = cover_configs(work / "cover-configs")
    tree = work / "before-code"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT,
                   check=True, capture_output=True)
    try:
        for side, code in (("before", tree), ("after", ROOT)):
            print(f"identity: running the {side} side ({code})", flush=True)
            _jobs(code, work / side, ml100k, work / "cover-configs", cover)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       check=False, capture_output=True)
    bad = 0
    checks = ([(f"{m}-{p}/metrics.csv", None) for m, p in RUNS] + [("quick/results.csv", "run")]
              + [(f"{name}/metrics.csv", None) for name in cover])
    for rel, key in checks:
        n, diff, only, added = compare(work / "before" / rel, work / "after" / rel, key)
        bad += diff
        extra = f"; columns on one side only: {', '.join(only)}" if only else ""
        extra += f"; {added} rows added after" if added else ""
        print(f"{rel:28} {n:5} values, {diff} differ{extra}")
    print("identity: IDENTICAL" if not bad else f"identity: {bad} values DIFFER")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
