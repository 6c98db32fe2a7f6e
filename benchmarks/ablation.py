"""The FedEM ablation (paper Table 2) on ML-100K and FilmTrust, both protocols (issue 3).

    python -m benchmarks.ablation [--rounds 100] [--seeds 0,1,2] [--jobs 2]
                                  [--datasets ml-100k,filmtrust] [--protocols strict,paper]
                                  [--out benchmarks/results/ablation]

Each grid point writes one JSON file into --out when it finishes; a restart
skips points already there, so the grid can be run across sessions. The table
(mean and std over seeds, beside the paper's Table 2) is printed from whatever
has finished, with --table-only to print without running.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

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


def point_name(dataset: str, protocol: str, variant: str, seed: int) -> str:
    return f"{dataset}__{protocol}__{variant}__seed{seed}"


def run_point(dataset: str, protocol: str, variant: str, seed: int, rounds: int,
              out: str, threads: int) -> str:
    """Train one grid point and write its JSON atomically."""
    import torch

    torch.set_num_threads(threads)
    from .common import machine, run_config, train

    method, merge = VARIANTS[variant]
    cfg = run_config(dataset, **{"federation.method": method, "federation.merge": merge,
                                 "data.protocol": protocol, "train.rounds": rounds,
                                 "train.eval_every": rounds, "train.seed": seed})
    t0 = time.perf_counter()
    res = train(cfg)
    record = {"dataset": dataset, "protocol": protocol, "variant": variant, "seed": seed,
              "rounds": rounds, "metrics": res["metrics"],
              "seconds_per_round": res["seconds_per_round"],
              "wall_s": time.perf_counter() - t0, "machine": machine()}
    path = Path(out) / f"{point_name(dataset, protocol, variant, seed)}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path.name


def load(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: mean +- std over seeds per dataset/protocol/variant, with the paper's."""
    import numpy as np

    lines = ["| dataset | protocol | variant | seeds | sampled HR@10 | sampled NDCG@10 | "
             "full HR@10 | full NDCG@10 | paper HR@10 / NDCG@10 | s/round |",
             "|---|---|---|---|---|---|---|---|---|---|"]
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
        lines.append(f"| {ds} | {proto} | {var} | {len(rs)} | {cell('sampled', 'hr@10')} | "
                     f"{cell('sampled', 'ndcg@10')} | {cell('full', 'hr@10')} | "
                     f"{cell('full', 'ndcg@10')} | {paper_s} | {spr:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--datasets", default="ml-100k,filmtrust")
    ap.add_argument("--protocols", default="strict,paper")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/ablation")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        todo = [(d, p, v, int(s)) for s in args.seeds.split(",") for d in args.datasets.split(",")
                for p in args.protocols.split(",") for v in args.variants.split(",")
                if not (out / f"{point_name(d, p, v, int(s))}.json").exists()]
        print(f"{len(todo)} grid points to run", flush=True)
        threads = max(1, (os.cpu_count() or 2) // args.jobs)
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_point, *pt, args.rounds, str(out), threads)
                       for pt in todo]
            for fut in as_completed(futures):
                print(f"done {fut.result()}", flush=True)
    print(table(load(out)))


if __name__ == "__main__":
    main()
