"""What a newcomer meets first: ``list``, ``run --help`` and ``attack`` on a broken run."""

from __future__ import annotations

import re

import pytest

from fedem_private.cli import build_parser, main
from fedem_private.simulation.config import BASELINE_METHODS, FEDERATED_METHODS


def _rows(text: str) -> dict[str, list[tuple[str, str]]]:
    """``list``'s output as kind -> [(name, note)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in text.splitlines():
        kind, name, *note = line.split(maxsplit=2)
        out.setdefault(kind, []).append((name, note[0] if note else ""))
    return out


def test_list_shows_baselines_apart_from_the_federated_presets(capsys):
    assert main(["list"]) == 0
    rows = _rows(capsys.readouterr().out)
    methods = [name for name, _ in rows["method"]]
    assert methods == list(FEDERATED_METHODS)
    baselines = dict(rows["baseline"])
    assert list(baselines) == list(BASELINE_METHODS)
    for name, note in baselines.items():
        assert "preset" not in note and "aggregation" not in note, (name, note)
        assert f"--method {name}" in note and len(note) > len(f"--method {name}") + 10
    assert "popular" in baselines["mostpop"] and "EASE" in baselines["ease"]


def _run_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["run"]


def _usage_block(text: str) -> list[str]:
    lines = text.splitlines()
    end = lines.index("") if "" in lines else len(lines)
    return lines[:end]


def test_run_help_is_short_and_points_at_the_full_help(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert len(_usage_block(text)) <= 2, _usage_block(text)
    assert len(text.splitlines()) < 120
    assert "--help-all" in text
    for flag in ("--dataset", "--method", "--rounds", "--privacy", "--epsilon", "--out"):
        assert re.search(rf"^\s+{flag}\b", text, re.M), flag


def test_run_help_all_lists_every_option(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "--help-all"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert len(_usage_block(text)) <= 2
    flags = {s for a in _run_parser()._actions for s in a.option_strings if s.startswith("--")}
    assert len(flags) > 80
    missing = sorted(f for f in flags if not re.search(rf"^\s+{re.escape(f)}\b", text, re.M))
    assert not missing


def test_flags_hidden_from_the_short_help_still_work():
    args = build_parser().parse_args(["run", "--hash-senet", "16", "--fedrap-mu", "0.5",
                                      "--shared-eval-negatives"])
    assert getattr(args, "federation.hash_senet") == 16
    assert getattr(args, "federation.fedrap_mu") == 0.5
    assert getattr(args, "data.shared_eval_negatives") is True
