"""What a user running their own CSV hit (issue 78, item 5): a population settings file on
another dataset or a baseline, progress kept under --out while a run goes on, an honest
message when a run is killed, and a warning when a run ends at chance or in noise."""

from __future__ import annotations

import csv
import json
import os
import socket

import pytest

from fedem_private.cli import Terminated, main

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


def test_a_run_keeps_its_progress_under_out_as_it_goes(tmp_path, ratings, capsys,
                                                       monkeypatch):
    from fedem_private.simulation.loop import Simulation

    out, seen = tmp_path / "run", {}
    real_step = Simulation.step

    def step(self):  # before round 4: what the folder holds after round 3
        if self.state.round == 3:
            seen["files"] = sorted(p.name for p in out.iterdir())
            seen["progress"] = json.loads((out / "progress.json").read_text())
            seen["rows"] = list(csv.DictReader((out / "metrics.csv").open()))
        return real_step(self)

    monkeypatch.setattr(Simulation, "step", step)
    assert main(["run", "--dataset", "csv", "--data-dir", str(ratings), "--method", "fedmf",
                 "--out", str(out), "--no-progress", *TINY]) == 0
    assert seen["files"] == ["metrics.csv", "progress.json"]
    assert [int(r["round"]) for r in seen["rows"]] == [2] and seen["rows"][0]["full_hr@10"]
    progress = seen["progress"]
    assert (progress["round"], progress["rounds"], progress["evaluated_round"]) == (3, 4, 2)
    assert progress["eta_seconds"] == pytest.approx(progress["seconds_per_round"])
    assert progress["pid"] == os.getpid()
    # the finished directory replaces them: no progress record left, every row kept
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "metrics.csv",
                                                      "privacy_ledger.json", "summary.json"]
    assert [int(r["round"]) for r in csv.DictReader((out / "metrics.csv").open())] == [2, 4]
    lines = [line for line in capsys.readouterr().err.splitlines() if " s a round, ETA " in line]
    assert [line.split(":")[0] for line in lines if "full HR@10" in line] == [
        "fedmf round 2/4", "fedmf round 4/4"]


def test_the_progress_of_a_run_killed_outright_does_not_hold_its_folder(tmp_path, ratings,
                                                                        capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.csv").write_text("round\n2\n")
    record = {"state": "running", "round": 3, "pid": os.getpid(),
              "host": socket.gethostname()}
    (out / "progress.json").write_text(json.dumps(record))
    args = ["run", "--dataset", "csv", "--data-dir", str(ratings), "--method", "fedmf",
            "--out", str(out), "--no-progress", *TINY]
    assert main(args) == 2  # its writer (this process) is alive: not taken
    assert "being written by a run in progress" in capsys.readouterr().err
    (out / "progress.json").write_text(json.dumps({**record, "pid": 2 ** 30}))  # no process
    assert main(args) == 0
    assert (out / "summary.json").is_file() and not (out / "progress.json").exists()
    (out / "progress.json").write_text(json.dumps({**record, "pid": 2 ** 30}))
    assert main(args) == 2  # beside a finished run: never replaced without --force
    assert "--force" in capsys.readouterr().err and (out / "summary.json").is_file()


def test_a_terminated_run_says_resume_only_when_a_checkpoint_was_kept(tmp_path, ratings,
                                                                      capsys, monkeypatch):
    from fedem_private import api
    from fedem_private.simulation.loop import Simulation

    real_step = Simulation.step

    def step_then_term(self):
        stats = real_step(self)
        if stats.round == 2:
            raise Terminated
        return stats

    monkeypatch.setattr(Simulation, "step", step_then_term)
    out = tmp_path / "run"
    args = ["run", "--dataset", "csv", "--data-dir", str(ratings), "--method", "fedmf",
            "--out", str(out), "--no-progress", *TINY]
    assert main(args) == 143
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("fedem-private: terminated; nothing of this run was kept")
    assert "--checkpoint-every" in err and "run the same command again" not in err
    assert not out.exists()  # its progress went with it
    assert main([*args, "--checkpoint-every", "1"]) == 143
    err = capsys.readouterr().err.splitlines()[-1]
    assert f"the checkpoint {api.checkpoint_path(out)} was kept" in err
    assert "run the same command again to resume" in err


def test_a_run_at_chance_or_in_noise_warns_and_says_so_in_its_summary(tmp_path, ratings):
    from fedem_private.data import leave_one_out, load_dataset
    from fedem_private.data.split import evaluation_exclusion_csr
    from fedem_private.experiments.outcome import full_chance, outcome_warnings

    split = leave_one_out(load_dataset("csv", str(ratings), seed=0), 0)
    chance, candidates = full_chance(split)
    indptr, _ = evaluation_exclusion_csr(split)  # the evaluation's own candidates
    assert candidates == pytest.approx(split.n_items - (indptr[1:] - indptr[:-1]).mean())
    assert chance == pytest.approx(10 / candidates)  # every user ranks 50 - 11 items
    at_chance = outcome_warnings(split, {"full": {"hr@10": 0.0}}, None)
    assert len(at_chance) == 1 and "below chance (0.2564" in at_chance[0]
    # 30 users: chance's standard error is 0.08, so 0.3 is still at chance (issue 80)
    assert "is at chance" in outcome_warnings(split, {"full": {"hr@10": 0.3}}, None)[0]
    assert outcome_warnings(split, {"full": {"hr@10": 0.5}}, None) == []
    noisy = outcome_warnings(split, {"full": {"hr@10": 0.5}},
                             {"noise_to_signal": {"mean_over_rounds": 46.0}})
    assert len(noisy) == 1 and "noise-to-signal ratio is 46" in noisy[0]
    assert outcome_warnings(split, None, {"noise_to_signal": {"mean_over_rounds": 2.0}}) == []


def test_a_noisy_run_prints_its_warning_and_records_it(tmp_path, ratings, capsys):
    out = tmp_path / "run"
    assert main(["run", "--dataset", "csv", "--data-dir", str(ratings), "--method", "fedmf",
                 "--out", str(out), "--no-progress", "--privacy", "ldp-gaussian",
                 "--epsilon", "1", "--clip", "1", *TINY]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert any("noise-to-signal ratio" in w for w in summary["warnings"])
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "noise-to-signal" in line] == [
        f"fedem-private: warning: {w}" for w in summary["warnings"] if "noise-to-signal" in w]
