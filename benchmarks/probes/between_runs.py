"""Resident memory after each of several runs in one process (docs/speed.md, "Memory between runs").

A `fedem-private tune` worker or the ladder runs config after config in one process. This
probe does the same with the given run configs (each a ``config.toml`` a run or a trial
wrote) and prints the process's resident memory (VmRSS) and its peak so far (VmHWM) after
each run. ``--keep-cycles`` turns off what ``execute`` does after a run
(:func:`fedem_private.hostmem.release_between_runs`: collect the finished Simulation's
reference cycles, trim the heap), to show what a process kept without it.

    OMP_NUM_THREADS=1 python -m benchmarks.probes.between_runs \\
        benchmarks/results/ladder/tuning/pfedrec-cdp4-lastfm-2k/trials/000{4,3,2,4}/config.toml

Runs go to temporary folders, removed at the end. Prints one line per run and a final
JSON list.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from pathlib import Path


def _status_mb(*keys: str) -> dict[str, float]:
    """The named /proc/self/status figures (kB there) in MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in keys:
            out[name] = int(value.split()[0]) / 1024
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", type=Path)
    ap.add_argument("--keep-cycles", action="store_true",
                    help="skip the collection and trim after each run (the old behaviour)")
    args = ap.parse_args(argv)
    from fedem_private.experiments import runner
    from fedem_private.simulation.config_io import from_dict

    if args.keep_cycles:
        runner.release_between_runs = lambda: 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(args.configs):
            cfg = from_dict(tomllib.loads(path.read_text())).validate().resolved()
            t0 = time.perf_counter()
            runner.execute(cfg, Path(tmp) / f"run{i}", force=True)
            mem = _status_mb("VmRSS", "VmHWM")
            row = {"config": str(path), "seconds": round(time.perf_counter() - t0, 1),
                   "rss_mib": round(mem["VmRSS"]), "peak_mib": round(mem["VmHWM"])}
            rows.append(row)
            print(f"{path}: {row['seconds']} s, resident {row['rss_mib']} MiB after the run, "
                  f"peak so far {row['peak_mib']} MiB", flush=True)
    print(json.dumps({"keep_cycles": args.keep_cycles, "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
