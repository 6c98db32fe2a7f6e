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
