"""``fedem-private tune``: Optuna over the validation item, resumable (issue 42)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from fedem_private.cli import main
from fedem_private.errors import UserError
from fedem_private.simulation.config import load_toml

pytestmark = pytest.mark.skipif(importlib.util.find_spec("optuna") is None,
                                reason="Optuna is not installed (pip install "
                                "'fedem-private[tune]')")

SPEC = """
[tune]
trials = {trials}
seed = 3

[tune.space]
"baseline.ease_lambda" = {{ low = 1.0, high = 1000.0, log = true }}

[base.data.synthetic]
n_users = 40
n_items = 60
mean_activity = 8

[base.federation]
method = "ease"
"""


def _read(path):
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_tune_runs_trials_on_validation_and_resumes(tmp_path):
    import json

    from fedem_private.experiments.tune import run_tuning

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=3))
    out = tmp_path / "study"
    first = run_tuning(spec, out)
    assert first["completed"] == 3
    rows = _read(out / "trials.csv")
    assert len(rows) == 3
    for row in rows:  # the objective is the trial run's own validation HR@10, not test
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert float(row["val_hr@10"]) == pytest.approx(summary["metrics"]["val"]["hr@10"])
        assert summary["metrics"]["val"] != summary["metrics"]["sampled"]
    before = {r["trial"]: r["baseline.ease_lambda"] for r in rows}
    # resuming tops the same study up to 5 completed trials; the first three are kept
    second = run_tuning(spec, out, trials=5)
    assert second["completed"] == 5
    after = {r["trial"]: r["baseline.ease_lambda"] for r in _read(out / "trials.csv")}
    assert len(after) == 5 and all(after[k] == v for k, v in before.items())
    # the resumed process proposes new points, not the study's first ones again (a
    # sampler seeded as at the start repeats its random start-up draws)
    assert len(set(after.values())) == 5
    best = load_toml(out / "best.toml")
    assert best.federation.method == "ease"
    assert max(float(r["val_hr@10"]) for r in _read(out / "trials.csv")) == \
        pytest.approx(second["best_value"])
    assert best.baseline.ease_lambda == pytest.approx(second["best_params"][
        "baseline.ease_lambda"])


def test_tune_command_and_bad_files(tmp_path, capsys):
    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=1))
    assert main(["tune", str(spec), "--out", str(tmp_path / "s")]) == 0
    assert "best sampled validation HR@10" in capsys.readouterr().out
    from fedem_private.experiments.tune import load_tune_spec

    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.format(trials=1).replace("baseline.ease_lambda", "baseline.nope"))
    with pytest.raises(UserError, match="nope"):
        load_tune_spec(bad)
    bad.write_text(SPEC.format(trials=0))
    with pytest.raises(UserError, match="trials"):
        load_tune_spec(bad)
    assert main(["tune", str(bad), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="Ray is not installed (pip install 'fedem-private[ray]')")
def test_tune_on_ray_workers_share_one_study(tmp_path):
    """``--ray``: two Ray tasks fill one SQLite study; every completed trial is one run
    directory of its own, scored on its own validation item."""
    import json

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=4))
    out = tmp_path / "study"
    assert main(["tune", str(spec), "--out", str(out), "--ray", "--workers", "2"]) == 0
    rows = _read(out / "trials.csv")
    assert 4 <= len(rows) <= 5  # workers racing for the last trial may each add one
    dirs = {r["run_dir"] for r in rows}
    assert len(dirs) == len(rows)
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert float(row["val_hr@10"]) == pytest.approx(summary["metrics"]["val"]["hr@10"])
    assert len({r["baseline.ease_lambda"] for r in rows}) == len(rows)
    assert (out / "best.toml").is_file()
    # the study resumes without Ray, topping it up to 6
    from fedem_private.experiments.tune import run_tuning

    assert run_tuning(spec, out, trials=6)["completed"] >= 6


def test_a_diverging_trial_is_recorded_and_the_study_goes_on(tmp_path, capsys):
    """A setting that blows up (NaN in the local tables: here FedMF with a learning rate of
    1e30) is a finished trial, listed with its reason and counted against the budget; the
    study does not stop, and the best config comes from the completed trials."""
    spec = tmp_path / "t.toml"
    spec.write_text("""
[tune]
trials = 4
seed = 0

[tune.space]
"train.lr" = { choices = [1e30, 0.01] }

[base.data.synthetic]
n_users = 30
n_items = 40
mean_activity = 6

[base.train]
rounds = 2
local_epochs = 1

[base.federation]
method = "fedmf"
""")
    assert main(["tune", str(spec), "--out", str(tmp_path / "s")]) == 0
    rows = _read(tmp_path / "s" / "trials.csv")
    assert len(rows) == 4
    status = {float(r["train.lr"]): r["status"] for r in rows}
    assert status == {1e30: "diverged", 0.01: "complete"}
    assert all(r["val_hr@10"] == "" for r in rows if r["status"] == "diverged")
    assert "more diverged" in capsys.readouterr().out
    assert load_toml(tmp_path / "s" / "best.toml").train.lr == pytest.approx(0.01)


def test_best_by_writes_the_best_config_of_each_choice(tmp_path, capsys):
    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=4).replace(
        '{ low = 1.0, high = 1000.0, log = true }', '{ choices = [10.0, 1000.0] }').replace(
        'seed = 3', 'seed = 0'))  # seed 0's first four trials draw both values
    out = tmp_path / "s"
    assert main(["tune", str(spec), "--out", str(out), "--best-by",
                 "baseline.ease_lambda"]) == 0
    rows = _read(out / "trials.csv")
    for value in ("10.0", "1000.0"):
        mine = [r for r in rows if r["baseline.ease_lambda"] == value]
        best = load_toml(out / f"best-{value}.toml")
        assert best.baseline.ease_lambda == float(value)
        assert f"trial {max(mine, key=lambda r: float(r['val_hr@10']))['trial']}," in \
            (out / f"best-{value}.toml").read_text().splitlines()[0]
    capsys.readouterr()
    assert main(["tune", str(spec), "--out", str(out), "--best-by", "train.lr"]) == 2
    assert "not a searched choice" in capsys.readouterr().err


def test_full_ranking_objective_scores_and_selects_by_the_validation_items_full_rank(
        tmp_path, capsys):
    import json

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=2).replace("seed = 3", 'seed = 3\nobjective = "full"'))
    out = tmp_path / "study"
    assert main(["tune", str(spec), "--out", str(out)]) == 0
    assert "best full-ranking validation HR@10" in capsys.readouterr().out
    rows = _read(out / "trials.csv")
    assert len(rows) == 2 and "val_hr@10" not in rows[0]
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert float(row["val_full_hr@10"]) == pytest.approx(
            summary["metrics"]["val_full"]["hr@10"])
        cfg = load_toml(Path(row["run_dir"]) / "config.toml")
        assert cfg.train.select_round == "best-val-full"
    assert "by full-ranking validation HR@10" in (out / "best.toml").read_text()
    # the study keeps its objective: the sampled one cannot top it up
    spec.write_text(SPEC.format(trials=3))
    with pytest.raises(UserError, match="scored by the full objective"):
        from fedem_private.experiments.tune import run_tuning
        run_tuning(spec, out)
    spec.write_text(SPEC.format(trials=1).replace("seed = 3", 'seed = 3\nobjective = "test"'))
    assert main(["tune", str(spec), "--out", str(tmp_path / "other")]) == 2
    assert "objective must be one of sampled, full" in capsys.readouterr().err


def test_outputs_are_written_after_every_trial(tmp_path, monkeypatch):
    """A study stopped part way keeps its trials.csv and best config: each trial rewrites
    them, and what a stopped study left is what it had finished."""
    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=3))
    out = tmp_path / "study"
    seen: list[int] = []
    real = tune._write_outputs

    def spy(study, root, *args, **kwargs):
        real(study, root, *args, **kwargs)
        seen.append(len(_read(root / "trials.csv")))
        assert load_toml(root / "best.toml").federation.method == "ease"
        assert not list(root.glob(".*.part"))  # nothing half-written left behind

    monkeypatch.setattr(tune, "_write_outputs", spy)
    tune.run_tuning(spec, out)
    assert seen[:3] == [1, 2, 3]  # one rewrite per trial, then the final one
    assert seen[-1] == 3


def _study(out, optuna):
    from fedem_private.experiments import tune

    out.mkdir(parents=True, exist_ok=True)
    return tune._open_study(optuna, out, 0)


def test_a_running_trial_holds_its_place_so_workers_never_overrun_the_budget(tmp_path):
    """A second worker that arrives while the first runs the last trial starts none: the
    running trial holds its place in the budget (it once ran a sixteenth trial of 15)."""
    import optuna

    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=2))
    out = tmp_path / "study"
    tune.run_tuning(spec, out, trials=1)
    live = _study(out, optuna).ask()  # another worker's trial, still running
    assert tune._work(str(spec), str(out), 2, 1) == 0
    study = _study(out, optuna)
    assert len(study.trials) == 2 and study.trials[live.number].state.name == "RUNNING"


def test_of_two_workers_racing_for_the_last_place_the_later_trial_stands_down(
        tmp_path, monkeypatch):
    """Both workers saw a free place; the trial numbered later finds it claimed by the
    earlier one, is failed as over budget without running, and its worker stops."""
    import optuna

    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=2))
    out = tmp_path / "study"
    tune.run_tuning(spec, out, trials=1)
    real, calls = tune._claims, []

    def racing(trials, optuna):  # the loop's check ran before the other worker's ask
        calls.append(1)
        if len(calls) == 1:
            _study(out, optuna).ask()
            return 1
        return real(trials, optuna)

    monkeypatch.setattr(tune, "_claims", racing)
    assert tune._work(str(spec), str(out), 2, 1) == 0  # it stood down, ran nothing
    study = _study(out, optuna)
    mine = study.trials[-1]
    assert mine.state.name == "FAIL" and tune.OVER_BUDGET in mine.user_attrs
    assert not mine.params  # nothing was suggested, nothing ran
    assert not (out / "trials" / f"{mine.number:04d}").exists()
    assert len(_read(out / "trials.csv")) == 1  # the stood-down trial is not listed


def test_running_trials_left_before_heartbeats_are_failed_once_on_resume(tmp_path):
    """A study whose worker was killed before workers recorded heartbeats keeps a trial
    RUNNING forever; resuming fails it (listed as interrupted) and fills the budget."""
    import optuna

    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=2))
    out = tmp_path / "study"
    study = _study(out, optuna)
    study.set_user_attr("objective", "sampled")
    stuck = study.ask()  # an old worker killed mid-trial: no heartbeat, no attribute
    assert tune.run_tuning(spec, out)["completed"] == 2
    study = _study(out, optuna)
    assert study.trials[stuck.number].state.name == "FAIL"
    assert study.user_attrs["interrupted"] == [stuck.number]
    assert study.user_attrs["heartbeats"] is True
    live = study.ask()  # from now on a running trial is a live worker's: it is kept
    tune.run_tuning(spec, out, trials=3)
    assert _study(out, optuna).trials[live.number].state.name == "RUNNING"


def test_a_killed_workers_trial_frees_its_place_once_its_heartbeat_is_stale(tmp_path):
    """A trial whose worker died (its heartbeat older than the grace period) holding the
    last place is failed before the budget is counted, and the place is filled by a
    trial of the same setting."""
    import sqlite3

    import optuna

    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(SPEC.format(trials=2))
    out = tmp_path / "study"
    tune.run_tuning(spec, out, trials=1)
    dead = _study(out, optuna).ask(
        {"baseline.ease_lambda": optuna.distributions.FloatDistribution(1.0, 1000.0, log=True)})
    with sqlite3.connect(out / "study.db") as db:  # its last heartbeat, an hour ago
        (trial_id,) = db.execute("select trial_id from trials where number = ?",
                                 (dead.number,)).fetchone()
        db.execute("insert into trial_heartbeats (trial_id, heartbeat) values "
                   "(?, datetime('now', '-1 hour'))", (trial_id,))
    assert tune._work(str(spec), str(out), 2, 1) == 1
    study = _study(out, optuna)
    assert study.trials[dead.number].state.name == "FAIL"
    assert [t.state.name for t in study.trials].count("COMPLETE") == 2
    # its setting was queued again and is the one that filled the place
    (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retry.state.name == "COMPLETE"
    assert retry.params == dead.params


ROUNDS_SPEC = """
[tune]
trials = 1
seed = 1

[tune.space]
"train.lr" = { low = 0.01, high = 0.3, log = true }

[base.data.synthetic]
n_users = 30
n_items = 40
mean_activity = 6

[base.train]
rounds = 4
local_epochs = 1
eval_every = 2

[base.federation]
method = "fedmf"
"""


def test_a_trial_shows_its_progress_each_evaluated_round(tmp_path, capsys):
    """A long trial is not silent: each evaluated round prints one line with its
    validation HR@10, reported to Optuna as the trial's intermediate value, and the
    study file records the rounds done."""
    import optuna

    spec = tmp_path / "t.toml"
    spec.write_text(ROUNDS_SPEC)
    out = tmp_path / "study"
    assert main(["tune", str(spec), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tune: trial 0")]
    assert [line.split(",")[1].strip() for line in lines] == ["round 2/4", "round 4/4"]
    trial = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}"
                              ).trials[0]
    assert trial.user_attrs["round"] == 4
    rows = _read(Path(trial.user_attrs["run_dir"]) / "metrics.csv")
    assert {int(r["round"]): pytest.approx(float(r["val_hr@10"])) for r in rows} == \
        trial.intermediate_values
    assert all(f"sampled validation HR@10 {float(r['val_hr@10']):.4f}" in line
               for r, line in zip(rows, lines, strict=True))


# one setting only: every trial is the same run, so a later trial resumes a killed one's
CHECKPOINT_SPEC = ROUNDS_SPEC.replace("seed = 1\n", "seed = 1\ncheckpoint_every = 2\n").replace(
    '{ low = 0.01, high = 0.3, log = true }', '{ choices = [0.05] }')


def test_a_killed_trial_resumes_from_its_checkpoint(tmp_path, kill_after, capsys):
    """With checkpoint_every, a trial's run saves its state keyed by its config. A worker
    killed mid-trial leaves it running; once its heartbeat is stale it is failed and its
    setting queued again, and that retry resumes the run from the checkpoint, which the
    finished trial removes."""
    import sqlite3

    import optuna
    from conftest import Killed

    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(CHECKPOINT_SPEC)
    out = tmp_path / "study"
    kill_after(3)
    with pytest.raises(Killed):
        tune.run_tuning(spec, out)
    assert len(list((out / "checkpoints").iterdir())) == 1
    (killed,) = _study(out, optuna).trials
    assert killed.state.name == "RUNNING"  # as after a SIGKILL: nothing failed it
    with sqlite3.connect(out / "study.db") as db:  # its last heartbeat, an hour ago
        db.execute("update trial_heartbeats set heartbeat = datetime('now', '-1 hour')")
    kill_after(None)
    capsys.readouterr()
    assert tune.run_tuning(spec, out)["completed"] == 1
    assert (f"tune: resuming {out}: 0 of 1 trials finished (0 completed, 0 diverged), "
            f"1 failed outside the budget (killed or stopped); the setting of killed trial "
            f"{killed.number} is queued again") in capsys.readouterr().err
    retry = _study(out, optuna).trials[-1]
    assert retry.system_attrs["failed_trial"] == killed.number
    (done,) = [r for r in _read(out / "trials.csv")]
    assert int(done["trial"]) == retry.number and int(done["retry_of"]) == killed.number
    summary = json.loads((Path(done["run_dir"]) / "summary.json").read_text())
    assert summary["checkpoint"]["resumed_at"] == [2]
    assert list((out / "checkpoints").iterdir()) == []


def test_a_setting_killed_twice_names_the_last_killed_trial(tmp_path, kill_after, capsys):
    """A retry that is killed in turn is queued again; the third trial's ``retry_of`` (and
    the resume line) name the second, the trial it replaces, not the first."""
    import sqlite3

    import optuna
    from conftest import Killed

    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(CHECKPOINT_SPEC)
    out = tmp_path / "study"
    kill_after(3)
    for _ in range(2):
        with pytest.raises(Killed):
            tune.run_tuning(spec, out)
        with sqlite3.connect(out / "study.db") as db:  # its last heartbeat, an hour ago
            db.execute("update trial_heartbeats set heartbeat = datetime('now', '-1 hour')")
    first, second = _study(out, optuna).trials
    assert second.system_attrs["failed_trial"] == first.number
    kill_after(None)
    capsys.readouterr()
    assert tune.run_tuning(spec, out)["completed"] == 1
    assert (f"2 failed outside the budget (killed or stopped); the setting of killed trial "
            f"{second.number} is queued again") in capsys.readouterr().err
    (done,) = _read(out / "trials.csv")
    assert int(done["retry_of"]) == second.number
    assert _study(out, optuna).trials[-1].system_attrs["failed_trial"] == first.number


def test_checkpoint_every_is_checked(tmp_path):
    from fedem_private.experiments import tune

    spec = tmp_path / "t.toml"
    spec.write_text(CHECKPOINT_SPEC.replace("checkpoint_every = 2", "checkpoint_every = 0"))
    with pytest.raises(UserError, match="checkpoint_every must be a positive"):
        tune.load_tune_spec(spec)
