"""The per-client ledger's cost a round, its bounds kept per history or composed afresh.

    OMP_NUM_THREADS=1 python -m benchmarks.probes.ledger_cost --users 10000 --q 0.1

A cdp-gaussian ledger (eps 4 over 400 planned rounds, rate ``--q``) records ``--rounds``
rounds of Poisson draws over ``--users`` clients; each round it finds the worst client and
its eps (what a run logs). Prints seconds a round with the bounds kept per signature (the
ledger as it is) and with the kept bounds cleared every round (composing afresh).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.ledger import PrivacyLedger
    from fedem_private.privacy.params import resolve_params

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--q", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    params = resolve_params(PrivacyConfig(mode="cdp-gaussian", epsilon=4.0,
                                          sample_rate=args.q, clip=80.0), 400)
    for afresh in (True, False):
        ledger = PrivacyLedger(params)
        draws = np.random.default_rng(0)
        start = time.perf_counter()
        for r in range(args.rounds):
            ledger.record_round(r, np.flatnonzero(draws.random(args.users) < args.q))
            if afresh:
                ledger._bounds_cache.clear()
        per = (time.perf_counter() - start) / args.rounds
        print(f"{'composed afresh' if afresh else 'kept per history'}: {per:.4f} s a round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
