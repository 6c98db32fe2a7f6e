"""The attribution table of issue 17: each option of the FedEM authors' code, alone, from `paper`.

Reads the run directories of ``benchmarks/attribution.toml`` (evaluated every round)
and prints, per method and protocol label, the sampled HR@10 at round 100 and at the
round with the best sampled test HR@10 (the authors' reporting for FedEM; read from
metrics.csv, so every run has it), mean ± std over the seeds found, each label's
difference from `paper` with a seed-noise verdict (the difference of means against
twice its standard error, :func:`benchmarks.common.seed_noise`), and the published
figure (FedEM paper, Table 1, ML-100K).

    python -m benchmarks.attribution_table runs/attribution
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from .common import seed_noise

# the FedEM paper's Table 1, ML-100K HR@10 (sampled: 99 negatives)
PUBLISHED = {"fedmf": 0.4889, "fedem-em": 0.9958}
ORDER = ("paper", "paper+min10", "paper+sharedneg", "paper+besttest", "paper+agg10",
         "paper+pcasim", "paper+batchmerge", "paper+earlystop", "paper-code")


def best_test(metrics_csv: Path) -> float:
    """The highest sampled test HR@10 over the evaluated rounds."""
    with metrics_csv.open() as f:
        values = [float(r["sampled_hr@10"]) for r in csv.DictReader(f)
                  if r.get("sampled_hr@10") not in (None, "")]
    return max(values) if values else math.nan


def runs(root: str) -> list[dict]:
    out = []
    for summary in sorted(Path(root).rglob("summary.json")):
        if any(part.startswith(".") for part in summary.parts):
            continue
        s = json.loads(summary.read_text())
        point = json.loads((summary.parent / "sweep_point.json").read_text())
        out.append({"variant": point["name"].split("/")[1],
                    "protocol": s.get("protocol_label") or s["protocol"], "seed": s["seed"],
                    "last": s["metrics"]["sampled"]["hr@10"],
                    "best": best_test(summary.parent / "metrics.csv"),
                    "rho": s.get("merge_rho_mean")})
    return out


def _ms(values: list[float]) -> tuple[float, float, int]:
    a = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if a.size == 0:
        return math.nan, math.nan, 0
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else math.nan, int(a.size)


def _cell(m: float, s: float, n: int) -> str:
    if n == 0:
        return "-"
    return f"{m:.3f}" if n < 2 else f"{m:.3f} ± {s:.3f}"


def _diff(cell: tuple[float, float, int], base: tuple[float, float, int]) -> str:
    if cell[2] == 0 or base[2] == 0:
        return "-"
    if cell[2] < 2 or base[2] < 2:
        return f"{cell[0] - base[0]:+.3f} (1 seed)"
    diff, two_se, beyond = seed_noise(*cell, *base)
    return f"{diff:+.3f} ({'beyond' if beyond else 'within'} noise)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    args = ap.parse_args()
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs(args.root):
        groups[(r["variant"], r["protocol"])].append(r)
    print("| method | protocol | seeds | HR@10 round 100 | vs paper | HR@10 best test round | "
          "vs paper (best) | rho | published |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant in ("fedmf", "fedem-em"):
        base_last = _ms([r["last"] for r in groups.get((variant, "paper"), [])])
        base_best = _ms([r["best"] for r in groups.get((variant, "paper"), [])])
        for proto in ORDER:
            rows = groups.get((variant, proto))
            if not rows:
                continue
            last = _ms([r["last"] for r in rows])
            best = _ms([r["best"] for r in rows])
            rho = _ms([r["rho"] for r in rows])
            same = proto == "paper"
            print(f"| {variant} | {proto} | {last[2]} | {_cell(*last)} | "
                  f"{'' if same else _diff(last, base_last)} | {_cell(*best)} | "
                  f"{'' if same else _diff(best, base_best)} | "
                  f"{'-' if rho[2] == 0 else f'{rho[0]:.3f}'} | {PUBLISHED[variant]} |")


if __name__ == "__main__":
    main()
