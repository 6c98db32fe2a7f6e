"""Membership labels for the scorer, under a relation the caller names explicitly.

Two relations (docs/design.md, section 6; IMIA, Yuan et al., WWW 2023):

- ``"positive_vs_any"``: members are the client's training positives,
  non-members every other item of the catalogue (label 0).
- ``"positive_vs_sampled"``: members are the training positives, non-members
  only the negatives the client sampled that round (duplicates collapse to
  one item); every other item is left out of the evaluation (label NaN). The
  random top-|positives| precision is then 1 / (1 + num_negatives) when the
  sampled negatives are distinct.

Labels are a float (k, m) array: 1.0 member, 0.0 non-member, NaN not scored.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .ground_truth import GroundTruth
from .observations import Observation

Relation = Literal["positive_vs_any", "positive_vs_sampled"]
RELATIONS: tuple[str, ...] = ("positive_vs_any", "positive_vs_sampled")


def check_relation(relation: str) -> None:
    """Raise ValueError unless ``relation`` is one of :data:`RELATIONS`."""
    if relation not in RELATIONS:
        raise ValueError(f"unknown membership relation {relation!r}; use one of {RELATIONS}")


def membership_labels(gt: GroundTruth, clients: np.ndarray, n_items: int,
                      relation: Relation) -> np.ndarray:
    """(len(clients), n_items) labels of ``clients`` (in that order) under ``relation``."""
    check_relation(relation)
    sel = gt.select(clients)
    pos = sel.positives.to_mask(n_items)
    if relation == "positive_vs_any":
        return pos.astype(np.float64)
    neg = sel.negatives.to_mask(n_items) & ~pos
    labels = np.full(pos.shape, np.nan)
    labels[pos] = 1.0
    labels[neg] = 0.0
    return labels


def labels_for(obs: Observation, gt: GroundTruth, relation: Relation) -> np.ndarray:
    """Labels aligned with ``obs`` (same round, same client order)."""
    if obs.round != gt.round:
        raise ValueError(f"observation of round {obs.round} scored against truth of {gt.round}")
    return membership_labels(gt, obs.clients, obs.n_items, relation)
