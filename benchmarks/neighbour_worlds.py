"""The neighbour-world harness as a table: every composition of its cover, what leaked.

    python -m benchmarks.neighbour_worlds            # the cover (about 50 compositions)
    python -m benchmarks.neighbour_worlds --cases    # the three regression cases only

Per composition: the target's largest release gap over its sensitivity (<= 1 is
sound; paper and ldp-touched-rows claim no bound) and the largest relative gap of
another client's release (0 up to float rounding is sound). See
:mod:`fedem_private.experiments.neighbours`.
"""

from __future__ import annotations

import argparse
import time

from fedem_private.experiments import neighbours as nb

CASES = [
    ("share rule, ldp-laplace (finding 1)", dict(mode="ldp-laplace", method="fedem",
                                                 protocol="paper-code")),
    ("share rule, ldp-gaussian (finding 1)", dict(mode="ldp-gaussian", method="fedem",
                                                  protocol="paper-code")),
    ("size weights, ldp-laplace (finding 2)", dict(mode="ldp-laplace", method="fedmf")),
    ("size weights, ldp-dpsgd (finding 2)", dict(mode="ldp-dpsgd", method="fedmf")),
    ("p_v of eq. 13, ldp-gaussian (finding 2)", dict(mode="ldp-gaussian", method="fedsim")),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", action="store_true", help="the regression cases only")
    args = p.parse_args(argv)
    rows = ([(name, nb.make_config(**kw)) for name, kw in CASES] if args.cases else
            [(nb.describe(nb.config_of(c)), nb.config_of(c))
             for c in nb.covering(nb.accepted())])
    print("| composition | target gap / sensitivity | other clients' gap | verdict |")
    print("|---|---|---|---|")
    bad = 0
    for name, cfg in rows:
        t0 = time.perf_counter()
        found = nb.run_pair(cfg)
        mech = cfg.privacy.mechanism
        claims = mech.claims_guarantee or not mech.perturbs
        verdict = ("sound" if found.sound else
                   "leaks (claims no bound)" if not claims and not [
                       v for v in found.violations if "target" not in v] else "LEAKS")
        bad += verdict == "LEAKS"
        print(f"| {name} | {found.target_gap:.3g} | {found.other_gap:.2g} | {verdict} "
              f"({time.perf_counter() - t0:.1f} s) |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
