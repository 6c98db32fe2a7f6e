"""DP-FTRL's strategies by their total squared error (issue 81; docs/privacy.md,
"dp-ftrl strategies").

    python -m benchmarks.probes.ftrl_error --rounds 100 400 --groups 1 2 4 10 20 100 1000

For each (T, G): the tree's and the optimised banded strategy's (b = min(G, T)) squared
sensitivity S_T (units of C^2), their ||B||_F^2 (the summed variance of the T noisy prefix
sums per unit sigma^2) and their product, the total squared error of the prefix sums at
a fixed eps per coordinate in units of (z C)^2; the ratio tree / banded is the factor of
variance the banded strategy saves, and its square root the factor of noise std per
prefix sum. Seconds, no randomness.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from fedem_private.privacy import ftrl, mf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 10, 20, 100, 1000])
    args = parser.parse_args(argv)
    print("| T | G | k | tree S_T | tree ||B||^2 | banded b | banded S_T | banded ||B||^2 "
          "| tree / banded error | noise std ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rounds in args.rounds:
        tree_b = float(sum(bin(t).count("1") for t in range(1, rounds + 1)))
        for groups in args.groups:
            tree = ftrl.FtrlPlan.for_run(rounds, groups)
            band = ftrl.FtrlPlan.for_run(rounds, groups, "banded")
            band_b = mf.decoder_squared_norm(np.array(band.coefs), rounds)
            ratio = tree.tree_sq * tree_b / (band.tree_sq * band_b)
            print(f"| {rounds} | {groups} | {tree.max_participations} | {tree.tree_sq:.0f} | "
                  f"{tree_b:.0f} | {band.bands} | {band.tree_sq:.2f} | {band_b:.0f} | "
                  f"{ratio:.2f} | {math.sqrt(ratio):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
