"""ldp-dpsgd's local training, eager per-step noise against lazy noise (one round, ML-100K).

All clients in chunks of 200, S = 20 steps at q_e = 0.1, 64 negatives, sigma = 1, C = 1,
alternating the two schemes ``--reps`` times in one process. The two give the same
distribution (tests/test_privacy_dpsgd.py), not the same numbers.

    OMP_NUM_THREADS=1 python -m benchmarks.probes.dpsgd_speed --data-dir ../shared/datasets/ml-100k
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from fedem_private.experiments.runner import prepare
from fedem_private.models.base import ClientParams
from fedem_private.privacy.dpsgd import DpsgdSettings, train_chunk
from fedem_private.simulation.config import RunConfig, with_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/datasets/ml-100k")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=200)
    args = ap.parse_args()
    sim = prepare(with_overrides(RunConfig(), {"data.dataset": "ml-100k",
                                              "data.data_dir": args.data_dir}))
    sp, bb = sim.view.split, sim.backbone
    n, m, d = sp.n_users, sp.n_items, sim.view.cfg.train.dim
    q0 = bb.init_items()
    st = DpsgdSettings(0.1, 1.0, 1.0, 20, 64, 4.0, 16.0)
    times: dict[str, list[float]] = {"eager": [], "lazy": []}
    for _ in range(args.reps):
        for lazy in (False, True):
            t = time.perf_counter()
            for a in range(0, n, args.chunk):
                ids = np.arange(a, min(a + args.chunk, n))
                start = ClientParams(q0.expand(len(ids), m, d).clone(), {}, bb.init_private(ids))
                train_chunk(bb, start, ids, sp.train_indptr, sp.train_items, st, 0, 1,
                            lazy_noise=lazy)
            times["lazy" if lazy else "eager"].append(time.perf_counter() - t)
    print(json.dumps({"threads": torch.get_num_threads(), "clients": n, "seconds": times}))


if __name__ == "__main__":
    main()
