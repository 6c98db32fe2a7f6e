"""Scoring an item-level attack against ground truth (docs/design.md, section 6).

Input: ``scores`` (k, m) from an attack and ``labels`` (k, m) from
:mod:`attacks.labels` (1 member, 0 non-member, NaN left out) under a relation
the caller names. Rows whose scores are all NaN (clients that did not take
part) are dropped. Metrics, with the keys :func:`score_attack` returns:

- ``auc``: ROC AUC over all labelled (client, item) pairs pooled
  (``sklearn.metrics.roc_auc_score``); ``auc_client_mean``: the mean of the
  per-client AUCs (clients with both classes).
- ``tpr@1%fpr``, ``tpr@0.1%fpr``: the largest TPR of a ROC point whose FPR is
  at most 1% / 0.1%; no interpolation between points, so the figure is one a
  threshold actually achieves (conservative).
- ``precision@20%``, ``recall@20%``, ``f1@20%``: what an attacker can compute
  without knowing how many members a client has: each client predicts the top
  20% of its labelled candidates (IMIA's published cutoff, Yuan et al., WWW
  2023), ceil(0.2 |labelled|) items, ties in a seeded random order; averaged
  over clients with at least one member. ``f1@20%_random_baseline``: the
  expected F1 of a random ranking at that cutoff (precision |members| /
  |labelled|, recall 0.2), averaged the same way.
- ``f1@public`` (and its precision, recall, random baseline): the same at a
  cutoff the attacker estimates from public facts, ``public_fraction`` of the
  candidates (e.g. 1 / (1 + num_negatives) under ``positive_vs_sampled``); NaN
  when the caller gives none.
- ``precision_oracle``, ``recall_oracle``, ``f1_oracle``: the ORACLE figure,
  each client's top-|members| items: it uses the true number of members, which
  no attacker knows, so it is an upper reference, not an attack's result (the
  three are equal per client). ``f1_random_baseline``: the same for a random
  ranking, the mean of |members| / |labelled| (1 / (1 + num_negatives) under
  ``positive_vs_sampled`` with distinct negatives).
- ``advantage``: membership advantage max over thresholds of TPR - FPR
  (Yeom et al., CSF 2018), pooled.
- ``eps_lb_cp``, ``eps_lb_one_run``: the empirical epsilon lower bounds of
  :mod:`attacks.audit` (read its assumptions). Clients are halved by a seeded
  permutation: thresholds / guess rules are chosen on one half, the bounds
  computed on the other (with ``randomized_membership``: every labelled pair
  is a canary, without per-client balancing, and when each client holds one
  canary that canary is its Clopper-Pearson trial). ``audit_assumptions_met``
  echoes the caller's ``randomized_membership``: only when membership was
  decided by independent fair coins (canary items) are the two figures
  certified lower bounds; with natural training data they are estimates and an
  audit must not treat them as proof of a privacy bug.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score, roc_curve

from .audit import cp_audit, one_run_audit, split_clients
from .labels import Relation, check_relation

SCORE_KEYS: tuple[str, ...] = (
    "auc", "auc_client_mean", "tpr@1%fpr", "tpr@0.1%fpr",
    "precision@20%", "recall@20%", "f1@20%", "f1@20%_random_baseline",
    "precision@public", "recall@public", "f1@public", "f1@public_random_baseline",
    "precision_oracle", "recall_oracle", "f1_oracle", "f1_random_baseline",
    "advantage", "eps_lb_cp", "eps_lb_one_run",
)
#: IMIA's published cutoff: the top 20% of a client's candidates are guessed members
PUBLISHED_CUTOFF = 0.2


def _pooled(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mask = ~np.isnan(labels)
    return labels[mask].astype(np.int64), scores[mask]


def _both_classes(y: np.ndarray) -> bool:
    return bool(y.size) and 0 < int(y.sum()) < y.size


def auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC of scores ``s`` for binary labels ``y``; NaN if a class is missing."""
    return float(roc_auc_score(y, s)) if _both_classes(y) else math.nan


def auc_rank(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic (ties count 1/2); equals :func:`auc`, faster.

    AUC = (sum of member ranks - n1 (n1 + 1) / 2) / (n1 n0), mid-ranks for ties.
    """
    n1 = int(y.sum())
    n0 = y.size - n1
    if n1 == 0 or n0 == 0:
        return math.nan
    ranks = rankdata(s)
    return float((ranks[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def tpr_at_fpr(y: np.ndarray, s: np.ndarray, max_fpr: float) -> float:
    """Largest TPR among ROC points with FPR <= ``max_fpr`` (no interpolation)."""
    if not _both_classes(y):
        return math.nan
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    return float(tpr[fpr <= max_fpr].max())


def advantage(y: np.ndarray, s: np.ndarray) -> float:
    """Membership advantage: max over thresholds of TPR - FPR (>= 0)."""
    if not _both_classes(y):
        return math.nan
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    return float(max(0.0, (tpr - fpr).max()))


def _f1(p: float, r: float) -> float:
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def cutoff_metrics(scores: np.ndarray, labels: np.ndarray, fraction: float | None,
                   seed: int = 0) -> dict[str, float]:
    """Per-client precision / recall / F1 of the top ``fraction`` of each client's labelled
    candidates (ceil, at least 1), averaged over clients with a member; ``fraction`` None:
    the top |members| (the oracle cutoff). With ``random_baseline`` the expected F1 of a
    random ranking at the same cutoff (precision |members| / |labelled|, recall k / |labelled|
    in expectation)."""
    rng = np.random.default_rng(seed)
    prec, rec, f1, base = [], [], [], []
    for s_row, y_row in zip(scores, labels, strict=True):
        mask = ~np.isnan(y_row)
        y, s = y_row[mask], s_row[mask]
        members = int((y == 1.0).sum())
        if members == 0:
            continue
        k = members if fraction is None else max(1, math.ceil(fraction * y.size))
        top = np.lexsort((rng.random(s.size), -s))[:k]
        tp = int((y[top] == 1.0).sum())
        p, r = tp / k, tp / members
        prec.append(p)
        rec.append(r)
        f1.append(_f1(p, r))
        base.append(_f1(members / y.size, min(k, y.size) / y.size))
    if not prec:
        return {"precision": math.nan, "recall": math.nan, "f1": math.nan,
                "random_baseline": math.nan}
    return {"precision": float(np.mean(prec)), "recall": float(np.mean(rec)),
            "f1": float(np.mean(f1)), "random_baseline": float(np.mean(base))}


def top_k_metrics(scores: np.ndarray, labels: np.ndarray, seed: int = 0,
                  public_fraction: float | None = None) -> dict[str, float]:
    """The cutoff metrics of the module docstring: at the published 20%, at the attacker's
    public estimate, and the oracle top-|members| (labelled ``_oracle``)."""
    out: dict[str, float] = {}
    oracle = cutoff_metrics(scores, labels, None, seed)
    published = cutoff_metrics(scores, labels, PUBLISHED_CUTOFF, seed)
    for name in ("precision", "recall", "f1"):
        out[f"{name}@20%"] = published[name]
    out["f1@20%_random_baseline"] = published["random_baseline"]
    public = (cutoff_metrics(scores, labels, public_fraction, seed)
              if public_fraction is not None else dict.fromkeys(oracle, math.nan))
    for name in ("precision", "recall", "f1"):
        out[f"{name}@public"] = public[name]
    out["f1@public_random_baseline"] = public["random_baseline"]
    for name in ("precision", "recall", "f1"):
        out[f"{name}_oracle"] = oracle[name]
    out["f1_random_baseline"] = oracle["random_baseline"]
    return out


def _json_ready(d: dict[str, Any]) -> dict[str, Any]:
    """NaN / inf floats become None so that strict JSON accepts the dict."""
    out: dict[str, Any] = {}
    for key, val in d.items():
        if isinstance(val, dict):
            out[key] = _json_ready(val)
        elif isinstance(val, float) and not math.isfinite(val):
            out[key] = None
        else:
            out[key] = val
    return out


def score_attack(scores: np.ndarray, labels: np.ndarray, *, relation: Relation,
                 confidence: float = 0.95, delta: float = 0.0, seed: int = 0,
                 randomized_membership: bool = False,
                 public_fraction: float | None = None) -> dict[str, Any]:
    """All metrics of the module docstring as a JSON-ready dict (NaN becomes None).

    Each row must be a different client of one audited release (e.g. one
    round): the Clopper-Pearson bound treats rows as independent trials, so
    stacking the same client's rows from several rounds would overstate it.
    ``relation`` must be the one ``labels`` were built with
    (:func:`attacks.labels.membership_labels`); it is recorded in the output.
    ``delta`` enters both epsilon bounds; ``seed`` fixes the client split, the
    trial draws and the tie-breaking. ``public_fraction``: the share of a client's
    candidates the attacker guesses are members, from public facts only (``f1@public``).
    """
    check_relation(relation)
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    if scores.shape != labels.shape or scores.ndim != 2:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be equal (k, m)")
    if not 0 < confidence < 1 or not 0 <= delta < 1:
        raise ValueError("need 0 < confidence < 1 and 0 <= delta < 1")
    bad = ~np.isnan(labels) & ~np.isin(labels, (0.0, 1.0))
    if bad.any():
        raise ValueError("labels must be 0, 1 or NaN")
    keep = ~np.isnan(scores).all(axis=1)
    scores, labels = scores[keep], labels[keep]
    if np.isnan(scores[~np.isnan(labels)]).any() or np.isinf(scores).any():
        raise ValueError("scores must be finite for every labelled (client, item)")
    y, s = _pooled(scores, labels)
    per_client = [auc_rank(*_pooled(sr, yr)) for sr, yr in zip(scores, labels, strict=True)]
    per_client = [a for a in per_client if not math.isnan(a)]
    select, evaluate = split_clients(scores.shape[0], seed)
    # coin-flipped canaries: one per client is a trial as it stands; pairs need no balancing
    one_each = bool(randomized_membership) and bool(((~np.isnan(labels)).sum(axis=1) <= 1).all())
    cp = cp_audit(scores, labels, select, evaluate, confidence=confidence, delta=delta, seed=seed,
                  coin_per_client=not one_each)
    one = one_run_audit(scores, labels, select, evaluate, confidence=confidence, delta=delta,
                        seed=seed, balance=not randomized_membership)
    out: dict[str, Any] = {
        "relation": relation,
        "n_clients": int(scores.shape[0]),
        "n_members": int((y == 1).sum()),
        "n_nonmembers": int((y == 0).sum()),
        "auc": auc(y, s),
        "auc_client_mean": float(np.mean(per_client)) if per_client else math.nan,
        "tpr@1%fpr": tpr_at_fpr(y, s, 0.01),
        "tpr@0.1%fpr": tpr_at_fpr(y, s, 0.001),
        **top_k_metrics(scores, labels, seed, public_fraction),
        "advantage": advantage(y, s),
        "eps_lb_cp": cp.eps_lb,
        "eps_lb_one_run": one.eps_lb,
        "confidence": confidence,
        "delta": delta,
        "audit_assumptions_met": bool(randomized_membership),
        "cp_detail": {"threshold": cp.threshold, "tp": cp.tp, "n_pos": cp.n_pos,
                      "fp": cp.fp, "n_neg": cp.n_neg},
        "one_run_detail": {"m": one.m, "r": one.r, "v": one.v, "frac_in": one.frac_in,
                           "frac_out": one.frac_out},
    }
    return _json_ready(out)


def score_attribute(prob: np.ndarray, truth: np.ndarray, known_values: np.ndarray
                    ) -> dict[str, Any]:
    """Attribute inference metrics on the evaluated (not known) clients, JSON-ready.

    ``prob``: predicted P(attribute = 1) per evaluated client; ``truth``: their
    0/1 attribute; ``known_values``: the attribute of the clients the attacker
    knew (for the majority-class baseline it could reach without any upload).
    ``auc`` (0.5 = chance), ``balanced_accuracy`` at threshold 0.5 (0.5 =
    chance), ``accuracy`` against ``majority_baseline`` (the evaluated
    clients' share of the class that is the majority among the known ones).
    """
    p = np.asarray(prob, dtype=np.float64)
    y = np.asarray(truth, dtype=np.int64)
    if p.shape != y.shape or np.isnan(p).any():
        raise ValueError("prob must be finite with one value per evaluated client")
    pred = (p >= 0.5).astype(np.int64)
    rates = [float((pred[y == c] == c).mean()) for c in (0, 1) if (y == c).any()]
    known = np.asarray(known_values, dtype=np.int64)
    majority = int(known.mean() >= 0.5) if known.size else int(y.mean() >= 0.5)
    out = {
        "n_eval": int(y.size),
        "positive_rate": float(y.mean()) if y.size else math.nan,
        "auc": auc(y, p),
        "balanced_accuracy": float(np.mean(rates)) if len(rates) == 2 else math.nan,
        "accuracy": float((pred == y).mean()) if y.size else math.nan,
        "majority_baseline": float((y == majority).mean()) if y.size else math.nan,
    }
    return _json_ready(out)
