"""The ldp-dpsgd step-size table (issue 20) from a report's results.csv.

    python -m benchmarks.dpsgd_lr_table benchmarks/results/privacy/dpsgd_lr/results.csv

One row per (local lr, per-positive clip C): HR@10 mean ± std over seeds, the clipped
fraction and pre-clip norm of the last round, and the difference of sampled HR@10 from
the defaults (lr 4, C = 1) with twice its standard error.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from .common import seed_noise

DEFAULT_LR, DEFAULT_CLIP = 4.0, 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    df = pd.read_csv(ap.parse_args().results)
    lr_col = "cfg.privacy.dpsgd_lr"  # left out of a run's config identity at its default
    df["lr"] = (df[lr_col] if lr_col in df else pd.Series(math.nan, index=df.index)
                ).fillna(DEFAULT_LR).astype(float)
    base = df[(df["lr"] == DEFAULT_LR) & (df["clip"] == DEFAULT_CLIP)]["hr10_sampled"]
    print("| lr | C | seeds | sampled HR@10 | full HR@10 | clipped / pre-clip norm | "
          "vs lr 4, C 1 |")
    print("|---|---|---|---|---|---|---|")
    for (lr, clip), g in df.groupby(["lr", "clip"]):
        s, f = g["hr10_sampled"], g["hr10_full"]
        diff, two_se, beyond = seed_noise(s.mean(), s.std(ddof=1), len(s), base.mean(),
                                          base.std(ddof=1), len(base))
        verdict = "beyond seed noise" if beyond else "within seed noise"
        print(f"| {lr:g} | {clip:g} | {len(s)} | {s.mean():.3f} ± {s.std(ddof=1):.3f} | "
              f"{f.mean():.4f} ± {f.std(ddof=1):.4f} | {g['frac_clipped'].mean():.2f} / "
              f"{g['mean_pre_clip_norm'].mean():.1f} | {diff:+.3f} (2 s.e. {two_se:.3f}, "
              f"{verdict}) |")


if __name__ == "__main__":
    main()
