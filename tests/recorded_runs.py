"""Small recorded synthetic runs shared by the recording and attack tests (seconds each)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

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


@dataclass
class DdpRecording:
    """A tiny ddp-skellam run that recorded its last round (:func:`ddp_recorded_round`)."""

    sim: Any  # the Simulation
    run_dir: Path
    transcript: dict[str, np.ndarray]  # what the server saw in the last round
    inputs: dict[tuple[int, int], np.ndarray]  # (round, client) -> its b-bit input, unmasked
    shares: dict[tuple[int, int], np.ndarray]  # (round, client) -> its Skellam noise share


def ddp_recorded_round(run_dir: Path, settings: dict[str, Any]) -> DdpRecording:
    """Run ddp-skellam with ``settings`` on the neighbour harness's tiny split, recording
    its last round into ``run_dir``; spies on the client side keep every client's b-bit
    input (before masking) and its noise share as the clients produced them."""
    from fedem_private.experiments import neighbours as nb
    from fedem_private.privacy import skellam
    from fedem_private.simulation.loop import Simulation

    rec = DdpRecording(None, run_dir, {}, {}, {})
    encode, noise = skellam.encode, skellam.skellam_noise

    def keep(store: dict, round_: int, clients: Any, rows: np.ndarray) -> None:
        for c, row in zip(np.asarray(clients).tolist(), rows, strict=True):
            store[(round_, int(c))] = row.copy()

    def spy_encode(plan, clipped, *, seed, round_, clients, secrets=None):
        enc = encode(plan, clipped, seed=seed, round_=round_, clients=clients, secrets=secrets)
        keep(rec.inputs, round_, clients, enc.values)
        return enc

    def spy_noise(shape, variance, *, secrets, round_, clients):
        out = noise(shape, variance, secrets=secrets, round_=round_, clients=clients)
        keep(rec.shares, round_, clients, out)
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(skellam, "encode", spy_encode)
    mp.setattr(skellam, "skellam_noise", spy_noise)
    try:
        rec.sim = Simulation(nb.make_config("ddp-skellam", settings=settings), nb.base_split())
        recording_setup(RecordSpec(("last",), 10))(rec.sim, run_dir)
        rec.sim.run()
    finally:
        mp.undo()
    with np.load(run_dir / "observations" / "secagg" / f"round_{nb.ROUNDS:04d}.npz") as z:
        rec.transcript = {k: z[k] for k in z.files}
    return rec
