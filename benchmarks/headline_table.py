"""The headline's tables: each method's HR@10 against total eps per architecture, where it
first lifts above chance, and whether elastic merging gains on its backbone.

    python -m benchmarks.headline_table benchmarks/results/privacy/headline2/results.csv \
        [--datasets ml-100k,filmtrust] [--data-root ../shared/datasets]

Reads a ``results.csv`` written by ``fedem-private report`` (or a sweep) and prints
markdown:

1. per dataset, one row per (architecture, method): sampled / full HR@10, mean over
   seeds, at each total eps (``inf`` is the clip-only point), with ``*`` where the
   setting is above chance: mean minus two standard errors above random ranking on
   both metrics (sampled: 10 of 100 candidates, 0.100; full: the mean over users of
   10 / (items not consumed), computed from the data when ``--data-root`` has it);
   the last column is the first eps, going down from the largest, below which it
   never again is above chance;
2. per dataset, each EM variant against its backbone without EM (``fedmf-em`` and
   ``fedem-em`` against ``fedmf``, ``pfedrec-em`` against ``pfedrec``) at each eps:
   the difference of sampled HR@10 means, marked "beyond" when it exceeds twice its
   standard error sqrt(s1^2/n1 + s2^2/n2);
3. the largest attack AUC (projection or support, max(AUC, 1 - AUC)) per
   (architecture, eps), over methods, seeds averaged; where the runs have one, the
   same attack's AUC on the control clients (``cdp-gaussian``: clients that sat the
   round out, whom the released aggregate cannot contain), so what the attack reads
   from popularity alone is beside what it reads from membership.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .common import mean_std, seed_noise

ARCH = {"ldp-laplace": "ldp-laplace", "ldp-dpsgd": "ldp-dpsgd", "cdp-gaussian": "cdp-gaussian"}
ORDER = ["fedmf", "fedmf-em", "fedem-em", "pfedrec", "pfedrec-em"]
BASE = {"fedmf-em": "fedmf", "fedem-em": "fedmf", "pfedrec-em": "pfedrec"}
SAMPLED_CHANCE = 0.1  # 10 of 1 positive + 99 sampled negatives


def full_chance(dataset: str, data_root: Path | None, seed: int = 0) -> float | None:
    """Mean over users of min(10, C_u) / C_u, C_u the items not consumed before the test."""
    if data_root is None or not (data_root / dataset).is_dir():
        return None
    from fedem_private.experiments.analysis import candidate_counts, leave_one_out, load_dataset

    cands = candidate_counts(leave_one_out(load_dataset(dataset, data_root / dataset), seed))
    return float(np.mean(np.minimum(10, cands) / cands))


def _stats(values: pd.Series) -> tuple[float, float, int]:
    """:func:`~benchmarks.common.mean_std` of a column (NaN left out)."""
    return mean_std(list(values.dropna().astype(float)))


def _eps_text(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


def above(group: pd.DataFrame, chance_full: float | None) -> bool:
    """Mean - 2 s.e. above chance on sampled and (when known) full HR@10; needs 2 seeds."""
    ok = True
    for col, chance in (("hr10_sampled", SAMPLED_CHANCE), ("hr10_full", chance_full)):
        if chance is None:
            continue
        m, s, n = _stats(group[col])
        if n < 2 or not m - 2 * s / math.sqrt(n) > chance:
            ok = False
    return ok


def utility_table(df: pd.DataFrame, dataset: str, chance_full: float | None) -> str:
    sub = df[df.dataset == dataset]
    eps_all = sorted(sub.eps_target.unique(), key=lambda e: -e)
    lines = ["| architecture | method | " + " | ".join(_eps_text(e) for e in eps_all)
             + " | seeds | above chance down to |",
             "|---|---|" + "---|" * len(eps_all) + "---|---|"]
    for arch in ARCH:
        for var in ORDER:
            cell = sub[(sub["mode"] == arch) & (sub.variant == var)]
            if cell.empty:
                continue
            cells, seeds, lowest = [], set(), None
            for e in eps_all:
                g = cell[cell.eps_target == e]
                if g.empty:
                    cells.append("")
                    continue
                ms, _, n = _stats(g.hr10_sampled)
                mf, _, _ = _stats(g.hr10_full)
                seeds.add(n)
                up = above(g, chance_full)
                cells.append(f"{ms:.3f} / {mf:.3f}{' *' if up else ''}")
            finite = sorted((e for e in cell.eps_target.unique() if not math.isinf(e)),
                            key=lambda e: -e)
            for e in finite:  # from the largest budget down, while it stays above chance
                if above(cell[cell.eps_target == e], chance_full):
                    lowest = e
                else:
                    break
            seed_text = "-".join(str(s) for s in sorted(seeds)) if len(seeds) > 1 else (
                str(next(iter(seeds))) if seeds else "0")
            lines.append(f"| {arch} | {var} | " + " | ".join(cells) + f" | {seed_text} | "
                         + ("none" if lowest is None else _eps_text(lowest)) + " |")
    return "\n".join(lines)


def em_table(df: pd.DataFrame, dataset: str) -> str:
    sub = df[df.dataset == dataset]
    eps_all = sorted(sub.eps_target.unique(), key=lambda e: -e)
    lines = ["| architecture | EM variant vs base | " + " | ".join(_eps_text(e) for e in eps_all)
             + " |", "|---|---|" + "---|" * len(eps_all)]
    for arch in ARCH:
        for var, base in BASE.items():
            a = sub[(sub["mode"] == arch) & (sub.variant == var)]
            b = sub[(sub["mode"] == arch) & (sub.variant == base)]
            if a.empty or b.empty:
                continue
            cells = []
            for e in eps_all:
                m1, s1, n1 = _stats(a[a.eps_target == e].hr10_sampled)
                m2, s2, n2 = _stats(b[b.eps_target == e].hr10_sampled)
                if n1 == 0 or n2 == 0:
                    cells.append("")
                    continue
                diff = m1 - m2
                if n1 < 2 or n2 < 2:
                    cells.append(f"{diff:+.3f} (1 seed)")
                    continue
                _, _, beyond = seed_noise(m1, s1, n1, m2, s2, n2)
                cells.append(f"{diff:+.3f}{' beyond' if beyond else ''}")
            lines.append(f"| {arch} | {var} vs {base} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def attack_table(df: pd.DataFrame, dataset: str) -> str:
    sub = df[df.dataset == dataset].copy()
    cols = [c for c in ("projection_auc", "support_auc") if c in sub.columns]
    if not cols:
        return "(no attack scores)"
    controls = {c: c.replace("_auc", "_control_auc") for c in cols}
    for c in cols + [v for v in controls.values() if v in sub.columns]:
        sub[c] = np.maximum(sub[c], 1 - sub[c])
    eps_all = sorted(sub.eps_target.unique(), key=lambda e: -e)
    lines = ["| architecture | " + " | ".join(_eps_text(e) for e in eps_all) + " |",
             "|---|" + "---|" * len(eps_all)]
    for arch in ARCH:
        a = sub[sub["mode"] == arch]
        if a.empty:
            continue
        cells = []
        for e in eps_all:
            g = a[a.eps_target == e]
            means = g.groupby("variant")[cols].mean()
            if means.empty or means.isna().all().all():
                cells.append("")
                continue
            flat = means.stack()
            var, attack = flat.idxmax()
            text = f"{flat.max():.3f} ({var}, {attack.split('_')[0]}"
            control = controls[attack]
            if control in g.columns:
                value = g.loc[g.variant == var, control].mean()
                if not math.isnan(value):
                    text += f"; control {value:.3f}"
            cells.append(text + ")")
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--datasets", default="ml-100k,filmtrust")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/datasets"))
    args = parser.parse_args(argv)
    if not args.results.is_file():
        print(f"headline_table: {args.results} is not a file", file=sys.stderr)
        return 2
    df = pd.read_csv(args.results)
    df = df[df.protocol == "strict"]
    df["eps_target"] = df["eps_target"].astype(float).fillna(math.inf)
    for ds in args.datasets.split(","):
        if not (df.dataset == ds).any():
            continue
        chance = full_chance(ds, args.data_root if args.data_root.is_dir() else None)
        chance_text = "unknown (no data)" if chance is None else f"{chance:.4f}"
        print(f"### {ds}: sampled / full HR@10 (chance 0.100 / {chance_text}; "
              "* above chance)\n")
        print(utility_table(df, ds, chance) + "\n")
        print(f"### {ds}: EM against its backbone, sampled HR@10 difference\n")
        print(em_table(df, ds) + "\n")
        print(f"### {ds}: strongest attack, max(AUC, 1 - AUC), over methods\n")
        print(attack_table(df, ds) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
