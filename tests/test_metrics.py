"""HR@K / NDCG@K against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.evaluation.metrics import (
    RankAccumulator,
    build_eval_sets,
    hr_ndcg,
    ranks_sampled,
)


def test_ranks_count_ties_against_the_model():
    test = torch.tensor([1.0, 0.5, 2.0])
    cand = torch.tensor([[0.0, 2.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])
    assert ranks_sampled(test, cand).tolist() == [2, 3, 0]


def test_hr_ndcg_hand_values():
    out = hr_ndcg(torch.tensor([0, 3, 12]), ks=(10,))
    assert math.isclose(out["hr@10"], 2 / 3)
    assert math.isclose(out["ndcg@10"], (1.0 + 1 / math.log2(5)) / 3)


def test_eval_sets_and_full_ranking():
    sp = leave_one_out(generate(SyntheticConfig(n_users=30, n_items=60, mean_activity=8), 0), 0)
    for protocol in ("paper", "strict"):
        sets = build_eval_sets(sp, protocol, seed=0)
        for u in range(sp.n_users):
            cand = set(sets.sampled[u].tolist())
            assert int(sp.test_items[u]) not in cand
            assert not cand & set(sp.train_of(u).tolist())
            if protocol == "paper":
                assert int(sp.val_items[u]) not in cand
    sets = build_eval_sets(sp, "strict", seed=0)
    # a model that scores exactly the test item highest gets rank 0 everywhere
    q = torch.zeros(sp.n_users, sp.n_items, 2)
    p = torch.zeros(sp.n_users, 2)
    p[:, 0] = 1.0
    q[torch.arange(sp.n_users), sets.test_items, 0] = 1.0
    acc = RankAccumulator(sp.n_users)
    acc.add(np.arange(sp.n_users), q, p, sets)
    res = acc.result()
    assert res["full"]["hr@10"] == 1.0 and res["sampled"]["ndcg@10"] == 1.0
    # training items scored above the test item do not count in full ranking
    q[:, :, 0] = 0.0
    for u in range(sp.n_users):
        q[u, sp.train_of(u), 0] = 5.0
    q[torch.arange(sp.n_users), sets.test_items, 0] = 1.0
    acc.add(np.arange(sp.n_users), q, p, sets)
    assert acc.result()["full"]["hr@10"] == 1.0
    # a constant model ranks the test item last (ties count against it)
    acc.add(np.arange(sp.n_users), torch.zeros_like(q), p, sets)
    assert acc.result()["sampled"]["hr@10"] == 0.0


def test_validation_item_ranked_in_full_against_a_brute_force_count():
    """val_full: the validation item's rank among every item but the client's training
    items and its test item (ties count against it), per user, as written out by hand."""
    sp = leave_one_out(generate(SyntheticConfig(n_users=25, n_items=40, mean_activity=8), 1), 1)
    sets = build_eval_sets(sp, "strict", seed=1, validation="separate")
    gen = torch.Generator().manual_seed(4)
    scores = torch.randint(0, 6, (sp.n_users, sp.n_items), generator=gen).double()  # ties
    acc = RankAccumulator(sp.n_users)
    order = np.random.default_rng(2).permutation(sp.n_users)
    for chunk in np.array_split(order, 3):  # chunked and out of order
        acc.add_scores(chunk, scores[torch.from_numpy(chunk)], sets)
    def brute(u: int, held: int) -> int:  # items outside train and both held-out, >= held's
        out = set(sp.train_of(u).tolist()) | {int(sp.test_items[u]), int(sp.val_items[u])}
        return sum(1 for j in range(sp.n_items) if j not in out and scores[u, j] >= scores[u, held])

    want = [brute(u, int(sp.val_items[u])) for u in range(sp.n_users)]
    assert acc.val_full.tolist() == want
    res = acc.result()
    ranks = torch.tensor(want)
    assert res["val_full"]["hr@10"] == pytest.approx(float((ranks < 10).double().mean()))
    assert res["val_full"]["users"] == sp.n_users
    # the test's own full ranking is unchanged beside it: its held-out twin is left out
    assert acc.full.tolist() == [brute(u, int(sp.test_items[u])) for u in range(sp.n_users)]


def test_eval_sets_of_a_sample_equal_the_full_build_rows():
    """issue 66: the sets built for the evaluated users only are, row for row, those of
    the full build (keyed draws), rank alike, and refuse a user they do not cover."""
    sp = leave_one_out(generate(SyntheticConfig(n_users=120, n_items=50, mean_activity=12,
                                                activity_sigma=1.0), 3), 3)
    chosen = np.sort(np.random.default_rng(0).choice(sp.n_users, 29, replace=False))
    for protocol, validation in (("strict", "separate"), ("paper", "shared")):
        full = build_eval_sets(sp, protocol, seed=3, validation=validation)
        part = build_eval_sets(sp, protocol, seed=3, validation=validation, users=chosen)
        at = torch.from_numpy(chosen)
        assert torch.equal(part.sampled, full.sampled[at])
        assert torch.equal(part.val_sampled, full.val_sampled[at])
        for u in chosen:
            assert np.array_equal(part.exclusions(u), full.exclusions(u))
        scores = torch.randint(0, 5, (chosen.size, sp.n_items),
                               generator=torch.Generator().manual_seed(1)).double()
        acc_full, acc_part = RankAccumulator(sp.n_users), RankAccumulator(sp.n_users)
        acc_full.add_scores(chosen, scores, full)
        acc_part.add_scores(chosen, scores, part)
        assert acc_full.result() == acc_part.result()
    outside = np.setdiff1d(np.arange(sp.n_users), chosen)[:1]
    with pytest.raises(ValueError, match="outside the evaluation sets"):
        part.rows(outside)
