"""Non-federated baselines: the floor and the ceilings of the accuracy axis (docs/design.md 14).

A baseline is selected like a method (``--method mostpop``, ``dp-mostpop``,
``centralised``, ``ease``, ``als``; settings in ``[baseline]``), runs on the
same split and protocol, and is scored by the same
:class:`~fedem_private.evaluation.metrics.RankAccumulator` against the same
evaluation sets (:func:`~fedem_private.evaluation.metrics.build_eval_sets` with the
run's seed) as a federated run, so its summary and results row read the same.

Each baseline registers a fit function ``(cfg, split) -> Fitted`` under its
method name with :func:`register`; :data:`~fedem_private.simulation.config.BASELINE_METHODS`
lists the names the configuration accepts, and a test checks both agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedem_private.data.split import Split
from fedem_private.evaluation.metrics import RankAccumulator, build_eval_sets, eval_sample
from fedem_private.simulation.config import RunConfig
from fedem_private.simulation.loop import validation_kind


@dataclass(frozen=True)
class Fitted:
    """A fitted baseline: its scores and what its summary says about it.

    ``scores``: (m,) item scores shared by every user, or (n, m) per user.
    ``privacy``: the summary's privacy block (mode ``none`` without a guarantee): what
    is released and how, never an un-noised figure of the data.
    ``info``: settings worth keeping (e.g. the architecture, k).
    ``clipping``: the summary's ``clipping`` block, simulator-only diagnostics of the
    clip (dp-mostpop: the users clipped at k, labelled not released), or None.
    """

    scores: np.ndarray
    privacy: dict[str, Any] = field(default_factory=lambda: {"mode": "none",
                                                              "guarantee": False})
    info: dict[str, Any] = field(default_factory=dict)
    model: str = "popularity"
    clipping: dict[str, Any] | None = None


FitFn = Callable[[RunConfig, Split], Fitted]
REGISTRY: dict[str, FitFn] = {}


def register(name: str) -> Callable[[FitFn], FitFn]:
    """Register ``fn`` as the fit function of baseline ``name``."""
    def wrap(fn: FitFn) -> FitFn:
        if name in REGISTRY:
            raise ValueError(f"baseline {name!r} registered twice")
        REGISTRY[name] = fn
        return fn
    return wrap


def fit(cfg: RunConfig, split: Split) -> Fitted:
    """Fit the baseline ``cfg.federation.method`` on ``split``'s training interactions."""
    name = cfg.federation.resolved_method
    if name not in REGISTRY:
        raise KeyError(f"no baseline registered as {name!r}")
    return REGISTRY[name](cfg, split)


def evaluate(cfg: RunConfig, split: Split, scores: np.ndarray,
             chunk: int = 512) -> dict[str, dict[str, float]]:
    """HR/NDCG of a score matrix ((m,) for all users alike, or (n, m)) on the run's
    evaluation sets: the same candidates, exclusions and validation draw as a federated
    run with this config and seed."""
    sets = build_eval_sets(split, cfg.data.protocol, cfg.train.seed,
                           validation=validation_kind(cfg))
    acc = RankAccumulator(split.n_users, standard_errors=bool(cfg.train.eval_users))
    s = torch.from_numpy(np.asarray(scores, dtype=np.float64))
    chosen = eval_sample(split.n_users, cfg.train.eval_users, cfg.train.seed)
    for start in range(0, chosen.shape[0], chunk):
        users = chosen[start:start + chunk]
        block = s.expand(users.shape[0], -1) if s.dim() == 1 else s[users]
        acc.add_scores(users, block.clone(), sets)
    return acc.result()


from fedem_private.baselines import registered  # noqa: E402,F401  (registers the baselines)
