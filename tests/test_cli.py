"""The command line: run directories, config round trip, one-line user errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from fedem_private.cli import main
from fedem_private.simulation.config import RunConfig, load_toml, to_dict

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def _synthetic_toml(path, **train):
    lines = ["[data.synthetic]", "n_users = 40", "n_items = 60", "mean_activity = 8", "",
             "[train]"] + [f"{k} = {v}" for k, v in train.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_writes_complete_run_directory(tmp_path, capsys):
    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=3)
    out = tmp_path / "run"
    assert main(["run", "--config", str(cfg), "--out", str(out), "--method", "fedem",
                 "--local-epochs", "1", "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "metrics.csv",
                                                      "privacy_ledger.json", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("dataset", "method", "protocol", "rounds", "seconds_per_round", "metrics"):
        assert key in summary
    assert summary["rounds"] == 3 and summary["method"] == "fedem"
    for kind in ("sampled", "full"):
        assert 0.0 <= summary["metrics"][kind]["hr@10"] <= 1.0
        assert 0.0 <= summary["metrics"][kind]["ndcg@10"] <= summary["metrics"][kind]["hr@10"]
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    # round 1 starts from the download; later rounds merge and report the mean weight on Q_g
    assert rows[0]["rho_mean"] == "" and 0.0 <= float(rows[2]["rho_mean"]) <= 1.0
    assert summary["merge_rho_mean"] == pytest.approx(float(rows[2]["rho_mean"]))
    resolved = load_toml(out / "config.toml")
    assert resolved.train.rounds == 3 and resolved.data.synthetic.n_users == 40
    assert resolved.federation.merge == "em" and resolved.federation.aggregation == "similarity"
    assert to_dict(resolved) == to_dict(resolved.resolved())
    assert "HR@10" in capsys.readouterr().out


def test_config_overrides_and_defaults():
    assert RunConfig().data.dataset == "synthetic"
    assert RunConfig().data.protocol == "strict"


@pytest.mark.parametrize("argv,needle", [
    (["run", "--rounds", "0"], "train.rounds must be a positive integer"),
    (["run", "--lr", "-1"], "train.lr must be a positive number"),
    (["run", "--dim", "0"], "train.dim"),
    (["run", "--method", "fedfoo"], "unknown method"),
    (["run", "--dataset", "nope"], "unknown dataset"),
    (["run", "--dataset", "ml-100k", "--data-dir", "/definitely/not/here"], "directory not found"),
    (["run", "--protocol", "loose"], "unknown protocol"),
    (["run", "--rho", "1.5", "--merge", "sm"], "rho"),
    (["run", "--privacy", "ldp-laplace", "--epsilon", "0"], "epsilon"),
    (["run", "--privacy", "ldp-laplace", "--epsilon", "1", "--clip", "-2"], "clip"),
    (["run", "--privacy", "ldp-laplace", "--epsilon", "1", "--delta", "2"], "delta"),
    (["run", "--lr", "abc"], "not a number"),
    (["run", "--config", "/no/such.toml"], "config file not found"),
    (["datasets", "download", "ml-99m"], "unknown dataset"),
])
def test_user_errors_are_one_line_exit_2(tmp_path, capsys, argv, needle):
    out = tmp_path / "out"
    assert main([*argv, *(["--out", str(out)] if argv[0] == "run" else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_bad_files_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "ml"
    bad.mkdir()
    (bad / "u.data").write_text("1\t2\tthree\t4\n")
    assert main(["run", "--dataset", "ml-100k", "--data-dir", str(bad), *TINY]) == 2
    assert "not a number" in capsys.readouterr().err
    (bad / "u.data").write_text("")
    assert main(["run", "--dataset", "ml-100k", "--data-dir", str(bad), *TINY]) == 2
    assert "empty" in capsys.readouterr().err
    (bad / "u.data").write_text("1\t2\t3\t4\n2\t3\t3\t4\n")
    assert main(["run", "--dataset", "ml-100k", "--data-dir", str(bad), *TINY]) == 2
    assert "every user has fewer than 3" in capsys.readouterr().err
    toml = tmp_path / "c.toml"
    toml.write_text("[train]\nroundz = 3\n")
    assert main(["run", "--config", str(toml), *TINY]) == 2
    assert "unknown key 'roundz'" in capsys.readouterr().err
    toml.write_text("[train\n")
    assert main(["run", "--config", str(toml), *TINY]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_existing_output_is_never_clobbered(tmp_path, capsys):
    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=1)
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert main(["run", "--config", str(cfg), "--out", str(out), *TINY]) == 2
    assert (out / "precious.txt").read_text() == "keep me"
    assert "--force" in capsys.readouterr().err
    assert main(["run", "--config", str(cfg), "--out", str(out), "--force", *TINY]) == 0
    assert (out / "summary.json").exists() and not (out / "precious.txt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_interrupted_run_leaves_nothing(tmp_path, monkeypatch):
    from fedem_private.simulation import loop as simulation

    def boom(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation.Simulation, "step", boom)
    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=1)
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "run"), *TINY]) == 130
    assert list(tmp_path.iterdir()) == [tmp_path / "c.toml"]


def test_console_entry_point_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedem_private", "run", "--rounds", "0"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    proc = subprocess.run([sys.executable, "-m", "fedem_private", "datasets", "list"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "ml-100k" in proc.stdout


def test_many_cold_test_items_warn_once_on_stderr(tmp_path, capsys):
    """A file whose latest interactions are items only that user has: the summary counts them
    and the run warns (one line) that HR@10 cannot credit those users for what was learned."""
    rows = [f"u{u},i{(u + k) % 12},1,{k}" for u in range(30) for k in range(6)]
    rows += [f"u{u},own{u},1,9" for u in range(20)]  # 20 of 30 users' latest: their own
    data = tmp_path / "cold.csv"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert main(["run", "--dataset", "csv", "--data-dir", str(data), "--out", str(out),
                 "--method", "fedmf", *TINY]) == 0
    cold = json.loads((out / "summary.json").read_text())["cold_items"]
    assert cold["test_share"] == pytest.approx(20 / 30)
    err = [line for line in capsys.readouterr().err.splitlines()
           if "warning" in line and "test items" in line]  # 32 items: sampled's warns too
    assert len(err) == 1 and "67% of the users' test items appear in no training" in err[0]


def test_paper_privacy_is_described_as_noise_without_a_guarantee(tmp_path, capsys):
    """The paper's recipe adds noise but has no accountant: neither the run's privacy line nor
    the sweep's log line may call it 'no noise' / 'eps ∞', and both name its heuristic."""
    from fedem_private.experiments.sweep import point_result

    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=2)
    out = tmp_path / "run"
    assert main(["run", "--config", str(cfg), "--out", str(out), "--privacy", "paper",
                 *TINY]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("privacy:"))
    heuristic = json.loads((out / "summary.json").read_text())["privacy"]["paper_heuristic"]
    assert "Laplace noise 0.1" in line and "NOT a DP guarantee" in line and "∞" not in line
    assert f"{heuristic['epsilon_summed_worst_client']:.4g}" in line
    logged = point_result(out)
    assert "Laplace 0.1" in logged and "no DP guarantee" in logged and "∞" not in logged
