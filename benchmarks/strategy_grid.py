"""DP-FTRL's strategies against DP-FedAvg in every cell of the population study (issue 81,
"Done when"; docs/population.md, "DP-FTRL strategies in every cell").

    python -m benchmarks.strategy_grid \\
        --study benchmarks/results/population/paired/study.csv \\
        --also benchmarks/results/population/participation/study.csv \\
        --runs runs/population-paired --out benchmarks/results/population/paired

Reads the population study's finished rows (``study.csv``, written by
``benchmarks/population_study.py``) and, with ``--also``, rows of another study.csv made by
the same command and settings for rungs the first lacks (e.g. the tree, measured in an
earlier slice; a run is a function of its settings and seed). For each (N, eps) cell of a
method it writes one row: DP-FedAvg (``cdp-gaussian``), the tree, banded, BLT and the
amplified ones (full HR@10 ± SE, mean over seeds; a strategy no row ran is left out), and
two checks of the issue's bar for the **pre-declared** strategy (``--strategy``, banded by
default; chosen before the grid, not the best by test):

- ``>= DP-FedAvg - SE``: the strategy's HR@10 is at least DP-FedAvg's minus DP-FedAvg's
  standard error;
- ``> tree where tree < DP-FedAvg``: where the tree reads below DP-FedAvg, the strategy
  reads above the tree ("n/a" where the tree is not below or was not run);

and, where both runs of a seed wrote ``ranks.csv`` under ``--runs``, the paired difference
strategy - DP-FedAvg on the same users with its two-sided p (``benchmarks/paired.py``;
Holm's rule over the table's paired cells: "beats", "below" or "not shown").
Writes ``<name>.md`` and ``<name>.png`` (``--name``, default strategies; HR@10 against N
per eps, the study's plot restricted to the method's rungs) under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.paired import verdicts
from benchmarks.population_study import paired_test, plot, seed_means

#: the table's columns: the study's mechanism name -> its heading
COLUMNS = {"cdp-gaussian": "DP-FedAvg", "dp-ftrl": "tree", "dp-ftrl-banded": "banded",
           "dp-ftrl-blt": "BLT", "dp-ftrl-banded-poisson": "amplified banded",
           "dp-ftrl-amplified": "amplified, b by error"}


def frame_of(study: Path, also: list[Path]) -> Any:
    """The study's rows, then each ``also`` file's rows for (N, rung) pairs not yet present."""
    import pandas as pd

    frame = pd.read_csv(study)
    for path in also:
        extra = pd.read_csv(path)
        have = set(zip(frame.users, frame.rung, strict=True))
        keep = [(n, r) not in have for n, r in zip(extra.users, extra.rung, strict=True)]
        frame = pd.concat([frame, extra[keep]], ignore_index=True)
    return frame


def checks(strategy: tuple[float, float] | None, fedavg: tuple[float, float] | None,
           tree: tuple[float, float] | None) -> tuple[str, str]:
    """The issue's two checks for one cell (``(hr, se)`` points; None where not run)."""
    if strategy is None or fedavg is None:
        return "-", "-"
    level = "yes" if strategy[0] >= fedavg[0] - fedavg[1] else "no"
    if tree is None or tree[0] >= fedavg[0]:
        return level, "n/a"
    return level, "yes" if strategy[0] > tree[0] else "no"


def point(frame: Any, n: int, rung: str, seeds: list[int]) -> tuple[float, float, int] | None:
    """``rung``'s full HR@10 at N = ``n`` over ``seeds`` (the study's seed mean and its
    standard error, :func:`~benchmarks.population_study.seed_means`) and how many of the
    seeds it ran; None where it ran none of them."""
    d = frame[(frame.users == n) & (frame.rung == rung) & frame.seed.isin(seeds)]
    if d.empty:
        return None
    r = seed_means(d).iloc[0]
    return float(r.hr), float(r.se), int(r.seeds)


def table(frame: Any, method: str, strategy: str, runs: Path | None) -> str:
    """strategies.md's table: one row per (N, eps) where ``method`` ran DP-FedAvg. Every
    column of a row is read at the same seeds: DP-FedAvg's, and of those the strategy's
    where it ran (so a three-seed DP-FedAvg cell meets a one-seed strategy at that seed)."""
    seeds_of = {(int(n), r): sorted(int(s) for s in d.seed)
                for (n, r), d in frame.groupby(["users", "rung"])}
    rows = []
    for n in sorted({int(u) for u in frame.users}):
        for eps in sorted({float(r.rpartition("-eps")[2]) for r in frame.rung
                           if r.startswith(f"{method}-cdp-gaussian-eps")}):
            name = {mech: f"{method}-{mech}-eps{eps:g}" for mech in COLUMNS}
            seeds = seeds_of.get((n, name["cdp-gaussian"]))
            if not seeds:
                continue
            test = None
            if (n, name[strategy]) in seeds_of:
                seeds = sorted(set(seeds) & set(seeds_of[(n, name[strategy])])) or seeds
                test = paired_test(runs, n, name[strategy], name["cdp-gaussian"], seeds)
            rows.append({"n": n, "eps": eps, "name": name, "test": test, "seeds": seeds,
                         "points": {m: point(frame, n, name[m], seeds) for m in COLUMNS}})
    called = iter(verdicts([r["test"] for r in rows if r["test"] is not None]))
    shown = [m for m in COLUMNS if m in ("cdp-gaussian", "dp-ftrl", strategy)
             or any(str(r).startswith(f"{method}-{m}-eps") for r in frame.rung)]
    heads = " | ".join(COLUMNS[m] for m in shown)
    lines = [f"| N | eps | seeds | {heads} | {COLUMNS[strategy]} >= DP-FedAvg - SE | "
             f"{COLUMNS[strategy]} > tree where tree < DP-FedAvg | "
             f"paired {COLUMNS[strategy]} - DP-FedAvg ± SE (users; seeds) | two-sided p | "
             "verdict (Holm) |", "|---|---|---|" + "---|" * (len(shown) + 5)]
    for r in rows:
        pts, test = r["points"], r["test"]
        cols = " | ".join("-" if pts[m] is None else f"{pts[m][0]:.4f} ± {pts[m][1]:.4f}"
                          + ("" if pts[m][2] == len(r["seeds"]) else f" ({pts[m][2]} seeds)")
                          for m in shown)
        level, above = checks(*(None if pts[m] is None else pts[m][:2]
                                for m in (strategy, "cdp-gaussian", "dp-ftrl")))
        if test is None:
            diff, p, word = "-", "-", "-"
        else:
            two = min(1.0, 2 * min(test.p_greater, test.p_less))
            diff = f"{test.diff:+.4f} ± {test.se:.4f} ({test.users:,}; {test.seeds})"
            p, word = f"{two:.3g}", next(called)
        seeds = " ".join(map(str, r["seeds"]))
        lines.append(f"| {r['n']:,} | {r['eps']:g} | {seeds} | {cols} | {level} | {above} | "
                     f"{diff} | {p} | {word} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="the population study's study.csv")
    parser.add_argument("--also", nargs="*", default=[],
                        help="study.csv files whose rungs the first lacks are added")
    parser.add_argument("--runs", default=None, help="the study's runs (for ranks.csv)")
    parser.add_argument("--method", default="fedmf")
    parser.add_argument("--strategy", default="dp-ftrl-banded",
                        choices=("dp-ftrl-banded", "dp-ftrl-blt", "dp-ftrl-banded-poisson",
                                 "dp-ftrl-amplified"),
                        help="the pre-declared matrix-factorisation strategy the checks read")
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default="strategies",
                        help="the files written: <out>/<name>.md and <out>/<name>.png")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = [Path(args.study), *map(Path, args.also)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"strategy_grid: no such study.csv: {', '.join(missing)}", file=sys.stderr)
        return 2
    frame = frame_of(paths[0], paths[1:])
    frame = frame[~frame.rung.str.contains("-nonce")]  # training's own noise: another table
    frame = frame[frame.rung.str.startswith(f"{args.method}-")
                  | frame.rung.str.startswith("dp-mostpop")
                  | (frame.rung == "mostpop")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = table(frame, args.method, args.strategy,
                 Path(args.runs) if args.runs else None)
    (out / f"{args.name}.md").write_text(text)
    epsilons = sorted({float(r.rpartition("-eps")[2]) for r in frame.rung
                       if r.startswith(f"{args.method}-cdp-gaussian-eps")})
    # the plot: the floor, the method without noise, and its four mechanisms (one nonce)
    keep = frame.rung.map(lambda r: not r.startswith(f"{args.method}-")
                          or r.endswith("-none") or any(f"-{m}-eps" in r for m in COLUMNS))
    plot(frame[keep], epsilons, out / f"{args.name}.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
