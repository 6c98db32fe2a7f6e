"""Attack AUC on participants against the control, from a report's results.csv (issue 20).

    python -m benchmarks.control_table benchmarks/results/attacks/cdp_attacks/results.csv

Under cdp-gaussian the item attacks see the released aggregate; each is scored on the
recorded clients who took part in the round and on those who sat it out (the control).
Prints, per total eps, mean ± std over seeds of both AUCs (positive_vs_sampled) and of
their difference, with a 2-standard-error verdict on the difference.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from attacks.registry import names_where

#: the item attacks, from the registry (an attack without columns in the file is skipped)
ATTACKS = names_where(kind="item")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    df = pd.read_csv(ap.parse_args().results)
    print("| eps | attack | seeds | AUC participants | AUC control | difference |")
    print("|---|---|---|---|---|---|")
    for eps, group in sorted(df.groupby("eps_target", dropna=False), key=lambda g: -g[0]):
        for name in ATTACKS:
            main_col, ctrl_col = f"{name}_auc", f"{name}_control_auc"
            if main_col not in group or ctrl_col not in group:
                continue
            a, c = group[main_col].astype(float), group[ctrl_col].astype(float)
            diff = a - c
            n = int(diff.notna().sum())
            se = diff.std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
            beyond = abs(diff.mean()) > 2 * se if n > 1 else False
            verdict = "beyond seed noise" if beyond else "within seed noise"
            print(f"| {eps:g} | {name} | {n} | {a.mean():.3f} ± {a.std(ddof=1):.3f} | "
                  f"{c.mean():.3f} ± {c.std(ddof=1):.3f} | {diff.mean():+.3f} "
                  f"(2 s.e. {2 * se:.3f}, {verdict}) |")


if __name__ == "__main__":
    main()
