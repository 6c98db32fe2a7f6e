"""Recording under cdp-gaussian: the released aggregate, and attacks with a control.

docs/design.md section 6: under a central mechanism the server sees no upload, only the
noisy aggregate of each round (and, as the aggregator, who took part). The
recording holds exactly that, the same two tables for every recorded client;
the item attacks score the participants and, as a control, the recorded
clients who sat the round out: what the aggregate reveals about a client it
does not contain is the population's signal.
"""

from __future__ import annotations

import numpy as np
import pytest

from attacks.ground_truth import load_ground_truth
from attacks.observations import load_observations, load_public, observes_aggregate
from attacks.run import AGGREGATE_VERDICT, run_attacks
from fedem_private.experiments.runner import execute, recording_hook
from fedem_private.privacy.central import poisson_participants
from fedem_private.simulation.config import RunConfig, with_overrides

N_USERS, RATE, RECORDED = 120, 0.4, 80


def _run(tmp_path, epsilon: float, rounds: str = "2,last"):
    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": N_USERS,
        "data.synthetic.n_items": 80, "train.rounds": 3, "train.local_epochs": 2,
        "train.dim": 8, "privacy.mode": "cdp-gaussian", "privacy.epsilon": epsilon,
        "privacy.sample_rate": RATE, "privacy.clip": 5.0,
        "record.rounds": rounds, "record.clients": RECORDED})
    run = tmp_path / f"eps{epsilon}"
    summary = execute(cfg, run, setup=recording_hook(cfg))
    return run, summary


@pytest.fixture(scope="module")
def clip_only(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("cdp"), float("inf"))


def test_recording_holds_the_released_aggregate(clip_only):
    run, summary = clip_only
    public = load_public(run)
    assert observes_aggregate(public) and public.privacy_mode == "cdp-gaussian"
    obs = {o.round: o for o in load_observations(run)}
    assert sorted(obs) == [2, 3]
    n = summary["n_users"]
    for t, o in obs.items():
        assert o.clients.tolist() == list(range(RECORDED))
        delta = o.upload.astype(np.float64) - o.sent.astype(np.float64)
        assert np.array_equal(delta, np.broadcast_to(delta[0], delta.shape))  # one release
        assert np.array_equal(o.sent, np.broadcast_to(o.sent[0], o.sent.shape))
        assert np.abs(delta[0]).max() > 0  # the round moved the global table
        took = np.zeros(n, dtype=bool)
        took[poisson_participants(0, t, n, RATE)] = True
        np.testing.assert_array_equal(o.participated, took[:RECORDED])
        assert 0 < o.participated.sum() < RECORDED  # both groups exist to score
    # what round 2 released is what round 3 sent
    np.testing.assert_allclose(obs[3].sent[0], obs[2].upload[0], atol=1e-6)
    truth = {g.round: g for g in load_ground_truth(run)}
    for g in truth.values():
        assert g.clients.tolist() == list(range(RECORDED))
        # every recorded client, in or out of the round, has its keyed negatives
        assert all(g.negatives.row(j).size > 0 for j in range(RECORDED))


def test_attacks_score_participants_and_a_control(clip_only):
    """Main = the attack's scores on the participants' rows, control = on the others':
    both recomputed here from one scoring of every recorded row."""
    from attacks import ATTACKS
    from attacks.labels import labels_for
    from attacks.observations import Observation
    from attacks.scoring import score_attack

    run, _ = clip_only
    report = run_attacks(run, ["projection", "support"], rounds=[3])
    o = load_observations(run, [3])[0]
    truth = load_ground_truth(run, [3])[0]
    public = load_public(run)
    everyone = Observation(o.round, o.clients, o.sent, o.upload, np.ones_like(o.participated))
    for rec in report["records"]:
        assert rec["audit_ok"] is None and rec["audit_reason"] == AGGREGATE_VERDICT
        assert rec["n_clients"] == int(o.participated.sum())
        assert rec["n_control_clients"] == int((~o.participated).sum())
        scores = ATTACKS[rec["attack"]](everyone, public)
        # one release: every row scores the items alike
        assert np.allclose(scores, np.broadcast_to(scores[0], scores.shape), equal_nan=True)
        labels = labels_for(o, truth, "positive_vs_sampled")
        for rows, key in ((o.participated, "relations"), (~o.participated, "relations_control")):
            s = scores.copy()
            s[~rows] = np.nan
            want = score_attack(s, labels, relation="positive_vs_sampled", seed=0,
                                randomized_membership=False)["auc"]
            assert rec[key]["positive_vs_sampled"]["auc"] == pytest.approx(want)
        main = rec["relations"]["positive_vs_sampled"]["auc"]
        control = rec["relations_control"]["positive_vs_sampled"]["auc"]
        assert main != control  # different clients, different items: not one number twice


def test_results_carry_the_control(clip_only):
    from fedem_private.experiments.attack_step import read_records
    from fedem_private.experiments.results import attack_columns

    run, _ = clip_only
    run_attacks(run, ["projection"], rounds=[3])
    out, verdict = attack_columns(read_records(run / "attacks.json"))
    assert verdict == ""  # nothing audited by an item attack on an aggregate
    assert 0.0 <= out["projection_control_auc"] <= 1.0
    assert out["projection_control_auc"] != out["projection_auc"]


def test_report_explains_the_control(clip_only, tmp_path):
    from fedem_private.experiments.report import write_report

    run, _ = clip_only
    run_attacks(run, ["projection"], rounds=[3])
    written = write_report(str(run.parent), str(tmp_path / "report"))
    text = next(p for p in written if p.name == "report.md").read_text()
    assert "projection_control AUC" in text
    assert "`<attack>_control`: under `cdp-gaussian`" in text
