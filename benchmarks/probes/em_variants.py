"""Issue 69 item 2: the table of elastic merging's variants under ``strict`` on FilmTrust.

Reads the runs of ``runs/em-variants/<name>-seed<s>/summary.json`` (each a ``fedem-private
run --config benchmarks/results/ladder/tuning/fedem-filmtrust-best.toml --seed s`` with the
variant's flags; the commands are in the written ``.md``) and the ladder's tuned FedMF,
FedEM and MostPop rows (``benchmarks/results/ladder/filmtrust/results.csv``), and writes
``benchmarks/results/utility/em-variants/filmtrust.csv`` (one row a run) and prints the
table of ``filmtrust.md``. Every figure is the
best-validation round's (``select_round = best-val``), as the ladder's are.

    python -m benchmarks.probes.em_variants
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

RUNS = Path("runs/em-variants")
LADDER = Path("benchmarks/results/ladder/filmtrust/results.csv")
OUT = Path("benchmarks/results/utility/em-variants")
CONFIG = "benchmarks/results/ladder/tuning/fedem-filmtrust-best.toml"

#: name -> (what it is, its flags beside --config CONFIG)
VARIANTS: dict[str, tuple[str, str]] = {
    "fedmf": ("FedMF tuned, re-run (fedmf-filmtrust-best.toml)", "FEDMF"),
    "sr": ("backbone: FedEM's settings, merge sr (FedMF at them)", "--merge sr"),
    "em": ("FedEM tuned (em, fedavg), re-run", ""),
    "seen": ("em, merge only the client's own rows", "--merge-rows seen"),
    "prox0.1": ("em + proximal table, mu 0.1", "--prox-mu 0.1"),
    "prox1": ("em + proximal table, mu 1", "--prox-mu 1"),
    "prox10": ("em + proximal table, mu 10", "--prox-mu 10"),
    "seen-prox1": ("em, own rows + proximal mu 1", "--merge-rows seen --prox-mu 1"),
}
#: the ladder's rows: label -> run-name prefix
LADDER_ROWS = {"MostPop (ladder)": "mostpop-seed",
               "FedMF tuned (ladder; fedmf-filmtrust-best.toml)": "fedmf-tuned-seed",
               "FedEM tuned (ladder; em, fedavg)": "fedem-fedavg-tuned-seed"}
#: full ranking over FilmTrust's 2,071 items less a user's training items: about 10 / 2,071
CHANCE_FULL = 10 / 2071


def _selected(run: Path) -> dict[str, float]:
    s = json.loads((run / "summary.json").read_text())
    sel = s["selected"]["metrics"]
    return {"hr10_full": sel["full"]["hr@10"], "ndcg10_full": sel["full"]["ndcg@10"],
            "hr10_sampled": sel["sampled"]["hr@10"], "val_hr10_sampled": sel["val"]["hr@10"],
            "selected_round": s["selected"]["round"],
            "hr10_full_last": s["metrics"]["full"]["hr@10"],
            "rho_mean": s.get("merge_rho_mean") or float("nan"),
            "seconds_per_round": s["seconds_per_round"]}


def _mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error over seeds (nan where one value or any missing)."""
    if any(math.isnan(x) for x in xs):
        return float("nan"), float("nan")
    if len(xs) < 2:
        return xs[0], float("nan")
    return statistics.mean(xs), statistics.stdev(xs) / math.sqrt(len(xs))


def collect() -> list[dict[str, object]]:
    """One row per (variant, seed) run found, then the ladder's rows."""
    rows: list[dict[str, object]] = []
    for name, (what, flags) in VARIANTS.items():
        for run in sorted(RUNS.glob(f"{name}-seed*")):
            if not (run / "summary.json").exists():
                continue
            seed = int(run.name.rsplit("seed", 1)[1])
            config = CONFIG if flags != "FEDMF" else CONFIG.replace("fedem-", "fedmf-")
            flags = "" if flags == "FEDMF" else flags
            rows.append({"variant": name, "what": what, "seed": seed, "source": str(run),
                         "command": f"fedem-private run --config {config} --seed {seed} "
                                    f"{flags}".strip(), **_selected(run)})
    with LADDER.open() as f:
        for r in csv.DictReader(f):
            for label, prefix in LADDER_ROWS.items():
                if r["run"].startswith(prefix) and r["run"][len(prefix):].isdigit():
                    rows.append({"variant": label, "what": label, "seed": int(r["seed"]),
                                 "source": str(LADDER), "command": "",
                                 "hr10_full": float(r["hr10_full"]),
                                 "ndcg10_full": float(r["ndcg10_full"]),
                                 "hr10_sampled": float(r["hr10_sampled"]),
                                 "val_hr10_sampled": float("nan"), "selected_round": "",
                                 "hr10_full_last": float("nan"),
                                 "rho_mean": float(r["rho_mean"] or "nan"),
                                 "seconds_per_round": float(r["seconds_per_round"] or "nan")})
    return rows


def main() -> int:
    rows = collect()
    OUT.mkdir(parents=True, exist_ok=True)
    keys = ["variant", "seed", "hr10_full", "ndcg10_full", "hr10_sampled", "val_hr10_sampled",
            "selected_round", "hr10_full_last", "rho_mean", "seconds_per_round", "what",
            "command", "source"]
    with (OUT / "filmtrust.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.4f}" if isinstance(r[k], float) else r[k]) for k in keys})
    order = list(dict.fromkeys(r["variant"] for r in rows))
    lines = ["| variant | seeds | full HR@10 | full NDCG@10 | sampled HR@10 | full HR@10, "
             "round 100 | mean rho |", "|---|---|---|---|---|---|---|"]
    for v in order:
        rs = [r for r in rows if r["variant"] == v]
        cells = []
        for k in ("hr10_full", "ndcg10_full", "hr10_sampled", "hr10_full_last"):
            m, se = _mean_se([float(r[k]) for r in rs])
            cells.append("-" if math.isnan(m) else f"{m:.3f}" if math.isnan(se)
                         else f"{m:.3f} ± {se:.3f}")
        rho = [float(r["rho_mean"]) for r in rs if not math.isnan(float(r["rho_mean"]))]
        label = rs[0]["what"] if rs[0]["what"] == v else f"`{v}`: {rs[0]['what']}"
        lines.append(f"| {label} | {','.join(str(r['seed']) for r in rs)} | "
                     f"{' | '.join(cells)} | {statistics.mean(rho):.3f} |" if rho else
                     f"| {label} | {','.join(str(r['seed']) for r in rs)} | "
                     f"{' | '.join(cells)} | - |")
    lines.append(f"| chance (full ranking) | - | {CHANCE_FULL:.4f} | - | 0.100 | - | - |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
