"""Helpers shared by the benchmark scripts (run by hand or with ``tox -e bench``)."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedem_private.experiments.analysis import RunConfig, with_overrides
from fedem_private.experiments.runner import last_merge_rho, prepare

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def data_dir(name: str) -> str:
    """Reference dataset folder beside the project (``--data-root`` or FEDEM_DATA_ROOT)."""
    root = Path(os.environ.get("FEDEM_DATA_ROOT", SHARED))
    path = root / name
    if not path.is_dir():
        raise SystemExit(f"benchmark needs the {name} dataset at {path}; set FEDEM_DATA_ROOT")
    return str(path)


def seed_noise(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int
               ) -> tuple[float, float, bool]:
    """(difference of means m1 - m2, twice its standard error, whether it exceeds that).

    The standard error of a difference of two independent means, sqrt(s1^2 / n1 +
    s2^2 / n2): a rough two-sided 95% rule for a handful of seeds.
    """
    two_se = 2 * math.sqrt(s1 * s1 / n1 + s2 * s2 / n2)
    diff = m1 - m2
    return diff, two_se, abs(diff) > two_se


def mean_std(values: list[float | None]) -> tuple[float, float, int]:
    """(mean, std with ddof 1, count) of the values given, None left out; std NaN for one
    value, and (NaN, NaN, 0) for none."""
    a = np.asarray([v for v in values if v is not None], dtype=float)
    if a.size == 0:
        return math.nan, math.nan, 0
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else math.nan, int(a.size)


def fmt_mean_std(m: float, s: float) -> str:
    """"m ± s" to 4 decimals; "m" alone when s is NaN (one seed), "-" when m is NaN."""
    if math.isnan(m):
        return "-"
    return f"{m:.4f}" if math.isnan(s) else f"{m:.4f} ± {s:.4f}"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count()}


def run_config(dataset: str, **overrides: Any) -> RunConfig:
    over = {"data.dataset": dataset,
            "data.data_dir": None if dataset == "synthetic" else data_dir(dataset)}
    over.update(overrides)
    return with_overrides(RunConfig(), over)


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run a config in memory; final metrics and seconds per round."""
    sim = prepare(cfg)
    history = sim.run()
    last = next(h.metrics for h in reversed(history) if h.metrics)
    rho = last_merge_rho(history)
    return {"metrics": last, "seconds_per_round": sum(h.seconds for h in history) / len(history),
            "privacy": sim.view.privacy_summary(), "merge_rho_mean": rho}


def emit(obj: Any) -> None:
    """The final JSON line of a benchmark."""
    print(json.dumps(obj, default=float))


def run_point(point: dict[str, Any], out: str, threads: int) -> str:
    """Train one grid point ``{"name", "dataset", "overrides", ...}``; write its JSON atomically.

    Everything in ``point`` besides the overrides is copied into the record.
    """
    import time

    torch.set_num_threads(threads)
    cfg = run_config(point["dataset"], **point["overrides"])
    t0 = time.perf_counter()
    res = train(cfg)
    record = {k: v for k, v in point.items() if k != "overrides"}
    record.update({"metrics": res["metrics"], "privacy": res["privacy"],
                   "seconds_per_round": res["seconds_per_round"],
                   "merge_rho_mean": res["merge_rho_mean"],
                   "wall_s": time.perf_counter() - t0, "machine": machine(),
                   "overrides": point["overrides"]})
    path = Path(out) / f"{point['name']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, path)
    return path.name


def run_grid(points: list[dict[str, Any]], out: Path, jobs: int) -> None:
    """Run the points not finished yet (one JSON each in ``out``), ``jobs`` at a time."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    out.mkdir(parents=True, exist_ok=True)
    todo = [p for p in points if not (out / f"{p['name']}.json").exists()]
    print(f"{len(todo)} of {len(points)} grid points to run", flush=True)
    threads = max(1, (os.cpu_count() or 2) // jobs)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_point, p, str(out), threads) for p in todo]
        for fut in as_completed(futures):
            print(f"done {fut.result()}", flush=True)


def load_records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def checkout_problem(peer_dir: str | None, needs: str, files: tuple[str, ...] | list[str]
                     ) -> str | None:
    """Why a published code's checkout at ``peer_dir`` cannot be run (None when it can):
    ``needs`` when no folder is given, else the ``files`` it lacks (the peer benchmarks'
    one-line refusal)."""
    if not peer_dir:
        return needs
    missing = [f for f in files if not (Path(peer_dir) / f).is_file()]
    if missing:
        return f"{needs}; {peer_dir} lacks {', '.join(missing)}"
    return None


def cuda_calls_on_cpu() -> None:
    """A published code's shim: ``.cuda()`` on tensors and modules returns the object
    itself, so code written for a GPU runs unchanged on the CPU (the peer benchmarks)."""
    import torch

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
