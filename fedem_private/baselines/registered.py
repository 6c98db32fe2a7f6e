"""The baselines' fit functions, each registered under its method name."""

from __future__ import annotations

from fedem_private.baselines.base import Fitted, register
from fedem_private.baselines.models import als_scores, centralised_mf_scores, ease_scores
from fedem_private.baselines.popularity import dp_counts, mostpop_scores
from fedem_private.data.split import Split
from fedem_private.simulation.config import RunConfig


@register("mostpop")
def fit_mostpop(cfg: RunConfig, split: Split) -> Fitted:
    """Training popularity, ties broken by a seeded item order."""
    return Fitted(mostpop_scores(split, cfg.train.run_seed), info={"tiebreak": "seeded jitter"})


@register("dp-mostpop")
def fit_dp_mostpop(cfg: RunConfig, split: Split) -> Fitted:
    """Popularity released once under ``baseline.architecture`` at ``baseline.epsilon``."""
    b = cfg.baseline
    release = dp_counts(split, b.architecture, b.k, b.epsilon, b.delta, cfg.train.run_seed)
    return Fitted(release.estimate, privacy=release.privacy,
                  info={"architecture": b.architecture, "epsilon_target": b.epsilon,
                        "k": b.k if b.architecture in ("central", "local") else None},
                  clipping=release.diagnostics or None)


@register("ease")
def fit_ease(cfg: RunConfig, split: Split) -> Fitted:
    """EASE (Steck 2019) at ``baseline.ease_lambda``."""
    lam = cfg.baseline.ease_lambda
    return Fitted(ease_scores(split, lam), info={"lambda": lam}, model="ease")


@register("als")
def fit_als(cfg: RunConfig, split: Split) -> Fitted:
    """Implicit ALS (Hu, Koren and Volinsky 2008) by the ``implicit`` library."""
    b = cfg.baseline
    scores = als_scores(split, b.als_factors, b.als_regularization, b.als_iterations,
                        b.als_alpha, cfg.train.run_seed)
    return Fitted(scores, info={"factors": b.als_factors, "regularization": b.als_regularization,
                                "iterations": b.als_iterations, "alpha": b.als_alpha},
                  model="als")


@register("centralised")
def fit_centralised(cfg: RunConfig, split: Split) -> Fitted:
    """FedMF's backbone and loss on the pooled training data, ``baseline.epochs`` epochs."""
    tr = cfg.train
    scores = centralised_mf_scores(split, cfg.data.protocol, dim=tr.dim, lr=tr.lr,
                                   batch_size=tr.batch_size, num_negatives=tr.num_negatives,
                                   init_std=tr.init_std, epochs=cfg.baseline.epochs,
                                   seed=tr.run_seed)
    return Fitted(scores, info={"epochs": cfg.baseline.epochs, "dim": tr.dim, "lr": tr.lr,
                                "batch_size": tr.batch_size, "optimizer": "adam"},
                  model="mf")
