"""HR@10 and NDCG@10 cross-checked against independent implementations (issue 42).

NDCG against scikit-learn's ``ndcg_score`` (one relevant item per user, so
IDCG = 1 and NDCG@K = 1 / log2(1 + position) when the test item is in the top
K, 0 otherwise); HR against a plain "is the test item among the K best
candidates" check written from scratch here. Both are computed over the
candidate set each protocol defines (the test item plus its 99 sampled
negatives; or every item outside the user's training set and validation
item), for sampled and full ranking, and must agree with
:class:`~fedem_private.evaluation.metrics.RankAccumulator` to 1e-9.

Scores are continuous random doubles, so there are no ties: scikit-learn
averages over tied scores while our metric counts ties against the model
(tested on its own in ``test_metrics.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import ndcg_score

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.evaluation.metrics import RankAccumulator, build_eval_sets

K = 10


def _split():
    data = generate(SyntheticConfig(n_users=60, n_items=150, mean_activity=12), 3)
    return leave_one_out(data, 3)


def _independent(scores: np.ndarray, candidates: list[np.ndarray],
                 test_items: np.ndarray) -> tuple[float, float]:
    """(HR@K, NDCG@K) averaged over users, by a top-K membership check and sklearn."""
    hits, ndcgs = [], []
    for u, cand in enumerate(candidates):
        s = scores[u, cand]
        top = cand[np.argsort(-s, kind="stable")[:K]]
        hits.append(float(test_items[u] in set(top.tolist())))
        relevance = (cand == test_items[u]).astype(float)[None, :]
        ndcgs.append(float(ndcg_score(relevance, s[None, :], k=K)))
    return float(np.mean(hits)), float(np.mean(ndcgs))


@pytest.mark.parametrize("protocol", ["strict", "paper"])
@pytest.mark.parametrize("boost", [0.0, 2.0])
def test_hr_ndcg_agree_with_sklearn_and_a_plain_hit_check(protocol: str, boost: float):
    sp = _split()
    sets = build_eval_sets(sp, protocol, seed=5)
    gen = np.random.default_rng(11)
    scores = gen.standard_normal((sp.n_users, sp.n_items))
    # a boost lifts each test item, so both hits and misses (and many positions) occur
    scores[np.arange(sp.n_users), sp.test_items] += boost
    acc = RankAccumulator(sp.n_users)
    half = sp.n_users // 2  # two chunks, as the simulation adds them
    for users in (np.arange(half), np.arange(half, sp.n_users)):
        acc.add_scores(users, torch.from_numpy(scores[users]), sets)
    got = acc.result()

    sampled = [np.concatenate([[sp.test_items[u]], sets.sampled[u].numpy()])
               for u in range(sp.n_users)]
    excluded = [set(sp.train_of(u).tolist()) | {int(sp.val_items[u])}
                for u in range(sp.n_users)]
    full = [np.array([i for i in range(sp.n_items) if i not in excluded[u]])
            for u in range(sp.n_users)]
    for u in range(sp.n_users):  # the candidate sets are what the protocol says
        assert sp.test_items[u] in set(full[u].tolist())
        # 99 draws (with replacement: a repeated negative counts each time it is drawn)
        assert len(sampled[u]) == 100 and sp.test_items[u] not in set(sampled[u][1:].tolist())
    for kind, cands in (("sampled", sampled), ("full", full)):
        hr, ndcg = _independent(scores, cands, sp.test_items)
        assert got[kind]["hr@10"] == pytest.approx(hr, abs=1e-9), kind
        assert got[kind]["ndcg@10"] == pytest.approx(ndcg, abs=1e-9), kind
    # not a vacuous agreement: some users hit and some miss under both rankings
    for kind in ("sampled", "full"):
        assert 0.0 < got[kind]["hr@10"] < 1.0


def test_crosscheck_detects_an_off_by_one_rank():
    """The independent NDCG differs from a metric that ranks from 1 instead of 0."""
    relevance = np.zeros((1, 20))
    relevance[0, 3] = 1.0
    s = np.linspace(1.0, 0.0, 20)[None, :]  # item 3 is at position 4 (rank 3, 0-based)
    assert ndcg_score(relevance, s, k=K) == pytest.approx(1 / np.log2(3 + 2), abs=1e-12)
    assert abs(ndcg_score(relevance, s, k=K) - 1 / np.log2(3 + 3)) > 1e-3
