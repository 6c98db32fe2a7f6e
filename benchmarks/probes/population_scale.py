"""Seconds a round and peak memory against the population size N at a fixed cohort
(issue 66, item 2; docs/design.md section 17).

    python -m benchmarks.probes.population_scale --users 10000 100000 1000000 \\
        --cohort 1000 --out benchmarks/results/population/scale.md

Each N runs in its own process (peak resident memory is a process's high-water mark):
FedMF under ``cdp-gaussian`` (q = cohort / N, z = 1, clip 1), ``--client-tables global``
(no client keeps an item table), evaluation on a keyed sample of ``--eval-users`` users
once at the end, one local epoch. The data are the built-in synthetic generator's with
ML-100K's catalogue (1,682 items) and ``--activity`` interactions per user on average;
the setup (data, split, simulation) is timed apart from the rounds. A round's time is the
median of rounds 2 to ``--rounds`` (round 1 pays first-call costs). The time a round
takes should grow with the cohort, not with N.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure(n: int, cohort: int, rounds: int, eval_users: int, activity: float) -> dict:
    """One population in this process: setup seconds, seconds per round, peak RSS."""
    from fedem_private.data import SyntheticConfig, generate, leave_one_out
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.simulation.config import (
        DataConfig,
        FederationConfig,
        RunConfig,
        TrainConfig,
    )
    from fedem_private.simulation.loop import Simulation

    start = time.perf_counter()
    synthetic = SyntheticConfig(n_users=n, n_items=1682, mean_activity=activity)
    split = leave_one_out(generate(synthetic, 0), 0)
    data_s = time.perf_counter() - start
    cfg = RunConfig(
        data=DataConfig(synthetic=synthetic),
        train=TrainConfig(rounds=rounds, eval_every=rounds, local_epochs=1,
                          cohort_size=cohort, eval_users=eval_users, client_tables="global"),
        federation=FederationConfig(method="fedmf"),
        privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=1.0, clip=1.0))
    sim = Simulation(cfg, split)
    setup_s = time.perf_counter() - start
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    metrics = sim.evaluate()
    return {"users": n, "cohort": cohort, "data_s": data_s, "setup_s": setup_s,
            "round_s": statistics.median(times[1:]), "rounds_s": times,
            "eval_s": time.perf_counter() - t, "eval_users": eval_users,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "interactions": int(split.train_indptr[-1]),
            "full_hr10": metrics["full"]["hr@10"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--cohort", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--eval-users", type=int, default=1000)
    parser.add_argument("--activity", type=float, default=20.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:  # the child: one population, JSON on stdout
        print(json.dumps(measure(args.one, args.cohort, args.rounds, args.eval_users,
                                 args.activity)))
        return 0
    rows = []
    for n in args.users:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.probes.population_scale", "--one", str(n),
             "--cohort", str(args.cohort), "--rounds", str(args.rounds),
             "--eval-users", str(args.eval_users), "--activity", str(args.activity)],
            capture_output=True, text=True, check=False)
        if proc.returncode:
            print(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed",
                  file=sys.stderr)
            rows.append({"users": n, "failed": proc.returncode})
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = ["| N | cohort | train interactions | setup s | s a round (median, rounds 2+) "
             "| eval s (users) | peak RSS GiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['users']:,} | failed (exit {r['failed']}) | | | | | |")
            continue
        lines.append(f"| {r['users']:,} | {r['cohort']:,} | {r['interactions']:,} | "
                     f"{r['setup_s']:.1f} | {r['round_s']:.3f} | {r['eval_s']:.2f} "
                     f"({r['eval_users']:,}) | {r['peak_rss_gib']:.2f} |")
    text = (f"Machine: {platform.processor() or platform.machine()}, "
            f"{platform.python_version()}; command: `python -m benchmarks.probes."
            f"population_scale {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
            + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
