"""Run a benchmark module as its user would (``python -m benchmarks.X``), for the tests of
the peer benchmarks' command lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` from the repository root, one torch thread; its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
