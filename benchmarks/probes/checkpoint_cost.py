"""What a checkpoint costs: its size, the seconds to write and read it, and the round after
reading it (fedem_private/experiments/checkpoint.py).

Two processes, as a killed run and its resumption are: ``save`` runs ``--rounds`` rounds of
the config and writes the checkpoint; ``load`` (a fresh process) reads it and runs one
round. Timings go to stdout, one line each::

    python -m benchmarks.probes.checkpoint_cost save CONFIG.toml /tmp/cost.checkpoint
    python -m benchmarks.probes.checkpoint_cost load CONFIG.toml /tmp/cost.checkpoint
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from fedem_private.experiments import checkpoint as checkpoints
from fedem_private.experiments.runner import load_data, prepare
from fedem_private.simulation.config import load_toml, to_dict, to_toml, with_overrides


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("save", "load"))
    parser.add_argument("config", help="a run config (TOML)")
    parser.add_argument("path", help="where the checkpoint goes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds before saving")
    args = parser.parse_args(argv)
    cfg = with_overrides(load_toml(args.config), {"train.rounds": args.rounds + 1,
                                                  "train.eval_every": args.rounds + 1})
    cfg = cfg.validate().resolved()
    config = to_toml(to_dict(cfg))
    ck = checkpoints.Checkpointing(Path(args.path), 1)
    if args.step == "save":
        sim = prepare(cfg)
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            sim.step()
            print(f"round {sim.state.round}: {time.perf_counter() - t0:.1f} s", flush=True)
        t0 = time.perf_counter()
        checkpoints.save(ck, config, sim, [], 0.0, [])
        print(f"save: {time.perf_counter() - t0:.1f} s, {ck.path.stat().st_size / 1e6:.1f} MB")
    else:
        t0 = time.perf_counter()
        resumed = checkpoints.load(ck, config)
        assert resumed is not None, f"no checkpoint at {ck.path}"
        print(f"load: {time.perf_counter() - t0:.1f} s", flush=True)
        t0 = time.perf_counter()  # a checkpoint holds no data: the config reads it again
        resumed.sim.attach_split(load_data(cfg)[1])
        print(f"data read again: {time.perf_counter() - t0:.1f} s", flush=True)
        t0 = time.perf_counter()
        resumed.sim.step()
        print(f"round {resumed.round} (resumed): {time.perf_counter() - t0:.1f} s")
        checkpoints.discard(ck)
    print(f"peak resident: {_peak_gb():.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
