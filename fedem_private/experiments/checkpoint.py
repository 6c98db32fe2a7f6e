"""Checkpoints of a run in progress, so a killed run resumes where it stopped.

A checkpoint is one file holding the whole :class:`~fedem_private.simulation.loop.Simulation`
(every tensor, part and counter; :meth:`Simulation.__getstate__` leaves out only the
harness's view and observers), the stats of the rounds run so far, the seconds they took,
the resolved config they belong to, and a fingerprint of the package's source. Every random
draw of a round is keyed by (seed, purpose, round, client) (docs/design.md, "Randomness"),
so nothing else is needed: a run resumed with the same code gives the same numbers as one
that never stopped (``tests/test_checkpoint.py``). A run resumed after the package's source
changed goes on, and its summary says so (``checkpoint.code_changed``).

The file is written every ``every`` rounds to a temporary name and moved into place, so a
kill mid-write leaves the previous checkpoint. It is removed once the run directory is
committed.

Trust: reading a checkpoint unpickles it, which can run code. Resume only from files this
tool wrote on a machine you trust; a checkpoint is no more shareable than a script.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedem_private.errors import UserError

FORMAT = 1  # the layout of the saved dictionary


def check_every(value: Any, name: str) -> int | None:
    """``value`` as a number of rounds between checkpoints (None: no checkpoints); anything
    but a positive integer is a user error naming ``name``, the option it came from."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise UserError(f"{name} must be a positive number of rounds, got {value!r}")
    return value


@dataclass(frozen=True)
class Checkpointing:
    """Where a run keeps its checkpoint and how often (in rounds) it rewrites it."""

    path: Path
    every: int

    def __post_init__(self) -> None:
        if self.every is None:
            raise UserError("checkpoints: every must be a positive number of rounds, got None")
        check_every(self.every, "checkpoints: every")

    def due(self, round_: int, rounds: int) -> bool:
        """Whether to write after ``round_``: every ``every`` rounds, never after the last
        (the run directory is written then)."""
        return round_ % self.every == 0 and round_ < rounds


@dataclass
class Resumed:
    """What a checkpoint gives back: the simulation after its last round and the run so
    far. ``resumes`` lists each resumption (its round and whether the code had changed)."""

    sim: Any
    history: list[Any]
    seconds: float
    resumes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def round(self) -> int:
        return int(self.sim.state.round)


@functools.cache
def source_fingerprint() -> str:
    """SHA-256 (16 hex digits) of the package's Python sources, in path order."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def beside(out: str | Path) -> Path:
    """Where a run going into ``out`` keeps its checkpoint: ``<out>.checkpoint``, beside it
    (the run directory itself appears only when the run is finished)."""
    out = Path(out).expanduser()
    return out.with_name(out.name + ".checkpoint")


def save(ck: Checkpointing, config: str, sim: Any, history: list[Any], seconds: float,
         resumes: list[dict[str, Any]]) -> None:
    """Write the checkpoint of ``sim`` after its last round (atomically: a temporary file
    moved into place)."""
    import torch

    ck.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = ck.path.with_name(ck.path.name + ".tmp")
    blob = {"format": FORMAT, "config": config, "source": source_fingerprint(),
            "sim": sim, "history": history, "seconds": seconds, "resumes": resumes}
    torch.save(blob, tmp)
    os.replace(tmp, ck.path)


def load(ck: Checkpointing, config: str, force: bool = False) -> Resumed | None:
    """The run saved in ``ck.path``, or None when there is none. ``config`` is the resolved
    config (TOML text) of the run asking: a checkpoint of another one is refused, or with
    ``force`` removed (it is in the way of this run; one of the same config is this run's
    progress, and ``force`` keeps it)."""
    import torch

    if not ck.path.exists():
        return None
    try:
        blob = torch.load(ck.path, weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise UserError(f"{ck.path}: not a readable checkpoint ({type(exc).__name__}); "
                        f"remove it to start the run afresh") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise UserError(f"{ck.path}: a checkpoint of another format; remove it to start "
                        f"the run afresh")
    if blob["config"] != config and force:
        discard(ck)
        return None
    if blob["config"] != config:
        raise UserError(f"{ck.path}: a checkpoint of another configuration; remove it "
                        f"(or pass --force) to start the run afresh")
    changed = blob["source"] != source_fingerprint()
    resumes = [*blob["resumes"], {"round": int(blob["sim"].state.round),
                                  "code_changed": changed}]
    return Resumed(blob["sim"], list(blob["history"]), float(blob["seconds"]), resumes)


def discard(ck: Checkpointing) -> None:
    """Remove the checkpoint (and a temporary file a kill left)."""
    for path in (ck.path, ck.path.with_name(ck.path.name + ".tmp")):
        path.unlink(missing_ok=True)


def summary(resumes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run summary's ``checkpoint`` entry: None for a run that never resumed."""
    if not resumes:
        return None
    return {"resumed_at": [r["round"] for r in resumes],
            "code_changed": any(r["code_changed"] for r in resumes)}
