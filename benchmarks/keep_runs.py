"""Keep a sweep's finished runs in git without their recordings, and bring them back.

``runs/`` is not committed, and a fresh machine starts without it: a long grid
interrupted at the end of a session would start again from nothing. This copies
the small files of every finished run directory (those that hold
``summary.json``) from one folder to another, keeping the layout: the files a
sweep needs to count the point as done (``summary.json``, ``sweep_point.json``,
``attacks.json``) and the ones ``results.csv`` is built from (``config.toml``,
``metrics.csv``), about 17 KB a run. What stays behind: the recordings
(``observations/``, ``ground_truth/``; the attacks on them have already run, and
their scores are in ``attacks.json``) and ``privacy_ledger.json`` (the per-round
ledger, 0.2-1.5 MB a run; its totals are in ``summary.json``).

    python -m benchmarks.keep_runs runs/headline2 benchmarks/results/privacy/headline2/kept# keep
    python -m benchmarks.keep_runs benchmarks/results/privacy/headline2/kept runs/headline2# resume

A run already present at the destination is left as it is (never overwritten);
a directory without ``summary.json`` (a run in flight) is not copied.

A ``fedem-private tune`` folder works the same way: its trials are run directories, and
its ``study.db`` (the study itself, which a resumed ``tune`` reads) is copied too, unless
the destination holds one at least as new (a study file only grows):

    python -m benchmarks.keep_runs runs/tune/fedmf-lastfm-2k \
        benchmarks/results/ladder/tuning/fedmf-lastfm-2k
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from fedem_private.experiments.results import find_runs

KEPT = ("summary.json", "sweep_point.json", "attacks.json", "config.toml", "metrics.csv")


def keep(src: Path, dst: Path) -> tuple[int, int]:
    """Copy the kept files of each finished run under ``src`` to ``dst``; (copied, present)."""
    copied = present = 0
    for run in find_runs(src):  # hidden folders (a sweep's temporary ones) are skipped
        target = dst / run.relative_to(src)
        if (target / "summary.json").is_file():
            present += 1
            continue
        tmp = target.with_name(target.name + ".keep-tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in KEPT:
            if (run / name).is_file():
                shutil.copy2(run / name, tmp / name)
        tmp.rename(target)  # all of it or nothing, like the sweep's own run directories
        copied += 1
    keep_study(src, dst)
    return copied, present


STUDY = "study.db"  # fedem_private.experiments.tune's study file


def keep_study(src: Path, dst: Path) -> bool:
    """Copy ``src/study.db`` over ``dst/study.db`` unless that one is at least as new (by
    modification time); whether it copied. Written beside and moved into place."""
    study, target = src / STUDY, dst / STUDY
    if not study.is_file() or (target.is_file()
                               and target.stat().st_mtime_ns >= study.stat().st_mtime_ns):
        return False
    dst.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(STUDY + ".keep-tmp")
    shutil.copy2(study, tmp)
    tmp.replace(target)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="folder of run directories")
    parser.add_argument("dst", type=Path, help="where their small files go")
    args = parser.parse_args(argv)
    if not args.src.is_dir():
        print(f"keep_runs: {args.src} is not a folder", file=sys.stderr)
        return 2
    copied, present = keep(args.src, args.dst)
    print(f"keep_runs: {copied} runs copied to {args.dst}, {present} already there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
