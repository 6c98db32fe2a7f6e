"""MLflow tracking (``--mlflow``): a real local SQLite store, read back through MlflowClient.

One store serves the whole module (creating an MLflow database takes seconds); the
runs, sweep and study are tiny synthetic ones of 2 rounds.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from sweep_helpers import TINY_BASE

from fedem_private.cli import main
from fedem_private.experiments import tracking

needs_mlflow = pytest.mark.skipif(not tracking.installed(),
                                  reason="MLflow is not installed (pip install "
                                  "'fedem-private[mlflow]')")

TINY_RUN = ["--dataset", "synthetic", "--rounds", "2", "--local-epochs", "1", "--dim", "4",
            "--privacy", "ldp-laplace", "--epsilon", "8", "--clip", "5", "--no-progress"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite tracking store for the module."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _runs(uri: str, where: str = "") -> list:
    client = _client(uri)
    exp = client.get_experiment_by_name(tracking.EXPERIMENT)
    return client.search_runs([exp.experiment_id], where, max_results=1000)


def _by_dir(uri: str, path: Path):
    found = _runs(uri, f"tags.`{tracking.DIR_TAG}` = '{path.absolute()}'")
    assert len(found) == 1, f"{len(found)} MLflow runs for {path}"
    return found[0]


def _artifacts(uri: str, run_id: str) -> set[str]:
    return {a.path for a in _client(uri).list_artifacts(run_id)}


@needs_mlflow
def test_a_run_is_logged_with_params_round_metrics_privacy_tags_and_files(
        tmp_path, store, capsys):
    out = tmp_path / "run"
    assert main(["run", *TINY_RUN, "--out", str(out), "--mlflow", store]) == 0
    assert "mlflow: logged 1 run (0 already logged)" in capsys.readouterr().out
    run = _by_dir(store, out)
    client = _client(store)
    # parameters: the resolved config, flattened section.key
    assert run.data.params["train.rounds"] == "2"
    assert run.data.params["privacy.mode"] == "ldp-laplace"
    assert run.data.params["data.synthetic.n_users"] == "600"
    # metrics: one value per evaluated round, step = round, as metrics.csv holds them
    with (out / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for column, name in (("full_hr@10", "hr10_full"), ("sampled_ndcg@10", "ndcg10_sampled")):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id,
                                                                              name))
        assert history == [(int(r["round"]), pytest.approx(float(r[column]))) for r in rows]
        assert [s for s, _ in history] == [1, 2]
    # the privacy block as tags
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    tags = run.data.tags
    assert tags["privacy.mode"] == "ldp-laplace"
    assert float(tags["privacy.epsilon"]) == pytest.approx(privacy["epsilon"]["reported"])
    assert float(tags["privacy.delta"]) == privacy["delta"]
    assert tags["privacy.neighbouring"] == privacy["neighbouring"]
    assert tags["privacy.trust_model"] == privacy["trust_model"]
    assert tags["privacy.description"] == privacy["description"]
    # the run directory's files
    assert {"config.toml", "metrics.csv", "summary.json"} <= _artifacts(store, run.info.run_id)
    assert run.info.status == "FINISHED"
    # logged once: logging the same directory again finds it
    again = tracking.log_run(out, store)
    assert again.logged == () and again.skipped == (run.info.run_id,)
    assert len(_runs(store, f"tags.`{tracking.DIR_TAG}` = '{out.absolute()}'")) == 1


@needs_mlflow
def test_a_sweep_is_a_parent_run_with_a_nested_child_per_point_logged_once(
        tmp_path, store, capsys):
    spec = tmp_path / "two.toml"
    spec.write_text('[sweep]\nmethods = ["fedmf"]\nprivacy = ["ldp-laplace"]\n'
                    "epsilons = [inf, 8]\nseeds = [0]\n" + TINY_BASE)
    root = tmp_path / "sweep"
    argv = ["sweep", str(spec), "--out", str(root), "--no-progress", "--mlflow", store]
    assert main(argv) == 0
    assert "logged 2 runs (0 already logged)" in capsys.readouterr().out
    parent = _by_dir(store, root)
    assert parent.data.tags[tracking.KIND_TAG] == "sweep"
    assert {"results.csv", "sweep.toml"} <= _artifacts(store, parent.info.run_id)
    children = _runs(store, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    points = sorted(p.parent for p in root.rglob("summary.json"))
    assert len(points) == 2
    assert sorted(c.data.tags[tracking.DIR_TAG] for c in children) == \
        sorted(str(p.absolute()) for p in points)
    eps = {c.data.tags["privacy.epsilon"] for c in children}
    assert "inf" in eps and any(e not in ("inf", "none") and float(e) == pytest.approx(8)
                                for e in eps)
    for child in children:
        assert child.data.params["train.rounds"] == "2"
        steps = [m.step for m in _client(store).get_metric_history(child.info.run_id,
                                                                   "hr10_full")]
        assert sorted(steps) == [1, 2]
    # resumed: every point is done, nothing is logged twice and the parent is reused
    assert main(argv) == 0
    assert "logged 0 runs (2 already logged)" in capsys.readouterr().out
    assert len(_runs(store, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")) == 2
    assert _by_dir(store, root).info.run_id == parent.info.run_id


@needs_mlflow
def test_a_study_logs_its_trials_under_one_parent_with_their_objective(tmp_path, store,
                                                                        capsys):
    pytest.importorskip("optuna", reason="tune needs Optuna (pip install 'fedem-private[tune]')")
    spec = tmp_path / "tune.toml"
    spec.write_text('[tune]\ntrials = 2\nseed = 0\n\n[tune.space]\n'
                    '"train.lr" = { low = 0.01, high = 0.3, log = true }\n' + TINY_BASE)
    out = tmp_path / "study"
    assert main(["tune", str(spec), "--out", str(out), "--mlflow", store]) == 0
    assert "logged 2 runs" in capsys.readouterr().out
    parent = _by_dir(store, out)
    assert parent.data.tags[tracking.KIND_TAG] == "tune"
    assert {"trials.csv", "best.toml"} <= _artifacts(store, parent.info.run_id)
    children = _runs(store, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    with (out / "trials.csv").open(newline="") as fh:
        scores = {row["trial"]: float(row["val_hr@10"]) for row in csv.DictReader(fh)}
    assert {c.data.tags["tune.trial"]: c.data.metrics["objective"] for c in children} == \
        pytest.approx(scores)


def test_the_default_store_is_sqlite_beside_the_runs(tmp_path):
    store = tracking.store_for(None, tmp_path)
    assert store.uri == f"sqlite:///{tmp_path.absolute() / 'mlflow.db'}"
    assert store.artifacts == (tmp_path.absolute() / "mlartifacts").as_uri()
    assert tracking.store_for(tracking.DEFAULT, tmp_path) == store
    other = tracking.store_for("http://localhost:5000", tmp_path)
    assert other.uri == "http://localhost:5000" and other.artifacts is None


def test_metric_names_follow_results_csv():
    assert tracking.metric_name("full_hr@10") == "hr10_full"
    assert tracking.metric_name("val_full_ndcg@20") == "ndcg20_val_full"
    assert tracking.metric_name("eps_spent") == "eps_spent"
    assert tracking.metric_name("odd@col") == "odd_col"


def test_without_mlflow_the_flag_fails_in_one_line_before_running(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setattr(tracking, "installed", lambda: False)
    out = tmp_path / "run"
    assert main(["run", *TINY_RUN, "--out", str(out), "--mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'fedem-private[mlflow]'" in err
    assert not out.exists()  # refused before the run
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nmethods = ["fedmf"]\nseeds = [0]\n' + TINY_BASE)
    assert main(["sweep", "--mlflow", str(spec)]) == 2  # the file taken as the URI
    assert "put the file before --mlflow" in capsys.readouterr().err


@needs_mlflow
def test_the_ladder_logs_its_runs_under_one_parent_and_prints_its_table(tmp_path, store,
                                                                         capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("tiny.toml").write_text("[data.synthetic]\nn_users = 40\nn_items = 60\n"
                                 "mean_activity = 8\n")
    assert main(["ladder", "--dataset", "synthetic", "--config", "tiny.toml", "--out", "lad",
                 "--rungs", "mostpop", "dp-mostpop:central", "--seeds", "0", "--epsilons", "1",
                 "--mlflow", store]) == 0
    out = capsys.readouterr().out
    table = out[out.index("ladder in lad"):].splitlines()  # ladder.md's rows (issue 80)
    assert table[2].startswith("MostPop") and table[3].startswith("DP-MostPop, central, eps 1")
    parent = _by_dir(store, tmp_path / "lad")
    assert parent.data.tags[tracking.KIND_TAG] == "ladder"
    assert {"ladder.md", "ladder.csv", "results.csv"} <= _artifacts(store, parent.info.run_id)
    children = _runs(store, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(c.info.run_name for c in children) == [
        "runs/dp-mostpop-central-eps1-seed0", "runs/mostpop-seed0"]
    mechanisms = {c.info.run_name: c.data.tags["privacy.mechanism"] for c in children}
    assert mechanisms["runs/mostpop-seed0"] == "none"
    dp = next(c for c in children if "dp-mostpop" in c.info.run_name)
    assert float(dp.data.tags["privacy.epsilon"]) == pytest.approx(1.0)
    assert dp.data.metrics["hr10_full"] == pytest.approx(json.loads(
        (tmp_path / "lad/runs/dp-mostpop-central-eps1-seed0/summary.json").read_text()
    )["metrics"]["full"]["hr@10"])


@needs_mlflow
def test_a_server_out_of_reach_is_one_line_and_the_run_stays(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    out = tmp_path / "run"
    assert main(["run", *TINY_RUN, "--out", str(out), "--mlflow", "http://127.0.0.1:9"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1  # one line (a clipping warning may come before it)
    assert "--mlflow http://127.0.0.1:9: could not log" in errors[0] and "intact" in errors[0]
    assert (out / "summary.json").is_file()
