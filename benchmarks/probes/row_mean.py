"""Is FedAvg's dilution of rarely touched item rows what holds FedMF below centralised MF?

Under ``fedavg`` the server's new item table is the data-size-weighted mean of the round's
uploaded tables, so row i moves by sum_v w_v (U_v,i - Q_i): a row that few clients trained
moves by their small share of the weight, a popular row by most of it, and one server
step (``federation.server_lr``) cannot suit both. The obvious alternative averages each
row over the clients whose upload changed it:

    Q_i <- Q_i + eta * sum_v w_v (U_v,i - Q_i) / sum_v w_v [U_v,i != Q_i]      (row mean)

This probe runs a config under that rule and prints its validation and test HR@10 beside
the same config under ``fedavg``. It is a diagnosis, not a shipped aggregator: the row
mean reads which rows each upload changed, which ``fedavg`` under secure aggregation
never reveals, so it has no privacy architecture and no neighbour-world test, and it is
registered only inside this process.

    python -m benchmarks.probes.row_mean \
        --config benchmarks/results/ladder/tuning/fedmf-ml-100k-best.toml \
        --server-lr 1 2 --rules row-mean --out runs/probes/row_mean

Each (rule, server lr) runs into its own directory under ``--out``; a finished one is read,
not run again. Prints one line per run and a final JSON list.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedem_private.experiments.analysis import no_privacy
from fedem_private.server import registry
from fedem_private.server.aggregators import FedAvgAggregator

NAME = "row-mean-probe"


class RowMeanAggregator(FedAvgAggregator):
    """FedAvg's weights, each row's change divided by the weight of the uploads that changed
    it (the module's equation); rows no upload changed stay. :func:`main` refuses a config
    with a privacy mode."""

    name = NAME
    takes_aggregate = False

    def begin_round(self, part_mask: Tensor) -> None:
        super().begin_round(part_mask)
        self._acc = None  # fedavg's weighted sum: this rule keeps its own sums below
        self._global = self.global_table.double()  # widened once a round, not per chunk
        self._count = torch.zeros(self.global_table.shape[0], dtype=torch.float64)
        self._delta = torch.zeros_like(self._global)

    def add(self, idx: Tensor, uploads: Tensor) -> None:
        assert self._weights is not None
        w = self._weights[idx]
        d = uploads.double() - self._global
        self._count += torch.einsum("k,km->m", w, (d != 0).any(-1).double())
        self._delta += torch.einsum("k,kmd->md", w, d)

    def end_round(self) -> None:
        touched = self._count > 0
        mean = torch.zeros_like(self._delta)
        mean[touched] = self._delta[touched] / self._count[touched, None]
        target = (self._global + mean).to(self.global_table.dtype)
        self.global_table = self.server_opt.step(self.global_table, target)
        self._received()


def run_one(cfg: dict[str, Any], rule: str, server_lr: float, out: Path) -> dict[str, Any]:
    """Run (or read) ``cfg`` with aggregation ``rule`` ('fedavg' or the row mean)."""
    import fedem_private as fp

    path = out / f"{rule}-slr{server_lr:g}"
    if not (path / "summary.json").is_file():
        fed = {**cfg["federation"], "aggregation": NAME if rule == "row-mean" else "fedavg",
               "server_lr": server_lr}
        fp.run({**cfg, "federation": fed}, out=path, force=True)
    m = json.loads((path / "summary.json").read_text())["metrics"]
    val = m.get("val", {}).get("hr@10", float("nan"))
    return {"rule": rule, "server_lr": server_lr, "val_hr@10": val,
            "sampled_hr@10": m["sampled"]["hr@10"], "full_hr@10": m["full"]["hr@10"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a run's TOML (a tuned best.toml)")
    parser.add_argument("--server-lr", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--rules", nargs="+", default=["row-mean", "fedavg"],
                        choices=("row-mean", "fedavg"))
    parser.add_argument("--out", default="runs/probes/row_mean")
    args = parser.parse_args(argv)
    registry.REGISTRY[NAME] = f"{__name__}:RowMeanAggregator"
    cfg = tomllib.loads(Path(args.config).read_text())
    mode = cfg.get("privacy", {}).get("mode", "none")
    if not no_privacy(mode):
        print(f"row_mean: the row mean has no privacy architecture; {args.config} runs "
              f"privacy mode {mode!r} (use a config without privacy)", file=sys.stderr)
        return 2
    rows = []
    for rule in args.rules:
        for lr in args.server_lr:
            rows.append(run_one(cfg, rule, lr, Path(args.out)))
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in rows[-1].items()), flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
