"""Calibration round trip: the calibrated noise meets the target, 0.999 x it does not."""

from __future__ import annotations

import math

import pytest

from fedem_private.errors import UserError
from fedem_private.privacy import accounting as acc
from fedem_private.privacy.accounting import RoundMechanism, repeated
from fedem_private.privacy.calibration import (
    gaussian_noise_multiplier,
    laplace_epsilon_round,
    noise_multiplier_for,
)
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params

DELTA = 1e-5


def _eps(kind: str, z: float, rounds: int, accountant: str) -> float:
    history = repeated(RoundMechanism(kind, z), rounds)
    if accountant == "exact":
        value = acc.gaussian_exact_epsilon(history, DELTA)
        assert value is not None
        return value
    return acc.BOUND_FUNCTIONS[accountant](history, DELTA)


ROUND_TRIPS = [
    (kind, accountant, eps, rounds)
    for kind, accountants in (("laplace", ("basic", "advanced", "rdp", "pld")),
                              ("gaussian", ("basic", "advanced", "rdp", "pld", "exact")))
    for accountant in accountants
    for eps, rounds in ((1.0, 20), (4.0, 50))
]


@pytest.mark.parametrize(("kind", "accountant", "eps", "rounds"), ROUND_TRIPS)
def test_round_trip(kind: str, accountant: str, eps: float, rounds: int) -> None:
    z = noise_multiplier_for(kind, eps, DELTA, rounds, accountant)
    assert _eps(kind, z, rounds, accountant) <= eps
    assert _eps(kind, 0.999 * z, rounds, accountant) > eps


def test_laplace_basic_closed_form_and_pinned_case() -> None:
    assert laplace_epsilon_round(10.0, DELTA, 100, "basic") == pytest.approx(0.1, rel=1e-12)
    # the pinned case backwards: eps_round 0.1 over 100 rounds gives 4.220 by PLD
    eps_round = laplace_epsilon_round(4.2203, DELTA, 100, "pld")
    assert eps_round == pytest.approx(0.1, rel=1e-3)


def test_tighter_accountant_allows_less_noise() -> None:
    zs = {a: noise_multiplier_for("laplace", 3.0, DELTA, 60, a)
          for a in ("basic", "advanced", "rdp", "pld")}
    assert zs["pld"] <= zs["rdp"] <= zs["basic"]
    zg = gaussian_noise_multiplier(3.0, DELTA, 60, "pld")
    assert zg >= gaussian_noise_multiplier(3.0, DELTA, 60, "exact")


def test_infinite_target_means_no_noise() -> None:
    assert noise_multiplier_for("gaussian", math.inf, DELTA, 10, "pld") == 0.0
    assert math.isinf(laplace_epsilon_round(math.inf, DELTA, 10, "rdp"))


@pytest.mark.parametrize(
    ("kind", "eps", "delta", "rounds", "accountant", "needle"),
    [
        ("gaussian", 1.0, 0.0, 10, "pld", "impossible with Gaussian"),
        ("gaussian", 1.0, 0.0, 10, "rdp", "impossible with Gaussian"),
        ("laplace", 1.0, 0.0, 10, "pld", "accountant 'basic'"),
        ("laplace", 0.0, DELTA, 10, "pld", "must be > 0"),
        ("laplace", math.nan, DELTA, 10, "pld", "must be > 0"),
        ("laplace", 1.0, 1.0, 10, "pld", "delta must be in"),
        ("laplace", 1.0, DELTA, 0, "pld", "rounds"),
        ("laplace", 1.0, DELTA, 10, "exact", "unknown accountant"),
    ],
)
def test_impossible_targets(kind: str, eps: float, delta: float, rounds: int,
                            accountant: str, needle: str) -> None:
    with pytest.raises(UserError, match=needle) as info:
        noise_multiplier_for(kind, eps, delta, rounds, accountant)
    assert "\n" not in str(info.value)


def test_pure_dp_target_with_basic() -> None:
    eps_round = laplace_epsilon_round(2.0, 0.0, 40, "basic")
    assert 40 * eps_round <= 2.0


def test_resolve_params_meets_the_total_budget() -> None:
    for mode in ("ldp-laplace", "ldp-gaussian"):
        params = resolve_params(PrivacyConfig(mode=mode, epsilon=2.0, accountant="rdp"), 30)
        mech = params.round_mechanism()
        assert mech is not None
        assert acc.compose(mech, 30, DELTA).reported <= 2.0
    g = resolve_params(PrivacyConfig(mode="ldp-gaussian", epsilon_round=0.5), 30)
    assert g.epsilon_round <= 0.5
    assert g.epsilon_round == pytest.approx(0.5, rel=1e-6)
