"""Where a round's time goes, and how the chunk size moves it (issue 19).

    python -m benchmarks.probes.profile_round [--data ml-1m-size|ml-100k|lastfm-2k] [--method fedem]
                                       [--device cpu|cuda|auto] [--chunks 64,256,1024]
                                       [--budget-mb 2048] [--profile [--sort cumulative]]
                                       [--floor] [--timed N] [--set KEY=VALUE ...]

For each chunk cap (the most clients trained side by side; the memory budget
still bounds it): round 1 is a warm-up, then the seconds of rounds 2 and 3
(``--timed N``: rounds 2 .. N + 1) and of one evaluation. ``--profile`` adds a
cProfile of one more round at the last cap (top functions by own time, or by
cumulative time with ``--sort cumulative``). Prints a table and a final JSON
line, with the timed rounds' CPU time (user and system), minor page faults and
the peak resident memory; ``FEDEM_PRIVATE_MALLOC=system`` in the environment
times the default allocator (fedem_private/hostmem.py). ``--floor`` adds the
machine's floor for the same tables
(:func:`benchmarks.probes.speed.floor`) and the faster timed round over it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fedem_private.experiments.runner import prepare
from fedem_private.simulation import loop

from ..common import emit, machine, run_config
from .speed import MEMORY_DATA, _sync, floor


@contextmanager
def gpu_busy(device: torch.device) -> Iterator[list[float]]:
    """Sample the GPU's utilisation (percent of time a kernel ran, as nvidia-smi reads it,
    through ``torch.cuda.utilization``) every 50 ms while the block runs; the list is
    empty on the CPU or where NVML is missing."""
    samples: list[float] = []
    if device.type != "cuda":
        yield samples
        return
    try:
        torch.cuda.utilization(device)
    except Exception:  # no NVML (pynvml) on this machine: nothing to sample
        yield samples
        return
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            samples.append(float(torch.cuda.utilization(device)))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def measure(data: str, method: str, device: str, cap: int, budget_mb: int,
            profile: bool, with_floor: bool = False, sort: str = "tottime",
            extra: dict[str, Any] | None = None, timed: int = 2) -> dict[str, Any]:
    dataset, over = MEMORY_DATA.get(data, (data, {}))
    over = {**over, **(extra or {})}
    cfg = run_config(dataset, **over, **{"federation.method": method, "train.rounds": 10,
                                         "train.eval_every": 10_000, "train.device": device,
                                         "train.memory_budget_mb": budget_mb})
    old = loop.MAX_CHUNK, loop.MAX_CHUNK_CUDA
    loop.MAX_CHUNK = loop.MAX_CHUNK_CUDA = cap
    try:
        sim = prepare(cfg)
        chunk = sim._chunk_size()
        sim.step()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        with gpu_busy(sim.view.device) as busy:
            rounds = [sim.step().seconds for _ in range(timed)]
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        with sim.host_memory():
            sim.evaluate()  # as a run's rounds evaluate: inside step, so tuned on the CPU
        _sync(sim.view.device)
        row: dict[str, Any] = {"data": data, "method": method, "device": sim.view.device.type,
                               "cap": cap, "chunk": chunk, "round_s": rounds,
                               # the timed rounds' CPU time in the process and in the
                               # kernel on its behalf, and their minor page faults
                               "user_s": r1.ru_utime - r0.ru_utime,
                               "sys_s": r1.ru_stime - r0.ru_stime,
                               "minor_faults": r1.ru_minflt - r0.ru_minflt,
                               "host_allocator_tuned": sim.view.host_allocator_tuned,
                               "eval_s": time.perf_counter() - t0,
                               # mean GPU utilisation over the timed rounds (percent)
                               "gpu_util_pct": sum(busy) / len(busy) if busy else None}
        if with_floor:  # the machine's floor for these tables, in the same process
            row["floor"] = floor(sim.state.q_local)
            row["round_over_floor"] = min(rounds) / (row["floor"]["gram_s"]
                                                     + row["floor"]["passes_s"])
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            sim.step()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(30)
            row["profile"] = buf.getvalue()
    finally:
        loop.MAX_CHUNK, loop.MAX_CHUNK_CUDA = old
    return row


def _value(text: str) -> Any:
    """A --set value as TOML reads it (1, 0.5, true, "x"), or else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="ml-100k")
    ap.add_argument("--method", default="fedem")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--chunks", default=str(loop.MAX_CHUNK),
                    help="chunk caps to compare (default: the CPU's)")
    ap.add_argument("--budget-mb", type=int, default=2048)
    ap.add_argument("--timed", type=int, default=2,
                    help="rounds timed after the warm-up round 1, 1-8 (default 2: rounds 2 and 3)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                    help="--profile: order functions by own time or by cumulative time")
    ap.add_argument("--floor", action="store_true",
                    help="also time the floor of benchmarks.probes.speed (one Gram GEMM of the "
                         "tables, four passes over them) and report the faster round / floor")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override (dotted key, TOML value), e.g. "
                         "data.synthetic.n_items=2000; repeatable")
    args = ap.parse_args()
    extra = {k: _value(v) for k, v in (a.split("=", 1) for a in args.set)}
    caps = [int(c) for c in args.chunks.split(",")]
    rows = []
    for i, cap in enumerate(caps):
        row = measure(args.data, args.method, args.device, cap, args.budget_mb,
                      args.profile and i == len(caps) - 1, args.floor, args.sort, extra,
                      min(max(1, args.timed), 8))  # of the config's 10 rounds
        rows.append(row)
        print(f"{row['data']} {row['method']} on {row['device']}: cap {cap:5d} -> chunk "
              f"{row['chunk']:5d}: rounds {' / '.join(f'{r:.2f}' for r in row['round_s'])} s, "
              f"evaluation {row['eval_s']:.2f} s; CPU user {row['user_s']:.1f} s, system "
              f"{row['sys_s']:.1f} s, {row['minor_faults']} minor faults (allocator "
              f"{'tuned' if row['host_allocator_tuned'] else 'system'})"
              + (f"; GPU busy {row['gpu_util_pct']:.0f}%" if row["gpu_util_pct"] is not None
                 else ""), flush=True)
        if "floor" in row:
            print(f"  floor: Gram GEMM {row['floor']['gram_s']:.2f} s, 4 passes "
                  f"{row['floor']['passes_s']:.3f} s; faster round / floor "
                  f"{row['round_over_floor']:.2f}x", flush=True)
        if "profile" in row:
            print(row["profile"])
    emit({"benchmark": "profile_round", "machine": machine(),
          "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
          "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
          "peak_gpu_gib": (torch.cuda.max_memory_allocated() / 2**30
                           if torch.cuda.is_available() else None),
          "overrides": extra,
          "rows": [{k: v for k, v in r.items() if k != "profile"} for r in rows]})


if __name__ == "__main__":
    main()
