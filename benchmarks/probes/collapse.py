"""Do the MLP backbones' scores collapse? Dead ReLU units and constant scores over rounds.

FedNCF collapses on ML-100K under Adam at lr 0.1 (sampled HR@10 below chance, full
HR@10 exactly 0) and GPFedRec, which shares its score MLP, declines there round after
round (BENCHMARKS, issues 13 and 14). A network whose first-layer ReLUs are all off
for every item scores every item the same, and the evaluation counts a tie against
the test item (docs/design.md 2a), so such a client can never hit. This benchmark trains a
run in memory and, every ``--every`` rounds, measures on every client's own model:

- ``dead_l0``: the share of first-layer units that are off (pre-activation <= 0) for
  every one of the m items, mean over clients;
- ``dead_last``: the same for the last hidden layer, the one that feeds the logit;
- ``constant``: the share of clients whose m scores are all equal (spread < 1e-6 of
  the largest absolute score, or < 1e-12);
- sampled and full HR@10 of the round (the loop's own evaluation).

    python -m benchmarks.probes.collapse --method gpfedrec --dataset ml-100k --protocol paper \
        --rounds 40 --every 10 [--lr 0.1] [--local-epochs 10] [--seed 0]

Prints one row per evaluated round and a final JSON line. MLP backbones only (ncf,
gpfedrec, and what is built on them).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from fedem_private.experiments.runner import prepare
from fedem_private.models.base import ClientParams

from ..common import emit, machine, run_config


def _mlp(params: ClientParams) -> dict[str, torch.Tensor]:
    """The client's MLP weights: shared (FedNCF) or private (GPFedRec)."""
    source = params.dense if "w0" in params.dense else params.private
    return {n: t for n, t in source.items() if n[0] in "wb" and n[1:].isdigit()}


def collapse_stats(sim: Any) -> dict[str, float]:
    """dead_l0, dead_last and constant (see the module docstring) over every client."""
    n = sim.view.n_users
    st = sim.state  # the engine's client state: this benchmark inspects the trained models
    dead0 = dead_last = constant = 0.0
    with torch.no_grad():
        for start in range(0, n, 64):
            idx = torch.arange(start, min(n, start + 64), device=st.q_local.device)
            params = st.params(idx)
            mlp = _mlp(params)
            layers = sum(1 for name in mlp if name.startswith("w"))
            if layers < 2:
                raise SystemExit(f"{sim.backbone.name} has no hidden MLP layer to inspect")
            q = params.items
            p = params.private["p"]
            h = torch.cat((p[:, None, :].expand(-1, q.shape[1], -1), q), dim=-1)
            alive = []
            for j in range(layers - 1):
                pre = torch.baddbmm(mlp[f"b{j}"].unsqueeze(1), h, mlp[f"w{j}"])
                alive.append((pre > 0).any(dim=1))  # (k, units): on for some item
                h = torch.relu(pre)
            scores = torch.baddbmm(mlp[f"b{layers - 1}"].unsqueeze(1), h,
                                   mlp[f"w{layers - 1}"]).squeeze(-1)
            dead0 += float((~alive[0]).double().mean(dim=1).sum())
            dead_last += float((~alive[-1]).double().mean(dim=1).sum())
            spread = scores.max(dim=1).values - scores.min(dim=1).values
            scale = scores.abs().max(dim=1).values
            constant += float(((spread <= 1e-6 * scale) | (spread < 1e-12)).double().sum())
    return {"dead_l0": dead0 / n, "dead_last": dead_last / n, "constant": constant / n}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="gpfedrec")
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--protocol", default="paper")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--local-epochs", type=int, default=None)
    ap.add_argument("--gpfedrec-reg", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    over: dict[str, Any] = {"federation.method": args.method, "data.protocol": args.protocol,
                            "train.rounds": args.rounds, "train.eval_every": args.every,
                            "train.seed": args.seed}
    if args.lr is not None:
        over["train.lr"] = args.lr
    if args.local_epochs is not None:
        over["train.local_epochs"] = args.local_epochs
    if args.gpfedrec_reg is not None:
        over["federation.gpfedrec_reg"] = args.gpfedrec_reg
    sim = prepare(run_config(args.dataset, **over))
    rows = []
    print("round  sampled_hr10  full_hr10  dead_l0  dead_last  constant")
    t0 = time.perf_counter()
    while sim.state.round < args.rounds:
        stats = sim.step()
        if not stats.metrics:
            continue
        row = {"round": stats.round, "sampled_hr10": stats.metrics["sampled"]["hr@10"],
               "full_hr10": stats.metrics["full"]["hr@10"], **collapse_stats(sim)}
        rows.append(row)
        print(f"{row['round']:5d}  {row['sampled_hr10']:12.4f}  {row['full_hr10']:9.4f}  "
              f"{row['dead_l0']:7.3f}  {row['dead_last']:9.3f}  {row['constant']:8.3f}",
              flush=True)
    emit({"benchmark": "collapse", "machine": machine(), "args": vars(args),
          "seconds": time.perf_counter() - t0, "rows": rows,
          "mean_dead_l0": float(np.mean([r["dead_l0"] for r in rows])) if rows else None})


if __name__ == "__main__":
    main()
