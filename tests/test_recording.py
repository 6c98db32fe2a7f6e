"""Recording what the server saw (experiments.recording) and the run/attack CLI flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from recorded_runs import recorded_run, small_config

from attacks.ground_truth import load_demographics, load_ground_truth
from attacks.observations import load_observations, load_public
from fedem_private.cli import main
from fedem_private.errors import UserError
from fedem_private.experiments.recording import RecordSpec
from fedem_private.experiments.runner import prepare
from fedem_private.models.mf import draw_samples


@pytest.fixture(scope="module")
def fedmf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_run(tmp_path_factory.mktemp("rec") / "run", rounds="1,2,last", clients=25)


def test_spec_parsing_and_resolution() -> None:
    spec = RecordSpec.parse("1, 50,last", 7)
    assert spec.rounds == (1, 50, "last") and spec.clients == 7
    assert spec.resolve(50) == (1, 50)
    assert RecordSpec.parse("last", None).clients == 100
    for bad in ("", "0", "x", "1,-2"):
        with pytest.raises(UserError):
            RecordSpec.parse(bad, 3)
    with pytest.raises(UserError, match="beyond"):
        spec.resolve(10)
    with pytest.raises(UserError):
        RecordSpec.parse("1", 0)


def test_recorded_files_hold_what_the_server_saw(fedmf_run: Path) -> None:
    obs = load_observations(fedmf_run)
    assert [o.round for o in obs] == [1, 2, 3]
    public = load_public(fedmf_run)
    assert public.extra["recorded_rounds"] == [1, 2, 3]
    assert public.n_items == 120 and public.num_negatives == 4 and public.lr == 0.1
    text = (fedmf_run / "observations" / "public.json").read_text()
    assert "seed" not in text  # the server must not be able to regenerate the noise
    sim = prepare(small_config())
    first = obs[0]
    np.testing.assert_array_equal(np.sort(first.clients), np.arange(25))  # first N ids
    assert first.participated.all()
    # round 1 sends every client the server's initial table; FedAvg stores it once
    assert first.sent.strides[0] == 0
    q0 = sim.state.q_global.numpy()
    np.testing.assert_allclose(first.sent[3], q0, atol=1e-3)
    truth = {g.round: g for g in load_ground_truth(fedmf_run)}
    for o in obs:
        gt = truth[o.round].select(o.clients)
        samples = draw_samples(sim.seed, o.round, o.clients, sim.split.train_indptr,
                               sim.split.train_items, *sim.excl, sim.split.n_items, 4)
        touched = np.zeros((o.n_clients, o.n_items), dtype=bool)
        for j, c in enumerate(o.clients):
            np.testing.assert_array_equal(gt.positives.row(j), sim.split.train_of(int(c)))
            a, b = samples.negatives_indptr[j], samples.negatives_indptr[j + 1]
            np.testing.assert_array_equal(gt.negatives.row(j), samples.negatives[a:b])
            touched[j, gt.positives.row(j)] = True
            touched[j, gt.negatives.row(j)] = True
        # no privacy: exactly the trained rows changed, untouched rows are bit-exact zeros
        changed = np.abs(o.upload - o.sent).max(axis=2) > 0
        np.testing.assert_array_equal(changed, touched)


def test_demographics_stored_apart(fedmf_run: Path) -> None:
    demo = load_demographics(fedmf_run)
    assert demo is not None and "gender" in demo.attributes
    np.testing.assert_array_equal(demo.clients, np.arange(25))
    sim = prepare(small_config())
    np.testing.assert_array_equal(demo.attributes["gender"], sim.demographics["gender"][:25])
    assert not any("gender" in p.name for p in (fedmf_run / "observations").iterdir())


def test_recording_does_not_change_the_run(tmp_path: Path, fedmf_run: Path) -> None:
    from fedem_private.experiments.runner import execute

    plain = execute(small_config(), tmp_path / "plain")
    recorded = json.loads((fedmf_run / "summary.json").read_text())
    assert plain["metrics"] == recorded["metrics"]


def test_nonparticipants_are_recorded_as_absent(tmp_path: Path) -> None:
    run = recorded_run(tmp_path / "frac", rounds="2", clients=30,
                       train__client_fraction=0.5)
    (obs,) = load_observations(run)
    sim = prepare(small_config(train__client_fraction=0.5))
    took_part = np.isin(obs.clients, sim.participants(2))
    np.testing.assert_array_equal(obs.participated, took_part)
    assert 0 < took_part.sum() < 30
    assert not obs.upload[~took_part].any()


def test_personalised_tables_are_recorded_per_client(tmp_path: Path) -> None:
    run = recorded_run(tmp_path / "em", rounds="last", clients=6, federation__method="fedem")
    (obs,) = load_observations(run)
    assert obs.sent.strides[0] != 0
    assert not np.array_equal(obs.sent[0], obs.sent[1])


def test_cli_run_records_and_attack_writes_the_report(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    out = tmp_path / "cli"
    torch.manual_seed(0)
    code = main(["run", "--rounds", "2", "--eval-every", "2", "--record-rounds", "1,last",
                 "--record-clients", "12", "--out", str(out), "--no-progress",
                 "--privacy", "ldp-laplace", "--epsilon-round", "5", "--clip", "1"])
    assert code == 0
    assert sorted(o.round for o in load_observations(out)) == [1, 2]
    code = main(["attack", str(out), "--attacks", "support,projection,canary"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "projection" in printed and "audit:" in printed
    report = json.loads((out / "attacks.json").read_text())
    item = [r for r in report["records"] if r["attack"] == "projection"]
    assert [r["round"] for r in item] == [1, 2]
    for r in item:
        assert set(r["relations"]) == {"positive_vs_any", "positive_vs_sampled"}
        for key in ("auc", "tpr@1%fpr", "tpr@0.1%fpr", "precision@20%", "recall@20%", "f1@20%",
                    "f1_oracle",
                    "f1_random_baseline", "advantage", "eps_lb_cp", "eps_lb_one_run"):
            assert key in r["relations"]["positive_vs_any"]
        assert r["eps_accounted"] == pytest.approx(5.0)
        assert r["audit_certified"] is False and "eps_lower_bound" in r and "audit_ok" in r
    canary = [r for r in report["records"] if r["attack"] == "canary"]
    assert canary[0]["audit_certified"] is True and canary[0]["audit_ok"] is True
    assert "not certified" in report["assumptions"] or "NOT" in report["assumptions"].upper()


@pytest.mark.parametrize("argv, message", [
    (["attack", "/nonexistent/run"], "run directory not found"),
    (["run", "--record-clients", "3", "--rounds", "1"], "--record-clients needs"),
    (["run", "--record-rounds", "1,x", "--rounds", "1"], "not a round number"),
])
def test_cli_user_errors_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    if argv[0] == "run":
        argv = [*argv, "--out", str(tmp_path / "x"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_attack_rejects_unknown_attacks_and_unrecorded_runs(
        tmp_path: Path, fedmf_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attack", str(fedmf_run), "--attacks", "support,nope"]) == 2
    assert "unknown attack 'nope'" in capsys.readouterr().err
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["attack", str(plain)]) == 2
    assert "not a run directory" in capsys.readouterr().err
