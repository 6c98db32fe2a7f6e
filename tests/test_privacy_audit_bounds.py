"""The audits' lower bounds (fedem_private.privacy.audit_bounds): hand-computed values,
soundness on mechanisms whose privacy is known exactly, and power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from attacks.audit import gdp_audit
from fedem_private.privacy.accounting import gaussian_epsilon
from fedem_private.privacy.audit_bounds import (
    fails,
    gdp_eps_lower_bound,
    gdp_mu_lower_bound,
    one_run_eps_lower_bound,
    one_run_p_value,
)


def test_one_run_p_value_hand_computed() -> None:
    # eps = 0: v is Binomial(r, 1/2); P[Bin(10, 1/2) >= 9] = (10 + 1) / 1024
    assert one_run_p_value(10, 10, 9, 0.0) == pytest.approx(11 / 1024, rel=1e-12)
    # delta term: 2 m delta max_i P[10 > Bin >= 10 - i] / i; the max is at i = 6:
    # (10 + 45 + 120 + 210 + 252 + 210) / 1024 / 6 = 847 / 6144
    p = one_run_p_value(10, 10, 10, 0.0, delta=1e-3)
    assert p == pytest.approx(1 / 1024 + 2 * 10 * 1e-3 * 847 / 6144, rel=1e-12)
    # eps = ln 3: q = 3/4; P[Bin(2, 3/4) >= 2] = 9/16
    assert one_run_p_value(5, 2, 2, math.log(3.0)) == pytest.approx(9 / 16, rel=1e-12)
    with pytest.raises(ValueError):
        one_run_p_value(5, 6, 2, 1.0)


def test_one_run_bound_hand_computed() -> None:
    # 10 guesses, all right, beta 0.05: q = 0.05 ** (1 / 10) = 0.741134, eps = ln(q / (1 - q))
    assert one_run_eps_lower_bound(10, 10, 10, confidence=0.95) == pytest.approx(1.05186,
                                                                                abs=1e-4)
    # 9 of 10 right: P[Bin(10, 1/2) >= 9] = 0.0107 < 0.05 so eps > 0, and the bound is
    # where P[Bin(10, q) >= 9] = 10 q^9 (1 - q) + q^10 crosses 0.05
    eps = one_run_eps_lower_bound(10, 10, 9, confidence=0.95)
    q = math.exp(eps) / (1 + math.exp(eps))
    assert 10 * q ** 9 * (1 - q) + q ** 10 == pytest.approx(0.05, abs=1e-9)
    assert 0 < eps < 1.05186
    # 8 of 10: P[Bin(10, 1/2) >= 8] = 56 / 1024 = 0.0547 >= 0.05: nothing certified
    assert one_run_eps_lower_bound(10, 10, 8, confidence=0.95) == 0.0
    # the delta term only lowers the bound
    assert one_run_eps_lower_bound(1000, 400, 380, delta=1e-5) < one_run_eps_lower_bound(
        1000, 400, 380)


def test_gdp_mu_bound_hand_computed() -> None:
    # a perfect test on 100 + 100 trials at confidence 0.95 (alpha 0.025 each side):
    # TPR_lo = 0.025 ** (1 / 100), FPR_hi = 1 - 0.025 ** (1 / 100); mu = 2 Phi^-1(TPR_lo)
    lo = 0.025 ** (1 / 100)
    assert lo == pytest.approx(0.963783, abs=1e-6)
    assert gdp_mu_lower_bound(100, 100, 0, 100, confidence=0.95) == pytest.approx(
        2 * norm.ppf(lo), rel=1e-9)
    assert 2 * norm.ppf(lo) == pytest.approx(3.5925, abs=1e-3)
    # a useless test certifies nothing; no member flagged: nothing
    assert gdp_mu_lower_bound(50, 100, 50, 100) == 0.0
    assert gdp_mu_lower_bound(0, 100, 0, 100) == 0.0
    assert gdp_mu_lower_bound(5, 0, 0, 10) == 0.0


def test_gdp_eps_is_the_gaussian_mechanisms_eps() -> None:
    assert gdp_eps_lower_bound(1.0, 1e-5) == pytest.approx(gaussian_epsilon(1.0, 1e-5))
    assert gdp_eps_lower_bound(1.0, 1e-5) == pytest.approx(4.3772, abs=1e-3)
    assert gdp_eps_lower_bound(0.0, 1e-5) == 0.0
    assert fails(2.0, 1.0) and not fails(1.0, 1.0) and not fails(None, 1.0)
    assert not fails(5.0, None) and not fails(5.0, math.inf)


def _gaussian_canaries(mu: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    members = g.random(n) < 0.5
    return mu * members + g.normal(size=n), members


def test_gdp_audit_is_sound_on_an_exact_gaussian_mechanism() -> None:
    """A mu-GDP mechanism (shift mu, unit noise): mu_lb > mu in at most ~5% of audits."""
    mu, n = 1.0, 4000
    sel, ev = np.arange(n // 5), np.arange(n // 5, n)
    bounds = [gdp_audit(*_gaussian_canaries(mu, n, seed), sel, ev, confidence=0.95).mu_lb
              for seed in range(60)]
    assert sum(b > mu for b in bounds) <= 6  # expected <= 3 of 60
    assert np.mean(bounds) > 0.6 * mu  # and it has power


def test_gdp_audit_catches_half_the_noise() -> None:
    """Noise at half the claimed scale doubles mu: the bound exceeds the claimed mu."""
    mu, n = 0.3, 20000
    sel, ev = np.arange(n // 5), np.arange(n // 5, n)
    caught = sum(gdp_audit(*_gaussian_canaries(2 * mu, n, seed), sel, ev).mu_lb > mu
                 for seed in range(10))
    assert caught >= 9
