"""DP-FTRL's strategies beside DP-FedAvg: a small measurement (issue 81; docs/privacy.md,
"dp-ftrl strategies").

    python -m benchmarks.ftrl_strategies --users 10000 --seeds 0 1 2 --epsilon 4 \\
        --out benchmarks/results/privacy/ftrl_strategies

FedMF on a population calibrated to ML-100K (``--dataset synthetic --calibrate-to ml-100k
--users N``), the same settings for every arm (fixed before any run: the population
study's FedMF settings, benchmarks/results/population/participation/fedmf-settings.toml,
with fewer rounds and a smaller cohort so that the whole grid fits in ~20 minutes on one
core): ``cdp-gaussian`` (DP-FedAvg, Poisson rate K / N), ``dp-ftrl`` with the tree, and
``dp-ftrl --ftrl-strategy banded`` (b = G = N / K bands) and ``blt`` (d = 3 buffers), and
amplified banded MF (``dp-ftrl-banded-poisson``: ``--ftrl-sampling poisson --ftrl-bands 5``,
p = 5 K / N; its noise_multiplier column is the DP-SGD-equivalent sigma / (C ||c||)), all
at one eps, plus one run without noise per seed. Each run is a directory
``<runs>/<arm>-seed<s>`` written through the public API (a finished one is not run again).
Writes ``<out>/<name>.csv`` (one row per run) and ``<out>/<name>.md`` (full HR@10 per arm:
the mean over seeds, its standard error, and each seed's figure), ``--name`` defaulting to
ftrl_strategies.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

#: the arms: name -> privacy settings (beside eps, delta and the clip)
ARMS: dict[str, dict[str, Any]] = {
    "none": {},
    "cdp-gaussian": {"mode": "cdp-gaussian"},
    "dp-ftrl-tree": {"mode": "dp-ftrl", "ftrl_strategy": "tree"},
    "dp-ftrl-banded": {"mode": "dp-ftrl", "ftrl_strategy": "banded"},
    "dp-ftrl-blt": {"mode": "dp-ftrl", "ftrl_strategy": "blt"},
    # amplified banded MF (--ftrl-sampling poisson): b = 5 groups and bands, p = q b = 0.25
    # at the default cohort 500 of 10,000; b fixed before any run as the b in {1, 2, 4, 5,
    # 10, 20} with the least total squared error of the prefix sums at eps 4 (sigma^2
    # ||B||_F^2 / C^2 at T = 100: 4457, 3517, 3180, 3174, 3419, 3847; 20 is the cyclic
    # banded arm's)
    "dp-ftrl-banded-poisson": {"mode": "dp-ftrl", "ftrl_strategy": "banded",
                               "ftrl_sampling": "poisson", "ftrl_bands": 5},
}


def config(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """The run config of ``arm`` at ``seed`` (a nested dict for fedem_private.run)."""
    data = {"dataset": "synthetic", "calibrate_to": "ml-100k", "data_dir": args.data_dir,
            "users": args.users, "protocol": "strict"}
    train = {"rounds": args.rounds, "local_epochs": 6, "lr": 0.2325193438902574,
             "batch_size": 256, "dim": 16, "num_negatives": 4, "seed": seed,
             "cohort_size": args.cohort, "eval_users": min(args.eval_users, args.users),
             "client_tables": "global", "eval_finetune": 3, "eval_every": args.rounds}
    fed = {"method": "fedmf", "server_lr": 2.6164065370985132}
    out: dict[str, Any] = {"data": data, "train": train, "federation": fed}
    if ARMS[arm]:
        out["privacy"] = {**ARMS[arm], "epsilon": args.epsilon, "delta": 1e-5,
                          "clip": args.clip}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--cohort", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--clip", type=float, default=80.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--eval-users", type=int, default=1000)
    parser.add_argument("--data-dir", default="../shared/datasets/ml-100k")
    parser.add_argument("--runs", default="runs/ftrl-strategies")
    parser.add_argument("--out", default="benchmarks/results/privacy/ftrl_strategies")
    parser.add_argument("--name", default="ftrl_strategies",
                        help="the output files' stem: <out>/<name>.csv and .md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import fedem_private as fp

    args = parse_args(argv)
    rows = []
    for seed in args.seeds:
        for arm in args.arms:
            path = Path(args.runs) / f"{arm}-seed{seed}"
            if not (path / "summary.json").is_file():
                print(f"ftrl_strategies: {path}", file=sys.stderr, flush=True)
                start = time.perf_counter()
                fp.run(config(args, arm, seed), out=path, force=True)
                print(f"ftrl_strategies: {path} {time.perf_counter() - start:.0f} s",
                      file=sys.stderr, flush=True)
            summary = json.loads((path / "summary.json").read_text())
            full = summary["metrics"]["full"]
            privacy = summary.get("privacy") or {}
            eps = (privacy.get("epsilon") or {}).get("reported") if privacy else None
            rows.append({"arm": arm, "seed": seed, "hr10_full": full["hr@10"],
                         "hr10_full_se": full["hr@10_se"], "eval_users": full["users"],
                         "eps_reported": eps,
                         "noise_multiplier": privacy.get("noise_multiplier"),
                         "seconds_total": summary.get("seconds_total")})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{args.name}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"FedMF, N = {args.users:,} calibrated to ML-100K, {args.rounds} rounds, cohort "
             f"{args.cohort} (G = {math.ceil(args.users / args.cohort)}), eps {args.epsilon:g} "
             f"at delta 1e-5, clip {args.clip:g}, {args.eval_users} evaluated users; "
             f"{platform.machine()} {platform.python_version()}",
             "", "| arm | full HR@10 (mean ± se over seeds) | per seed | eps reported |",
             "|---|---|---|---|"]
    for arm in args.arms:
        mine = [r for r in rows if r["arm"] == arm]
        hr = [r["hr10_full"] for r in mine]
        mean = sum(hr) / len(hr)
        se = math.sqrt(sum(r["hr10_full_se"] ** 2 for r in mine)) / len(mine)
        if len(hr) > 1:
            spread = math.sqrt(sum((h - mean) ** 2 for h in hr) / (len(hr) - 1))
            se = max(se, spread / math.sqrt(len(hr)))
        eps = mine[0]["eps_reported"]
        lines.append(f"| {arm} | {mean:.4f} ± {se:.4f} | "
                     f"{', '.join(f'{h:.3f}' for h in hr)} | "
                     f"{'-' if eps is None else f'{eps:.3f}'} |")
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
