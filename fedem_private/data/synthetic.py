"""Seeded synthetic interaction data with the shape of real recommendation logs.

Non-IID clients come from clustered tastes: each user belongs to one of
``n_clusters`` taste clusters and prefers items whose latent vectors align
with its cluster centre. Item popularity follows a power law (Zipf with
``popularity_exponent``) and user activity is log-normal, so heterogeneity and
sparsity resemble MovieLens-like data. Everything derives from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from .interactions import Interactions, from_raw


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and shape of the synthetic dataset (defaults: a one-minute default run)."""

    n_users: int = 600
    n_items: int = 500
    n_clusters: int = 6
    mean_activity: float = 30.0
    activity_sigma: float = 0.7
    popularity_exponent: float = 0.8
    taste_strength: float = 4.0
    latent_dim: int = 8

    def validate(self) -> None:
        for name in ("n_users", "n_items", "n_clusters", "latent_dim"):
            if getattr(self, name) < 1:
                raise UserError(f"synthetic.{name} must be a positive integer")
        if self.n_items < 10:
            raise UserError("synthetic.n_items must be at least 10")
        if not self.mean_activity >= 3:
            raise UserError("synthetic.mean_activity must be at least 3")
        if not self.activity_sigma >= 0:
            raise UserError("synthetic.activity_sigma must be >= 0")


def generate(cfg: SyntheticConfig, seed: int) -> Interactions:
    """Draw the dataset; the same (cfg, seed) always gives the same interactions."""
    from .. import rng  # here, not at import: rng loads torch, and validation must not

    cfg.validate()
    g = np.random.default_rng(int(rng.key(seed, rng.Stream.SYNTHETIC, 0, 0)))
    n, m, k, dim = cfg.n_users, cfg.n_items, cfg.n_clusters, cfg.latent_dim
    items = g.normal(size=(m, dim))
    centres = g.normal(size=(k, dim))
    cluster = g.integers(0, k, size=n)
    tastes = centres[cluster] + 0.5 * g.normal(size=(n, dim))
    rank = g.permutation(m)
    log_pop = -cfg.popularity_exponent * np.log1p(rank)
    logits = log_pop[None, :] + cfg.taste_strength * (tastes @ items.T) / np.sqrt(dim)
    mu = np.log(cfg.mean_activity) - cfg.activity_sigma**2 / 2
    activity = np.rint(g.lognormal(mu, cfg.activity_sigma, size=n)).astype(np.int64)
    activity = np.clip(activity, 3, max(3, m // 2))
    gumbel = -np.log(-np.log(g.uniform(1e-12, 1.0, size=(n, m))))
    order = np.argsort(-(logits + gumbel), axis=1)
    users, chosen, stamps = [], [], []
    for u in range(n):
        picked = order[u, : activity[u]]
        users.append(np.full(picked.shape[0], u))
        chosen.append(picked)
        stamps.append(g.permutation(picked.shape[0]).astype(np.float64))
    # a demographic attribute correlated with taste, for the attribute-inference attack
    female_rate = g.uniform(0.15, 0.85, size=k)
    gender = (g.uniform(size=n) < female_rate[cluster]).astype(np.int64)
    return from_raw("synthetic", np.concatenate(users), np.concatenate(chosen),
                    np.concatenate(stamps), {"gender": dict(enumerate(gender.tolist()))})
