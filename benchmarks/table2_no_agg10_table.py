"""Table 2's FedSim rows under the ``paper-code`` preset without its 10% aggregation.

    python -m benchmarks.table2_no_agg10_table [benchmarks/results/table2_no_agg10/kept]

The runs of ``benchmarks/table2_no_agg10.toml`` and ``table2_no_agg10_filmtrust.toml``
(protocol ``paper+<every other option of the preset that applies>``): sampled HR@10 at each
run's reported round (best test HR@10, the preset's rule for these methods) and at round
100, mean ± std over seeds, against the published figure, with the scorecard's verdict
(:func:`benchmarks.scorecard.verdict`). Prints a markdown table.
"""

from __future__ import annotations

import sys

from .scorecard import load, verdict
from .table3 import PAPER, ROOT

KEPT = ROOT / "benchmarks" / "results" / "table2_no_agg10" / "kept"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    frame = load(args[0] if args else KEPT)
    print("| dataset | method | seeds | reported round: sampled HR@10 (rounds) | published "
          "| vs published | round 100 |")
    print("|---|---|---|---|---|---|---|")
    for (dataset, variant), g in frame.groupby(["dataset", "variant"], sort=True):
        n = len(g)
        sel, last = g["hr10_sampled_selected"], g["hr10_sampled"]
        rounds = ", ".join(str(int(r)) for r in g["selected_round"]) \
            if "selected_round" in g.columns else "-"
        pub = PAPER[(dataset, variant)][0]
        print(f"| {dataset} | {variant} | {n} | {sel.mean():.3f} ± {sel.std():.3f} ({rounds}) "
              f"| {pub:.4f} | {verdict(sel.mean(), sel.std(), n, pub)} "
              f"| {last.mean():.3f} ± {last.std():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
