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
    mu = np.log(cfg.mean_activity) - cfg.activity_sigma**2 / 2
    activity = np.rint(g.lognormal(mu, cfg.activity_sigma, size=n)).astype(np.int64)
    activity = np.clip(activity, 3, max(3, m // 2))
    chosen = _choose(g, log_pop, tastes, items, cfg.taste_strength, activity)
    users, stamps = [], []
    for u in range(n):
        users.append(np.full(chosen[u].shape[0], u))
        stamps.append(g.permutation(chosen[u].shape[0]).astype(np.float64))
    # a demographic attribute correlated with taste, for the attribute-inference attack
    female_rate = g.uniform(0.15, 0.85, size=k)
    gender = (g.uniform(size=n) < female_rate[cluster]).astype(np.int64)
    return from_raw("synthetic", np.concatenate(users), np.concatenate(chosen),
                    np.concatenate(stamps), {"gender": dict(enumerate(gender.tolist()))})


_BLOCK = 1 << 22  # entries of the (users, items) grid held at once


def _choose(g: np.random.Generator, log_pop: np.ndarray, tastes: np.ndarray,
            items: np.ndarray, strength: float, activity: np.ndarray) -> list[np.ndarray]:
    """Each user's items by the Gumbel-top-k trick: user u takes the activity[u] largest
    of log_pop + strength tastes_u . items / sqrt(dim) + Gumbel noise, in that order.
    Rows are drawn in blocks of about ``_BLOCK`` entries, which consumes ``g`` exactly
    as one (users, items) draw would (the generator fills row-major), so the data do not
    depend on the block, and 100,000 users x 20,000 items fit in memory."""
    n, m, dim = tastes.shape[0], items.shape[0], items.shape[1]
    rows = max(1, _BLOCK // m)
    chosen: list[np.ndarray] = []
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        logits = log_pop[None, :] + strength * (tastes[lo:hi] @ items.T) / np.sqrt(dim)
        logits -= np.log(-np.log(g.uniform(1e-12, 1.0, size=(hi - lo, m))))
        order = _top(-logits, int(activity[lo:hi].max()))
        chosen.extend(order[u - lo, : activity[u]].copy() for u in range(lo, hi))
    return chosen


def _top(keys: np.ndarray, k: int) -> np.ndarray:
    """Each row's k smallest keys' columns, smallest first: the first k columns of
    ``np.argsort(keys, axis=1)`` for distinct keys (Gumbel-perturbed logits are distinct
    almost surely), found by a partial partition instead of a full sort of every row."""
    if k >= keys.shape[1]:
        return np.argsort(keys, axis=1)
    part = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return np.take_along_axis(part, np.argsort(np.take_along_axis(keys, part, axis=1),
                                               axis=1), axis=1)
