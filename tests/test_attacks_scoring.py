"""Scoring metrics against hand-computed values and limiting cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attacks.scoring import (
    SCORE_KEYS,
    advantage,
    auc,
    auc_rank,
    score_attack,
    top_k_metrics,
    tpr_at_fpr,
)


def test_auc_by_hand() -> None:
    y = np.array([1, 1, 0, 0, 0])
    s = np.array([0.9, 0.4, 0.5, 0.1, 0.2])
    # member pairs won: 0.9 beats all 3; 0.4 beats 0.1 and 0.2 -> 5 / 6
    assert auc(y, s) == pytest.approx(5 / 6)
    assert auc(np.array([1, 0]), np.array([0.3, 0.3])) == pytest.approx(0.5)
    assert np.isnan(auc(np.array([1, 1]), np.array([0.1, 0.2])))


def test_rank_auc_agrees_with_sklearn() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = (rng.random(50) < 0.3).astype(int)
        s = rng.integers(0, 6, 50).astype(float)  # many ties
        assert auc_rank(y, s) == pytest.approx(auc(y, s))


def test_tpr_at_low_fpr_by_hand() -> None:
    neg = np.arange(100) / 100  # 0.00 .. 0.99
    pos = np.array([2.0, 0.995, 0.985])
    y = np.concatenate([np.ones(3), np.zeros(100)]).astype(int)
    s = np.concatenate([pos, neg])
    # threshold 0.985 flags one negative (0.99): FPR 1%, TPR 1
    assert tpr_at_fpr(y, s, 0.01) == pytest.approx(1.0)
    # FPR <= 0.1% allows no negative: only the two members above 0.99
    assert tpr_at_fpr(y, s, 0.001) == pytest.approx(2 / 3)


def test_advantage_by_hand() -> None:
    y = np.array([1, 1, 0, 0])
    s = np.array([0.9, 0.3, 0.5, 0.1])
    # t=0.9: .5 - 0; t=0.5: .5 - .5; t=0.3: 1 - .5; t=0.1: 1 - 1
    assert advantage(y, s) == pytest.approx(0.5)


def test_top_k_by_hand() -> None:
    scores = np.array([[0.9, 0.8, 0.1, 0.7], [0.1, 0.2, 0.3, 0.4]])
    labels = np.array([[1.0, 0.0, 1.0, np.nan], [0.0, 0.0, 0.0, 1.0]])
    out = top_k_metrics(scores, labels, public_fraction=0.5)
    # the oracle: client 0's top-2 of labelled {0.9 (1), 0.8 (0), 0.1 (1)} -> 1 of 2;
    # client 1's top-1 -> 1 of 1
    assert out["precision_oracle"] == pytest.approx(0.75)
    assert out["recall_oracle"] == pytest.approx(0.75)
    assert out["f1_oracle"] == pytest.approx(0.75)
    assert out["f1_random_baseline"] == pytest.approx((2 / 3 + 1 / 4) / 2)
    # the published cutoff, ceil(0.2 x labelled) = 1 each: client 0 guesses 0.9 (a
    # member: p 1, r 1/2), client 1 guesses 0.4 (p 1, r 1)
    assert out["precision@20%"] == pytest.approx(1.0)
    assert out["recall@20%"] == pytest.approx(0.75)
    assert out["f1@20%"] == pytest.approx((2 / 3 + 1.0) / 2)
    # random at 1 guess: client 0 p 2/3 r 1/3; client 1 p 1/4 r 1/4
    assert out["f1@20%_random_baseline"] == pytest.approx(
        (2 * (2 / 3) * (1 / 3) / (2 / 3 + 1 / 3) + 1 / 4) / 2)
    # the public half: ceil(1.5) = 2 and 2 guesses: client 0 1 of 2 (r 1/2); client 1
    # {0.4 (1), 0.3 (0)}: p 1/2, r 1
    assert out["precision@public"] == pytest.approx(0.5)
    assert out["recall@public"] == pytest.approx(0.75)
    assert out["f1@public"] == pytest.approx((0.5 + 2 / 3) / 2)
    assert np.isnan(top_k_metrics(scores, labels)["f1@public"])


def _labels(k: int, m: int, n_pos: int, n_neg: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.full((k, m), np.nan)
    for j in range(k):
        idx = rng.permutation(m)
        labels[j, idx[:n_pos]] = 1.0
        labels[j, idx[n_pos: n_pos + n_neg]] = 0.0
    return labels


def test_perfect_scores() -> None:
    labels = _labels(40, 100, 5, 20, seed=0)
    scores = np.nan_to_num(labels, nan=0.5) + 0.0
    out = score_attack(scores, labels, relation="positive_vs_sampled")
    assert set(SCORE_KEYS) <= set(out)
    assert out["auc"] == 1.0 and out["advantage"] == 1.0 and out["auc_client_mean"] == 1.0
    assert out["tpr@1%fpr"] == 1.0 and out["tpr@0.1%fpr"] == 1.0
    assert out["precision_oracle"] == out["recall_oracle"] == out["f1_oracle"] == 1.0
    assert out["f1_random_baseline"] == pytest.approx(1 / (1 + 4))
    # the top 20% (5 of 25 candidates, exactly the members) is perfect too
    assert out["f1@20%"] == 1.0 and out["f1@20%_random_baseline"] == pytest.approx(0.2)
    assert out["eps_lb_cp"] > 0 and out["eps_lb_one_run"] > 0
    json.dumps(out, allow_nan=False)


def test_random_scores() -> None:
    labels = _labels(200, 60, 6, 24, seed=1)
    scores = np.random.default_rng(2).random(labels.shape)
    out = score_attack(scores, labels, relation="positive_vs_sampled", seed=3)
    assert abs(out["auc"] - 0.5) < 0.03
    assert out["advantage"] < 0.08
    assert abs(out["f1_oracle"] - out["f1_random_baseline"]) < 0.04
    assert abs(out["f1@20%"] - out["f1@20%_random_baseline"]) < 0.04
    assert out["eps_lb_cp"] == 0.0
    assert out["eps_lb_one_run"] == 0.0
    assert out["audit_assumptions_met"] is False


def test_score_attack_input_checks() -> None:
    labels = _labels(4, 10, 2, 4, seed=0)
    with pytest.raises(ValueError, match="relation"):
        score_attack(np.zeros((4, 10)), labels, relation="members")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="equal"):
        score_attack(np.zeros((4, 9)), labels, relation="positive_vs_any")
    partial = np.zeros((4, 10))
    partial[0, np.flatnonzero(~np.isnan(labels[0]))[0]] = np.nan
    with pytest.raises(ValueError, match="finite"):
        score_attack(partial, labels, relation="positive_vs_sampled")


def test_single_class_metrics_are_none_in_json() -> None:
    labels = np.ones((4, 3))
    out = score_attack(np.zeros((4, 3)), labels, relation="positive_vs_any")
    assert out["auc"] is None and out["advantage"] is None
    json.dumps(out, allow_nan=False)
