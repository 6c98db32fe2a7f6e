"""Helpers shared by the benchmark scripts (run by hand or with ``tox -e bench``)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from fedem_private.config import RunConfig, with_overrides
from fedem_private.runner import prepare

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def data_dir(name: str) -> str:
    """Reference dataset folder beside the project (``--data-root`` or FEDEM_DATA_ROOT)."""
    root = Path(os.environ.get("FEDEM_DATA_ROOT", SHARED))
    path = root / name
    if not path.is_dir():
        raise SystemExit(f"benchmark needs the {name} dataset at {path}; set FEDEM_DATA_ROOT")
    return str(path)


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
    return {"metrics": last, "seconds_per_round": sum(h.seconds for h in history) / len(history),
            "privacy": sim.privacy.summary()}


def emit(obj: Any) -> None:
    """The final JSON line of a benchmark."""
    print(json.dumps(obj, default=float))
