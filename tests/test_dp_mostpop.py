"""dp-mostpop's three releases (docs/design.md section 14): noise scale, unbiasedness, and epsilon
against the accountants (issue 42)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedem_private.baselines.popularity import (
    central_gaussian_counts,
    interaction_laplace_counts,
    k_subsets,
    local_interaction_laplace_counts,
    local_oue_counts,
    oue_probabilities,
    train_counts,
)
from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.privacy.accounting import (
    RoundMechanism,
    dpfedavg_bounds,
    epsilon_bounds,
    repeated,
)
from fedem_private.privacy.calibration import dpfedavg_noise_multiplier


@pytest.fixture(scope="module")
def split():
    return leave_one_out(generate(SyntheticConfig(n_users=80, n_items=120, mean_activity=15),
                                  1), 1)


def _clipped_counts(split, k, seed):
    _, items = k_subsets(split, k, seed)
    return np.bincount(items, minlength=split.n_items).astype(float)


def test_k_subsets_are_at_most_k_of_the_users_own_training_items(split):
    k = 6
    indptr, items = k_subsets(split, k, seed=3)
    for u in range(split.n_users):
        mine = items[indptr[u]:indptr[u + 1]]
        assert len(mine) == min(k, split.train_counts[u])
        assert len(set(mine.tolist())) == len(mine)
        assert set(mine.tolist()) <= set(split.train_of(u).tolist())
    # L2 sensitivity of the sum under add/remove of one user: ||v_u||_2 <= sqrt(k)
    assert math.sqrt(np.diff(indptr).max()) <= math.sqrt(k)
    assert (split.train_counts > k).any()  # the clip binds for some users here


def test_central_epsilon_is_the_cdp_gaussian_accountants_one_release(split):
    eps, delta, k = 1.0, 1e-5, 8
    rel = central_gaussian_counts(split, k, eps, delta, seed=0)
    z = dpfedavg_noise_multiplier(eps, delta, 1.0, 1, "pld")
    assert rel.privacy["noise_multiplier"] == pytest.approx(z, rel=1e-12)
    assert rel.noise_std == pytest.approx(z * math.sqrt(k), rel=1e-12)
    bounds = dpfedavg_bounds(1.0, z, 1, delta)
    assert rel.epsilon["reported"] == pytest.approx(bounds.reported, rel=1e-12)
    # calibrated to the target: at most it, and not far below (the noise is not wasted)
    assert eps - 1e-3 <= rel.epsilon["reported"] <= eps
    # a single unamplified Gaussian release: the exact Gaussian curve agrees (Balle-Wang)
    exact = epsilon_bounds(repeated(RoundMechanism("gaussian", z), 1), delta).gaussian_exact
    assert exact == pytest.approx(eps, abs=2e-3)


def test_central_noise_is_unbiased_with_the_calibrated_scale(split):
    k, eps, delta = 8, 2.0, 1e-5
    errors = []
    for seed in range(40):
        rel = central_gaussian_counts(split, k, eps, delta, seed)
        errors.append(rel.estimate - _clipped_counts(split, k, seed))
    err = np.concatenate(errors)
    sigma = rel.noise_std
    assert abs(err.mean()) < 4 * sigma / math.sqrt(err.size)
    assert err.std() == pytest.approx(sigma, rel=0.05)


def test_local_oue_probabilities_and_worst_case_ratio_by_enumeration():
    """Brute force on 4 items, k = 2: the largest likelihood ratio of any report between
    any two inputs of at most k items is exactly e^epsilon."""
    eps, k, m = 1.3, 2, 4
    p, q = oue_probabilities(eps / k)
    assert p == 0.5 and q == pytest.approx(1 / (math.exp(eps / k) + 1))
    inputs = [set(c) for r in range(k + 1) for c in itertools.combinations(range(m), r)]

    def likelihood(y, x):
        return math.prod((p if i in x else q) if y[i] else (1 - p if i in x else 1 - q)
                         for i in range(m))

    worst = max(math.log(likelihood(y, a) / likelihood(y, b))
                for y in itertools.product((0, 1), repeat=m) for a in inputs for b in inputs)
    assert worst == pytest.approx(eps, abs=1e-9)


def test_local_estimate_is_unbiased_and_its_epsilon_is_pure(split):
    k = int(split.train_counts.max())  # no clipping: the subsets are the training sets
    eps = 4.0
    truth = train_counts(split)
    estimates = np.stack([local_oue_counts(split, k, eps, seed).estimate for seed in range(60)])
    rel = local_oue_counts(split, k, eps, 0)
    assert rel.epsilon["reported"] == pytest.approx(eps, rel=1e-12)
    assert rel.privacy["delta"] == 0.0
    # unbiased: the mean error over 60 releases, per item, within 4 standard errors
    p, q = oue_probabilities(eps / k)
    n = split.n_users
    var = (truth * p * (1 - p) + (n - truth) * q * (1 - q)) / (p - q) ** 2
    z = (estimates.mean(axis=0) - truth) / np.sqrt(var / estimates.shape[0])
    assert np.abs(z).max() < 4.5
    assert abs(z.mean()) < 4 / math.sqrt(z.size)
    # and the spread at a count of 0 is the stated noise scale
    zero = truth == 0
    if zero.any():
        assert estimates[:, zero].std() == pytest.approx(rel.noise_std, rel=0.15)


def test_local_oracle_loses_accuracy_as_epsilon_falls(split):
    k = int(split.train_counts.max())
    truth = train_counts(split)
    errs = {eps: np.mean([np.abs(local_oue_counts(split, k, eps, s).estimate - truth).mean()
                          for s in range(5)]) for eps in (1.0, 50.0)}
    assert errs[50.0] < errs[1.0]


def test_interaction_laplace_scale_and_epsilon(split):
    eps, delta = 0.5, 1e-5
    rel = interaction_laplace_counts(split, eps, delta, seed=0)
    assert rel.privacy["laplace_b"] == pytest.approx(1 / eps, rel=1e-9)
    bounds = epsilon_bounds(repeated(RoundMechanism("laplace", rel.privacy["laplace_b"]), 1),
                            delta)
    assert rel.epsilon["reported"] == pytest.approx(bounds.reported, rel=1e-12)
    assert rel.epsilon["basic"] == pytest.approx(eps, rel=1e-9)
    assert rel.epsilon["reported"] <= eps + 1e-12
    err = np.concatenate([interaction_laplace_counts(split, eps, delta, s).estimate
                          - train_counts(split) for s in range(50)])
    assert abs(err.mean()) < 4 * rel.noise_std / math.sqrt(err.size)
    assert err.std() == pytest.approx(math.sqrt(2) / eps, rel=0.05)
    # Laplace, not Gaussian: mean absolute deviation b (a Gaussian of that std has 0.8 b)
    assert np.abs(err).mean() == pytest.approx(1 / eps, rel=0.05)


def test_every_release_states_relation_trust_and_sensitivity(split):
    for rel in (central_gaussian_counts(split, 5, 1.0, 1e-5, 0),
                local_oue_counts(split, 5, 1.0, 0),
                interaction_laplace_counts(split, 1.0, 1e-5, 0),
                local_interaction_laplace_counts(split, 1.0, 1e-5, 0)):
        for key in ("neighbouring", "trust_model", "sensitivity", "epsilon", "mode"):
            assert rel.privacy[key], key
        assert rel.privacy["guarantee"] is True


def test_removing_a_user_changes_no_other_users_subset(split):
    """Add/remove neighbours differ in one user's vector only: the other users' k-subsets
    must not depend on who else is in the data. The smaller split keeps each user's source
    key (``source_users``), as the loader's re-indexing does; its positions would move
    (the loader-level check is tests/test_dp_mostpop_neighbours.py)."""
    import dataclasses

    k = 4
    drop = 0
    keep = np.arange(1, split.n_users)
    lo, hi = split.train_indptr[1], split.train_indptr[-1]
    smaller = dataclasses.replace(
        split, n_users=split.n_users - 1, train_indptr=split.train_indptr[1:] - lo,
        train_items=split.train_items[lo:hi], val_items=split.val_items[keep],
        test_items=split.test_items[keep], users=split.users[keep],
        source_users=split.source_users[keep])
    a_ptr, a_items = k_subsets(split, k, seed=7)
    b_ptr, b_items = k_subsets(smaller, k, seed=7)
    for u in range(1, split.n_users):
        assert np.array_equal(a_items[a_ptr[u]:a_ptr[u + 1]],
                              b_items[b_ptr[u - 1]:b_ptr[u]])
    assert split.train_counts[drop] > 0
    # so the two sums differ by user 0's vector alone: L2 distance at most sqrt(k)
    diff = (np.bincount(a_items, minlength=split.n_items)
            - np.bincount(b_items, minlength=split.n_items))
    assert np.linalg.norm(diff) <= math.sqrt(k) + 1e-12


def test_infinite_epsilon_is_the_noiseless_release_without_a_guarantee(split):
    k = 6
    central = central_gaussian_counts(split, k, math.inf, 1e-5, seed=2)
    assert np.array_equal(central.estimate, _clipped_counts(split, k, 2))
    assert central.privacy["guarantee"] is False and central.epsilon["reported"] is None
    inter = interaction_laplace_counts(split, math.inf, 1e-5, seed=2)
    assert np.array_equal(inter.estimate, train_counts(split))
    assert inter.privacy["guarantee"] is False
    with pytest.raises(ValueError, match="finite"):
        local_oue_counts(split, k, math.inf, 0)


def test_local_interaction_laplace_scale_and_epsilon(split):
    """Every client's report carries Laplace(1 / eps) per item: the sum's noise has
    standard deviation sqrt(2 n) / eps and is unbiased; one Laplace round's epsilon."""
    eps, delta = 2.0, 1e-5
    rel = local_interaction_laplace_counts(split, eps, delta, seed=0)
    assert rel.privacy["laplace_b"] == pytest.approx(1 / eps, rel=1e-9)
    assert rel.epsilon["basic"] == pytest.approx(eps, rel=1e-9)
    assert rel.noise_std == pytest.approx(math.sqrt(2 * split.n_users) / eps, rel=1e-9)
    err = np.concatenate([local_interaction_laplace_counts(split, eps, delta, s).estimate
                          - train_counts(split) for s in range(30)])
    assert abs(err.mean()) < 4 * rel.noise_std / math.sqrt(err.size)
    assert err.std() == pytest.approx(rel.noise_std, rel=0.05)
    with pytest.raises(ValueError, match="finite"):
        local_interaction_laplace_counts(split, math.inf, delta, 0)


def test_local_interaction_neighbours_differ_by_one_count_alone(split):
    """Neighbour worlds (add/remove one interaction) share every noise draw, so the two
    releases differ by exactly 1 in the removed item's count and nowhere else."""
    import dataclasses

    u = int(np.argmax(split.train_counts))
    lo = split.train_indptr[u]
    removed = int(split.train_items[lo])
    items = np.delete(split.train_items, lo)
    indptr = split.train_indptr.copy()
    indptr[u + 1:] -= 1
    smaller = dataclasses.replace(split, train_items=items, train_indptr=indptr)
    a = local_interaction_laplace_counts(split, 1.0, 1e-5, seed=3).estimate
    b = local_interaction_laplace_counts(smaller, 1.0, 1e-5, seed=3).estimate
    diff = a - b
    assert diff[removed] == pytest.approx(1.0, abs=1e-9)
    assert np.abs(np.delete(diff, removed)).max() < 1e-9
