"""Does a calibrated population keep its source's accuracy ladder (docs/design.md section 17)?

At the source's own size, the real data and a population drawn from the model fitted to
them (``--dataset synthetic --calibrate-to SOURCE``) are split and scored the same way
(leave-one-out, ``strict``, the project's evaluation sets and metrics), one seed at a
time: the real split with that seed, the population drawn with that seed. Rungs:

- chance: the exact expectation of a random order of each user's candidates;
- MostPop: the project's baseline (``--method mostpop``);
- EASE (lambda ``--ease-lambda``): the project's relation in the dual form (equation C.1
  of :mod:`fedem_private.data.calibration`), which is exact and takes seconds where the
  primal inverse of LastFM-2K's 17,632 x 17,632 Gram matrix takes minutes; on a source of
  at most 5,000 items the probe prints its largest difference from the project's
  ``ease_scores``. Scored by the project's ``baselines.evaluate``;
- each ``--run-config FILE``: that federated config run on both (``--rounds`` overrides
  its rounds), through :func:`fedem_private.run`, into ``--out``.

The rule the probe checks (issue 66): the calibrated ladder keeps the real one's order,
and each rung's ratio to EASE is within 25% of the real one (full and sampled HR@10).
MostPop's and EASE's full HR@10 are the fit's calibration targets (on other seeds: the fit
draws its own); chance, the sampled metrics and the federated rungs are out of sample::

    python -m benchmarks.probes.calibration --source ml-100k \\
        --data-dir ../shared/datasets/ml-100k --seeds 0 1 2

Prints the model's hash, a markdown table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedem_private import baselines
from fedem_private.api import resolve_config, run
from fedem_private.baselines.models import ease_scores as project_ease
from fedem_private.data import calibrated_population, leave_one_out, load_dataset
from fedem_private.data.calibration import ease_scores, training_matrix
from fedem_private.data.population import PopulationModel, draw_population
from fedem_private.data.split import Split
from fedem_private.errors import UserError
from fedem_private.experiments.analysis import candidate_counts

K = 10
TOLERANCE = 0.25  # a rung's ratio to EASE, calibrated over real, within 1 +- this
KINDS = ("full", "sampled")


def chance(split: Split) -> dict[str, float]:
    """Expected HR@10 of a uniformly random order: mean_u min(K, n_u) / n_u over each
    user's n_u full-ranking candidates; K / 100 against 99 sampled negatives."""
    n = candidate_counts(split).astype(float)
    return {"full": float((np.minimum(K, n) / n).mean()), "sampled": K / 100}


def held_out_percentile(split: Split) -> float:
    """Mean over users of the share of their training items less popular (in training
    counts) than their test item: 0.5 when the test item is a random one of theirs, below
    when the latest items lean to the less popular (MovieLens), out of sample."""
    pop = np.bincount(split.train_items, minlength=split.n_items)
    owner = np.repeat(np.arange(split.n_users), split.train_counts)
    below = pop[split.train_items] < pop[split.test_items][owner]
    share = np.bincount(owner, weights=below, minlength=split.n_users)
    return float((share / np.maximum(split.train_counts, 1)).mean())


def scored(split: Split, seed: int, method: str, scores: np.ndarray | None = None
           ) -> dict[str, float]:
    """Full and sampled HR@10 of a baseline on ``split``: ``scores`` if given, else the
    project's fit of ``method``; the evaluation sets are the project's for ``seed``."""
    cfg = resolve_config({"train": {"seed": seed}, "federation": {"method": method}})
    if scores is None:
        scores = baselines.fit(cfg, split).scores
    metrics = baselines.evaluate(cfg, split, scores)
    return {kind: metrics[kind]["hr@10"] for kind in KINDS}


def federated(path: Path, label: str, world: str, seed: int, overrides: dict[str, Any],
              out: Path) -> dict[str, float]:
    """Full and sampled HR@10 of the config in ``path`` run on ``world`` with ``seed`` (a
    run that finished in ``out`` is read back, not run again)."""
    where = out / f"{label}-{world}-seed{seed}"
    if (where / "summary.json").is_file():
        metrics = json.loads((where / "summary.json").read_text())["metrics"]
        return {kind: metrics[kind]["hr@10"] for kind in KINDS}
    result = run(path, where, overrides=overrides, force=True, warn=False)
    metrics = result.summary["metrics"]
    return {kind: metrics[kind]["hr@10"] for kind in KINDS}


def world_overrides(args: argparse.Namespace, model: PopulationModel, world: str,
                    seed: int) -> dict[str, Any]:
    """The data and seed keys that put a federated config on the real data or on the
    population (the source's size)."""
    common = {"train.seed": seed, "data.data_dir": args.data_dir, "train.rounds": args.rounds}
    if world == "real":
        return {**common, "data.dataset": args.source}
    return {**common, "data.dataset": "synthetic", "data.calibrate_to": args.source,
            "data.users": model.source_users}


def measure(args: argparse.Namespace, model: PopulationModel, seed: int
            ) -> dict[str, dict[str, dict[str, float]]]:
    """rung -> world -> {full, sampled} HR@10 for one seed."""
    real = load_dataset(args.source, args.data_dir)
    splits = {"real": leave_one_out(real, seed),
              "calibrated": leave_one_out(draw_population(model, seed, real.n_users), seed)}
    out: dict[str, dict[str, dict[str, float]]] = {"chance": {}, "MostPop": {},
                                                   f"EASE (lambda {args.ease_lambda:g})": {}}
    for world, split in splits.items():
        args.percentiles.setdefault(world, []).append(held_out_percentile(split))
        out["chance"][world] = chance(split)
        out["MostPop"][world] = scored(split, seed, "mostpop")
        ease = ease_scores(training_matrix(split), args.ease_lambda)
        out[f"EASE (lambda {args.ease_lambda:g})"][world] = scored(split, seed, "ease", ease)
    for path in args.run_config:
        label = Path(path).stem
        out[label] = {world: federated(Path(path), label, world, seed,
                                       world_overrides(args, model, world, seed), args.out)
                      for world in splits}
    return out


def ease_check(args: argparse.Namespace) -> float | None:
    """Largest |dual - primal| / max |primal| of EASE's scores on the real seed-0 split
    (None above 5,000 items, where the primal takes minutes)."""
    real = load_dataset(args.source, args.data_dir)
    if real.n_items > 5000:
        return None
    split = leave_one_out(real, 0)
    primal = project_ease(split, args.ease_lambda)
    dual = ease_scores(training_matrix(split), args.ease_lambda)
    return float(np.abs(dual - primal).max() / np.abs(primal).max())


def _mean_sd(values: list[float]) -> str:
    a = np.asarray(values)
    return f"{a.mean():.4f}" if a.size == 1 else f"{a.mean():.4f} ± {a.std(ddof=1):.4f}"


def ladder_order(mean: dict, kind: str, world: str) -> list[str]:
    """The rungs from lowest to highest mean HR@10 of ``kind`` on ``world``."""
    return sorted(mean, key=lambda r: mean[r][world][kind])


def table(per_seed: list[dict], ease_name: str) -> tuple[list[str], dict[str, Any]]:
    """Markdown rows and the verdict: order kept and every ratio within TOLERANCE."""
    rungs = list(per_seed[0])
    mean = {r: {w: {k: float(np.mean([s[r][w][k] for s in per_seed])) for k in KINDS}
                for w in ("real", "calibrated")} for r in rungs}
    lines = ["| rung | real full | calibrated full | real sampled | calibrated sampled | "
             "full / EASE (real, calibrated) | sampled / EASE (real, calibrated) | within "
             f"{TOLERANCE:.0%} |", "|---|---|---|---|---|---|---|---|"]
    ratios_ok = True
    for r in rungs:
        cells, ok = [], True
        for kind in KINDS:
            cells += [_mean_sd([s[r][w][kind] for s in per_seed]) for w in ("real", "calibrated")]
        pairs = []
        for kind in KINDS:
            real = mean[r]["real"][kind] / mean[ease_name]["real"][kind]
            cal = mean[r]["calibrated"][kind] / mean[ease_name]["calibrated"][kind]
            pairs.append(f"{real:.3f}, {cal:.3f}")
            ok &= abs(cal / real - 1) <= TOLERANCE
        ratios_ok &= ok
        lines.append(f"| {r} | {' | '.join(cells)} | {' | '.join(pairs)} | "
                     f"{'yes' if ok else 'NO'} |")
    order = {kind: ladder_order(mean, kind, "calibrated") == ladder_order(mean, kind, "real")
             for kind in KINDS}
    verdict = {"order_kept": order, "ratios_within": ratios_ok,
               "holds": ratios_ok and all(order.values()), "means": mean}
    return lines, verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="the real dataset, e.g. ml-100k")
    ap.add_argument("--data-dir", default=None, help="its files (default: the download cache)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ease-lambda", type=float, default=500.0)
    ap.add_argument("--run-config", action="append", default=[], metavar="FILE",
                    help="a federated config (TOML) to run on both worlds (repeatable)")
    ap.add_argument("--rounds", type=int, default=None, help="override --run-config's rounds")
    ap.add_argument("--out", type=Path, default=None,
                    help="where --run-config's runs go (default: a temporary folder)")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except UserError as exc:
        print(f"calibration: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    model = calibrated_population(args.source, args.data_dir)
    print(f"population model {model.sha256[:16]} ({args.source}, s = "
          f"{model.taste_strength:.4g}, w = {model.order_strength:.4g}; fitted or loaded in "
          f"{time.perf_counter() - t0:.1f} s)")
    check = ease_check(args)
    if check is not None:
        print(f"EASE dual form vs the project's primal, real seed 0: max relative "
              f"difference {check:.2e}")
    args.percentiles = {}
    with tempfile.TemporaryDirectory(prefix="calibration-") as tmp:
        args.out = args.out or Path(tmp)
        per_seed = [measure(args, model, seed) for seed in args.seeds]
    lines, verdict = table(per_seed, f"EASE (lambda {args.ease_lambda:g})")
    print(f"\n{args.source} at its own size, seeds {' '.join(map(str, args.seeds))} "
          f"(mean ± sd over seeds):\n")
    print("\n".join(lines))
    print(f"\norder kept: full {verdict['order_kept']['full']}, sampled "
          f"{verdict['order_kept']['sampled']}; every ratio within {TOLERANCE:.0%}: "
          f"{verdict['ratios_within']}; rule holds: {verdict['holds']} "
          f"({time.perf_counter() - t0:.0f} s)")
    pct = {w: float(np.mean(v)) for w, v in args.percentiles.items()}
    print(f"test item's popularity percentile among its user's training items: real "
          f"{pct['real']:.3f}, calibrated {pct['calibrated']:.3f} (random: 0.5)")
    print(json.dumps({"source": args.source, "model_sha256": model.sha256,
                      "seeds": args.seeds, "ease_dual_check": check,
                      "held_out_percentile": pct, **verdict}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
