"""FedMF and the no-federation baseline on ML-100K under both protocols (issue 2).

    python -m benchmarks.protocols [--rounds 100] [--seed 0] [--jobs 2]

Prints a table beside the paper's FedMF (HR@10 0.4889, NDCG@10 0.2721).
Paper hyper-parameters: d=16, E=10, B=256, lr 0.1. Resumable: one JSON per
finished point in --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import load_records, run_grid

PAPER_FEDMF = {"hr@10": 0.4889, "ndcg@10": 0.2721}


def points(dataset: str, rounds: int, seed: int) -> list[dict]:
    return [{"name": f"{dataset}__{method}__{protocol}__seed{seed}", "dataset": dataset,
             "method": method, "protocol": protocol, "seed": seed,
             "overrides": {"federation.method": method, "data.protocol": protocol,
                           "train.rounds": rounds, "train.eval_every": rounds,
                           "train.seed": seed}}
            for method in ("fedmf", "local") for protocol in ("paper", "strict")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/utility/protocols")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.table_only:
        run_grid(points(args.dataset, args.rounds, args.seed), out, args.jobs)
    print("| method | protocol | sampled HR@10 | sampled NDCG@10 | full HR@10 | full NDCG@10 |")
    print("|---|---|---|---|---|---|")
    for r in load_records(out):
        m = r["metrics"]
        print(f"| {r['method']} | {r['protocol']} | {m['sampled']['hr@10']:.4f} | "
              f"{m['sampled']['ndcg@10']:.4f} | {m['full']['hr@10']:.4f} | "
              f"{m['full']['ndcg@10']:.4f} |")
    print(f"| paper's FedMF (Table 1) | paper | {PAPER_FEDMF['hr@10']} | "
          f"{PAPER_FEDMF['ndcg@10']} | - | - |")


if __name__ == "__main__":
    main()
