"""The FedEM ablation (paper Table 2) on ML-100K and FilmTrust, both protocols (issue 3).

    python -m benchmarks.ablation [--rounds 100] [--seeds 0,1,2] [--jobs 2]
                                  [--datasets ml-100k,filmtrust] [--protocols strict,paper]
                                  [--out benchmarks/results/utility/ablation]

Each grid point writes one JSON file into --out when it finishes; a restart
skips points already there, so the grid can be run across sessions. The table
(mean and std over seeds, beside the paper's Table 2) is printed from whatever
has finished, with --table-only to print without running.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import load_records, run_grid

VARIANTS = {  # name -> (method, merge)
    "FedMF-SR": ("fedmf", "sr"),
    "FedSim-SR": ("fedsim", "sr"),
    "FedSim-SM": ("fedsim", "sm"),
    "FedSim-DM": ("fedsim", "dm"),
    "FedSim-EM": ("fedem", "em"),
}
PAPER_TABLE2 = {  # (HR@10, NDCG@10), FedEM paper Table 2
    "filmtrust": {"FedMF-SR": (0.6577, 0.5290), "FedSim-SR": (0.7206, 0.5501),
                  "FedSim-SM": (0.7774, 0.5959), "FedSim-DM": (0.8433, 0.7051),
                  "FedSim-EM": (0.8932, 0.7701)},
    "ml-100k": {"FedMF-SR": (0.4889, 0.2721), "FedSim-SR": (0.6320, 0.4457),
                "FedSim-SM": (0.7190, 0.5277), "FedSim-DM": (0.9427, 0.8175),
                "FedSim-EM": (0.9958, 0.9427)},
}


def points(datasets: list[str], protocols: list[str], variants: list[str], seeds: list[int],
           rounds: int) -> list[dict[str, Any]]:
    """Grid points, seeds outermost so a partial run covers every cell once first."""
    out = []
    for seed in seeds:
        for ds in datasets:
            for proto in protocols:
                for var in variants:
                    method, merge = VARIANTS[var]
                    out.append({"name": f"{ds}__{proto}__{var}__seed{seed}", "dataset": ds,
                                "protocol": proto, "variant": var, "seed": seed,
                                "rounds": rounds,
                                "overrides": {"federation.method": method,
                                              "federation.merge": merge,
                                              "data.protocol": proto, "train.rounds": rounds,
                                              "train.eval_every": rounds, "train.seed": seed}})
    return out


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: mean +- std over seeds per dataset/protocol/variant, with the paper's."""
    import numpy as np

    lines = ["| dataset | protocol | variant | seeds | sampled HR@10 | sampled NDCG@10 | "
             "full HR@10 | full NDCG@10 | paper HR@10 / NDCG@10 | mean rho | s/round |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["dataset"], r["protocol"], r["variant"]) for r in records},
                  key=lambda k: (k[0], k[1], list(VARIANTS).index(k[2])))
    for ds, proto, var in keys:
        rs = [r for r in records if (r["dataset"], r["protocol"], r["variant"]) == (ds, proto, var)]

        def cell(kind: str, metric: str, rs=rs) -> str:
            v = np.array([r["metrics"][kind][metric] for r in rs])
            return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}" if len(v) > 1 else f"{v[0]:.4f}"

        paper = PAPER_TABLE2.get(ds, {}).get(var)
        paper_s = f"{paper[0]:.4f} / {paper[1]:.4f}" if paper else "-"
        spr = np.mean([r["seconds_per_round"] for r in rs])
        # weight on Q_g in the last round's merge (eq. 10), over the seeds that recorded it
        rhos = [r["merge_rho_mean"] for r in rs if r.get("merge_rho_mean") is not None]
        rho_s = f"{np.mean(rhos):.3f} ({len(rhos)})" if rhos else "-"
        lines.append(f"| {ds} | {proto} | {var} | {len(rs)} | {cell('sampled', 'hr@10')} | "
                     f"{cell('sampled', 'ndcg@10')} | {cell('full', 'hr@10')} | "
                     f"{cell('full', 'ndcg@10')} | {paper_s} | {rho_s} | {spr:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--datasets", default="ml-100k,filmtrust")
    ap.add_argument("--protocols", default="strict,paper")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/utility/ablation")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.table_only:
        grid = points(args.datasets.split(","), args.protocols.split(","),
                      args.variants.split(","), [int(s) for s in args.seeds.split(",")],
                      args.rounds)
        run_grid(grid, out, args.jobs)
    print(table(load_records(out)))


if __name__ == "__main__":
    main()
