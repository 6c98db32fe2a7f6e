"""Secure aggregation's costs against the cohort size (issue 68, item 5).

    OMP_NUM_THREADS=1 python -m benchmarks.probes.secagg_costs [--length 1024] [--bits 16]

One simulated round of fedem_private's secure aggregation (SecAgg+ graph, degree
2 ceil(log2 n), threshold k/2 + 1) per cohort size, with 5% of the cohort dropping
after sending: bytes each client uploads (keys, encrypted shares, masked input,
unmasking answers) and downloads, client CPU seconds (mean per client) and the server's
CPU seconds. Writes benchmarks/results/privacy/secagg/costs.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from fedem_private.privacy import secagg  # a probe of the protocol itself


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--cohorts", default="10,30,100,300,1000")
    args = ap.parse_args()
    rows = []
    for m in (int(c) for c in args.cohorts.split(",")):
        x = np.random.default_rng(m).integers(0, 1 << args.bits, size=(m, args.length),
                                              dtype=np.int64).astype(np.uint32)
        ids = np.arange(m)
        after = ids[: max(0, m // 20)]
        tick = time.perf_counter()
        view = secagg.run_round(x, ids, args.bits, seed=0, round_=1, drop_after=after)
        wall = time.perf_counter() - tick
        assert view.total is not None
        assert np.array_equal(view.total, (x.astype(np.int64).sum(0) % (1 << args.bits)))
        row = {"cohort": m, "degree": view.degree, "threshold": view.threshold,
               "dropped_after": int(after.size), "wall_seconds": wall,
               **view.costs.per_client()}
        rows.append(row)
        print(json.dumps(row))
    out = Path(__file__).resolve().parents[1] / "results" / "privacy" / "secagg" / "costs.json"
    out.write_text(json.dumps({
        "command": "OMP_NUM_THREADS=1 python -m benchmarks.probes.secagg_costs "
                   f"--length {args.length} --bits {args.bits} --cohorts {args.cohorts}",
        "machine": platform.processor() or platform.machine(),
        "note": "shared 2-core machine, other jobs running: times are upper-ish figures",
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
