"""Tuning's own privacy cost (issue 42, item 2): the noisy validation score, the number of
trials drawn before the search, and the search's eps (fedem_private.privacy.tuning)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_mod

from fedem_private.cli import main
from fedem_private.errors import UserError
from fedem_private.privacy.tuning import (
    SHAPES,
    TrialCount,
    TrialEvent,
    noisy_score,
    search_epsilon,
)
from fedem_private.simulation.config import load_toml

DELTA = 1e-5


# ----------------------------------------------------------------------- the score
def test_the_score_noise_is_keyed_and_has_the_stated_scale():
    assert noisy_score(50, 3.0, seed=1, trial=4) == noisy_score(50, 3.0, seed=1, trial=4)
    assert noisy_score(50, 3.0, seed=1, trial=4) != noisy_score(50, 3.0, seed=1, trial=5)
    assert noisy_score(50, 3.0, seed=1, trial=4) != noisy_score(50, 3.0, seed=2, trial=4)
    draws = np.array([noisy_score(0, 5.0, seed=0, trial=t) for t in range(4000)])
    # sd within 5% (chi-square, 4000 draws: about 4 standard errors) and mean near 0
    assert abs(draws.std() / 5.0 - 1.0) < 0.05
    assert abs(draws.mean()) < 4 * 5.0 / math.sqrt(4000)
    with pytest.raises(ValueError):
        noisy_score(1, 0.0, seed=0, trial=0)


# ------------------------------------------------------------- the number of trials
@pytest.mark.parametrize("shape", [math.inf, 1.0, 0.0, 0.5, 3.0])
def test_the_drawn_number_of_trials_has_the_accounted_mean(shape):
    count = TrialCount(6.0, shape)
    assert count.distribution().mean() == pytest.approx(6.0, rel=1e-6)
    draws = np.array([count.draw(s) for s in range(3000)])
    assert abs(draws.mean() - 6.0) < 4 * draws.std() / math.sqrt(len(draws))
    if shape != math.inf:  # truncated: at least one trial
        assert draws.min() >= 1
    assert count.draw(11) == count.draw(11)


@pytest.mark.parametrize("shape", [1.0, 0.0, 0.5, 3.0])
def test_the_halting_probability_matches_dp_accounting(shape):
    """The gamma the draws use is dp-accounting's for the same mean and shape (its private
    helper is the reference), never smaller (never more trials than accounted)."""
    ours = TrialCount(9.0, shape).gamma()
    theirs = rdp_mod._gamma_truncated_negative_binomial(shape, 9.0)
    assert ours == pytest.approx(theirs, rel=1e-8)
    assert ours >= theirs


# ---------------------------------------------------------------------- accounting
TRIAL = TrialEvent(sample_rate=0.1, noise_multiplier=1.3, rounds=20, score_noise=10.0)


def test_every_trial_is_the_k_fold_composition_and_grows_with_k():
    one = search_epsilon(TRIAL, DELTA, trials=1)["views"]["observer"]
    assert one["every_trial"]["rdp"] == pytest.approx(one["one_trial"]["rdp"])
    eps = [search_epsilon(TRIAL, DELTA, trials=k)["views"]["observer"]["every_trial"]
           ["reported"] for k in (1, 4, 16)]
    assert eps[0] < eps[1] < eps[2]
    acc = rdp_mod.RdpAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(TRIAL.event("observer"), 4))
    assert search_epsilon(TRIAL, DELTA, trials=4, pld=False)["views"]["observer"][
        "every_trial"]["rdp"] == pytest.approx(acc.get_epsilon(DELTA))


def test_one_run_is_the_training_alone():
    acc = search_epsilon(TRIAL, DELTA, trials=1)["views"]["observer"]
    assert acc["one_run"]["rdp"] < acc["one_trial"]["rdp"]
    acc_free = search_epsilon(TrialEvent(0.1, 1.3, 20, 1e12), DELTA, trials=1)
    assert acc["one_run"]["rdp"] == pytest.approx(
        acc_free["views"]["observer"]["one_trial"]["rdp"], rel=1e-6)


def test_the_score_costs_something_and_the_aggregator_more():
    free = TrialEvent(0.1, 1.3, 20, 1e9)
    assert (search_epsilon(TRIAL, DELTA, trials=1)["views"]["observer"]["one_trial"]["rdp"]
            > search_epsilon(free, DELTA, trials=1)["views"]["observer"]["one_trial"]["rdp"])
    views = search_epsilon(TRIAL, DELTA, trials=3)["views"]
    assert views["aggregator"]["every_trial"]["reported"] > \
        views["observer"]["every_trial"]["reported"]


def _theorem2(sigma: float, mean: float, shape: float, delta: float) -> float:
    """Papernot and Steinke's Theorem 2 by hand for the Gaussian mechanism (RDP
    lambda / (2 sigma^2) at every order), converted with the classic
    eps = rdp(lambda) + log(1/delta) / (lambda - 1): looser than dp-accounting's
    conversion, so an upper bound on what it reports."""
    gamma = TrialCount(mean, shape).gamma()
    orders = np.concatenate([np.linspace(1.01, 8, 200), np.arange(8, 256, 0.5)])
    rdp = orders / (2 * sigma ** 2)
    c = (1 + shape) * np.min((1 - 1 / orders) * rdp - math.log(gamma) / orders)
    out = rdp + math.log(mean) / (orders - 1) + c
    return float(np.min(out + math.log(1 / delta) / (orders - 1)))


@pytest.mark.parametrize("shape", [1.0, 0.5])
def test_only_choice_is_theorem_2_and_below_composing_every_trial(shape):
    sigma = 4.0
    trial = TrialEvent(1.0, 1e9, 1, sigma)  # one Gaussian release of the score, nothing else
    acc = search_epsilon(trial, DELTA, trials=8, count=TrialCount(8.0, shape))
    chosen = acc["views"]["observer"]["only_choice"]["rdp"]
    one = acc["views"]["observer"]["one_trial"]["rdp"]
    assert one < chosen <= _theorem2(sigma, 8.0, shape, DELTA)
    assert chosen > 0.7 * _theorem2(sigma, 8.0, shape, DELTA)  # the same bound, a tighter
    # conversion
    assert chosen < acc["views"]["observer"]["every_trial"]["rdp"]


def test_a_final_run_adds_to_both_bounds():
    bare = search_epsilon(TRIAL, DELTA, trials=5, count=TrialCount(5.0, math.inf), pld=False)
    final = search_epsilon(TRIAL, DELTA, trials=5, count=TrialCount(5.0, math.inf), pld=False,
                           final_runs=1)
    for bound in ("every_trial", "only_choice"):
        assert final["views"]["observer"][bound]["rdp"] > bare["views"]["observer"][bound]["rdp"]


# ---------------------------------------------------------------------- the command
needs_optuna = pytest.mark.skipif(importlib.util.find_spec("optuna") is None,
                                  reason="Optuna is not installed (pip install "
                                  "'fedem-private[tune]')")

SPEC = """
[tune]
seed = 2
{trials}

[tune.space]
"train.lr" = {{ low = 0.01, high = 0.3, log = true }}
{extra_space}

[tune.private]
score_noise = 2.0
{private}

[base.data.synthetic]
n_users = 40
n_items = 50
mean_activity = 6

[base.train]
rounds = 3
local_epochs = 1
eval_every = 3

[base.federation]
method = "fedmf"

[base.privacy]
mode = "{mode}"
epsilon = 8.0
delta = 1e-5
sample_rate = 0.5
clip = 1.0
"""


def _spec(tmp_path: Path, trials: str = "", private: str = 'mean_trials = 2',
          mode: str = "cdp-gaussian", extra_space: str = "") -> Path:
    path = tmp_path / "t.toml"
    path.write_text(SPEC.format(trials=trials, private=private, mode=mode,
                                extra_space=extra_space))
    return path


@needs_optuna
def test_a_private_search_releases_only_noisy_scores_and_accounts_for_itself(tmp_path, capsys):
    from fedem_private.experiments.tune import load_private

    spec = _spec(tmp_path)
    out = tmp_path / "s"
    assert main(["tune", str(spec), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "privacy of the search" in printed and "only the choice seen" in printed
    # a trial's progress shows its rounds, never its (unreleased) validation score
    progress = [line for line in captured.err.splitlines() if line.startswith("tune: trial")]
    assert progress and all(line.endswith("round 3/3") for line in progress)
    import optuna
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    assert all(not t.intermediate_values for t in study.trials)
    assert "best noisy sampled validation HR@10" in printed
    drawn = load_private(spec).count().draw(2)
    with (out / "trials.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == drawn  # exactly K trials, K drawn from the seed
    assert all("val_hr@10" not in key for key in rows[0])  # the scores are kept apart
    with (out / "noisy-scores.csv").open() as fh:
        scores = {int(r["trial"]): r for r in csv.DictReader(fh)}
    assert {int(r["trial"]) for r in rows} == set(scores)
    for row in rows:
        val = json.loads((Path(row["run_dir"]) / "summary.json").read_text())["metrics"]["val"]
        hits = round(val["hr@10"] * val["users"])
        score = scores[int(row["trial"])]
        assert score["publishing_costs"].startswith("every-trial eps")
        released = float(score["val_hr@10_noisy"])
        assert released == pytest.approx(
            noisy_score(hits, 2.0, seed=2, trial=int(row["trial"])) / val["users"])
        assert released != pytest.approx(val["hr@10"])  # the true score never left
    acc = json.loads((out / "privacy.json").read_text())
    assert acc["trials_started"] == drawn and acc["trials_drawn"] == drawn
    obs = acc["views"]["observer"]
    assert obs["one_trial"]["reported"] > 8.0 - 1e-6  # each trial is calibrated to eps 8
    assert obs["every_trial"]["reported"] > obs["one_trial"]["reported"]
    assert "only_choice" in obs
    assert load_toml(out / "best.toml").train.select_round == "last"


@needs_optuna
def test_a_fixed_number_of_private_trials_gets_the_every_trial_bound_only(tmp_path):
    from fedem_private.experiments.tune import run_tuning

    result = run_tuning(_spec(tmp_path, trials="trials = 2", private=""), tmp_path / "s")
    views = result["privacy"]["views"]
    assert result["completed"] == 2 and "only_choice" not in views["observer"]
    assert views["observer"]["every_trial"]["reported"] > \
        views["observer"]["one_trial"]["reported"]


@pytest.mark.parametrize("kwargs, words", [
    ({"mode": "ldp-gaussian"}, "cdp-gaussian"),
    ({"extra_space": '"train.rounds" = { choices = [2, 3] }'}, "train.rounds"),
    ({"extra_space": '"privacy.sample_rate" = { choices = [0.2, 0.5] }'}, "sample_rate"),
    ({"trials": "trials = 3"}, "drop [tune] trials"),
    ({"private": 'mean_trials = 0.5'}, "mean_trials"),
    ({"private": 'mean_trials = 2\ndistribution = "uniform"'}, "distribution"),
])
def test_private_searches_that_cannot_be_accounted_are_refused(tmp_path, capsys, kwargs, words):
    from fedem_private.experiments.tune import load_private

    spec = _spec(tmp_path, **kwargs)
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_private(spec)
    assert main(["tune", str(spec), "--out", str(tmp_path / "s")]) == 2
    assert words.split()[0] in capsys.readouterr().err


def test_shape_names_are_dp_accountings():
    assert SHAPES == {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}


def test_the_ladder_labels_an_accounted_search_with_the_whole_pipelines_eps(tmp_path):
    from benchmarks.ladder import private_rungs

    study = tmp_path / "fedmf-cdp-private"
    study.mkdir()
    (study / "best.toml").write_text('[federation]\nmethod = "fedmf"\n\n[privacy]\n'
                                     'mode = "cdp-gaussian"\nepsilon = 1.5\n')
    acc = search_epsilon(TRIAL, DELTA, trials=3, count=TrialCount(3.0, math.inf), pld=False)
    (study / "privacy.json").write_text(json.dumps(acc))
    rungs = private_rungs("ml-100k", "x", [0, 1], [], modes=[], accounted=[str(study)])
    assert [name for _, name, _ in rungs] == ["fedmf-cdp-private-accounted-seed0",
                                              "fedmf-cdp-private-accounted-seed1"]
    label = rungs[0][0]
    chosen = acc["views"]["observer"]["only_choice"]["reported"]
    run = acc["views"]["observer"]["one_run"]["reported"]
    assert f"eps {run:.2f} a run" in label and f"only the choice seen {chosen:.2f}" in label
    assert rungs[1][2]["train"]["seed"] == 1


@needs_optuna
def test_a_total_budget_sets_each_trials_noise_and_is_met(tmp_path):
    from fedem_private.experiments.tune import run_tuning

    spec = _spec(tmp_path, private="mean_trials = 2\ntotal_epsilon = 6.0")
    spec.write_text(spec.read_text().replace("epsilon = 8.0\n", ""))
    result = run_tuning(spec, tmp_path / "s")
    acc = result["privacy"]["views"]["observer"]
    assert acc["only_choice"]["reported"] == pytest.approx(6.0, abs=1e-3)
    assert acc["one_trial"]["reported"] < 6.0 - 1  # each trial well below the total
    assert load_toml(tmp_path / "s" / "best.toml").privacy.noise_multiplier == \
        pytest.approx(result["privacy"]["trial"]["noise_multiplier"])
    spec.write_text(spec.read_text().replace('mode = "cdp-gaussian"',
                                             'mode = "cdp-gaussian"\nepsilon = 2.0'))
    with pytest.raises(UserError, match="total_epsilon sets each trial's noise"):
        run_tuning(spec, tmp_path / "t")


@needs_optuna
def test_each_trial_of_a_private_search_draws_its_own_randomness(tmp_path):
    """Issue 65: every trial of a private search ran with the base seed, so two trials'
    aggregates carried the same noise and their difference was noise-free. Each trial now
    runs with its own nonce (its own noise, participation, initialisation, negatives),
    the final run (best.toml) with nonce 0, never a trial's; the data and the validation
    candidates stay the base seed's."""
    from fedem_private.data import leave_one_out, load_dataset
    from fedem_private.experiments import neighbours as nb
    from fedem_private.experiments.tune import run_tuning, trial_nonce

    out = tmp_path / "s"
    run_tuning(_spec(tmp_path, trials="trials = 3", private=""), out)
    with (out / "trials.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    cfgs = [load_toml(Path(r["run_dir"]) / "config.toml") for r in rows]
    nonces = [c.train.nonce for c in cfgs]
    assert nonces == [trial_nonce(2, int(r["trial"])) for r in rows]
    assert 0 not in nonces and len(set(nonces)) == len(nonces)
    seeds = {c.train.run_seed for c in cfgs}
    final = load_toml(out / "best.toml")
    assert final.train.nonce == 0 and final.train.run_seed == 0
    assert len(seeds) == len(cfgs) and final.train.run_seed not in seeds
    assert {c.train.seed for c in cfgs} == {0}  # one dataset, one split, one candidate set
    # an observer who sees two trials' releases cannot cancel their noise: at one
    # setting, the two trials' aggregates differ by independent noise
    cfg = cfgs[0]
    data = load_dataset(cfg.data.dataset, cfg.data.data_dir, seed=cfg.train.seed,
                        synthetic=cfg.data.synthetic)
    split = leave_one_out(data, cfg.train.seed, cfg.data.min_user_ratings)
    pair = nb.trials_pair(cfg, nonces=(nonces[0], nonces[1]), split=split)
    assert pair.sound, pair.violations


def test_the_tuner_owns_the_nonce(tmp_path):
    spec = _spec(tmp_path, trials="trials = 2", private="",
                 extra_space='"train.nonce" = { low = 1, high = 9, int = true }')
    from fedem_private.experiments.tune import load_tune_spec

    with pytest.raises(UserError, match="train.nonce"):
        load_tune_spec(spec)
