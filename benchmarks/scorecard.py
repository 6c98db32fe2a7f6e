"""Every published number of the FedEM paper's Tables 1-4 beside ours, one line each (issue 17).

    python -m benchmarks.scorecard [--committed] [SOURCE ...] [--dataset NAME ...]

A SOURCE is a ``results.csv`` written by ``fedem-private report``, a folder of run
directories (a sweep's output, or the small files ``benchmarks/keep_runs.py`` keeps), or
a folder of ``benchmarks.ablation`` records (``<dataset>__<protocol>__<variant>__seed<k>.json``,
the Table 2 runs made before the sweep existed). A run found twice counts once: the same
(dataset, method, protocol, privacy mode, optimiser, seed) from a later SOURCE replaces an
earlier one, so list older records first. ``--committed`` reads the results committed
under ``benchmarks/results`` that BENCHMARKS.md's scorecard is made from (:data:`COMMITTED`),
before any SOURCE given.

For each published (dataset, method) figure (sampled HR@10; ``benchmarks.table3`` holds
the published values) it prints the tables that publish it, the figure, and ours as
mean ± standard deviation over seeds (ddof 1) with the number of seeds, under three
protocols:

- ``paper-code`` at each run's reported round (the authors' code's rule: best test or
  best validation HR@10, :func:`benchmarks.table3.selected`), with the verdict against
  the published figure: **reproduced** when it lies within the 2-sigma prediction interval
  of one more seed of ours, |ours - published| <= 2 s sqrt(1 + 1/n) (s our seeds' standard
  deviation, n their number: the published figure is one run with seed noise of its own),
  **above** or **below** beyond that, and ``1 seed`` when one seed cannot say;
- ``paper`` and ``strict`` at round 100;
- ``paper-code`` again at each run's last evaluated round (round 100 in every committed
  grid), with its verdict: the same runs under the other reporting rule, which tells how
  much of a distance the reported-round rule makes.

Runs of a backbone trained with its published code's optimiser (``train.optimizer =
"sgd"``) are their own rows, ``<method> (sgd)``, beside the same published figure, and so
are runs of the preset with an option it leaves off for that method (protocol
``paper-code+agg10``: row ``<method> with agg10``, in the paper-code column); runs
under the paper's privacy recipe are ``fedem-em + paper LDP`` (Table 4). Published
LastFM-2K figures come from another file than the one run here (docs/design.md 2a). A dataset
with published figures and no runs at all (ML-1M on these machines) gets one line that
says so, with the command that fills it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from fedem_private.experiments.analysis import UserError
from fedem_private.experiments.results import collect, read_results

from .common import mean_std
from .table3 import LDP_SUFFIX, published, selected

# which of the paper's tables publish each method's figure
TABLES = {"fedmf": "1, 2, 3", "fedncf": "1, 3", "pfedrec": "1, 3", "gpfedrec": "1, 3",
          "fedrap": "1, 3", "fedem-em": "1, 2", "fedsim": "2", "fedem-sm": "2",
          "fedem-dm": "2", "fedmf-em": "3", "fedncf-em": "3", "pfedrec-em": "3",
          "gpfedrec-em": "3", "fedrap-em": "3", "fedem-em" + LDP_SUFFIX: "4"}
ORDER = ["fedmf", "fedncf", "pfedrec", "gpfedrec", "fedrap", "fedem-em", "fedsim",
         "fedem-sm", "fedem-dm", "fedmf-em", "fedncf-em", "pfedrec-em", "gpfedrec-em",
         "fedrap-em", "fedem-em" + LDP_SUFFIX]
PROTOCOLS = ("paper-code", "paper", "strict")
DATASETS = ("ml-100k", "filmtrust", "lastfm-2k", "ml-1m")
# benchmarks.ablation's variant names -> the sweep's
ABLATION = {"FedMF-SR": "fedmf", "FedSim-SR": "fedsim", "FedSim-SM": "fedem-sm",
            "FedSim-DM": "fedem-dm", "FedSim-EM": "fedem-em"}
FILL = {"ml-1m": "fedem-private sweep benchmarks/specs/reproduction/ml1m.toml --out runs/ml1m "
                 "(needs the GroupLens ML-1M files in data/ml-1m)"}
NOTES = {"lastfm-2k": "the published LastFM-2K figures describe another file (1,600 users, "
                      "12,454 items) than the one run here (1,892 users, 17,632 items)"}


def _ablation_records(folder: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(folder.glob("*__*__*__seed*.json")):
        rec = json.loads(path.read_text())
        variant = ABLATION.get(rec.get("variant", ""))
        if variant is None:
            continue
        rows.append({"run": f"ablation/{path.stem}", "dataset": rec["dataset"],
                     "variant": variant, "protocol": rec["protocol"], "seed": rec["seed"],
                     "mode": rec.get("privacy", {}).get("mode", "none"),
                     "hr10_sampled": rec["metrics"]["sampled"]["hr@10"]})
    return pd.DataFrame(rows)


def load(source: str | Path) -> pd.DataFrame:
    """The runs of one SOURCE (see the module docstring) as a results frame."""
    path = Path(source)
    if path.is_file():
        return read_results(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no such results.csv or folder: {path}")
    if any(path.glob("*__*__*__seed*.json")):
        return _ablation_records(path)
    return collect(path)


def runs(sources: list[str | Path]) -> pd.DataFrame:
    """Every run of the sources, each once, labelled and at its reported round."""
    frames = [f for f in (load(s) for s in sources) if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["run", "dataset", "variant", "protocol", "seed",
                                     "hr10_sampled"])
    frame = pd.concat(frames, ignore_index=True)
    frame["hr10_sampled_last"] = frame["hr10_sampled"]  # before the reported round replaces it
    frame = selected(frame) if "hr10_sampled_selected" in frame.columns else frame.copy()
    if "cfg.train.optimizer" in frame.columns:
        sgd = frame["cfg.train.optimizer"] == "sgd"
        frame.loc[sgd, "variant"] = frame.loc[sgd, "variant"] + " (sgd)"
    more = frame["protocol"].astype(str).str.startswith("paper-code+")
    frame.loc[more, "variant"] = (frame.loc[more, "variant"] + " with "
                                  + frame.loc[more, "protocol"].str.removeprefix("paper-code+"))
    frame.loc[more, "protocol"] = "paper-code"
    mode = frame["mode"].fillna("none") if "mode" in frame.columns else "none"
    frame["mode"] = mode
    frame.loc[frame["mode"] == "paper", "variant"] += LDP_SUFFIX
    # a real privacy mechanism is not in the paper's tables
    frame = frame[frame["mode"].isin(["none", "paper"])]
    return frame.drop_duplicates(subset=["dataset", "variant", "protocol", "seed"],
                                 keep="last")


def _cell(m: float, s: float, n: int) -> str:
    if n == 0:
        return "-"
    if n == 1:
        return f"{m:.3f} (1)"
    return f"{m:.3f} ± {s:.3f} ({n})"


def verdict(m: float, s: float, n: int, published: float) -> str:
    """Ours (mean m, std s over n seeds) against a published figure (module docstring)."""
    if n == 0:
        return "-"
    diff = m - published
    if n == 1:
        return f"{diff:+.3f} (1 seed)"
    if abs(diff) <= 2 * s * math.sqrt(1 + 1 / n):
        return f"{diff:+.3f} reproduced"
    return f"{diff:+.3f} {'above' if diff > 0 else 'below'}"


def _method(variant: str) -> str:
    """The published method of a row label: ``pfedrec-em (sgd) with agg10`` -> ``pfedrec-em``."""
    return variant.split(" with ")[0].removesuffix(" (sgd)")


def _published(dataset: str, variant: str) -> float | None:
    """The published HR@10 of a row label, an ``(sgd)`` or ``with <option>`` row sharing its
    method's figure."""
    figure = published(dataset, _method(variant))
    return None if figure is None else figure[0]


def _variants(frame: pd.DataFrame, dataset: str) -> list[str]:
    """The published methods of ``dataset``, then any (sgd) or with <option> row after its
    method's."""
    have = set(frame.loc[frame["dataset"] == dataset, "variant"])
    out = []
    for v in ORDER:
        if _published(dataset, v) is None:
            continue
        out.append(v)
        out.extend(sorted(x for x in have if _method(x) == v and x != v))
    return out


def scorecard(frame: pd.DataFrame, datasets: list[str] | None = None) -> list[str]:
    """The scorecard's markdown lines (module docstring)."""
    lines = []
    for dataset in datasets or list(DATASETS):
        sub = frame[frame["dataset"] == dataset]
        lines.append(f"#### {dataset}: sampled HR@10, published against ours")
        lines.append("")
        if sub.empty:
            lines.append(f"Not run here: {FILL.get(dataset, 'no runs in these sources')}.")
            lines.append("")
            continue
        if dataset in NOTES:
            lines.extend([f"Note: {NOTES[dataset]}.", ""])
        lines.append("| method | tables | published | paper-code (reported round) | "
                     "vs published | paper (round 100) | strict (round 100) | "
                     "paper-code (last round) | vs published |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for variant in _variants(frame, dataset):
            figure = _published(dataset, variant)
            assert figure is not None
            cells = {}
            for protocol in PROTOCOLS:
                rows = sub[(sub["variant"] == variant) & (sub["protocol"] == protocol)]
                cells[protocol] = mean_std(rows["hr10_sampled"].dropna().tolist())
                if protocol == "paper-code":
                    last = mean_std(rows["hr10_sampled_last"].dropna().tolist())
            base = _method(variant)
            lines.append(f"| {variant} | {TABLES.get(base, '')} | {figure:.4f} | "
                         f"{_cell(*cells['paper-code'])} | "
                         f"{verdict(*cells['paper-code'], figure)} | "
                         f"{_cell(*cells['paper'])} | {_cell(*cells['strict'])} | "
                         f"{_cell(*last)} | {verdict(*last, figure)} |")
        lines.append("")
    return lines


#: the committed results behind BENCHMARKS.md's scorecard, oldest first (``--committed``):
#: Table 2's ablation records and Table 3's grids at round 100, then the runs kept from the
#: attribution, FilmTrust / LastFM-2K (CPU, GPU, CPU again), Tables 1-4 under paper-code and the
#: published optimisers' grids
COMMITTED = ("utility/ablation", "utility/backbones/results.csv", "utility/table3/results.csv",
             "reproduction/attribution/results.csv", "reproduction/attribution/kept",
             "reproduction/paper_code/kept", "reproduction/lastfm/kept",
             "reproduction/lastfm_gpu/kept", "reproduction/lastfm_cpu/kept",
             "reproduction/table3_paper_code/kept", "reproduction/table2_paper_code/kept",
             "reproduction/table4_paper_code/kept", "reproduction/pfedrec_sgd/kept",
             "reproduction/gpfedrec_sgd/kept", "reproduction/fedrap_sgd/kept",
             "reproduction/em_agg10", "reproduction/fedncf_em_agg10/kept")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", help="results.csv files and run folders")
    ap.add_argument("--committed", action="store_true",
                    help="read the committed results under benchmarks/results (COMMITTED), "
                         "before any SOURCE given")
    ap.add_argument("--dataset", action="append", choices=DATASETS,
                    help="only this dataset (repeatable; default: all four)")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parent / "results"
    sources = [root / name for name in COMMITTED] if args.committed else []
    sources += args.sources
    if not sources:
        ap.error("give SOURCE folders or results.csv files, or --committed")
    try:
        frame = runs(sources)
    except (FileNotFoundError, UserError) as exc:
        print(f"scorecard: {exc}", file=sys.stderr)
        return 2
    print("\n".join(scorecard(frame, args.dataset)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
