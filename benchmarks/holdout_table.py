"""FedEM's holdout adapter objective against FedMF, FedSim and FedEM (train), under `strict`.

    python -m benchmarks.holdout_table benchmarks/results/utility/holdout/kept \
        [--ablation benchmarks/results/utility/ablation]

Reads the holdout sweep's run directories (``benchmarks/specs/utility/holdout.toml`` and
``benchmarks/specs/utility/holdout_train.toml``) and the ablation's records
(``benchmarks/ablation.py``, the same settings: 100 rounds, no privacy) and prints
markdown:

1. per dataset, sampled and full HR@10 at round 100 (mean ± std over seeds) of
   FedMF, FedSim, FedEM (train) from the ablation, FedEM (train) and FedEM
   (holdout) from the runs, with holdout's difference from each in sampled HR@10,
   "beyond" seed noise when larger than twice its standard error;
2. rho (EM's mean weight on the server's table, eq. 10) every 10 rounds: holdout
   (mean over seeds) and train (the runs of ``holdout_train.toml``);
3. whether each train run here equals the ablation's record at round 100 (the
   same configuration; every metric to the last digit).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from fedem_private.experiments.results import find_runs

from .common import fmt_mean_std, mean_std, seed_noise

ABLATION = {"FedMF-SR": "FedMF (ablation)", "FedSim-SR": "FedSim (ablation)",
            "FedSim-EM": "FedEM (train) (ablation)"}


def verdict(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int) -> str:
    """``+0.0123 (beyond noise, 2 s.e. 0.0100)``; no verdict with one seed on a side."""
    if n1 < 2 or n2 < 2:
        return f"{m1 - m2:+.4f} (one seed: no noise estimate)"
    diff, two_se, beyond = seed_noise(m1, s1, n1, m2, s2, n2)
    return f"{diff:+.4f} ({'beyond' if beyond else 'within'} noise, 2 s.e. {two_se:.4f})"


def runs(root: Path) -> pd.DataFrame:
    rows = []
    for run in find_runs(root):
        s = json.loads((run / "summary.json").read_text())
        name = json.loads((run / "sweep_point.json").read_text())["name"]
        metrics = pd.read_csv(run / "metrics.csv")
        rows.append({"dataset": s["dataset"], "variant": name.split("/")[1],
                     "seed": s["seed"], "sampled": s["metrics"]["sampled"]["hr@10"],
                     "full": s["metrics"]["full"]["hr@10"], "metrics": metrics,
                     "exact": s["metrics"]})
    return pd.DataFrame(rows)


def ablation(root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(root.glob("*__strict__*.json")):
        r = json.loads(path.read_text())
        if r["variant"] in ABLATION:
            rows.append({"dataset": r["dataset"], "variant": ABLATION[r["variant"]],
                         "seed": r["seed"], "sampled": r["metrics"]["sampled"]["hr@10"],
                         "full": r["metrics"]["full"]["hr@10"], "exact": r["metrics"]})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--ablation", type=Path,
                        default=Path("benchmarks/results/utility/ablation"))
    args = parser.parse_args(argv)
    for folder in (args.runs, args.ablation):
        if not folder.is_dir():
            print(f"holdout_table: {folder} is not a folder", file=sys.stderr)
            return 2
    ours, abl = runs(args.runs), ablation(args.ablation)
    hold = ours[ours.variant == "fedem-em-holdout"]
    train = ours[ours.variant == "fedem-em"]
    for ds in sorted(hold.dataset.unique()):
        print(f"### {ds}, strict, 100 rounds: HR@10 at round 100\n")
        print("| method | seeds | sampled HR@10 | full HR@10 | holdout minus it (sampled) |")
        print("|---|---|---|---|---|")
        h = hold[hold.dataset == ds]
        hm, hs, hn = mean_std(list(h.sampled))
        for name in ABLATION.values():
            a = abl[(abl.dataset == ds) & (abl.variant == name)]
            m, s, n = mean_std(list(a.sampled))
            fm, fs, _ = mean_std(list(a.full))
            print(f"| {name} | {n} | {fmt_mean_std(m, s)} | {fmt_mean_std(fm, fs)} | "
                  f"{verdict(hm, hs, hn, m, s, n)} |")
        tr = train[train.dataset == ds]
        if not tr.empty:
            m, s, n = mean_std(list(tr.sampled))
            fm, fs, _ = mean_std(list(tr.full))
            print(f"| FedEM (train), this grid | {n} | {fmt_mean_std(m, s)} | "
                  f"{fmt_mean_std(fm, fs)} | {verdict(hm, hs, hn, m, s, n)} |")
        fm, fs, _ = mean_std(list(h.full))
        print(f"| FedEM (holdout) | {hn} | {fmt_mean_std(hm, hs)} | {fmt_mean_std(fm, fs)} |"
              " |\n")
        print(f"### {ds}: rho every 10 rounds\n")
        traj = {}
        for label, part in (("holdout", h), ("train", train[train.dataset == ds])):
            if part.empty:
                continue
            frames = [m.set_index("round")["rho_mean"] for m in part.metrics]
            traj[f"{label} ({len(frames)} seed{'s' if len(frames) > 1 else ''})"] = (
                pd.concat(frames, axis=1).mean(axis=1))
        table = pd.DataFrame(traj).T
        print("| objective | " + " | ".join(str(int(r)) for r in table.columns) + " |")
        print("|---|" + "---|" * len(table.columns))
        for label, row in table.iterrows():
            print(f"| {label} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
        print()
        for _, t in train[train.dataset == ds].iterrows():
            rec = abl[(abl.dataset == ds) & (abl.variant == ABLATION["FedSim-EM"])
                      & (abl.seed == t.seed)]
            if rec.empty:
                continue
            same = rec.iloc[0].exact == t.exact
            print(f"{ds} train seed {t.seed} at round 100 against the ablation's record: "
                  f"{'identical' if same else 'DIFFERENT'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
