"""How much Adam work a vectorised round does against the per-client reference (issue 14).

    python -m benchmarks.probes.row_work [--dataset ml-100k] [--methods fedrap,pfedrec,fedmf]

Exact Adam moves every row that has a moment, at every step, whether or not the
step's batch touched it. The per-client reference keeps one ``torch.optim.Adam``
over the whole (m, d) item-side tables, so each of a client's steps updates all
m rows of each table it trains. The vectorised round trains a compact table of
each client's touched rows, padded to the chunk's tallest client, and updates
only the clients still training at a step. This script counts, for one round:

- ``reference``: sum over clients of steps_j x m (item-table rows updated);
- ``padded``: sum over steps of (clients still training) x (the chunk's compact
  height): the rows the vectorised Adam step really moves;
- ``valid``: the same with each client's own touched rows (no padding).

A row here is one item row of one trained table; a backbone that trains two
tables per item (FedRAP's C and P_u) trains both in both paths, so the ratios
hold per table. The counts come from the plans the round itself builds (each
backbone's ``make_plan`` is wrapped while one round runs), so they follow the
data, the protocol and the training settings given. Prints a table and a JSON
line.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import numpy as np

from fedem_private.experiments.runner import prepare
from fedem_private.models import backbone_class
from fedem_private.models.base import Plan
from fedem_private.simulation.config import METHOD_BACKBONE

from ..common import emit, machine, run_config


def count(plans: list[Plan], n_items: int) -> dict[str, float]:
    """Row-step counts of one round's plans (see the module docstring)."""
    reference = padded = valid = 0
    for plan in plans:
        lengths = np.array([t.shape[0] for t in plan.touched], dtype=np.int64)
        reference += int(plan.steps.sum()) * n_items
        for a in plan.active.tolist():
            padded += a * plan.rows
            valid += int(lengths[:a].sum())
    return {"reference": reference, "padded": padded, "valid": valid,
            "reference_over_padded": reference / max(padded, 1),
            "padded_over_valid": padded / max(valid, 1)}


def measure(dataset: str, method: str) -> dict[str, Any]:
    """Run round 1 of ``method`` on ``dataset`` and count its Adam row-steps."""
    # the module of the method's backbone class, where its make_plan is looked up
    module = importlib.import_module(backbone_class(METHOD_BACKBONE[method]).__module__)
    original = module.make_plan
    plans: list[Plan] = []

    def recording(*args: Any, **kwargs: Any) -> Plan:
        plan = original(*args, **kwargs)
        plans.append(plan)
        return plan

    cfg = run_config(dataset, **{"federation.method": method, "train.rounds": 1,
                                 "train.eval_every": 10_000})
    sim = prepare(cfg)
    module.make_plan = recording
    try:
        sim.step()
    finally:
        module.make_plan = original
    n_items = sim.view.n_items
    return {"dataset": dataset, "method": method, "chunks": len(plans),
            "n_items": n_items, **count(plans, n_items)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--methods", default="fedrap,pfedrec,fedmf")
    args = ap.parse_args()
    rows = [measure(args.dataset, m) for m in args.methods.split(",")]
    for r in rows:
        print(f"{r['dataset']} {r['method']}: reference {r['reference']:,} row-steps, "
              f"vectorised {r['padded']:,} ({r['valid']:,} without padding): reference / "
              f"vectorised {r['reference_over_padded']:.2f}x, "
              f"padding {r['padded_over_valid']:.2f}x")
    emit({"benchmark": "row_work", "machine": machine(), "rows": rows})


if __name__ == "__main__":
    main()
