"""DP-FTRL's strategies by their total squared error (issue 81; docs/privacy.md,
"dp-ftrl strategies").

    python -m benchmarks.probes.ftrl_error --rounds 100 400 --groups 1 2 4 10 20 100 1000

For each (T, G): the tree's, the optimised banded strategy's (b = min(G, T)) and the
optimised BLT's (d = ``--buffers``, default 3) squared sensitivity S_T (units of C^2), their
||B||_F^2 (the summed variance of the T noisy prefix sums per unit sigma^2) and their
product, the total squared error of the prefix sums at a fixed eps per coordinate in units
of (z C)^2; the ratios tree / banded and tree / BLT are the factors of variance each saves
over the tree (their square roots the factors of noise std per prefix sum), and BLT / banded
what the BLT's O(d) noise memory costs against banded's O(b). Seconds, no randomness.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from fedem_private.privacy import blt, ftrl, mf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 10, 20, 100, 1000])
    parser.add_argument("--buffers", type=int, default=blt.DEFAULT_BUFFERS)
    args = parser.parse_args(argv)
    print("| T | G | k | tree S_T | tree ||B||^2 | banded b | banded S_T | banded ||B||^2 "
          f"| BLT S_T (d = {args.buffers}) | BLT ||B||^2 | tree / banded error "
          "| tree / BLT error | BLT / banded error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rounds in args.rounds:
        tree_b = float(sum(bin(t).count("1") for t in range(1, rounds + 1)))
        for groups in args.groups:
            tree = ftrl.FtrlPlan.for_run(rounds, groups)
            band = ftrl.FtrlPlan.for_run(rounds, groups, "banded")
            band_b = mf.decoder_squared_norm(np.array(band.coefs), rounds)
            ours = ftrl.FtrlPlan.for_run(rounds, groups, "blt", buffers=args.buffers)
            ours_b = blt.decoder_squared_norm(ours.omega, ours.theta, rounds)
            tree_e, band_e, ours_e = (tree.tree_sq * tree_b, band.tree_sq * band_b,
                                      ours.tree_sq * ours_b)
            print(f"| {rounds} | {groups} | {tree.max_participations} | {tree.tree_sq:.0f} | "
                  f"{tree_b:.0f} | {band.bands} | {band.tree_sq:.2f} | {band_b:.0f} | "
                  f"{ours.tree_sq:.2f} | {ours_b:.0f} | {tree_e / band_e:.2f} | "
                  f"{tree_e / ours_e:.2f} | {ours_e / band_e:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
