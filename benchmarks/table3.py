"""The FedEM paper's Table 3 beside what we measure: each backbone as published and +EM.

    python -m benchmarks.table3 [--selected] [RESULTS.csv ...]

Reads one or more ``results.csv`` files written by ``fedem-private report``
(default: ``benchmarks/results/backbones/results.csv``) and prints, per
dataset, protocol and method, the number of seeds that finished, sampled and
full HR@10 / NDCG@10 as mean ± std (ddof 1) over those seeds, the paper's
HR@10 / NDCG@10, and, for each backbone, the EM gain with a flag saying
whether it exceeds seed noise: the two means differ by more than twice the
larger standard deviation (needs 2+ seeds on each side; "?" otherwise).

``--selected`` reads each run's reported round instead of its last (the
``*_selected`` columns a run with ``train.select_round`` writes, e.g. under
``paper-code``: best validation or best test HR@10, each method's code's rule); a
run without them is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "backbones" / "results.csv"

# FedEM paper, Table 3: (HR@10, NDCG@10) without and with EM
PAPER = {
    ("filmtrust", "fedmf"): (0.6577, 0.5290), ("filmtrust", "fedmf-em"): (0.7804, 0.6426),
    ("filmtrust", "fedncf"): (0.6597, 0.5337), ("filmtrust", "fedncf-em"): (0.7315, 0.6852),
    ("filmtrust", "pfedrec"): (0.6756, 0.5398), ("filmtrust", "pfedrec-em"): (0.9691, 0.8544),
    ("filmtrust", "gpfedrec"): (0.6836, 0.5425), ("filmtrust", "gpfedrec-em"): (0.8723, 0.6706),
    ("filmtrust", "fedrap"): (0.8024, 0.5455), ("filmtrust", "fedrap-em"): (0.8044, 0.5498),
    ("ml-100k", "fedmf"): (0.4889, 0.2721), ("ml-100k", "fedmf-em"): (0.8759, 0.7533),
    ("ml-100k", "fedncf"): (0.4252, 0.2290), ("ml-100k", "fedncf-em"): (0.7529, 0.7162),
    ("ml-100k", "pfedrec"): (0.6882, 0.3913), ("ml-100k", "pfedrec-em"): (0.9905, 0.9238),
    ("ml-100k", "gpfedrec"): (0.7010, 0.4069), ("ml-100k", "gpfedrec-em"): (0.9247, 0.6938),
    ("ml-100k", "fedrap"): (0.8897, 0.7950), ("ml-100k", "fedrap-em"): (0.9735, 0.8964),
}
METRICS = ["hr10_sampled", "ndcg10_sampled", "hr10_full", "ndcg10_full"]


def _cell(values: pd.Series) -> str:
    if values.empty:
        return "-"
    if len(values) == 1:
        return f"{values.iloc[0]:.4f}"
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}"


def gain(base: pd.Series, em: pd.Series) -> str:
    """EM minus base (sampled HR@10) and whether it exceeds seed noise."""
    if base.empty or em.empty:
        return "-"
    diff = em.mean() - base.mean()
    if len(base) < 2 or len(em) < 2:
        return f"{diff:+.4f} (?)"
    noise = 2 * max(base.std(ddof=1), em.std(ddof=1))
    return f"{diff:+.4f} ({'beyond' if abs(diff) > noise else 'within'} seed noise)"


def selected(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with each metric replaced by its value at the run's reported round."""
    cols = [f"{m}_selected" for m in METRICS]
    missing = [c for c in cols if c not in frame.columns]
    if missing or frame[cols].isna().any().any():
        raise SystemExit("--selected needs runs that report a selected round "
                         "(train.select_round, e.g. the paper-code protocol); some have none")
    out = frame.copy()
    for m in METRICS:
        out[m] = frame[f"{m}_selected"]
    return out


def table(frame: pd.DataFrame) -> str:
    lines = ["| dataset | protocol | method | seeds | sampled HR@10 | sampled NDCG@10 | "
             "full HR@10 | full NDCG@10 | paper HR@10 / NDCG@10 | EM gain (sampled HR@10) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, protocol), sub in frame.groupby(["dataset", "protocol"], sort=True):
        for variant in sorted(sub["variant"].unique(), key=lambda v: (v.removesuffix("-em"),
                                                                      v.endswith("-em"))):
            rows = sub[sub["variant"] == variant]
            paper = PAPER.get((dataset, variant))
            paper_text = f"{paper[0]:.4f} / {paper[1]:.4f}" if paper else "-"
            em_text = ""
            if variant.endswith("-em"):
                base = sub[sub["variant"] == variant.removesuffix("-em")]["hr10_sampled"]
                em_text = gain(base, rows["hr10_sampled"])
            cells = [_cell(rows[m]) for m in METRICS]
            lines.append(f"| {dataset} | {protocol} | {variant} | {rows['seed'].nunique()} | "
                         + " | ".join(cells) + f" | {paper_text} | {em_text} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    use_selected = "--selected" in argv
    paths = [Path(a) for a in argv if a != "--selected"] or [DEFAULT]
    frame = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    frame = frame.drop_duplicates(subset=["run"], keep="last")
    if use_selected:
        frame = selected(frame)
    print(table(frame))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
