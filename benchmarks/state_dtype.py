"""bfloat16 per-client state against float32 (issue 43, item 4): accuracy, time, memory.

    python -m benchmarks.state_dtype --dataset ml-100k --method fedmf --seeds 0 1 2
    python -m benchmarks.state_dtype --dataset lastfm-2k --method fedem --rounds 3 --seeds 0
    python -m benchmarks.state_dtype --config runs/tune/fedem-ml-100k/best.toml --name fedem-tuned

Runs each (state dtype, seed) as its own ``fedem-private run`` child process, so its
peak resident memory (``ru_maxrss`` from ``os.wait4``) is its own; a run whose
``summary.json`` exists is read, not run again (the memory and time columns then come
from ``state_dtype.json`` beside it). Writes
``benchmarks/results/speed/state_dtype-<dataset>-<method>.md`` with each dtype's mean ±
sd over seeds and whether the difference exceeds twice its standard error
(:func:`benchmarks.common.seed_noise`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import data_dir, seed_noise

DTYPES = ("float32", "bfloat16")
METRICS = (("sampled", "hr@10"), ("full", "hr@10"), ("sampled", "ndcg@10"))


def run_one(out: Path, setting: list[str], seed: int, dtype: str) -> dict[str, float]:
    """Run (or read) one point (``setting``: its ``fedem-private run`` flags); returns its
    metrics, wall seconds and peak RSS (GB)."""
    stamp = out / "state_dtype.json"
    if not (out / "summary.json").is_file():
        cmd = [sys.executable, "-m", "fedem_private.cli", "run", *setting, "--seed", str(seed),
               "--state-dtype", dtype, "--out", str(out), "--force", "--no-progress"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"run failed: {' '.join(cmd)}")
        stamp.write_text(json.dumps({"seconds": time.perf_counter() - t0,
                                     "peak_rss_gb": usage.ru_maxrss / 2**20}))
    summary = json.loads((out / "summary.json").read_text())
    row = {f"{kind} {name}": summary["metrics"][kind][name] for kind, name in METRICS}
    extra = json.loads(stamp.read_text()) if stamp.is_file() else {}
    row["seconds"] = extra.get("seconds", float("nan"))
    row["peak_rss_gb"] = extra.get("peak_rss_gb", float("nan"))
    row["seconds_per_round"] = summary.get("seconds_per_round", float("nan"))
    return row


def _ms(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table(rows: dict[str, list[dict[str, float]]]) -> str:
    keys = [f"{k} {n}" for k, n in METRICS] + ["seconds_per_round", "peak_rss_gb"]
    lines = ["| state dtype | seeds | " + " | ".join(keys) + " |",
             "|---" * (len(keys) + 2) + "|"]
    for dtype, runs in rows.items():
        cells = []
        for k in keys:
            m, s = _ms([r[k] for r in runs])
            cells.append(f"{m:.4f} ± {s:.4f}" if "hr" in k or "ndcg" in k else f"{m:.2f}")
        lines.append(f"| {dtype} | {len(runs)} | " + " | ".join(cells) + " |")
    if all(len(v) > 1 for v in rows.values()) and len(rows) == 2:
        a, b = (rows[d] for d in DTYPES)
        for k in keys[:3]:
            (ma, sa), (mb, sb) = _ms([r[k] for r in a]), _ms([r[k] for r in b])
            diff, two_se, beyond = seed_noise(mb, sb, len(b), ma, sa, len(a))
            lines.append(f"\nbfloat16 - float32, {k}: {diff:+.4f} (2 s.e. {two_se:.4f}: "
                         f"{'beyond' if beyond else 'within'} seed noise)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--method", default="fedmf")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=None,
                        help="default: the last round only")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=None,
                        help="a run config (e.g. a tune best.toml) instead of --method, "
                        "--rounds, --eval-every; --dataset must name its dataset")
    parser.add_argument("--name", default=None, help="the config's name in paths and titles")
    parser.add_argument("--runs", default="runs/state_dtype")
    parser.add_argument("--out", default="benchmarks/results/speed")
    args = parser.parse_args(argv)
    if args.config:
        setting, what = ["--config", args.config], args.name or Path(args.config).stem
        flags = f"--config {args.config}" + (f" --name {args.name}" if args.name else "")
    else:
        every = args.eval_every or args.rounds
        setting = ["--dataset", args.dataset, "--data-dir", data_dir(args.dataset),
                   "--protocol", "strict", "--method", args.method, "--rounds",
                   str(args.rounds), "--eval-every", str(every)]
        what = f"{args.method}-r{args.rounds}"
        flags = f"--dataset {args.dataset} --method {args.method} --rounds {args.rounds}"
    rows: dict[str, list[dict[str, float]]] = {d: [] for d in DTYPES}
    for seed in args.seeds:
        for dtype in DTYPES:
            out = Path(args.runs) / args.dataset / f"{what}-{dtype}-seed{seed}"
            rows[dtype].append(run_one(out, setting, seed, dtype))
    text = (f"# state dtype: {what} on {args.dataset}, strict\n\n"
            f"`python -m benchmarks.state_dtype {flags} --seeds "
            f"{' '.join(map(str, args.seeds))}`"
            f" on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            "one thread per run (wall time is not a speed claim on a shared machine)\n\n"
            + table(rows))
    path = Path(args.out) / f"state_dtype-{args.dataset}-{what}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
