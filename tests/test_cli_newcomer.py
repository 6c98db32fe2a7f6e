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


def test_run_help_lists_every_registered_dataset_and_mechanism(capsys):
    """issue 80: ``run --help`` once listed neither ddp-skellam nor ml-10m/20m/25m, its text
    written by hand; it is now read from the registries, a mechanism registered later
    included."""
    from fedem_private.data import DATASETS
    from fedem_private.privacy import registry
    from fedem_private.privacy.mech.base import Mechanism

    class Listed(Mechanism):
        name = "toy-listed-in-help"

    registry.register(Listed)
    try:
        with pytest.raises(SystemExit):
            main(["run", "--help"])
    finally:
        registry.unregister(Listed.name)
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # unwrapped
    dataset = text[text.index("--dataset DATASET"):text.index("--data-dir")]
    privacy = text[text.index("--privacy PRIVACY"):text.index("--sample-rate")]
    for name in DATASETS:
        assert f" {name}," in dataset or f" {name} (" in dataset, name
    assert {"ml-10m", "ml-20m", "ml-25m"} <= set(DATASETS)
    for name in (*registry.names(), "toy-listed-in-help"):
        assert re.search(rf"\b{re.escape(name)}\b", privacy), name
    assert "ddp-skellam" in privacy and "ldp-touched-rows (INSECURE)" in privacy


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


# ------------------------------------------------------------- attack on a broken directory
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from recorded_runs import recorded_run

    return recorded_run(tmp_path_factory.mktemp("rec") / "run", rounds="last", clients=10,
                        train__rounds=1, train__eval_every=1)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _first_round_file(run, folder):
    return sorted((run / folder).glob("round_*.npz"))[0]


BREAKS = {
    "summary.json": lambda run: _truncate(run / "summary.json"),
    "config.toml": lambda run: (run / "config.toml").write_text("[train\nrounds = ",
                                                              encoding="utf-8"),
    "public.json": lambda run: _truncate(run / "observations" / "public.json"),
    "observations npz": lambda run: _truncate(_first_round_file(run, "observations")),
    "ground truth npz": lambda run: _truncate(_first_round_file(run, "ground_truth")),
    "no config": lambda run: (run / "config.toml").unlink(),
}


@pytest.fixture
def no_attack_work(monkeypatch):
    """Every call that would start the attacks' work, recorded instead of run."""
    import attacks.run

    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        raise SystemExit("the attacks started")

    monkeypatch.setattr(attacks.run, "run_attacks", spy)
    return calls


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_attack_refuses_a_broken_run_directory_before_any_work(recorded, tmp_path, capsys,
                                                               no_attack_work, broken):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    BREAKS[broken](run)
    assert main(["attack", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedem-private: error: "), err
    assert str(run) in err
    assert no_attack_work == []


def test_attack_refuses_rounds_not_recorded_before_any_work(recorded, capsys, no_attack_work):
    assert main(["attack", str(recorded), "--rounds", "7", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no recorded observations of rounds 7 (recorded: 1)" in err
    assert no_attack_work == []


def test_an_intact_run_directory_reaches_the_attacks(recorded, no_attack_work):
    with pytest.raises(SystemExit, match="the attacks started"):
        main(["attack", str(recorded), "--quiet"])
    assert len(no_attack_work) == 1
