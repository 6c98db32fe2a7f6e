"""Would scoring a tuning trial by its best evaluated round, instead of its last, choose
another setting? (``fedem-private tune`` scores the last round's validation HR@10.)

Reads each study folder's kept trials (``trials/<n>/metrics.csv`` and ``config.toml``, as
``benchmarks.keep_runs`` keeps them) and prints, for each study and each value of ``--by``
(a config key such as ``federation.merge``, as ``tune --best-by`` groups), the trial each
rule picks, its two validation readings and its test full HR@10 at its best validation
round::

    python -m benchmarks.probes.tune_rule benchmarks/results/ladder/tuning/*/ --by federation.merge
"""

from __future__ import annotations

import argparse
import csv
import tomllib
from pathlib import Path
from typing import Any


def _trial(folder: Path) -> dict[str, Any] | None:
    """One finished trial's readings, or None (unfinished, or no validation column)."""
    if not (folder / "summary.json").is_file() or not (folder / "metrics.csv").is_file():
        return None
    with (folder / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    key = "val_full_hr@10" if rows and rows[0].get("val_full_hr@10") else "val_hr@10"
    evaluated = [r for r in rows if r.get(key)]
    if not evaluated:
        return None
    vals = [float(r[key]) for r in evaluated]
    best = max(range(len(vals)), key=lambda i: (vals[i], -i))  # the earliest best round
    return {"name": folder.name, "objective": key, "last": vals[-1], "best": vals[best],
            "test_at_best": float(evaluated[best]["full_hr@10"]),
            "config": tomllib.loads((folder / "config.toml").read_text())}


def _value(config: dict[str, Any], dotted: str | None) -> Any:
    if dotted is None:
        return "all"
    section, _, key = dotted.partition(".")
    return (config.get(section) or {}).get(key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path, help="study folders with trials/")
    parser.add_argument("--by", default=None, help="group trials by this dotted config key")
    args = parser.parse_args(argv)
    differ = 0
    for study in args.studies:
        if not (study / "trials").is_dir():
            continue
        trials = [t for t in map(_trial, sorted((study / "trials").iterdir())) if t]
        groups: dict[Any, list[dict[str, Any]]] = {}
        for t in trials:
            groups.setdefault(_value(t["config"], args.by), []).append(t)
        for value, group in groups.items():
            by_last = max(group, key=lambda t: t["last"])
            by_best = max(group, key=lambda t: t["best"])
            same = by_last["name"] == by_best["name"]
            differ += not same
            print(f"{study.name} [{value}] {len(group)} trials ({group[0]['objective']}): "
                  f"last-round rule picks {by_last['name']} (last {by_last['last']:.4f}, "
                  f"best {by_last['best']:.4f}, test {by_last['test_at_best']:.4f}); "
                  f"best-round rule {'the same' if same else by_best['name']}"
                  + ("" if same else f" (last {by_best['last']:.4f}, best "
                     f"{by_best['best']:.4f}, test {by_best['test_at_best']:.4f})"))
    print(f"groups where the rules pick different trials: {differ}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
