"""Non-federated baselines: the floor and the ceilings of the accuracy axis (docs/design.md 14).

A baseline is selected like a method (``--method mostpop``, ``dp-mostpop``,
``centralised``, ``ease``, ``als``; settings in ``[baseline]``), runs on the
same split and protocol, and is scored by the same
:class:`~fedem_private.evaluation.metrics.RankAccumulator` against the same
evaluation sets (:func:`~fedem_private.evaluation.metrics.build_eval_sets` with the
run's seed) as a federated run, so its summary and results row read the same.

Each baseline registers a fit function ``(cfg, split) -> Fitted`` under its
method name with :func:`register` (the record and the registry live in
:mod:`fedem_private.baselines.base`, which imports nothing of this package back);
:data:`~fedem_private.simulation.config.BASELINE_METHODS` lists the names the
configuration accepts, and a test checks both agree.
"""

from __future__ import annotations

import numpy as np
import torch

from fedem_private.baselines import registered  # noqa: F401  (registers the baselines)
from fedem_private.baselines.base import REGISTRY, FitFn, Fitted, register  # noqa: F401
from fedem_private.data.split import Split
from fedem_private.evaluation.metrics import RankAccumulator, build_eval_sets, eval_sample
from fedem_private.simulation.config import RunConfig
from fedem_private.simulation.loop import validation_kind


def fit(cfg: RunConfig, split: Split) -> Fitted:
    """Fit the baseline ``cfg.federation.method`` on ``split``'s training interactions."""
    name = cfg.federation.resolved_method
    if name not in REGISTRY:
        raise KeyError(f"no baseline registered as {name!r}")
    return REGISTRY[name](cfg, split)


def evaluate(cfg: RunConfig, split: Split, scores: np.ndarray,
             chunk: int = 512, keep: list[RankAccumulator] | None = None
             ) -> dict[str, dict[str, float]]:
    """HR/NDCG of a score matrix ((m,) for all users alike, or (n, m)) on the run's
    evaluation sets: the same candidates, exclusions and validation draw as a federated
    run with this config and seed. ``keep``, where given, receives the ranks."""
    chosen = eval_sample(split.n_users, cfg.train.eval_users, cfg.train.seed)
    sets = build_eval_sets(split, cfg.data.protocol, cfg.train.seed,
                           validation=validation_kind(cfg),
                           users=chosen if cfg.train.eval_users else None)
    acc = RankAccumulator(split.n_users, standard_errors=bool(cfg.train.eval_users))
    s = torch.from_numpy(np.asarray(scores, dtype=np.float64))
    for start in range(0, chosen.shape[0], chunk):
        users = chosen[start:start + chunk]
        block = s.expand(users.shape[0], -1) if s.dim() == 1 else s[users]
        acc.add_scores(users, block.clone(), sets)
    if keep is not None:
        keep.append(acc)
    return acc.result()

