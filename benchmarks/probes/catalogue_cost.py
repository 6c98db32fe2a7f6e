"""What a private round costs as the catalogue grows (issue 78, item 1; docs/design.md
section 19): the calibrated ML-100K population (1,682 items) against gowalla (40,981 items)
at the same cohort, in one command.

    python -m benchmarks.probes.catalogue_cost --rounds 4 --dense

Each world runs in its own subprocess (so its peak memory is its own): FedMF under
cdp-gaussian at eps 4 with the population study's settings (the 10^4-user tuning,
``benchmarks/results/population/tuned-10k/fedmf-best.toml``: local epochs, rates,
negatives, fine-tune), ``--cohort`` clients a round (Poisson at q = K / N), clients that
keep no table, ``--clip``. It times ``--rounds`` rounds by ``Simulation.step`` with no
evaluation among them and reports the median of rounds 2 on (round 1 warms the allocator),
and the process's peak RSS. Rows: the secure sum over the rows each client trained (the
default), the dense reference over every row (``--dense``), and private row selection
(``--select K``). The two worlds run one after the other for each row, so that a busy
machine slows both alike; the
ratio is the figure to read, the seconds are this machine's. Needs ../shared/datasets
(ml-100k, gowalla).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

TUNED = "benchmarks/results/population/tuned-10k/fedmf-best.toml"
SHARED = Path("../shared/datasets")
WORLDS = {
    "calibrated ml-100k (1,682 items)": {"data.dataset": "synthetic",
                                         "data.calibrate_to": "ml-100k",
                                         "data.data_dir": str(SHARED / "ml-100k"),
                                         "data.users": 10_000},
    "gowalla (40,981 items)": {"data.dataset": "csv", "data.calibrate_to": None,
                               "data.users": None,
                               "data.data_dir": str(SHARED / "gowalla" / "interactions.csv")},
}


def config(world: str, cohort: int, clip: float, rounds: int, select: int) -> dict[str, Any]:
    """The world's run config (the tuned file's layout with the probe's overrides)."""
    cfg = tomllib.loads(Path(TUNED).read_text())
    for key, value in {**WORLDS[world], "train.cohort_size": cohort, "train.rounds": rounds + 1,
                       "train.eval_every": 10 ** 6, "privacy.mode": "cdp-gaussian",
                       "privacy.epsilon": 4.0, "privacy.clip": clip,
                       "privacy.select_rows": select}.items():
        section, name = key.split(".")
        if value is None:
            cfg[section].pop(name, None)
        else:
            cfg[section][name] = value
    return cfg


def one(world: str, cohort: int, clip: float, rounds: int, dense: bool, select: int
        ) -> dict[str, Any]:
    """Run ``rounds`` timed rounds of ``world`` in this process."""
    from fedem_private.api import resolve_config
    from fedem_private.experiments.runner import prepare
    from fedem_private.simulation.loop import SecureSumUploads

    SecureSumUploads.sparse_sums = not dense
    sim = prepare(resolve_config(config(world, cohort, clip, rounds, select)))
    seconds = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        sim.step()
        seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "items": int(sim.split.n_items), "users": int(sim.split.n_users),
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cohort", type=int, default=1000)
    ap.add_argument("--clip", type=float, default=10.0)
    ap.add_argument("--dense", action="store_true", help="also the dense reference sum")
    ap.add_argument("--select", type=int, default=0, help="also private row selection at K")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="sparse", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        print(json.dumps(one(a.one, a.cohort, a.clip, a.rounds, a.variant == "dense",
                             a.select if a.variant == "select" else 0)))
        return 0
    variants = ["sparse"] + (["dense"] if a.dense else []) + (["select"] if a.select else [])
    rows = []
    for variant in variants:
        found = {}
        for world in WORLDS:
            out = subprocess.run([sys.executable, "-m", "benchmarks.probes.catalogue_cost",
                                  "--one", world, "--variant", variant, "--rounds",
                                  str(a.rounds), "--cohort", str(a.cohort), "--clip",
                                  str(a.clip), "--select", str(a.select)],
                                 check=True, capture_output=True, text=True)
            found[world] = json.loads(out.stdout.strip().splitlines()[-1])
        base = statistics.median(found[next(iter(WORLDS))]["seconds"][1:])
        for world, r in found.items():
            med = statistics.median(r["seconds"][1:])
            rows.append(f"| {variant}{f' K={a.select}' if variant == 'select' else ''} | "
                        f"{world} | {r['users']:,} | {a.cohort} | {med:.2f} | "
                        f"{med / base:.2f} | {r['peak_gb']:.2f} |")
    print("| secure sum | world | N | cohort | s a round (median of rounds 2-"
          f"{a.rounds}) | vs calibrated | peak RSS GB |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
