"""Small recorded synthetic runs shared by the recording and attack tests (seconds each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedem_private.experiments.recording import RecordSpec, recording_setup
from fedem_private.experiments.runner import execute
from fedem_private.simulation.config import RunConfig, with_overrides

SMALL: dict[str, Any] = {
    "data.synthetic.n_users": 60,
    "data.synthetic.n_items": 120,
    "train.rounds": 3,
    "train.eval_every": 3,
}


def small_config(**overrides: Any) -> RunConfig:
    """A 60-user, 120-item synthetic run of 3 rounds, with ``overrides`` (dotted keys)."""
    values = dict(SMALL)
    values.update({k.replace("__", "."): v for k, v in overrides.items()})
    return with_overrides(RunConfig(), values)


def recorded_run(out: Path, rounds: str = "1,last", clients: int = 40,
                 **overrides: Any) -> Path:
    """Run :func:`small_config` with recording into ``out``; returns ``out``."""
    spec = RecordSpec.parse(rounds, clients)
    execute(small_config(**overrides), out, force=True, setup=recording_setup(spec))
    return out
