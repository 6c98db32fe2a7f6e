"""Choosing the popularity blend of the two-stage recommender on gowalla's proxy population
(issue 78; docs/population.md, "Popularity blended into the re-ranker").

    python -m benchmarks.probes.select_blend --betas 0 0.5 1 2 4 --seeds 0

FedMF under DP-FedAvg at eps 4 with private row selection (K = 1,000 rows) on the proxy
population of ``benchmarks/gowalla_study.py`` (its first 3,000 users in the public order,
none of them a study user; written there under ``runs/gowalla-study/data``), with the
proxy's n32 settings (``benchmarks/results/population/gowalla/proxy/fedmf-n32-settings.toml``:
cohort 100, so that a proxy user takes part about as often as a study user), clip 10, at
each ``--select-blend`` beta of ``--betas``: at ranking a selected item scores
s_ui + beta log(1 + noisy count). Training is the same for every beta at a seed (the blend
is post-processing at ranking), so the runs differ only in their ranking. Each run reads
its validation and test full HR@10 on the same 2,000 users; beta is chosen by validation
(proxy users only: no study user's privacy is spent on it). MostPop and DP-MostPop
(k 25) on the proxy at the same seed are the references. Writes ``<out>/blend.csv`` and
``<out>/blend.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

SETTINGS = Path("benchmarks/results/population/gowalla/proxy/fedmf-n32-settings.toml")


def config(data: Path, seed: int, beta: float) -> dict[str, Any]:
    """A proxy run of FedMF at eps 4 with row selection and the popularity blend ``beta``."""
    cfg = tomllib.loads(SETTINGS.read_text())
    d = {"dataset": "csv", "data_dir": str(data), "protocol": "strict"}
    cfg["data"] = d
    cfg["train"].update({"seed": seed, "select_round": "best-val-full"})
    cfg["privacy"] = {"mode": "cdp-gaussian", "epsilon": 4.0, "delta": 1e-5, "clip": 10.0,
                      "select_rows": 1000, "select_blend": float(beta)}
    return cfg


def references(data: Path, seed: int) -> dict[str, dict[str, Any]]:
    """The proxy's MostPop and DP-MostPop (k 25, eps 4), each with its validation HR@10."""
    common = {"seed": seed, "eval_users": 2000, "select_round": "best-val-full"}
    d = {"dataset": "csv", "data_dir": str(data), "protocol": "strict"}
    return {"mostpop": {"data": d, "train": common, "federation": {"method": "mostpop"}},
            "dp-mostpop-k25-eps4": {"data": d, "train": common,
                                    "federation": {"method": "dp-mostpop"},
                                    "baseline": {"architecture": "central", "epsilon": 4.0,
                                                 "k": 25}}}


def read(run: Path) -> dict[str, float | None]:
    s = json.loads((run / "summary.json").read_text())
    val = (s["metrics"].get("val_full") or {}).get("hr@10")
    full = s["metrics"]["full"]
    return {"val_hr10_full": val, "hr10_full": full["hr@10"],
            "hr10_full_se": full.get("hr@10_se"), "seconds_total": s.get("seconds_total")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--data", type=Path, default=Path("runs/gowalla-study/data/gowalla-proxy.csv"))
    ap.add_argument("--runs", type=Path, default=Path("runs/select-blend"))
    ap.add_argument("--out", type=Path,
                    default=Path("benchmarks/results/population/gowalla/proxy"))
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"select_blend: no proxy population at {args.data}: run benchmarks.gowalla_study "
              "once (it writes it)", file=sys.stderr)
        return 2
    import pandas as pd

    import fedem_private as fp

    rows = []
    for seed in args.seeds:
        todo = references(args.data, seed)
        todo.update({f"fedmf-cdp-eps4-blend{b:g}": config(args.data, seed, b)
                     for b in args.betas})
        for name, cfg in todo.items():
            run = args.runs / f"{name}-seed{seed}"
            if not (run / "summary.json").is_file():
                print(f"select_blend: {run}", file=sys.stderr, flush=True)
                fp.run(cfg, out=run, force=True, warn=False)
            rows.append({"rung": name, "seed": seed, **read(run)})
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "blend.csv", index=False)
    g = frame.groupby("rung", sort=False)[["val_hr10_full", "hr10_full"]].mean()
    lines = ["| rung | seeds | validation full HR@10 | test full HR@10 |", "|---|---|---|---|"]
    for rung, r in g.iterrows():
        n = int((frame.rung == rung).sum())
        lines.append(f"| {rung} | {n} | {r.val_hr10_full:.4f} | {r.hr10_full:.4f} |")
    blends = g[g.index.str.contains("-blend")]
    best = blends.val_hr10_full.idxmax()
    lines.append(f"\nChosen by validation: {best}.")
    (args.out / "blend.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
