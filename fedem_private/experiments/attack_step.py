"""The sweep's bridge to the recording and attack step (docs/design.md, section 6).

The sweep never calls :mod:`fedem_private.experiments.recording` or :mod:`attacks.run`
directly: it asks :func:`load` for an :class:`AttackStep`, a pair of plain
functions, so that tests can stub it and the sweep keeps working (trained,
not attacked) when that code is missing or its interface has changed.

Interface used:

- ``fedem_private.experiments.recording.recording_setup(RecordSpec(rounds, clients))``
  gives a ``setup(sim, run_dir)`` hook for :func:`fedem_private.experiments.runner.execute`
  that records what the server saw into the run directory under construction;
- ``attacks.registry.names()`` lists the attacks (:func:`known_attacks`);
- ``attacks.run.run_attacks(run_dir, names, seed=..., device=..., shadow=...)`` reads
  a finished run directory and writes ``attacks.json`` into it; the attacks compute on
  the device the run trained on (``train.device`` of its ``config.toml``), and ``imia``
  retrains the backbone's own client (:mod:`fedem_private.experiments.shadow`).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ATTACKS_FILE = "attacks.json"


@dataclass(frozen=True)
class AttackStep:
    """Recording hook plus attack runner.

    ``record(sim, run_dir, rounds, clients)`` attaches the recorder (rounds:
    ints or ``"last"``; the first ``clients`` client ids); ``attack(run_dir,
    names)`` writes ``attacks.json``.
    """

    record: Callable[[Any, Path, Sequence[int | str], int], None]
    attack: Callable[[Path, Sequence[str]], None]


def load() -> AttackStep | str:
    """The attack step, or a one-line reason why attacks cannot run."""
    try:
        recording = importlib.import_module("fedem_private.experiments.recording")
        setup_factory = recording.recording_setup
        record_spec = recording.RecordSpec
    except (ImportError, AttributeError) as exc:
        return f"recording unavailable: {exc}"
    try:
        runner = importlib.import_module("attacks.run")
        run_attacks = runner.run_attacks
    except (ImportError, AttributeError) as exc:
        return f"attack step unavailable: {exc}"

    def record(sim: Any, run_dir: Path, rounds: Sequence[int | str], clients: int) -> None:
        setup_factory(record_spec(tuple(rounds), int(clients)))(sim, run_dir)

    def attack(run_dir: Path, names: Sequence[str]) -> None:
        from fedem_private.experiments.shadow import shadow_model

        run_attacks(str(run_dir), list(names), seed=0, device=_run_device(Path(run_dir)),
                    shadow=shadow_model)

    return AttackStep(record=record, attack=attack)


def _run_device(run_dir: Path) -> str:
    """The device a finished run trained on (``cpu`` or ``cuda``, from its config.toml)."""
    from fedem_private.simulation.config import load_toml

    return load_toml(run_dir / "config.toml").train.device


def known_attacks() -> tuple[str, ...] | None:
    """Names the attack step accepts, from the attacks' registry (:mod:`attacks.registry`),
    or None when it cannot tell (no ``attacks`` package).

    Light: the registry lists names without importing any attack module (torch,
    scikit-learn, ...).
    """
    try:
        registry = importlib.import_module("attacks.registry")
    except ImportError:
        return None
    return tuple(registry.names())


def read_records(path: Path) -> list[dict[str, Any]] | None:
    """The per-(attack, round) records of an ``attacks.json``; None if absent or unreadable.

    Accepts a JSON list of records, or an object holding one under ``records``,
    ``results`` or ``attacks`` (else its first list of objects).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict):
        lists = [data.get(k) for k in ("records", "results", "attacks")]
        lists += list(data.values())
        data = next((v for v in lists if isinstance(v, list)
                     and all(isinstance(r, dict) for r in v)), [])
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else None
