"""Peak memory of FedEM with each client's whole item table kept against only its trained
rows (``--client-tables kept`` / ``sparse``; issue 79, docs/design.md section 17).

    python -m benchmarks.probes.sparse_state --users 10000 100000 --tables sparse kept \\
        --data-dir ../shared/datasets/ml-100k --rounds 3 --cohort 200 --eval-users 500

Each (N, tables) runs in its own process (peak resident memory is a process's high-water
mark): FedEM (merge em, learned rho) with ``--aggregation fedavg`` on a population
calibrated to ML-100K (``--dataset synthetic --calibrate-to ml-100k --users N``), a fixed
cohort a round, default local training, evaluation on a keyed sample of ``--eval-users``
users at the last round. Printed per run, as one JSON line: peak RSS, the clients' item
state (kept: the n m d table; sparse: :meth:`SparseTables.nbytes`), the mean rows stored
per client that took part, seconds of setup and per round, and full HR@10. The run is the
same as ``fedem-private run --dataset synthetic --calibrate-to ml-100k --data-dir DIR
--users N --method fedem --aggregation fedavg --rounds R --cohort-size K --eval-users M
--client-tables T``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time


def measure(n: int, tables: str, data_dir: str, rounds: int, cohort: int,
            eval_users: int) -> dict:
    """One run in this process: peak RSS, state bytes, seconds, HR@10."""
    import numpy as np

    from fedem_private.experiments.runner import prepare
    from fedem_private.simulation.config import (
        DataConfig,
        FederationConfig,
        RunConfig,
        TrainConfig,
    )

    start = time.perf_counter()
    cfg = RunConfig(
        data=DataConfig(dataset="synthetic", calibrate_to="ml-100k", data_dir=data_dir,
                        users=n),
        train=TrainConfig(rounds=rounds, eval_every=rounds, cohort_size=cohort,
                          eval_users=eval_users, client_tables=tables),
        federation=FederationConfig(method="fedem", aggregation="fedavg"))
    sim = prepare(cfg)
    setup_s = time.perf_counter() - start
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        stats = sim.step()
        times.append(time.perf_counter() - t)
    st = sim.state
    if st.sparse is not None:
        state_bytes = st.sparse.nbytes()
        rows = st.sparse.stored_rows()
        mean_rows = float(rows[rows > 0].mean()) if (rows > 0).any() else 0.0
    else:
        assert st.q_local is not None
        state_bytes = st.q_local.numel() * st.q_local.element_size()
        mean_rows = float(sim.split.n_items)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    full = (stats.metrics or {}).get("full", {})
    return {"users": n, "tables": tables, "items": int(sim.split.n_items),
            "peak_rss_mib": round(peak_kib / 1024), "state_mib": round(state_bytes / 2**20, 1),
            "mean_rows_per_participant": round(mean_rows, 1),
            "setup_s": round(setup_s, 1), "round_s": [round(t, 1) for t in times],
            "hr10_full": full.get("hr@10"), "hr10_full_se": full.get("hr@10_se"),
            "stored_users": int(np.count_nonzero(rows)) if st.sparse is not None else n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, nargs="+", default=[10_000])
    ap.add_argument("--tables", nargs="+", default=["sparse", "kept"])
    ap.add_argument("--data-dir", default="../shared/datasets/ml-100k")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cohort", type=int, default=200)
    ap.add_argument("--eval-users", type=int, default=500)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:  # the child: one (N, tables)
        print(json.dumps(measure(args.users[0], args.tables[0], args.data_dir, args.rounds,
                                 args.cohort, args.eval_users)))
        return 0
    print(json.dumps({"machine": platform.processor() or platform.machine(),
                      "python": platform.python_version()}))
    for n in args.users:
        for tables in args.tables:
            cmd = [sys.executable, "-m", "benchmarks.probes.sparse_state", "--one",
                   "--users", str(n), "--tables", tables, "--data-dir", args.data_dir,
                   "--rounds", str(args.rounds), "--cohort", str(args.cohort),
                   "--eval-users", str(args.eval_users)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            line = (out.stdout.strip().splitlines() or [""])[-1]
            print(line if out.returncode == 0 else json.dumps(
                {"users": n, "tables": tables, "error": out.stderr.strip()[-300:]}),
                flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
