"""What DP-FedAvg's per-round eps log costs: the composed accountant against the per-(q, z)
fast path (issue 78: a private round made cheap; fedem_private/privacy/bounds.py).

    python -m benchmarks.probes.accounting_cost --q 0.1 --z 1.1 --rounds 40

A cdp-gaussian run logs the observer's eps after every round: T rounds of one Poisson-
sampled Gaussian (q, z), by RDP and PLD. The reference builds a fresh accountant over the
whole T-round event each time (``dpfedavg_*_epsilon_composed``); the fast path computes one
round's RDP curve and PLD once per (q, z) and composes them T times. This times both over
rounds 1 .. ``--rounds`` (as a run's log calls them) in one process and prints the seconds
a round of each, their ratio and the largest difference of the figures.
"""

from __future__ import annotations

import argparse
import time

from fedem_private.privacy import bounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--q", type=float, default=0.1)
    ap.add_argument("--z", type=float, default=1.1)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args(argv)
    q, z, d = args.q, args.z, args.delta
    out: dict[str, list[tuple[float, float]]] = {}
    seconds: dict[str, float] = {}
    paths = {"composed": (bounds.dpfedavg_rdp_epsilon_composed,
                          bounds.dpfedavg_pld_epsilon_composed),
             "fast": (bounds.dpfedavg_rdp_epsilon, bounds.dpfedavg_pld_epsilon)}
    for name, (rdp, pld) in paths.items():
        start = time.perf_counter()
        out[name] = [(rdp(q, z, t, d), pld(q, z, t, d)) for t in range(1, args.rounds + 1)]
        seconds[name] = (time.perf_counter() - start) / args.rounds
    worst = max(max(abs(a[0] - b[0]), abs(a[1] - b[1]))
                for a, b in zip(out["fast"], out["composed"], strict=True))
    print(f"q {q} z {z} rounds 1..{args.rounds}: composed {seconds['composed']:.4f} s a round, "
          f"fast {seconds['fast']:.4f} s a round, ratio "
          f"{seconds['composed'] / seconds['fast']:.1f}; largest |difference| of eps "
          f"{worst:.2e}; eps at T = {args.rounds}: rdp {out['fast'][-1][0]:.4f}, "
          f"pld {out['fast'][-1][1]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
