"""The FedEM paper's Tables 1-4 beside what we measure: each backbone as published and +EM
(Tables 1 and 3), FedEM's merge ablation (Table 2) and FedEM with the paper's LDP (Table 4).

    python -m benchmarks.table3 [--selected] [RESULTS.csv ...]

Reads one or more ``results.csv`` files written by ``fedem-private report``
(default: ``benchmarks/results/utility/backbones/results.csv``) and prints, per
dataset, protocol and method, the number of seeds that finished, sampled and
full HR@10 / NDCG@10 as mean ± std (ddof 1) over those seeds, the paper's
HR@10 / NDCG@10, and, for each backbone, the EM gain with a flag saying
whether it exceeds seed noise: the two means differ by more than twice the
larger standard deviation (needs 2+ seeds on each side; "?" otherwise).
Runs under the paper's privacy recipe (mode ``paper``) are their own rows,
``<variant> + paper LDP``, beside Table 4's "w/ LDP" figures.

Published figures for LastFM-2K come from a different file than the one run
here (the paper's 1,600 users and 12,454 items against this file's 1,892 and
17,632). FedNCF on LastFM-2K reads 0.4996 / 0.3307 in Table 1 and 0.4925 / 0.3215
in Table 3; the table shows Table 1's.

``--selected`` reads each run's reported round instead of its last (the
``*_selected`` columns a run with ``train.select_round`` writes, e.g. under
``paper-code``: best validation or best test HR@10, each method's code's rule); a
run without them is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from fedem_private.experiments.analysis import capability

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "utility" / "backbones" / "results.csv"

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
    ("ml-1m", "fedmf"): (0.4871, 0.2733), ("ml-1m", "fedmf-em"): (0.8199, 0.6606),
    ("ml-1m", "fedncf"): (0.4230, 0.2285), ("ml-1m", "fedncf-em"): (0.7606, 0.6979),
    ("ml-1m", "pfedrec"): (0.6730, 0.3898), ("ml-1m", "pfedrec-em"): (0.9656, 0.7978),
    ("ml-1m", "gpfedrec"): (0.6776, 0.3973), ("ml-1m", "gpfedrec-em"): (0.8823, 0.6777),
    ("ml-1m", "fedrap"): (0.8619, 0.7661), ("ml-1m", "fedrap-em"): (0.9538, 0.8648),
    ("lastfm-2k", "fedmf"): (0.5934, 0.3963), ("lastfm-2k", "fedmf-em"): (0.7013, 0.6061),
    ("lastfm-2k", "fedncf"): (0.4996, 0.3307), ("lastfm-2k", "fedncf-em"): (0.6564, 0.5445),
    ("lastfm-2k", "pfedrec"): (0.7833, 0.6822), ("lastfm-2k", "pfedrec-em"): (0.8810, 0.8052),
    ("lastfm-2k", "gpfedrec"): (0.7975, 0.6690), ("lastfm-2k", "gpfedrec-em"): (0.8385, 0.7475),
    ("lastfm-2k", "fedrap"): (0.6210, 0.5923), ("lastfm-2k", "fedrap-em"): (0.6320, 0.5869),
    # Table 1's FedEM (similarity + EM) and Table 2's FedSim merges (SR = fedsim, SM, DM)
    ("filmtrust", "fedem-em"): (0.8932, 0.7701), ("ml-100k", "fedem-em"): (0.9958, 0.9427),
    ("ml-1m", "fedem-em"): (0.9507, 0.8392), ("lastfm-2k", "fedem-em"): (0.7935, 0.7151),
    ("filmtrust", "fedsim"): (0.7206, 0.5501), ("ml-100k", "fedsim"): (0.6320, 0.4457),
    ("filmtrust", "fedem-sm"): (0.7774, 0.5959), ("ml-100k", "fedem-sm"): (0.7190, 0.5277),
    ("filmtrust", "fedem-dm"): (0.8433, 0.7051), ("ml-100k", "fedem-dm"): (0.9427, 0.8175),
}
# Table 4: FedEM "w/ LDP" (the paper's recipe; no noise level given)
PAPER_LDP = {
    "filmtrust": (0.8802, 0.7353), "ml-100k": (0.9936, 0.9399), "ml-1m": (0.9392, 0.8193),
    "lastfm-2k": (0.7707, 0.6930),
}
LDP_SUFFIX = " + paper LDP"
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
    """The frame with each metric replaced by its value at the run's reported round: the
    selected one where the run selects (``train.select_round``, e.g. under ``paper-code``),
    the last one where it reports the last (the default, e.g. ``strict``)."""
    rule = frame.get("cfg.train.select_round")
    last = (rule.isna() | (rule == "last")) if rule is not None else pd.Series(
        False, index=frame.index)
    cols = [f"{m}_selected" for m in METRICS]
    if any(c not in frame.columns for c in cols):
        if last.all():
            return frame.copy()
        raise SystemExit("--selected needs runs that report a selected round "
                         "(train.select_round, e.g. the paper-code protocol); some have none")
    if (frame.loc[~last, cols].isna().any(axis=1)).any():
        raise SystemExit("--selected: a run that selects its reported round "
                         "(train.select_round) has no selected round recorded")
    out = frame.copy()
    for m in METRICS:
        out.loc[~last, m] = frame.loc[~last, f"{m}_selected"]
    return out


def _order(variant: str) -> tuple[str, bool, bool]:
    """Each backbone, then its +EM; a paper-LDP row after its noiseless one."""
    plain = variant.removesuffix(LDP_SUFFIX)
    return plain.removesuffix("-em"), plain.endswith("-em"), variant != plain


def published(dataset: str, variant: str) -> tuple[float, float] | None:
    """The paper's (HR@10, NDCG@10) for a row label of :func:`table`, if it has one."""
    if variant.endswith(LDP_SUFFIX):
        base = variant.removesuffix(LDP_SUFFIX)
        return PAPER_LDP.get(dataset) if base == "fedem-em" else None
    return PAPER.get((dataset, variant))


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs under the paper's privacy recipe as their own variant rows."""
    if "mode" not in frame.columns:
        return frame
    out = frame.copy()
    ldp = out["mode"].map(lambda m: capability(m, "paper_heuristic")).astype(bool)
    out.loc[ldp, "variant"] = out.loc[ldp, "variant"] + LDP_SUFFIX
    return out


def table(frame: pd.DataFrame) -> str:
    frame = labelled(frame)
    lines = ["| dataset | protocol | method | seeds | sampled HR@10 | sampled NDCG@10 | "
             "full HR@10 | full NDCG@10 | paper HR@10 / NDCG@10 | EM gain (sampled HR@10) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, protocol), sub in frame.groupby(["dataset", "protocol"], sort=True):
        for variant in sorted(sub["variant"].unique(), key=_order):
            rows = sub[sub["variant"] == variant]
            paper = published(dataset, variant)
            paper_text = f"{paper[0]:.4f} / {paper[1]:.4f}" if paper else "-"
            em_text = ""
            if variant.endswith("-em") and variant != "fedem-em":
                base = sub[sub["variant"] == variant.removesuffix("-em")]["hr10_sampled"]
                em_text = gain(base, rows["hr10_sampled"])
            cells = [_cell(rows[m]) for m in METRICS]
            lines.append(f"| {dataset} | {protocol} | {variant} | {rows['seed'].nunique()} | "
                         + " | ".join(cells) + f" | {paper_text} | {em_text} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    use_selected = "--selected" in argv
    paths = [Path(a) for a in argv if a != "--selected"] or [DEFAULT]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"table3: no such results.csv: {', '.join(missing)} (write one with "
                         f"fedem-private report DIR --out DIR)")
    frame = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    frame = frame.drop_duplicates(subset=["run"], keep="last")
    if use_selected:
        frame = selected(frame)
    print(table(frame))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
