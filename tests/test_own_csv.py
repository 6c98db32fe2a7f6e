"""What a user running their own CSV hit (issue 78, item 5): a population settings file on
another dataset or a baseline, progress kept under --out while a run goes on, an honest
message when a run is killed, and a warning when a run ends at chance or in noise."""

from __future__ import annotations

import json

import pytest

from fedem_private.cli import main

TINY = ["--rounds", "4", "--eval-every", "2", "--local-epochs", "1", "--dim", "4"]


@pytest.fixture
def ratings(tmp_path):
    """A small user,item,rating,timestamp file: 30 users, 12 of 50 items each."""
    lines = ["user,item,rating,timestamp"]
    lines += [f"u{u},i{(7 * u + 3 * k) % 50},5,{k}" for u in range(30) for k in range(12)]
    path = tmp_path / "ratings.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _settings(path, **tables):
    """A settings file like the population study's (benchmarks/results/population/)."""
    text = []
    for name, values in tables.items():
        text.append(f"[{name}]")
        text += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(text) + "\n")
    return str(path)


POPULATION = {"dataset": "synthetic", "calibrate_to": "ml-100k", "users": 10000}
FEDERATED = {"method": "fedmf", "aggregation": "fedavg", "merge": "sr", "server_lr": 2.5}


def test_a_population_settings_file_runs_on_another_dataset(tmp_path, ratings, capsys):
    cfg = _settings(tmp_path / "s.toml", data=POPULATION, train={"rounds": 3})
    args = ["run", "--config", cfg, "--dataset", "csv", "--data-dir", str(ratings)]
    assert main([*args, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"fedem-private: note: ignoring data.calibrate_to, data.users "
                                f"of {cfg} (--dataset csv: they calibrate the synthetic "
                                f"population)"]
    assert 'dataset = "csv"' in out and "calibrate_to" not in out and "rounds = 3" in out
    # given as flags, they are refused as before
    assert main([*args, "--calibrate-to", "ml-100k", "--dry-run"]) == 2
    assert "use it with --dataset synthetic" in capsys.readouterr().err


def test_a_baseline_runs_from_a_federated_settings_file(tmp_path, capsys):
    cfg = _settings(tmp_path / "s.toml", federation=FEDERATED,
                    train={"client_tables": "global", "cohort_size": 10, "seed": 3})
    assert main(["run", "--config", cfg, "--method", "mostpop", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"fedem-private: note: ignoring federation.aggregation, federation.merge, "
        f"federation.server_lr, train.client_tables, train.cohort_size of {cfg} (--method "
        f"mostpop is a non-federated baseline)"]
    assert 'method = "mostpop"' in out and 'aggregation = "none"' in out and "seed = 3" in out
    # the same setting as a flag is still refused; the file's own method keeps its keys
    assert main(["run", "--config", cfg, "--method", "mostpop", "--aggregation", "fedavg",
                 "--dry-run"]) == 2
    assert "--aggregation fedavg does not apply" in capsys.readouterr().err
    assert main(["run", "--config", cfg, "--dry-run"]) == 0
    assert "note" not in capsys.readouterr().err
