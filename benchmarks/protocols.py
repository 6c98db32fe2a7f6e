"""FedMF and the no-federation baseline on ML-100K under both protocols (issue 2).

    python -m benchmarks.protocols [--rounds 100] [--seed 0]

Prints a table beside the paper's FedMF (HR@10 0.4889, NDCG@10 0.2721) and a
final JSON line. Paper hyper-parameters: d=16, E=10, B=256, lr 0.1.
"""

from __future__ import annotations

import argparse
import time

from .common import emit, machine, run_config, train

PAPER_FEDMF = {"hr@10": 0.4889, "ndcg@10": 0.2721}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dataset", default="ml-100k")
    args = ap.parse_args()
    rows = []
    for method in ("fedmf", "local"):
        for protocol in ("paper", "strict"):
            t0 = time.perf_counter()
            cfg = run_config(args.dataset, **{"federation.method": method,
                                              "data.protocol": protocol,
                                              "train.rounds": args.rounds,
                                              "train.eval_every": args.rounds,
                                              "train.seed": args.seed})
            res = train(cfg)
            m = res["metrics"]
            rows.append({"method": method, "protocol": protocol,
                         "sampled_hr@10": m["sampled"]["hr@10"],
                         "sampled_ndcg@10": m["sampled"]["ndcg@10"],
                         "full_hr@10": m["full"]["hr@10"], "full_ndcg@10": m["full"]["ndcg@10"],
                         "seconds_per_round": res["seconds_per_round"],
                         "wall_s": time.perf_counter() - t0})
            r = rows[-1]
            print(f"{method:6} {protocol:6} sampled HR@10 {r['sampled_hr@10']:.4f} "
                  f"NDCG@10 {r['sampled_ndcg@10']:.4f} | full HR@10 {r['full_hr@10']:.4f} "
                  f"NDCG@10 {r['full_ndcg@10']:.4f} | {r['seconds_per_round']:.2f} s/round",
                  flush=True)
    print(f"paper FedMF (sampled-99, paper protocol): HR@10 {PAPER_FEDMF['hr@10']} "
          f"NDCG@10 {PAPER_FEDMF['ndcg@10']}")
    emit({"benchmark": "protocols", "dataset": args.dataset, "rounds": args.rounds,
          "seed": args.seed, "rows": rows, "machine": machine()})


if __name__ == "__main__":
    main()
