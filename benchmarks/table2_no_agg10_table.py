"""Tables 2 and 4 under the ``paper-code`` preset without its 10% aggregation.

    python -m benchmarks.table2_no_agg10_table [FOLDER ...]

The runs of ``benchmarks/table2_no_agg10*.toml`` (Table 2's rows) and
``table4_no_agg10*.toml`` (Table 4's FedEM under the paper's Laplace recipe, and
FilmTrust's ``paper+firstseen`` bracket): each run protocol ``paper+<options>``. One row per
(dataset, method, protocol): sampled HR@10 at each run's reported round (best test HR@10,
the preset's rule for these methods; the last for a protocol without a best-round option)
and at the last round (100 in the committed grids), mean ± std over seeds, against the
published figure, with the scorecard's verdict (:func:`benchmarks.scorecard.verdict`).
The protocol column reads
``preset - agg10`` for every option of the preset but the share. Prints a markdown table.
Default folders: :data:`KEPT`.
"""

from __future__ import annotations

import sys

import pandas as pd

from .scorecard import load, verdict
from .table3 import ROOT, labelled, published

KEPT = (ROOT / "benchmarks" / "results" / "reproduction" / "table2_no_agg10" / "kept",
        ROOT / "benchmarks" / "results" / "reproduction" / "table4_no_agg10" / "kept")
# the preset's options other than the share that apply to every method of these grids (the
# reported-round option is recorded resolved: besttest or bestval)
PRESET_CORE = {"min10", "sharedneg", "pcasim"}
BEST = {"bestauto", "besttest", "bestval"}


def protocol_label(protocol: str) -> str:
    """``preset - agg10`` for the preset without its share (the options that apply named one
    by one), else the protocol itself."""
    tokens = set(protocol.split("+")[1:])
    if (protocol.startswith("paper+") and "agg10" not in tokens and tokens >= PRESET_CORE
            and tokens & BEST):
        return "preset - agg10"
    return protocol


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folders = args or [k for k in KEPT if k.exists()]
    frame = labelled(pd.concat([load(f) for f in folders], ignore_index=True))
    frame["label"] = frame["protocol"].map(protocol_label)
    if "hr10_sampled_selected" not in frame.columns:
        frame["hr10_sampled_selected"] = float("nan")
    print("| dataset | method | protocol | seeds | reported round: sampled HR@10 (rounds) "
          "| published | vs published | last round |")
    print("|---|---|---|---|---|---|---|---|")
    for (dataset, variant, label), g in frame.groupby(["dataset", "variant", "label"],
                                                      sort=True):
        n = len(g)
        last = g["hr10_sampled"]
        sel = g["hr10_sampled_selected"].fillna(last)  # a protocol reporting its last round
        # a run without a best-round option reports its last round
        picked = g["selected_round"].fillna(g["rounds"]) if "selected_round" in g.columns \
            else g["rounds"]
        rounds = ", ".join(str(int(r)) for r in picked)
        figure = published(dataset, variant)
        pub = "-" if figure is None else f"{figure[0]:.4f}"
        vs = "-" if figure is None else verdict(sel.mean(), sel.std(), n, figure[0])
        print(f"| {dataset} | {variant} | {label} | {n} | {sel.mean():.3f} ± {sel.std():.3f} "
              f"({rounds}) | {pub} | {vs} | {last.mean():.3f} ± {last.std():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
