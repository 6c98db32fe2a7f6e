"""Empirical epsilon lower bounds: closed forms, independent recomputation, soundness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attacks.audit import (
    cp_eps_lower_bound,
    cp_lower,
    cp_upper,
    eps_from_rates,
    one_run_eps_lower_bound,
    one_run_p_value,
)
from attacks.scoring import score_attack


def test_clopper_pearson_edges_and_closed_forms() -> None:
    assert float(cp_lower(0, 10, 0.025)) == 0.0
    assert float(cp_upper(10, 10, 0.025)) == 1.0
    # all n succeed: lower bound alpha ** (1 / n); none succeed: upper 1 - alpha ** (1 / n)
    assert float(cp_lower(10, 10, 0.025)) == pytest.approx(0.025 ** 0.1)
    assert float(cp_upper(0, 10, 0.025)) == pytest.approx(1 - 0.025 ** 0.1)
    assert float(eps_from_rates(0.9, 0.1)) == pytest.approx(math.log(9))
    assert float(eps_from_rates(0.5, 0.5)) == 0.0
    # ln((0.8 - 0.1) / 0.1) = ln 7 beats ln((1 - 0.1 - 0.1) / (1 - 0.8)) = ln 4
    assert float(eps_from_rates(0.8, 0.1, delta=0.1)) == pytest.approx(math.log(7))
    # ln(0.5 / 0.05) = ln 10 beats the complement test's ln(0.95 / 0.5) ...
    assert float(eps_from_rates(0.5, 0.05)) == pytest.approx(math.log(10))
    # ... and here the complement test, ln((1 - 0.5) / (1 - 0.95)) = ln 10, wins
    assert float(eps_from_rates(0.95, 0.5)) == pytest.approx(math.log(10))
    assert float(eps_from_rates(0.3, 0.1, delta=0.3)) == 0.0


def test_cp_bound_is_zero_for_random_guessing() -> None:
    assert cp_eps_lower_bound(500, 1000, 500, 1000) == 0.0
    assert cp_eps_lower_bound(52, 100, 47, 100) == 0.0


def test_cp_bound_grows_with_sample_size_for_a_perfect_attack() -> None:
    bounds = [cp_eps_lower_bound(n, n, 0, n) for n in (10, 100, 1000, 10000)]
    assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
    alpha = 0.025
    n = 100
    lo = alpha ** (1 / n)
    assert bounds[1] == pytest.approx(math.log(lo / (1 - lo)))


def test_cp_bound_through_score_attack_grows_with_clients() -> None:
    eps = []
    for k in (40, 160, 640):
        labels = np.zeros((k, 4))
        labels[:, 0] = 1.0
        out = score_attack(labels.copy(), labels, relation="positive_vs_any")
        eps.append(out["eps_lb_cp"])
    assert 0 < eps[0] < eps[1] < eps[2]


def _p_value_direct(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Independent recomputation with exact integer binomial coefficients."""
    q = math.exp(eps) / (1 + math.exp(eps))
    pmf = [math.comb(r, j) * q ** j * (1 - q) ** (r - j) for j in range(r + 1)]
    tail = sum(pmf[v:])
    extra = max((sum(pmf[v - i: v]) / i for i in range(1, v + 1)), default=0.0)
    return min(1.0, tail + 2 * m * delta * extra)


@pytest.mark.parametrize(("m", "r", "v", "eps", "delta"), [
    (100, 40, 30, 0.5, 0.0), (100, 40, 30, 1.0, 1e-3), (50, 50, 50, 2.0, 0.0),
    (200, 60, 31, 0.0, 1e-5), (30, 10, 0, 1.0, 0.01)])
def test_one_run_p_value_matches_direct_sum(m: int, r: int, v: int, eps: float,
                                            delta: float) -> None:
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(
        _p_value_direct(m, r, v, eps, delta), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("delta", [0.0, 1e-4])
def test_one_run_bound_is_the_p_value_crossing(delta: float) -> None:
    m, r, v = 1000, 200, 170
    eps = one_run_eps_lower_bound(m, r, v, confidence=0.95, delta=delta)
    assert eps > 0
    assert _p_value_direct(m, r, v, eps, delta) < 0.05 + 1e-12
    assert _p_value_direct(m, r, v, eps + 1e-6, delta) >= 0.05 - 1e-9
    assert one_run_eps_lower_bound(m, r, v, delta=delta) <= one_run_eps_lower_bound(m, r, v)


def test_one_run_pure_dp_matches_the_binomial_tail_root() -> None:
    # all r guesses right: P[Bin(r, q) >= r] = q ** r = beta  ->  q = beta ** (1 / r)
    r = 100
    q = 0.05 ** (1 / r)
    assert one_run_eps_lower_bound(r, r, r) == pytest.approx(math.log(q / (1 - q)), rel=1e-6)
    assert one_run_eps_lower_bound(100, 100, 50) == 0.0
    assert one_run_eps_lower_bound(100, 0, 0) == 0.0


def test_one_run_bound_is_sound_for_randomised_response() -> None:
    """eps-DP randomised response on each canary's inclusion bit: the bound rarely exceeds eps."""
    eps, m = 1.0, 400
    q = math.exp(eps) / (1 + math.exp(eps))
    violations = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        released = np.where(rng.random(m) < q, included, ~included)
        v = int((released == included).sum())  # guess the released bit for every canary
        violations += one_run_eps_lower_bound(m, m, v) > eps
    assert violations <= 5  # expected about 5% of 40


def test_cp_audit_is_sound_for_randomised_response_clients() -> None:
    """Per client, canaries with coin-flip membership released by eps-DP randomised response."""
    eps, k, per_client = 1.0, 400, 6
    q = math.exp(eps) / (1 + math.exp(eps))
    violations, cp_bounds, one_run_bounds = 0, [], []
    for seed in range(10):
        rng = np.random.default_rng(100 + seed)
        labels = (rng.random((k, per_client)) < 0.5).astype(float)
        flip = rng.random((k, per_client)) >= q
        scores = np.where(flip, 1.0 - labels, labels) + 1e-3 * rng.random((k, per_client))
        out = score_attack(scores, labels, relation="positive_vs_any", seed=seed,
                           randomized_membership=True)
        assert out["audit_assumptions_met"] is True
        violations += out["eps_lb_cp"] > eps
        violations += out["eps_lb_one_run"] > eps
        cp_bounds.append(out["eps_lb_cp"])
        one_run_bounds.append(out["eps_lb_one_run"])
    assert violations <= 1
    # and the audits have power: on average they certify a good part of eps
    assert np.mean(cp_bounds) > 0.3 and np.mean(one_run_bounds) > 0.3
