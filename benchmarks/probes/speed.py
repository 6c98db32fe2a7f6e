"""Speed and memory of the vectorised engine against the per-client reference.

    python -m benchmarks.probes.speed [--parts engine,aggregation,scaling,memory] [--quick]
                               [--device cpu|cuda|auto]

Parts (each measured in this one process run, except memory, which runs in a
fresh subprocess so its peak RSS is its own):

- engine: seconds per round on ML-100K for the vectorised engine (mean of
  rounds 2..4) and for the one-client-at-a-time reference (round 2), FedMF and
  FedEM (the engine's rounds run with the host allocator tuned, the reference,
  outside any round, with glibc's defaults: fedem_private.hostmem); and, in the
  same process, the machine's floor for a round (issue 19): four in-place passes
  over the clients' (n, m, d) float32 tables, and one float32 GEMM of the
  uploads' Gram matrix (n x md times md x n), each the fastest of 5 repeats;
- backbones: the same for the FedNCF and PFedRec backbones with static
  replacement and with elastic merging (each preset keeps its FedAvg);
- graph: GPFedRec's graph aggregation (cosine Gram matrix, neighbours,
  propagation) on real ML-100K uploads (943 clients) and on random tables of
  ML-1M size (6,040 x 3,706 x 16);
- aggregation: similarity weights (equation 13) at ML-100K size, closed form
  vs cvxpy per client;
- scaling: FedMF round time on synthetic data as clients grow (1k to 20k) and
  as items grow;
- memory: peak resident memory and seconds of two FedEM rounds at ML-1M size
  (6,040 clients x 3,706 items x d=16, synthetic) and on LastFM-2K (1,892 x
  17,632; the real data when it is in the datasets folder, else synthetic of
  its size), each in a fresh subprocess.

``--device`` (parts engine and memory): where the engine's tensors live. On
cuda the per-client reference (a CPU loop) is not timed, the floor is measured
on the GPU, every timing waits for the GPU to finish, and the memory part also
reports the peak GPU memory allocated.

Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedem_private.experiments.runner import prepare
from fedem_private.reference import round as reference
from fedem_private.reference.aggregation import similarity_weights_cvxpy
from fedem_private.server.aggregation import (
    fedavg_weights,
    pairwise_sq_distances,
    similarity_weights,
)

from ..common import SHARED, emit, machine, run_config


def _round_times(sim, rounds: int) -> list[float]:
    return [sim.step().seconds for _ in range(rounds)]


def engine(method: str, rounds: int = 3, with_reference: bool = True,
           merge: str | None = None, device: str = "cpu") -> dict[str, Any]:
    """Vectorised seconds per round (rounds 2..) and the reference's round 2 (CPU only:
    on another ``device`` the reference is not timed)."""
    cfg = run_config("ml-100k", **{"federation.method": method, "federation.merge": merge,
                                   "train.rounds": rounds + 1, "train.eval_every": 10_000,
                                   "train.device": device})
    sim = prepare(cfg)
    with_reference = with_reference and sim.view.device.type == "cpu"
    sim.step()  # round 1: warm-up (merging starts in round 2)
    out: dict[str, Any] = {"method": method if merge is None else f"{method}-{merge}",
                           "backbone": sim.view.cfg.federation.backbone,
                           "device": sim.view.device.type,
                           # the engine's rounds run tuned, the reference between them
                           # with glibc's defaults (fedem_private.hostmem)
                           "host_allocator_tuned": sim.view.host_allocator_tuned}
    if with_reference:
        t0 = time.perf_counter()
        reference.simulation_round(sim)
        out["reference_s"] = time.perf_counter() - t0
    times = _round_times(sim, rounds - 1)
    with _recording_plans() as plans:  # the last timed round's chunks, for adam_bound
        times += _round_times(sim, 1)
    out["vectorised_s"] = float(np.mean(times))
    if with_reference:
        out["speedup"] = out["reference_s"] / out["vectorised_s"]
    out["floor"] = floor(sim.state.q_local)
    fl = out["floor"]
    out["vs_passes"] = out["vectorised_s"] / fl["passes_s"]
    out["vs_gram_and_passes"] = out["vectorised_s"] / (fl["gram_s"] + fl["passes_s"])
    if plans:
        out["adam_bound"] = adam_bound(plans, int(sim.state.q_local.shape[-1]),
                                       sim.state.q_local.device)
        out["adam_bound"]["state_rows"] = int(np.prod(sim.state.q_local.shape[:2]))
        out["adam_vs_passes"] = out["adam_bound"]["tight_s"] / fl["passes_s"]
    return out


def _adam_steps(steps: list[list[torch.Tensor]]) -> None:
    """``fused_adam`` on each step's (param, grad, m, v), at step counts 1, 2, ..."""
    from fedem_private.models.base import LocalTrainConfig, fused_adam

    cfg = LocalTrainConfig()
    for s, (param, grad, m, v) in enumerate(steps):
        fused_adam([param], [grad], [m], [v], s + 1, cfg)


@contextlib.contextmanager
def _recording_plans() -> Iterator[list[tuple[int, np.ndarray, np.ndarray]]]:
    """Record (rows, active clients per step, touched rows per client) of every plan the
    MF backbone's local training makes meanwhile (one per chunk)."""
    from fedem_private.models import mf

    made: list[tuple[int, np.ndarray, np.ndarray]] = []
    original = mf.make_plan

    def spy(*args: Any, **kwargs: Any):
        plan = original(*args, **kwargs)
        made.append((int(plan.rows), plan.active.copy(),
                     np.array([t.shape[0] for t in plan.touched])))
        return plan

    mf.make_plan = spy
    try:
        yield made
    finally:
        mf.make_plan = original


def adam_bound(plans: list[tuple[int, np.ndarray, np.ndarray]], d: int,
               device: torch.device) -> dict[str, float]:
    """The item table's exact Adam steps of one round's local training, replayed alone.

    Exact per-step Adam (torch.optim.Adam, what the per-client references run) moves every
    row a client has touched at every one of its steps: a row keeps momentum once it has
    had a gradient. ``padded_s`` replays the engine's own steps (each chunk's first
    ``active[s]`` clients, all ``rows`` of its compact table, as ``fused_adam`` does);
    ``tight_s`` each client's own touched rows only, packed so that a step is one
    contiguous prefix: nearly the least an exact implementation must do with this kernel
    (only a row not yet reached in the first epoch could skip a step). Times are the
    fastest of 3, of torch's fused Adam kernel; row counts are in ``*_rows``.
    """
    padded = tight = 0.0
    padded_rows = tight_rows = 0
    for rows, active, touched in plans:
        k = int(active.max(initial=0))
        if k == 0:
            continue
        bufs = [torch.rand((k, rows, d), device=device) for _ in range(4)]
        flat = [b.view(-1, d) for b in bufs]
        cum = np.concatenate(([0], np.cumsum(touched)))
        packed = [int(cum[a]) for a in active.tolist()]  # the first a clients' own rows
        engine_steps = [[b[:a] for b in bufs] for a in active.tolist()]  # all their rows
        tight_steps = [[f[:r] for f in flat] for r in packed]
        padded += _fastest(functools.partial(_adam_steps, engine_steps), repeats=3,
                           device=device)
        tight += _fastest(functools.partial(_adam_steps, tight_steps), repeats=3,
                          device=device)
        padded_rows += int(active.sum()) * rows
        tight_rows += sum(packed)
    return {"padded_s": padded, "tight_s": tight, "padded_rows": padded_rows,
            "tight_rows": tight_rows}


def _sync(device: torch.device | None) -> None:
    """Wait for the device's queued kernels (a no-op on the CPU and for None)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _fastest(fn, repeats: int = 5, device: torch.device | None = None) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def floor(tables: torch.Tensor) -> dict[str, float]:
    """The unavoidable work of a round on this machine, for (n, m, d) float32 tables.

    ``passes_s``: four in-place element-wise passes over the tables (read and
    write every value once each); ``gram_s``: one float32 GEMM of the flattened
    tables' Gram matrix. Fastest of 5 repeats each, on the tables' device.
    """
    state = tables.detach().to(torch.float32).clone()
    flat = state.reshape(state.shape[0], -1)
    passes = _fastest(lambda: [state.mul_(1.0) for _ in range(4)], device=state.device)
    gram = _fastest(lambda: flat @ flat.T, device=state.device)
    return {"passes_s": passes, "gram_s": gram}


def aggregation(n_clients: int | None = None) -> dict[str, Any]:
    """Closed-form vs cvxpy weights on uploads from a real ML-100K round."""
    cfg = run_config("ml-100k", **{"federation.method": "fedsim", "train.rounds": 2,
                                   "train.eval_every": 10_000})
    sim = prepare(cfg)
    sim.step()
    tables = sim.state.q_local if n_clients is None else sim.state.q_local[:n_clients]
    n = tables.shape[0]
    p = fedavg_weights(sim.sizes[:n])
    t0 = time.perf_counter()
    d = pairwise_sq_distances(tables)
    t_dist = time.perf_counter() - t0
    t0 = time.perf_counter()
    w_fast = similarity_weights(p, d, sim.view.cfg.federation.alpha)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    w_ref = similarity_weights_cvxpy(p, d, sim.view.cfg.federation.alpha)
    t_ref = time.perf_counter() - t0
    return {"clients": n, "distances_s": t_dist, "closed_form_s": t_fast, "cvxpy_s": t_ref,
            "speedup": t_ref / t_fast, "max_abs_diff": float((w_fast - w_ref).abs().max())}


def graph(sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Seconds of one graph aggregation: ML-100K uploads after a round, then random tables."""
    from fedem_private.server.graph import graph_tables

    cfg = run_config("ml-100k", **{"federation.method": "gpfedrec", "train.rounds": 2,
                                   "train.eval_every": 10_000})
    sim = prepare(cfg)
    sim.step()
    rows = []
    inputs = [("ml-100k uploads", sim.state.q_local)]
    g = torch.Generator().manual_seed(0)
    inputs += [(f"random {n}x{m}", torch.randn(n, m, 16, generator=g) * 0.1) for n, m in sizes]
    for what, tables in inputs:
        t0 = time.perf_counter()
        graph_tables(tables)
        rows.append({"what": what, "clients": int(tables.shape[0]),
                     "items": int(tables.shape[1]), "seconds": time.perf_counter() - t0})
        print(f"  graph: {rows[-1]}", flush=True)
        del tables
    return rows


def scaling(clients: list[int], items: list[int]) -> list[dict[str, Any]]:
    """FedMF seconds per round on synthetic data of growing size (mean of rounds 2-3)."""
    rows = []
    for n, m in [(c, items[0]) for c in clients] + [(clients[0], i) for i in items[1:]]:
        cfg = run_config("synthetic", **{"data.synthetic.n_users": n,
                                         "data.synthetic.n_items": m,
                                         "train.rounds": 3, "train.eval_every": 10_000})
        sim = prepare(cfg)
        sim.step()
        rows.append({"clients": sim.view.split.n_users, "items": m,
                     "interactions": int(sim.view.split.train_counts.sum()),
                     "seconds_per_round": float(np.mean(_round_times(sim, 2)))})
        print(f"  scaling: {rows[-1]}", flush=True)
    return rows


MEMORY_DATA = {
    # ML-1M's size; no copy of ML-1M exists on these machines (datasets README)
    "ml-1m-size": ("synthetic", {"data.synthetic.n_users": 6040, "data.synthetic.n_items": 3706,
                                 "data.synthetic.mean_activity": 165}),
    # LastFM-2K's size, when the real data is absent (about 49 interactions per user)
    "lastfm-2k-size": ("synthetic", {"data.synthetic.n_users": 1892,
                                     "data.synthetic.n_items": 17632,
                                     "data.synthetic.mean_activity": 49}),
    # issue 43's scale target: 100,000 synthetic clients x 20,000 items, about 50 each
    "100k-clients": ("synthetic", {"data.synthetic.n_users": 100_000,
                                   "data.synthetic.n_items": 20_000,
                                   "data.synthetic.mean_activity": 50}),
}


def memory_child(method: str, data: str, device: str = "cpu") -> None:
    """Run in a subprocess: two rounds; print peak RSS (GiB) as JSON (and, on cuda, the
    peak GPU memory allocated)."""
    if data == "lastfm-2k" and not (Path(os.environ.get("FEDEM_DATA_ROOT", SHARED))
                                    / "lastfm-2k").is_dir():
        data = "lastfm-2k-size"
    dataset, over = MEMORY_DATA.get(data, (data, {}))
    cfg = run_config(dataset, **over, **{"federation.method": method,
                                         "train.rounds": 2, "train.eval_every": 10_000,
                                         "train.device": device})
    t0 = time.perf_counter()
    sim = prepare(cfg)
    times = _round_times(sim, 2)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    row = {"method": method, "data": data, "device": sim.view.device.type,
           "clients": sim.view.split.n_users, "items": sim.view.split.n_items, "round_s": times,
           "peak_rss_gib": peak, "wall_s": time.perf_counter() - t0}
    if sim.view.device.type == "cuda":
        row["peak_gpu_gib"] = torch.cuda.max_memory_allocated(sim.view.device) / 2**30
    print(json.dumps(row))


def memory(method: str, data: str, device: str = "cpu") -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.probes.speed", "--memory-child",
                           method, "--memory-data", data, "--device", device],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="engine,backbones,graph,aggregation,scaling,memory")
    ap.add_argument("--backbones", default="fedncf,pfedrec,gpfedrec,fedrap",
                    help="presets timed by the backbones part")
    ap.add_argument("--no-em", action="store_true", help="backbones part: skip the +EM rounds")
    ap.add_argument("--quick", action="store_true", help="smaller scaling grid, no memory part")
    ap.add_argument("--memory-data", default="ml-1m-size,lastfm-2k",
                    help="memory part: ml-1m-size, lastfm-2k (real data if present, else "
                         "lastfm-2k-size), or any dataset name")
    ap.add_argument("--device", default="cpu",
                    help="parts engine and memory: cpu, cuda or auto (default cpu)")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.memory_data, args.device)
        return
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"benchmark": "speed", "machine": machine()}
    if "engine" in parts:
        result["engine"] = [engine("fedmf", device=args.device),
                            engine("fedem", device=args.device)]
        for row in result["engine"]:
            fl = row["floor"]
            ref = (f"reference {row['reference_s']:.1f} s/round, {row['speedup']:.1f}x"
                   if "reference_s" in row else "reference not timed (CPU loop)")
            print(f"engine {row['method']:6} on {row['device']}: vectorised "
                  f"{row['vectorised_s']:.2f} s/round, {ref}; "
                  f"floor: 4 passes {fl['passes_s']:.3f} s ({row['vs_passes']:.1f}x), "
                  f"Gram GEMM {fl['gram_s']:.3f} s (round / (GEMM + passes) "
                  f"{row['vs_gram_and_passes']:.1f}x)", flush=True)
            if "adam_bound" in row:
                ab = row["adam_bound"]
                print(f"  exact Adam of local training alone: {ab['tight_s']:.3f} s "
                      f"({ab['tight_rows'] / ab['state_rows']:.1f} row updates per state row; "
                      f"{row['adam_vs_passes']:.1f}x the 4 passes), as the engine pads it "
                      f"{ab['padded_s']:.3f} s ({ab['padded_rows'] / ab['state_rows']:.1f})",
                      flush=True)
    if "backbones" in parts:
        names = args.backbones.split(",")
        result["backbones"] = [engine(m, merge=g) for m in names for g in (None, "em")
                               if not (args.no_em and g)]
        for row in result["backbones"]:
            print(f"backbone {row['backbone']:8} {row['method']:11}: vectorised "
                  f"{row['vectorised_s']:.2f} s/round, reference {row['reference_s']:.1f} "
                  f"s/round, {row['speedup']:.1f}x", flush=True)
    if "graph" in parts:
        result["graph"] = graph([(6040, 3706)])
    if "aggregation" in parts:
        agg = aggregation()
        result["aggregation"] = agg
        print(f"aggregation ({agg['clients']} clients): closed form {agg['closed_form_s']:.3f} s,"
              f" cvxpy {agg['cvxpy_s']:.1f} s, {agg['speedup']:.0f}x, "
              f"max |diff| {agg['max_abs_diff']:.1e}; distances {agg['distances_s']:.2f} s",
              flush=True)
    if "scaling" in parts:
        clients = [1000, 2000, 5000] if args.quick else [1000, 2000, 5000, 10000, 20000]
        items = [1000, 2000, 4000] if args.quick else [1000, 2000, 4000, 8000]
        result["scaling"] = scaling(clients, items)
    if "memory" in parts and not args.quick:
        result["memory"] = [memory("fedem", data, args.device)
                            for data in args.memory_data.split(",")]
        for row in result["memory"]:
            gpu = (f", peak GPU {row['peak_gpu_gib']:.2f} GiB" if "peak_gpu_gib" in row
                   else "")
            print(f"memory {row['method']} {row['data']} {row['clients']}x{row['items']} on "
                  f"{row['device']}: peak RSS {row['peak_rss_gib']:.2f} GiB{gpu}, rounds "
                  f"{row['round_s']}", flush=True)
    emit(result)


if __name__ == "__main__":
    torch.set_num_threads(torch.get_num_threads())
    main()
