"""DSkellam's encoding and accounting (fedem_private/privacy/skellam.py), recomputed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from fedem_private.privacy import skellam as S
from fedem_private.privacy.client_secrets import ClientSecrets


def test_hadamard_is_orthonormal_and_its_own_inverse() -> None:
    x = np.random.default_rng(0).normal(size=(3, 64))
    y = S.hadamard(x)
    assert np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1))
    assert np.allclose(S.hadamard(y), x)
    signs = S.rotation_signs(1, 2, 64)
    assert np.allclose(S.unrotate(S.rotate(x[:, :50], signs), signs, 50), x[:, :50])


def test_conditional_rounding_meets_the_norm_bound() -> None:
    rng = np.random.default_rng(1)
    y = rng.normal(size=(200, 256)) * 3
    bound = S.rounded_l2_bound(float(np.linalg.norm(y, axis=1).max()), 256, S.DEFAULT_BETA)
    out, tries = S.round_conditionally(y, bound, secrets=ClientSecrets(0), round_=1,
                                       clients=np.arange(200))
    assert np.all(np.linalg.norm(out, axis=1) <= bound)
    assert np.all(np.abs(out - y) < 1)
    assert tries.min() >= 1


def test_encode_decode_recovers_the_sum_within_rounding_and_noise() -> None:
    plan = S.make_plan(bits=16, clip=1.0, dim=300, cohort=20, noise_clients=20, rounds=5,
                       delta=1e-5, noise_multiplier=0.0)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(20, 300))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    enc = S.encode(plan, x, seed=3, round_=1, clients=np.arange(20))
    assert enc.values.max() < 1 << 16
    est = S.decode(plan, enc.values.astype(np.int64).sum(axis=0), seed=3, round_=1)
    # no noise: only the rounding errors, each entry < 1 per client before scaling
    assert np.linalg.norm(est - x.sum(axis=0)) <= 20 * math.sqrt(plan.padded) / plan.scale
    assert np.linalg.norm(est - x.sum(axis=0)) < 0.01 * np.linalg.norm(x.sum(axis=0))


def test_the_noise_variance_is_the_planned_one() -> None:
    n = S.skellam_noise((50, 2000), 40.0, secrets=ClientSecrets(0), round_=1, clients=np.arange(50))
    assert abs(n.var() / 40.0 - 1) < 0.02 and abs(n.mean()) < 0.05


def _skellam_logpmf(k: np.ndarray, mu: float) -> np.ndarray:
    """log pmf of Poisson(mu/2) - Poisson(mu/2) at k, summed in log space over the two
    Poissons' values (no underflow in the tails the high orders weigh)."""
    from scipy.stats import poisson

    a = np.abs(np.asarray(k))[:, None]
    j = np.arange(0, int(mu + 40 * math.sqrt(mu) + 40))[None, :]
    return special.logsumexp(poisson.logpmf(j + a, mu / 2) + poisson.logpmf(j, mu / 2), axis=1)


def _renyi_shift(orders: tuple[int, ...], shift: int, mu: float) -> np.ndarray:
    """D_alpha(Sk + shift || Sk) at each order, summed numerically over the pmfs."""
    half = int(mu + 40 * math.sqrt(mu) + 40)
    k = np.arange(-half - abs(shift), half + abs(shift) + 1)
    lq = _skellam_logpmf(k, mu)
    lp = np.roll(lq, shift)  # log pmf of Sk + shift (the wrapped ends are negligible)
    inner = slice(abs(shift), len(k) - abs(shift))
    lp, lq = lp[inner], lq[inner]
    return np.array([float(special.logsumexp(a * lp + (1 - a) * lq)) / (a - 1)
                     for a in orders])


ORDERS = tuple(range(2, 41))


@pytest.mark.parametrize(("mu", "shifts"), [(3.0, (1,)), (8.0, (2, 1)), (20.0, (1, 1, 1, 1)),
                                            (50.0, (3,))])
def test_the_rdp_bound_holds_against_the_pmfs(mu: float, shifts: tuple[int, ...]) -> None:
    """Small noise, where the discretisation term matters: the paper's bound is above the
    numerical Renyi divergence of the product distribution at every order."""
    l2 = math.sqrt(sum(s * s for s in shifts))
    l1 = float(sum(abs(s) for s in shifts))
    bound = S.skellam_rdp(ORDERS, l1, l2, mu)
    exact = sum(_renyi_shift(ORDERS, s, mu) for s in shifts)
    assert np.all(exact <= bound * (1 + 1e-9)), (exact, bound)


def test_reported_epsilon_within_one_percent_of_the_pmfs() -> None:
    """At the noise the mechanism runs at, the eps reported (the bound, composed, converted)
    is within 1% of the eps of the exact Renyi divergences of the worst-case shift (the L1
    bound met: Delta_2^2 entries of one), composed and converted the same way."""
    l2 = 4.0
    l1 = S.rounded_l1_bound(l2, 1024)  # = l2^2 = 16
    rounds, delta = 10, 1e-5
    mu = S.calibrate_variance(4.0, rounds, l1, l2, delta)
    orders = tuple(range(2, 65))
    reported = S.rdp_epsilon(rounds * S.skellam_rdp(orders, l1, l2, mu), delta, orders)
    exact_rdp = 16 * _renyi_shift(orders, 1, mu)
    exact = S.rdp_epsilon(rounds * exact_rdp, delta, orders)
    assert exact <= reported
    assert reported / exact - 1 < 0.01
    assert abs(S.skellam_epsilon(rounds, l1, l2, mu, delta) - 4.0) < 1e-3


def test_wrap_bound_and_derived_scale() -> None:
    plan = S.make_plan(bits=16, clip=1.0, dim=3000, cohort=100, noise_clients=90, rounds=20,
                       delta=1e-5, epsilon=5.0)
    assert plan.wrap <= S.WRAP_TARGET
    assert abs(plan.epsilon(20) - 5.0) < 1e-3
    # more bits: a larger scale, the same guarantee, a smaller rounding inflation
    wide = S.make_plan(bits=20, clip=1.0, dim=3000, cohort=100, noise_clients=90, rounds=20,
                       delta=1e-5, epsilon=5.0)
    assert wide.scale > 10 * plan.scale
    assert wide.l2 / (wide.scale * wide.clip) < plan.l2 / (plan.scale * plan.clip)
    with pytest.raises(ValueError, match="cannot hold"):
        S.make_plan(bits=8, clip=1.0, dim=3000, cohort=100, noise_clients=90, rounds=20,
                    delta=1e-5, epsilon=5.0)
    # a wrap-around bound that can fail: far too large a scale
    assert S.wrap_bound(16, 1e6, 1.0, 4096, 100, plan.variance, plan.beta) == 1.0


PLAN = {"clip": 1.0, "dim": 3000, "cohort": 100, "noise_clients": 90, "rounds": 20,
        "delta": 1e-5, "epsilon": 5.0, "noise_multiplier": None, "scale": None}


def test_too_few_bits_are_refused_with_the_fewest_that_hold_the_sum() -> None:
    """issue 80: --ddp-bits 4 was refused without the bits that would do; the refusal now
    names the smallest, found by trying each in turn (12 here: 11 still fails)."""
    from fedem_private.errors import UserError
    from fedem_private.privacy.ddp import DdpSecureSum

    assert S.smallest_bits(bits=4, **PLAN) == 12
    with pytest.raises(ValueError, match="cannot hold"):
        S.make_plan(bits=11, **PLAN)
    assert S.make_plan(bits=12, **PLAN).wrap <= S.WRAP_TARGET
    ddp = DdpSecureSum(clip=1.0, bits=4, scale=None, tolerance=0.1, dropout=0.0,
                       expected_count=100.0, cohort=100, seed=0, rounds=20, delta=1e-5,
                       epsilon=5.0, noise_multiplier=None)
    with pytest.raises(UserError, match=r"4 bits cannot hold .*; give --ddp-bits 12 or more"):
        ddp._plan_for(3000)
    # more inputs than 2^31 a round: no bits up to 32 hold the sum, and the refusal says so
    assert S.smallest_bits(bits=4, **{**PLAN, "cohort": 3 * 10**9}) is None
    ddp.cohort = 3 * 10**9
    with pytest.raises(UserError, match="not even --ddp-bits 32 holds it"):
        ddp._plan_for(3000)


def test_a_cohort_of_thousands_gets_a_plan_not_an_overflow() -> None:
    """(1 - beta)^-K overflowed a float from K ~ 760 (OverflowError out of make_plan, a
    traceback for a cohort of 800); in logs, the plan is found and meets the target."""
    plan = S.make_plan(bits=16, **{**PLAN, "cohort": 1000, "noise_clients": 1000})
    assert 0 < plan.wrap <= S.WRAP_TARGET
    assert S.wrap_bound(16, plan.scale, 1.0, plan.padded, 1000, plan.variance,
                        plan.beta) == plan.wrap
