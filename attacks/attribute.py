"""The ``attribute`` attack: infer a demographic attribute (gender) from what clients uploaded.

Threat model (docs/design.md, sections 5-6): besides the uploads and the public
hyper-parameters, the server is assumed to know the attribute of a fraction
of the clients (users who disclosed it, e.g. in their profile). That side
knowledge is the only labelled input, and it arrives as
:class:`KnownAttributes`, built by the runner from the clients it
designates as known; the clients the attack is scored on are never among
them, and no ground truth (training items, sampled negatives) reaches the
attack. Attribute inference from federated recommendation updates is
studied e.g. by Zhang et al., "Comprehensive Privacy Analysis on Federated
Recommender System against Attribute Inference Attacks" (IEEE TKDE 2023).

Features per client (``features``):

- ``"interactions"``: the inferred interactions. An item-level
  attack (``item_attack``: ``projection`` by default, or ``support``) ranks
  the client's items; the top K are taken as its interactions, K being the
  expected number of positives given the rows the upload changed
  (:func:`attacks.imia.expected_positives`). The 0/1 vector is L2-normalised.
- ``"scores"``: the positive part of the item-level attack's scores (no
  count needed: useful when K cannot be read off the upload, e.g. FedEM),
  L2-normalised.
- ``"uploads"``: the per-item change norms of the upload itself
  (||upload_i - sent_i||), L2-normalised per client.

- ``"auto"`` (default): the attacker tries the sets of
  :data:`AUTO_FEATURES` and keeps the one with the best cross-validated AUC
  on its known clients.

Classifier: L2-regularised logistic regression with balanced class weights,
its inverse regularisation C chosen from :data:`C_GRID` by the
``folds``-fold cross-validated AUC on the known clients (C = 1 when a class
has fewer than ``folds`` known clients). Output: the probability that the attribute is 1 for
every recorded client (NaN for clients that did not take part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score

from ._store import readonly
from .base import blank_nonparticipants
from .imia import candidate_rows, expected_positives
from .observations import Observation, PublicKnowledge
from .registry import Attack, Capabilities, attack_class, names_where
from .support import support

FEATURES = ("interactions", "scores", "uploads")
C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
AUTO_FEATURES: tuple[tuple[str, str], ...] = (
    ("interactions", "projection"), ("scores", "projection"), ("interactions", "support"),
    ("uploads", "support"))


@dataclass(frozen=True, eq=False)
class KnownAttributes:
    """The server's side knowledge: attribute ``name`` (0/1) of the clients ``clients``."""

    name: str
    clients: np.ndarray  # (n,) int64
    values: np.ndarray  # (n,) int64, 0 or 1

    def __post_init__(self) -> None:
        clients = np.asarray(self.clients, dtype=np.int64).reshape(-1)
        values = np.asarray(self.values).reshape(-1)
        if values.shape != clients.shape:
            raise ValueError("KnownAttributes: one value per client")
        if not np.isin(values, (0, 1)).all():
            raise ValueError("KnownAttributes: values must be 0 or 1")
        if np.unique(clients).size != clients.size:
            raise ValueError("KnownAttributes: duplicate clients")
        object.__setattr__(self, "clients", readonly(clients))
        object.__setattr__(self, "values", readonly(values.astype(np.int64)))


def client_features(obs: Observation, public: PublicKnowledge, *, features: str = "interactions",
                    item_attack: str = "projection") -> np.ndarray:
    """(k, m) L2-normalised feature rows (zeros for clients that did not take part)."""
    if features not in FEATURES:
        raise ValueError(f"unknown features {features!r}; use one of {FEATURES}")
    items = names_where(kind="item", shadow=False)
    if item_attack not in items:
        raise ValueError(f"unknown item attack {item_attack!r}; use one of {sorted(items)}")
    item_scores = attack_class(item_attack).scores
    norms = np.nan_to_num(support(obs, public))
    if features == "uploads":
        x = norms
    elif features == "scores":
        x = np.clip(np.nan_to_num(item_scores(obs, public)), 0.0, None)
    else:
        scores = np.nan_to_num(item_scores(obs, public), nan=-np.inf)
        cand = candidate_rows(norms, 1 + public.num_negatives)
        k_pos = expected_positives(cand.sum(1), obs.n_items, public.num_negatives)
        x = np.zeros_like(norms)
        order = np.argsort(-scores, axis=1, kind="stable")
        for j in range(obs.n_clients):
            x[j, order[j, : k_pos[j]]] = 1.0
    x[~obs.participated] = 0.0
    length = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(length > 0, length, 1.0)


def _choose_c(x: np.ndarray, y: np.ndarray, folds: int, seed: int) -> tuple[float, float]:
    """(C, its mean cross-validated AUC) with the best AUC on the known clients (NaN: no CV)."""
    if int(np.bincount(y, minlength=2).min()) < folds:
        return 1.0, float("nan")
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    best, best_auc = 1.0, -np.inf
    for c in C_GRID:
        clf = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
        value = float(np.mean(cross_val_score(clf, x, y, cv=cv, scoring="roc_auc")))
        if value > best_auc:
            best, best_auc = c, value
    return best, best_auc


def attribute(obs: Observation, public: PublicKnowledge, known: KnownAttributes, *,
              features: str = "auto", item_attack: str = "projection",
              folds: int = 5, seed: int = 0) -> np.ndarray:
    """(k,) P(attribute = 1) per recorded client from a classifier fit on the known clients.

    ``features="auto"`` lets the attacker pick, among :data:`AUTO_FEATURES`,
    the feature set with the best cross-validated AUC on its known clients
    (model selection uses the side knowledge only); otherwise ``features``
    and ``item_attack`` fix it.
    """
    if features != "auto" and features not in FEATURES:
        raise ValueError(f"unknown features {features!r}; use 'auto' or one of {FEATURES}")
    combos = AUTO_FEATURES if features == "auto" else ((features, item_attack),)
    pos = {int(c): j for j, c in enumerate(obs.clients)}
    rows = np.array([pos.get(int(c), -1) for c in known.clients], dtype=np.int64)
    use = (rows >= 0)
    use[use] &= obs.participated[rows[use]]
    yt = known.values[use]
    out = np.full(obs.n_clients, np.nan)
    if yt.size == 0 or np.unique(yt).size < 2:
        rate = float(yt.mean()) if yt.size else 0.5
        out[:] = rate
        return blank_nonparticipants(out[:, None], obs)[:, 0]
    best: tuple[float, np.ndarray, float] | None = None
    for kind, attack in combos:
        x = client_features(obs, public, features=kind, item_attack=attack)
        c, score = _choose_c(x[rows[use]], yt, folds, seed)
        score = -np.inf if np.isnan(score) else score
        if best is None or score > best[0]:
            best = (score, x, c)
    assert best is not None
    _, x, c = best
    clf = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
    clf.fit(x[rows[use]], yt)
    out = clf.predict_proba(x)[:, 1].astype(np.float64)
    return blank_nonparticipants(out[:, None], obs)[:, 0]


@dataclass(frozen=True)
class AttributeOptions:
    """The knobs of :func:`attribute` (the share of clients whose attribute the attacker
    knows is the command's ``--known-fraction``)."""

    features: str = "auto"
    item_attack: str = "projection"
    folds: int = 5


class AttributeAttack(Attack):
    """Registration of :func:`attribute`: reads the uploads and the side knowledge, scores
    clients (gender)."""

    options = AttributeOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        kind="client", observes=("uploads", "released-aggregate", "side-knowledge"))

    @classmethod
    def infer(cls, obs: Observation, public: PublicKnowledge, known: KnownAttributes,
              options: AttributeOptions, seed: int) -> np.ndarray:
        """(k,) :func:`attribute` with ``options``."""
        return attribute(obs, public, known, features=options.features,
                         item_attack=options.item_attack, folds=options.folds, seed=seed)
