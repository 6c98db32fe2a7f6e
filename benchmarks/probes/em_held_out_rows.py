"""Does a client's own item table know its held-out item? (issue 69: why elastic merging falls
under ``strict`` and gains under ``paper``.)

A merging run (``--config``, e.g. a tuned FedEM file) is run to its last round. Then, for each
evaluated client u, the score change that its own table Q_l brings over the server's table
Q_g (what the server would send next), with the client's own private parameters p_u,

    delta_u(i) = s(p_u, Q_l[i]) - s(p_u, Q_g[i])          (MF: p_u . (Q_l[i] - Q_g[i]))

is computed for every full-ranking candidate i (every item outside u's training set and
validation item; the test item is one of them), and the probe reports the percentile of the
test item's delta among its candidates:

    pct_u = (#{i : delta_u(i) < delta_u(test)} + #{i != test : delta_u(i) = delta_u(test)} / 2)
            / (n_candidates - 1).

If the local table carries nothing about the held-out item, the test item is exchangeable with
the other candidates and pct_u averages 0.5. Under ``strict`` a client trains its own positives
up and samples its negatives uniformly from every other item, the held-out ones included, so
delta_u(test) should be a draw like any candidate's (or lower: the rows the client pushed down
as negatives). Under ``paper`` the held-out items are never sampled as negatives
(``data/split.py:exclusion_csr``), so every candidate but the held-out ones is pushed down
round after round in a table that persists across rounds, and pct_u should approach 1: the
leak that elastic merging (rho < 1 keeps the local rows) carries into the ranking. Popular items
gain more in the server's table than in one client's, so the percentile sits below 0.5 under
both protocols; what the probe measures is the difference between them, at equal settings.
The full HR@10 of the own and the server's tables is reported for context. One CSV row per
(label, protocol, seed)::

    python -m benchmarks.probes.em_held_out_rows \\
        --config benchmarks/results/ladder/tuning/fedem-filmtrust-best.toml \\
        --data-dir ../shared/datasets/filmtrust --protocols strict paper --seeds 0 1 2 \\
        --out benchmarks/results/utility/em-held-out/filmtrust.csv

The probe looks inside the simulation on purpose (benchmarks/README.md): nothing here is a
released value and nothing is private.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.probes.em_diagnostics import cli_overrides, view_params
from fedem_private.api import resolve_config
from fedem_private.errors import UserError
from fedem_private.evaluation.metrics import RankAccumulator
from fedem_private.experiments.runner import prepare

FIELDS = ["label", "protocol", "seed", "rounds", "clients", "pct_test", "pct_test_se",
          "own_full_hr10", "global_full_hr10", "seconds"]


def percentile(delta: np.ndarray, candidates: np.ndarray, target: int) -> float:
    """The percentile of ``delta[target]`` among ``delta[candidates]`` (target excluded from
    the comparison set; ties count half), as in the module docstring."""
    others = candidates[candidates != target]
    if others.size == 0:
        return float("nan")
    d, t = delta[others], delta[target]
    return float(((d < t).sum() + 0.5 * (d == t).sum()) / others.size)


def held_out_percentiles(sim: Any) -> dict[str, float]:
    """Mean and standard error over the evaluated clients of the test item's percentile, and
    the own and server tables' full HR@10."""
    chosen = sim.eval_sample()
    sets = sim.eval_sets
    m = sim.split.n_items
    accs = {v: RankAccumulator(sim.split.n_users) for v in ("own", "global")}
    pct_test = []
    size = max(1, sim._chunk_size())
    with torch.no_grad():
        for start in range(0, chosen.shape[0], size):
            users = chosen[start:start + size]
            idx = sim._index(users)
            own = sim.backbone.scores(view_params(sim, "own", idx))
            glob = sim.backbone.scores(view_params(sim, "global", idx))
            accs["own"].add_scores(users, own, sets)
            accs["global"].add_scores(users, glob, sets)
            delta = (own - glob).double().cpu().numpy()
            for row, u in enumerate(users):
                keep = np.ones(m, dtype=bool)
                keep[sets.exclusions(int(u))] = False
                test = int(sets.test_items[u])
                keep[test] = True
                cands = np.flatnonzero(keep)
                pct_test.append(percentile(delta[row], cands, test))

    def mean_se(xs: list[float]) -> tuple[float, float]:
        a = np.asarray([x for x in xs if np.isfinite(x)])
        if a.size == 0:
            return float("nan"), float("nan")
        return float(a.mean()), float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else 0.0

    pt, pts = mean_se(pct_test)
    return {"clients": int(chosen.shape[0]), "pct_test": pt, "pct_test_se": pts,
            "own_full_hr10": accs["own"].result()["full"]["hr@10"],
            "global_full_hr10": accs["global"].result()["full"]["hr@10"]}


def run_one(args: argparse.Namespace, protocol: str, seed: int) -> dict[str, Any]:
    """One run to its last round, then the percentiles (one CSV row)."""
    overrides = cli_overrides(args, {"train.seed": seed, "data.protocol": protocol,
                                     "train.select_round": "last"})
    rounds = resolve_config(args.config, overrides).train.rounds
    cfg = resolve_config(args.config, {**overrides, "train.eval_every": rounds})
    sim = prepare(cfg)
    t0 = time.perf_counter()
    while sim.state.round < cfg.train.rounds:
        sim.step()
    row = {"label": args.label, "protocol": protocol, "seed": seed,
           "rounds": cfg.train.rounds, **held_out_percentiles(sim),
           "seconds": round(time.perf_counter() - t0, 1)}
    print(f"em_held_out_rows: {args.label} {protocol} seed {seed}: test item at percentile "
          f"{row['pct_test']:.3f} ± {row['pct_test_se']:.3f} of the local table's score "
          f"change; own HR@10 {row['own_full_hr10']:.4f}, server's {row['global_full_hr10']:.4f}",
          file=sys.stderr, flush=True)
    return row


def table(path: Path) -> str:
    """The Markdown table of a probe CSV: per (label, protocol), the mean over seeds of the
    test item's percentile and of the own and server tables' full HR@10, ± the standard error
    over seeds (the evaluation sample's for one seed)."""
    import pandas as pd

    frame = pd.read_csv(path)
    lines = ["| label | protocol | seeds | test item's percentile | own table full HR@10 | "
             "server's table full HR@10 |", "|---|---|---|---|---|---|"]
    for (label, protocol), g in frame.groupby(["label", "protocol"], sort=False):
        n = len(g)

        def cell(col: str, g: Any = g, n: int = n) -> str:
            se = g[col].std(ddof=1) / np.sqrt(n) if n > 1 else (
                float(g["pct_test_se"].iloc[0]) if col == "pct_test" else float("nan"))
            return f"{g[col].mean():.3f}" + (f" ± {se:.3f}" if np.isfinite(se) else "")

        lines.append(f"| {label} | {protocol} | {n} | {cell('pct_test')} | "
                     f"{cell('own_full_hr10')} | {cell('global_full_hr10')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="a merging run's TOML (e.g. tuned FedEM)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--protocols", nargs="+", default=["strict", "paper"],
                    choices=("strict", "paper"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one change to the config (repeatable), e.g. federation.merge=sm")
    ap.add_argument("--label", default="base", help="the run's name in the CSV")
    ap.add_argument("--out", type=Path, required=True, help="CSV, appended to")
    ap.add_argument("--table", action="store_true",
                    help="print the Markdown table of --out's rows and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.out), end="")
        return 0
    if args.config is None:
        ap.error("--config is required (unless --table)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.is_file():
        with args.out.open() as f:
            done = {(r["label"], r["protocol"], int(r["seed"])) for r in csv.DictReader(f)}
    new = not args.out.is_file()
    try:
        with args.out.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            for seed in args.seeds:
                for protocol in args.protocols:
                    if (args.label, protocol, seed) in done:
                        print(f"em_held_out_rows: {args.label} {protocol} seed {seed} done",
                              file=sys.stderr)
                        continue
                    writer.writerow(run_one(args, protocol, seed))
                    f.flush()
    except UserError as exc:
        print(f"em_held_out_rows: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
