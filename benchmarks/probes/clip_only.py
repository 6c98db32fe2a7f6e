"""A population study cell with its clip but (almost) no noise (issue 66, docs/population.md).

The study's private rung for ``--method`` at ``--users`` N, ``--seed`` and ``--mechanism``
(:func:`benchmarks.population_study.rungs`, the method's settings file and clip), with the
privacy section's eps replaced by a fixed noise multiplier ``--noise-multiplier`` z: a small
z separates what the clip does to a model from what the noise does. Its eps is whatever z
gives (thousands at z 0.01): a diagnostic, not a private run. The run goes into
``--runs``/N<N>/<method>-<mechanism>-z<z>-seed<seed>; a finished one is read back::

    python -m benchmarks.probes.clip_only --method pfedrec \\
        --settings benchmarks/results/population/participation/pfedrec-settings.toml \\
        --users 100000 --seed 0 --mechanism dp-ftrl --noise-multiplier 0.01

Prints the run's full HR@10 with its standard error as one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from benchmarks import population_study as study


def config(method: str, settings: str, users: int, seed: int, mechanism: str,
           noise_multiplier: float, data_dir: str, clip: float | None = None
           ) -> tuple[str, dict]:
    """(run name, config): the study's rung at eps 4 with eps swapped for the multiplier
    (``clip``: the study's ``--clip``, else the settings file's)."""
    args = study.parse_args(["--epsilons", "4", "--methods", method, "--mechanisms", mechanism,
                             "--settings", f"{method}={settings}", "--data-dir", data_dir,
                             "--no-reference", *(["--clip", str(clip)] if clip else [])])
    name, cfg = next(r for r in study.rungs(users, seed, args)
                     if r[0].startswith(f"{method}-{mechanism}-"))
    cfg = copy.deepcopy(cfg)
    cfg["privacy"].pop("epsilon")
    cfg["privacy"]["noise_multiplier"] = noise_multiplier
    return f"{method}-{mechanism}-z{noise_multiplier:g}-seed{seed}", cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="pfedrec", choices=("fedmf", "pfedrec"))
    parser.add_argument("--settings", required=True, help="the method's settings file")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mechanism", default="dp-ftrl",
                        choices=("cdp-gaussian", "dp-ftrl", "dp-ftrl-banded",
                                 "dp-ftrl-banded-poisson"))
    parser.add_argument("--clip", type=float, default=None,
                        help="the study's --clip (FedMF's population study: 80)")
    parser.add_argument("--noise-multiplier", type=float, default=0.01)
    parser.add_argument("--data-dir", default="../shared/datasets/ml-100k")
    parser.add_argument("--runs", default="runs/population-diag")
    args = parser.parse_args(argv)
    name, cfg = config(args.method, args.settings, args.users, args.seed, args.mechanism,
                       args.noise_multiplier, args.data_dir, args.clip)
    summary = study.ensure(Path(args.runs) / f"N{args.users}" / name, cfg)
    full = summary["metrics"]["full"]
    print(json.dumps({"run": name, "users": args.users, "hr10_full": full["hr@10"],
                      "hr10_full_se": full.get("hr@10_se"),
                      "epsilon": (summary.get("privacy") or {}).get("epsilon")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
