"""Would stopping hopeless tuning trials early (pruning) have cost a study its answer?

``fedem-private tune`` runs every trial to its last round. A LastFM-2K FedEM trial takes
0.5-2.5 hours, and most of them sit at chance throughout, so stopping a trial that is
still at chance part way would save hours. This replays two stopping rules on the kept
trials of finished studies (``trials/<n>/metrics.csv``, ``summary.json``, as
``benchmarks.keep_runs`` keeps them), in trial order:

- ``chance``: stop a trial at round ``--at`` when its validation HR@10 is within three
  standard deviations of chance: K / n_items for the full ranking (a slight
  under-estimate: a client's training items are not ranked), K / 100 for the sampled
  one (the validation item against 99 negatives), over the trial's validation users.
- ``median``: Optuna's ``MedianPruner`` (``n_startup_trials = 5``, warm-up ``--at``
  rounds): stop a trial at an evaluated round when its reading is below the median of
  the readings the trials that ran to the end had at that round.

For each study and rule it prints the trials stopped, the share of the study's rounds
saved, and the stopped trials that ended above the chance band (they were learning,
only late) with their last readings. It cannot replay the sampler: a real study would
have proposed other settings after a stopped trial, so the rounds saved are an upper
bound on what the rule buys and the late learners a lower bound on what it costs::

    python -m benchmarks.probes.prune_rule benchmarks/results/ladder/tuning/*/ --at 30
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any

K = 10  # HR@10
STARTUP = 5  # MedianPruner's n_startup_trials (Optuna's default)


def _trial(folder: Path) -> dict[str, Any] | None:
    """One finished trial's validation readings by round, its chance band and last
    reading, or None (unfinished, or no validation column)."""
    if not (folder / "summary.json").is_file() or not (folder / "metrics.csv").is_file():
        return None
    summary = json.loads((folder / "summary.json").read_text())
    with (folder / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    full = bool(rows and rows[0].get("val_full_hr@10"))
    key, users = ("val_full_hr@10", "val_full_users") if full else ("val_hr@10", "val_users")
    readings = {int(r["round"]): float(r[key]) for r in rows if r.get(key)}
    if not readings:
        return None
    p = K / (summary["n_items"] if full else 100)
    n = float(next(r[users] for r in rows if r.get(users)))
    return {"name": folder.name, "readings": readings, "last": readings[max(readings)],
            "band": p + 3 * math.sqrt(p * (1 - p) / n), "rounds": max(readings)}


def _chance_stop(trial: dict[str, Any], at: int, _done: list[dict[str, Any]]) -> int | None:
    """The round the chance rule stops ``trial`` at, or None."""
    seen = [r for r in trial["readings"] if r <= at]
    if not seen or max(seen) >= trial["rounds"]:
        return None
    return max(seen) if trial["readings"][max(seen)] <= trial["band"] else None


def _median_stop(trial: dict[str, Any], at: int, done: list[dict[str, Any]]) -> int | None:
    """The first round MedianPruner stops ``trial`` at, given the trials that ran to the
    end before it, or None."""
    if len(done) < STARTUP:
        return None
    for step in sorted(trial["readings"]):
        if step < at or step >= trial["rounds"]:
            continue
        others = [t["readings"][step] for t in done if step in t["readings"]]
        if others and trial["readings"][step] < statistics.median(others):
            return step
    return None


RULES = {"chance": _chance_stop, "median": _median_stop}


def replay(trials: list[dict[str, Any]], rule: str, at: int) -> dict[str, Any]:
    """The rule replayed over ``trials`` in order: the trials stopped (name, round), the
    rounds saved over all rounds run, and the stopped trials that ended above chance."""
    done: list[dict[str, Any]] = []
    stopped, saved = [], 0
    for t in trials:
        stop = RULES[rule](t, at, done)
        if stop is None:
            done.append(t)
        else:
            stopped.append(t)
            saved += t["rounds"] - stop
    late = [t for t in stopped if t["last"] > t["band"]]
    best = max(trials, key=lambda t: t["last"])
    return {"stopped": stopped, "saved": saved / sum(t["rounds"] for t in trials),
            "late": late, "best_stopped": best in stopped}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path, help="study folders with trials/")
    parser.add_argument("--at", type=int, default=30,
                        help="the round the chance rule looks at; the median rule's warm-up")
    args = parser.parse_args(argv)
    totals = {rule: [0, 0, 0] for rule in RULES}  # trials, stopped, late learners stopped
    for study in args.studies:
        if not (study / "trials").is_dir():
            continue
        trials = [t for t in map(_trial, sorted((study / "trials").iterdir())) if t]
        if not trials:
            continue
        for rule in RULES:
            r = replay(trials, rule, args.at)
            totals[rule][0] += len(trials)
            totals[rule][1] += len(r["stopped"])
            totals[rule][2] += len(r["late"])
            late = ", ".join(f"{t['name']} (last {t['last']:.4f})" for t in r["late"])
            print(f"{study.name} [{rule}]: {len(r['stopped'])} of {len(trials)} trials "
                  f"stopped, {r['saved']:.0%} of rounds saved; stopped but learning: "
                  f"{len(r['late'])}{': ' + late if late else ''}"
                  + ("; THE STUDY'S BEST STOPPED" if r["best_stopped"] else ""))
    for rule, (n, stopped, late) in totals.items():
        print(f"all studies [{rule}]: {stopped} of {n} trials stopped, of which {late} "
              f"ended above chance")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
