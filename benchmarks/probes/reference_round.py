"""Time one per-client reference round alone and report the process's peak memory.

The reference (``fedem_private.reference.round.simulation_round``) is the slow,
obvious counterpart the speed benchmark divides by. Run it in a fresh process, with and
without the host allocator tuning of the engine's round before it, to see what the
allocator does to it (BENCHMARKS.md, "A fourth reading"):

    OMP_NUM_THREADS=2 python -m benchmarks.probes.reference_round --method fedem
    FEDEM_PRIVATE_MALLOC=system OMP_NUM_THREADS=2 \
        python -m benchmarks.probes.reference_round --method fedem

Until the tuning was scoped to the engine's rounds (fedem_private.hostmem), it stayed in
force for the process and the FedEM reference fragmented the heap until the OOM killer
took it; now the reference runs with glibc's defaults either way, after a tuned round.

The run is ML-100K with the method's defaults; round 1 is the engine's (so that round 2's
reference has a merge to do), round 2 the reference's.
"""

from __future__ import annotations

import argparse
import resource
import time

from fedem_private.experiments.runner import prepare
from fedem_private.reference import round as reference

from ..common import run_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="fedem")
    args = ap.parse_args()
    cfg = run_config("ml-100k", **{"federation.method": args.method, "train.rounds": 3,
                                   "train.eval_every": 10_000})
    sim = prepare(cfg)
    sim.step()
    t0 = time.perf_counter()
    reference.simulation_round(sim)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    allocator = ("engine round tuned" if sim.view.host_allocator_tuned else "system") + \
        ", reference untuned"
    print(f"{args.method} reference round: {seconds:.1f} s, peak RSS {peak:.2f} GiB "
          f"(host allocator: {allocator})")


if __name__ == "__main__":
    main()
