"""Accountants behind one interface (privacy.accountants) and the one generic calibration."""

from __future__ import annotations

import dataclasses
import math

import pytest

from fedem_private.privacy.accountants import (
    Accountant,
    DpFedAvgRounds,
    LocalRounds,
    accountant_class,
    accountant_names,
)
from fedem_private.privacy.accounting import RoundMechanism, epsilon_bounds, repeated
from fedem_private.privacy.calibration import (
    calibrate,
    calibrate_delta,
    calibrate_noise,
    dpfedavg_noise_multiplier,
    noise_multiplier_for,
)

EPS, DELTA = 2.0, 1e-5
FAMILIES = (LocalRounds("laplace", 5), LocalRounds("gaussian", 5), DpFedAvgRounds(0.2, 5))
CASES = [(name, fam) for name in accountant_names() for fam in FAMILIES
         if accountant_class(name).accepts(fam)]


def test_every_accountant_is_registered_and_has_a_case() -> None:
    assert set(accountant_names()) == {"basic", "advanced", "rdp", "pld", "exact",
                                       "dpfedavg-rdp", "dpfedavg-pld"}
    assert {name for name, _ in CASES} == set(accountant_names())


@pytest.mark.parametrize(("name", "family"), CASES, ids=[f"{n}-{f.kind}" for n, f in CASES])
def test_calibrated_noise_meets_the_target_and_barely(name: str, family: object) -> None:
    cls = accountant_class(name)
    z = calibrate_noise(cls, family, EPS, DELTA)  # type: ignore[arg-type]
    assert 0 < z < math.inf
    assert cls(family.history(z)).epsilon(DELTA) <= EPS  # type: ignore[attr-defined]
    assert cls(family.history(0.999 * z)).epsilon(DELTA) > EPS  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "family"), CASES, ids=[f"{n}-{f.kind}" for n, f in CASES])
def test_solving_for_eps_and_delta_round_trips(name: str, family: object) -> None:
    cls = accountant_class(name)
    z = calibrate(cls, family, epsilon=EPS, delta=DELTA)  # type: ignore[arg-type]
    eps = calibrate(cls, family, noise_multiplier=z, delta=DELTA)  # type: ignore[arg-type]
    assert EPS * (1 - 1e-3) <= eps <= EPS
    delta = calibrate_delta(cls, family, z, eps)  # type: ignore[arg-type]
    assert 0 <= delta <= DELTA * (1 + 1e-6)
    assert cls(family.history(z)).epsilon(delta) <= eps  # type: ignore[attr-defined]


def test_the_public_functions_are_the_generic_calibration() -> None:
    for kind, name in (("laplace", "basic"), ("gaussian", "rdp"), ("gaussian", "exact")):
        assert noise_multiplier_for(kind, EPS, DELTA, 5, name) == calibrate_noise(
            accountant_class(name), LocalRounds(kind, 5), EPS, DELTA)
    assert dpfedavg_noise_multiplier(EPS, DELTA, 0.2, 5, "rdp") == calibrate_noise(
        accountant_class("dpfedavg-rdp"), DpFedAvgRounds(0.2, 5), EPS, DELTA)


def test_step_state_and_bounds_agree_with_the_accounting_functions() -> None:
    mech = RoundMechanism("gaussian", 3.0)
    bounds = epsilon_bounds(repeated(mech, 4), DELTA)
    for name in ("basic", "advanced", "rdp", "pld"):
        acc: Accountant = accountant_class(name)().step(mech, 1).step(mech, 3)
        assert acc.history == repeated(mech, 4)
        assert acc.epsilon(DELTA) == getattr(bounds, name)
        assert type(acc).from_state(acc.state()) == acc
    exact = accountant_class("exact")(repeated(mech, 4))
    assert exact.epsilon(DELTA) == bounds.gaussian_exact
    with pytest.raises(dataclasses.FrozenInstanceError):
        exact.history = ()  # type: ignore[misc]
    with pytest.raises(ValueError):
        accountant_class("exact")(repeated(RoundMechanism("laplace", 3.0), 2)).epsilon(DELTA)
    with pytest.raises(ValueError):
        accountant_class("rdp").from_state(exact.state())
