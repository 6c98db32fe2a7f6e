"""The one-shot canary audit of cdp-gaussian (Andrew et al., ICLR 2024) inside a real run.

Directions and participation draws, the Gaussian-fit estimate against known
Gaussians, a canary's exact contribution to the secure sum, an end-to-end run
that reports both views beside the accounted eps, and a planted bug (noise at
half the accounted scale) that the audit flags while the sound run passes.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedem_private.errors import UserError
from fedem_private.privacy import central
from fedem_private.privacy.accounting import gaussian_epsilon
from fedem_private.privacy.canaries import (
    CanaryAudit,
    canary_directions,
    canary_membership,
    canary_participation,
    gaussian_fit_epsilon,
    one_run_bound,
)
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.simulation.config import RunConfig, with_overrides

DELTA = 1e-5


def test_directions_are_keyed_unit_vectors_nearly_orthogonal():
    u = canary_directions(3, 40, 5000)
    assert u.shape == (40, 5000) and u.dtype == torch.float64
    assert torch.allclose(u.norm(dim=1), torch.ones(40, dtype=torch.float64))
    assert torch.equal(u, canary_directions(3, 40, 5000))
    assert not torch.equal(u, canary_directions(4, 40, 5000))
    gram = u @ u.T - torch.eye(40, dtype=torch.float64)
    assert float(gram.abs().max()) < 6 / math.sqrt(5000)


def test_canary_participation_is_poisson_at_the_clients_rate():
    draws = np.stack([canary_participation(0, t, 500, 0.3) for t in range(1, 41)])
    assert draws.mean() == pytest.approx(0.3, abs=4 * math.sqrt(0.21 / draws.size))
    assert canary_participation(0, 5, 10, 1.0).all()


@pytest.mark.parametrize("mu", [0.0, 0.5, 2.0])
def test_gaussian_fit_recovers_a_known_shift(mu):
    g = np.random.default_rng(1)
    fit = gaussian_fit_epsilon(g.normal(1.5 * mu, 1.5, 4000), g.normal(0.0, 1.5, 4000), DELTA)
    assert fit["mu"] == pytest.approx(mu, abs=4 * fit["mu_se"])
    assert fit["eps_hat"] == gaussian_epsilon(max(fit["mu"], 0.0), DELTA)


def test_an_inserted_canary_adds_exactly_c_along_its_direction():
    audit = CanaryAudit(count=3, clip=0.7, noise_multiplier=0.0, sample_rate=1.0, seed=2)
    ins = audit.members
    assert ins is not None and ins.any() and not ins.all()
    total = audit.contribution(1, torch.Size([1, 30, 4]))
    u = audit.directions
    assert total.shape == (1, 30, 4)
    expected = 0.7 * u[torch.from_numpy(np.flatnonzero(ins))].sum(dim=0)
    assert torch.allclose(total.reshape(-1), expected)
    audit.observe(total)
    proj = audit.projections[0]
    # an inserted canary reads about 1 (its own C / C) plus the others' tiny overlap
    assert np.allclose(proj[ins], 1.0, atol=0.5) and np.allclose(proj[~ins], 0.0, atol=0.5)


def test_membership_is_a_keyed_fair_coin():
    coins = canary_membership(0, 20000)
    assert coins.mean() == pytest.approx(0.5, abs=4 * math.sqrt(0.25 / coins.size))
    assert np.array_equal(coins, canary_membership(0, 20000))
    assert not np.array_equal(coins, canary_membership(1, 20000))


def test_one_run_bound_counts_top_and_bottom_guesses():
    # a perfect separation of 100 + 100: every rule's guesses are right; the widest rule
    # (f = 0.25: 50 + 50 guesses) certifies the most, at level 1 - 0.05 / 3
    from fedem_private.privacy.audit_bounds import one_run_eps_lower_bound

    out = one_run_bound(np.arange(100) + 1000.0, np.arange(100.0), 0.0)
    assert (out["m"], out["r"], out["v"], out["fraction"]) == (200, 100, 100, 0.25)
    assert out["eps_lower_bound"] == pytest.approx(
        one_run_eps_lower_bound(200, 100, 100, confidence=1 - 0.05 / 3))
    # no separation: nothing certified
    g = np.random.default_rng(0)
    assert one_run_bound(g.normal(size=100), g.normal(size=100), 1e-5)["eps_lower_bound"] \
        < 0.5


def _run(tmp_path, name: str, **privacy) -> dict:
    from fedem_private.experiments.runner import execute

    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 200,
        "data.synthetic.n_items": 600, "train.rounds": 10, "train.local_epochs": 1,
        "train.dim": 16, "privacy.mode": "cdp-gaussian", "privacy.noise_multiplier": 1.0,
        "privacy.sample_rate": 0.5, "privacy.clip": 0.5, "privacy.canaries": 100,
        **{f"privacy.{k}": v for k, v in privacy.items()}})
    execute(cfg, tmp_path / name)
    return json.loads((tmp_path / name / "summary.json").read_text())["privacy"]


@pytest.mark.parametrize("planted", [False, True], ids=["sound", "PLANTED-half-noise"])
def test_planted_bug_noise_at_half_the_accounted_scale_is_flagged(tmp_path, monkeypatch,
                                                                  planted):
    """PLANTED BUG: the aggregate's noise at half the scale the accountant assumes. The
    aggregator view's fitted mu doubles and the audit flags the run; the sound run passes."""
    if planted:
        real = central.aggregate_noise

        def half(shape, scale, *, seed, round_):
            return real(shape, scale / 2, seed=seed, round_=round_)

        monkeypatch.setattr(central, "aggregate_noise", half)
    p = _run(tmp_path, "run")
    audit = p["canary_audit"]
    agg = audit["views"]["aggregator"]
    assert audit["canaries"] == 200 and 70 < audit["canaries_inserted"] < 130
    assert audit["max_rounds_inserted"] >= 1
    assert agg["eps_accounted"] == pytest.approx(
        gaussian_epsilon(math.sqrt(audit["max_rounds_inserted"]) / 1.0, DELTA), rel=1e-3)
    assert audit["views"]["observer"]["eps_accounted"] == p["epsilon"]["reported"]
    assert agg["flagged"] == planted and audit["ok"] == (not planted)
    from fedem_private.experiments.results import collect

    table = collect(tmp_path)
    assert bool(table["canary_ok"].iloc[0]) == (not planted)
    assert table["canary_eps_hat_aggregator"].iloc[0] == pytest.approx(agg["eps_hat"])
    for view in ("aggregator", "observer"):  # the certified bound, below the accounted eps
        v = audit["views"][view]
        assert v["one_run"]["m"] > 0 and 0 <= v["eps_lower_bound"] <= v["eps_bound_accounted"]
        assert not v["flagged_certified"] and v["flagged"] == v["flagged_estimate"]
    assert agg["eps_bound_accounted"] >= agg["eps_accounted"]  # worst over ALL canaries
    if not planted:  # the sound estimate sits at or below what the mechanism promises
        assert agg["mu"] <= agg["mu_expected"] + 3 * agg["mu_se"]
        assert agg["eps_hat"] <= agg["eps_accounted"]
        obs = audit["views"]["observer"]
        assert not obs["flagged"] and obs["eps_hat"] <= obs["eps_accounted"]
    else:
        assert agg["mu"] > 1.5 * agg["mu_expected"]


@pytest.mark.parametrize("values,needle", [
    ({"mode": "ldp-gaussian", "epsilon": 1.0}, "cdp-gaussian, not"),
    ({"canaries": 1}, "at least 2"),
    ({"canaries": -3}, "integer >= 0"),
    ({"clip_quantile": 0.5}, "fixed clip"),
])
def test_bad_canary_settings(values, needle):
    settings = {"mode": "cdp-gaussian", "epsilon": 1.0, "canaries": 10, **values}
    with pytest.raises(UserError, match=needle):
        PrivacyConfig(**settings)
