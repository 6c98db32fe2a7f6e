"""The certified canary audit (attacks.canary) on the real release functions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attacks.canary import canary_audit, canary_scores, claimed_epsilon, params_from_log
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params


def _params(mode: str, eps_round: float):
    return resolve_params(PrivacyConfig(mode=mode, epsilon_round=eps_round), 1)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_laplace_sound_passes_and_half_noise_is_caught(eps: float) -> None:
    params = _params("ldp-laplace", eps)
    sound = canary_audit(params, seed=1, n_clients=4000)
    assert sound["audit_ok"] is True and sound["eps_lower_bound"] <= eps
    assert sound["audit_assumptions_met"] is True
    broken = canary_audit(params, seed=1, noise_factor=0.5, n_clients=4000)
    assert broken["audit_ok"] is False and broken["eps_lower_bound"] > eps


def test_gaussian_sound_passes() -> None:
    params = _params("ldp-gaussian", 1.0)
    out = canary_audit(params, seed=2, n_clients=4000)
    assert out["audit_ok"] is True and out["delta"] == params.delta


def test_touched_rows_are_caught_at_any_noise() -> None:
    for eps in (0.1, 1.0):
        out = canary_audit(_params("ldp-touched-rows", eps), seed=3, n_clients=2000)
        assert out["eps_claimed"] == pytest.approx(eps)
        assert out["audit_ok"] is False and out["eps_lower_bound"] > 3.0


def test_canaries_are_fair_coins_on_the_release() -> None:
    params = _params("ldp-laplace", 1.0)
    scores, labels = canary_scores(params, n_clients=2000, seed=0, noise_factor=1e-9)
    assert 0.45 < labels.mean() < 0.55
    np.testing.assert_allclose(np.sign(scores), 2 * labels - 1)  # no noise: exact +-C


def test_params_round_trip_and_claims() -> None:
    params = _params("ldp-laplace", 1.5)
    assert params_from_log(params.as_log()) == params
    assert claimed_epsilon(params) == pytest.approx(1.5)
    touched = _params("ldp-touched-rows", 0.7)
    assert touched.epsilon_round == float("inf") and claimed_epsilon(touched) == 0.7
    none = resolve_params(PrivacyConfig(), 1)
    assert claimed_epsilon(none) is None
    with pytest.raises(ValueError):
        canary_scores(none)
    no_noise = dataclasses.replace(params, noise_scale=0.0, epsilon_round=float("inf"))
    assert claimed_epsilon(no_noise) is None


@pytest.mark.parametrize("adaptive", [False, True])
def test_cdp_sound_passes_and_too_little_noise_is_caught(adaptive: bool) -> None:
    """One round of the secure sum, add/remove, unamplified (the aggregator's view).

    The one-threshold certified bound is weak against Gaussian noise: at half the
    accounted noise (true eps 4.4 against the claimed 2.0) it certifies 1.4 with
    20,000 canaries and 2.0 with 100,000 (measured), so half noise is caught by the
    noise statistic of tests/test_privacy_cdp.py instead, and this audit is shown to
    catch 0.3 of the accounted noise.
    """
    extra = {"clip_quantile": 0.5, "clip_count_noise": 20.0} if adaptive else {}
    params = resolve_params(PrivacyConfig(mode="cdp-gaussian", noise_multiplier=2.0,
                                          sample_rate=0.5, clip=3.0, **extra), 10, 100)
    claimed = params.epsilon_round
    sound = canary_audit(params, seed=4, n_clients=4000)
    assert sound["eps_claimed"] == pytest.approx(claimed)
    assert sound["audit_ok"] is True and sound["eps_lower_bound"] <= claimed
    broken = canary_audit(params, seed=4, noise_factor=0.3, n_clients=4000)
    assert broken["audit_ok"] is False and broken["eps_lower_bound"] > claimed


def test_cdp_canaries_are_clipped_and_present_or_absent() -> None:
    params = resolve_params(PrivacyConfig(mode="cdp-gaussian", noise_multiplier=1.0,
                                          clip=3.0), 1)
    scores, labels = canary_scores(params, n_clients=2000, seed=0, noise_factor=1e-12)
    assert 0.45 < labels.mean() < 0.55
    # no noise: a present canary's 2C delta is clipped to C, an absent one adds nothing
    np.testing.assert_allclose(scores, 3.0 * labels, atol=1e-9)


def test_cdp_run_without_recording_is_audited_from_its_ledger(tmp_path) -> None:
    """cdp-gaussian records nothing; the canary audit needs only the ledger's parameters."""
    from attacks.run import run_attacks
    from fedem_private.errors import UserError
    from fedem_private.experiments.runner import execute
    from fedem_private.simulation.config import RunConfig, with_overrides

    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 40, "data.synthetic.n_items": 30,
        "train.rounds": 2, "train.local_epochs": 1, "train.dim": 4,
        "privacy.mode": "cdp-gaussian", "privacy.epsilon": 2.0, "privacy.sample_rate": 0.5,
        "privacy.clip": 1.0})
    execute(cfg, tmp_path / "run")
    report = run_attacks(tmp_path / "run", ["canary"])
    (record,) = report["records"]
    assert record["eps_claimed"] == pytest.approx(report["eps_accounted_per_round"])
    assert record["audit_ok"] is True and report["audit_ok"] is True
    assert (tmp_path / "run" / "attacks.json").is_file()
    with pytest.raises(UserError, match="recorded"):
        run_attacks(tmp_path / "run", ["projection", "canary"])
