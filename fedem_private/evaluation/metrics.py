"""Leave-one-out ranking metrics: HR@K and NDCG@K, sampled and full ranking.

For user u with held-out test item i*, rank(u) is the number of candidate
items scored at least as high as i* (ties count against the model, so a
constant scorer cannot look good). HR@K = mean_u [rank(u) < K] and
NDCG@K = mean_u [rank(u) < K] / log2(rank(u) + 2) (He et al., 2015/2017).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedem_private import rng
from fedem_private.data.negatives import sample_excluding
from fedem_private.data.split import Split, evaluation_exclusion_csr, exclusion_csr

KS = (10, 20)


@dataclass(frozen=True)
class EvalSets:
    """What each user is ranked against, fixed for a whole run."""

    test_items: torch.Tensor  # (n,)
    sampled: torch.Tensor  # (n, 99) sampled negatives
    excl_indptr: np.ndarray  # items never ranked in full ranking (train + validation)
    excl_items: np.ndarray
    # validation (docs/design.md 2a): each user's validation item and its (n, 99) sampled negatives,
    # None when the run reports no validation metric
    val_items: torch.Tensor | None = None
    val_sampled: torch.Tensor | None = None


# what the validation item is ranked against: no validation metric, the test's own 99
# negatives (the authors' code, docs/design.md 2a), or a separate draw of 99 from the same pool
VALIDATIONS = (None, "shared", "separate")


def build_eval_sets(split: Split, protocol: str, seed: int, n_sampled: int = 99,
                    validation: str | None = None) -> EvalSets:
    """The 99 sampled candidates per user and the full-ranking exclusions.

    ``paper``: candidates come from items the user never interacted with in
    any split (as in the published code). ``strict``: from items outside the
    user's training set and validation item, other than the test item.

    ``validation`` (docs/design.md 2a): None, no validation metric; ``"shared"``, the
    validation item is ranked against the test's own 99 negatives (ONE set, as
    in the FedEM code); ``"separate"``, against 99 drawn separately from the
    same pool (keyed as the test's draw with evaluation round 1, not 0).
    """
    if validation not in VALIDATIONS:
        raise ValueError(f"unknown validation {validation!r}")
    if protocol == "paper":
        indptr, items = exclusion_csr(split, "paper")
    else:
        indptr, items = _with_test(split)
    n = split.n_users
    owner = np.repeat(np.arange(n), n_sampled)
    counter = np.tile(np.arange(n_sampled), n)
    u = rng.uniform(rng.key(seed, rng.Stream.EVAL, 0, owner), counter)
    cand = sample_excluding(indptr, items, split.n_items, owner, u).reshape(n, n_sampled)
    e_ptr, e_items = evaluation_exclusion_csr(split)
    val_items = val_cand = None
    if validation is not None:
        val_items = torch.from_numpy(split.val_items)
        if validation == "shared":
            val_cand = torch.from_numpy(cand)
        else:
            u_val = rng.uniform(rng.key(seed, rng.Stream.EVAL, 1, owner), counter)
            val_cand = torch.from_numpy(sample_excluding(indptr, items, split.n_items, owner,
                                                         u_val).reshape(n, n_sampled))
    return EvalSets(torch.from_numpy(split.test_items), torch.from_numpy(cand), e_ptr, e_items,
                    val_items, val_cand)


def sampled_pools(split: Split) -> np.ndarray:
    """Per user, how many distinct items :func:`build_eval_sets` draws its sampled negatives
    from, under either protocol: every item but the user's training, validation and test
    items. Below ``n_sampled`` the draw must repeat items (a negative scored above the test
    item then counts more than once), so sampled HR/NDCG can fall below full ranking's."""
    n, m = split.n_users, split.n_items
    keys = np.repeat(np.arange(n, dtype=np.int64), split.train_counts) * m + split.train_items

    def outside_training(items: np.ndarray) -> np.ndarray:
        wanted = np.arange(n, dtype=np.int64) * m + items
        at = np.searchsorted(keys, wanted)
        inside = at < keys.size
        inside[inside] = keys[at[inside]] == wanted[inside]
        return ~inside

    held = (outside_training(split.val_items).astype(np.int64)
            + (outside_training(split.test_items) & (split.test_items != split.val_items)))
    return m - np.asarray(split.train_counts, dtype=np.int64) - held


def sampled_note(split: Split, n_sampled: int = 99) -> dict[str, object]:
    """summary.json's ``sampled_candidates``: how many users have fewer than ``n_sampled``
    distinct items to draw sampled negatives from (:func:`sampled_pools`), the fewest, and
    a warning when any has."""
    pools = sampled_pools(split)
    short = int((pools < n_sampled).sum())
    note: dict[str, object] = {"asked": n_sampled, "users": int(pools.size),
                               "users_short": short,
                               "fewest": int(pools.min()) if pools.size else None,
                               "warning": None}
    if short:
        note["warning"] = (
            f"{short} of {pools.size} users have fewer than {n_sampled} items to draw their "
            f"{n_sampled} sampled negatives from (fewest {note['fewest']}): their negatives "
            f"repeat, so sampled HR/NDCG can fall below full ranking's and are not "
            f"comparable with runs on larger catalogues; read the full-ranking metrics")
    return note


def _with_test(split: Split) -> tuple[np.ndarray, np.ndarray]:
    n = split.n_users
    users = np.concatenate([np.repeat(np.arange(n), split.train_counts), np.arange(n),
                            np.arange(n)])
    items = np.concatenate([split.train_items, split.val_items, split.test_items])
    key = np.unique(users * split.n_items + items)
    indptr = np.zeros(n + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(key // split.n_items, minlength=n))
    return indptr, (key % split.n_items).astype(np.int64)


def ranks_sampled(scores_test: torch.Tensor, scores_cand: torch.Tensor) -> torch.Tensor:
    """Rank of the test item among sampled candidates: #candidates with score >= test."""
    return (scores_cand >= scores_test[:, None]).sum(dim=1)


def hr_ndcg(ranks: torch.Tensor, ks: tuple[int, ...] = KS) -> dict[str, float]:
    """HR@K and NDCG@K averaged over users from 0-based ranks."""
    r = ranks.double()
    out: dict[str, float] = {}
    for k in ks:
        hit = (r < k).double()
        out[f"hr@{k}"] = float(hit.mean())
        out[f"ndcg@{k}"] = float((hit / torch.log2(r + 2.0)).mean())
    return out


def eval_sample(n_users: int, eval_users: int, seed: int) -> np.ndarray:
    """The users a run evaluates, sorted: every user, or with ``eval_users`` M < n the M
    with the smallest uniforms keyed by (seed, EVAL, round 2, user): a fixed simple random
    sample without replacement, the same in every round, for federated runs and baselines
    alike (``train.eval_users``; keyed by the data's seed, not the run's nonce)."""
    if not eval_users or eval_users >= n_users:
        return np.arange(n_users)
    u = rng.uniform(rng.key(seed, rng.Stream.EVAL, 2, np.arange(n_users)), 0)
    return np.sort(np.argpartition(u, eval_users - 1)[:eval_users])


def hr_ndcg_se(ranks: torch.Tensor, ks: tuple[int, ...] = KS) -> dict[str, float]:
    """The standard error of each :func:`hr_ndcg` mean over a sample of users: the sample
    standard deviation of the per-user terms ([rank < K], [rank < K] / log2(rank + 2))
    over sqrt(users); keys ``<metric>_se``. One user or none: nan."""
    r = ranks.double()
    out: dict[str, float] = {}
    n = int(r.numel())
    for k in ks:
        hit = (r < k).double()
        for name, terms in ((f"hr@{k}", hit), (f"ndcg@{k}", hit / torch.log2(r + 2.0))):
            out[f"{name}_se"] = (float(terms.std(unbiased=True)) / n ** 0.5 if n > 1
                                 else float("nan"))
    return out


class RankAccumulator:
    """Collects per-user ranks chunk by chunk, then averages.

    The scores may live on any device: the ranks are computed there and only
    they (one integer per user) come back to the CPU, where they are kept.
    """

    def __init__(self, n_users: int, standard_errors: bool = False) -> None:
        # standard_errors: each metric also reported with its standard error over the users
        # ranked (``<metric>_se``) and their count (``users``): a sample of users
        self.standard_errors = standard_errors
        self.sampled = torch.full((n_users,), -1, dtype=torch.long)
        self.full = torch.full((n_users,), -1, dtype=torch.long)
        self.val = torch.full((n_users,), -1, dtype=torch.long)
        # the validation item ranked in full: against every item but the training items
        # and the test item (the test's full ranking with the two held-out items swapped)
        self.val_full = torch.full((n_users,), -1, dtype=torch.long)

    def add(self, users: np.ndarray, q: torch.Tensor, p: torch.Tensor, sets: EvalSets) -> None:
        """Score users' own dot-product models: q (k, m, d) item tables, p (k, d) user vectors."""
        self.add_scores(users, torch.bmm(q, p[:, :, None]).squeeze(2), sets)

    def add_scores(self, users: np.ndarray, scores: torch.Tensor, sets: EvalSets) -> None:
        """Rank each user's test item from its model's scores of every item (k, m), on the
        scores' device."""
        dev = scores.device
        users_t = torch.from_numpy(np.asarray(users, dtype=np.int64))
        test = sets.test_items[users_t].to(dev)
        s_test = scores.gather(1, test[:, None]).squeeze(1)
        s_cand = scores.gather(1, sets.sampled[users_t].to(dev))
        self.sampled[users_t] = ranks_sampled(s_test, s_cand).cpu()
        # full ranking: every item except training items, the validation item and the test item
        lo, hi = sets.excl_indptr[users], sets.excl_indptr[np.asarray(users) + 1]
        rows = torch.from_numpy(np.repeat(np.arange(len(users)), hi - lo)).to(dev)
        cols = torch.from_numpy(np.concatenate(
            [sets.excl_items[a:b] for a, b in zip(lo, hi, strict=True)])).to(dev)
        own = torch.arange(len(users), device=dev)
        self.full[users_t] = _full_ranks(scores, s_test, rows, cols, own, test).cpu()
        if sets.val_items is not None and sets.val_sampled is not None:
            val = sets.val_items[users_t].to(dev)
            s_val = scores.gather(1, val[:, None]).squeeze(1)
            s_vcand = scores.gather(1, sets.val_sampled[users_t].to(dev))
            self.val[users_t] = ranks_sampled(s_val, s_vcand).cpu()
            # the excluded entries hold the validation item itself; the test item is left out
            self.val_full[users_t] = _full_ranks(scores, s_val, rows, cols, own, test).cpu()

    def result(self) -> dict[str, dict[str, float]]:
        done = self.sampled >= 0
        out = {"sampled": self._metrics(self.sampled[done]),
               "full": self._metrics(self.full[done])}
        if bool((self.val >= 0).any()):  # validation item vs its 99 sampled (docs/design.md 2a)
            ranked = self.val[self.val >= 0]  # "users": how many ranked a validation item
            out["val"] = {**self._metrics(ranked), "users": int(ranked.numel())}
            ranked = self.val_full[self.val_full >= 0]
            out["val_full"] = {**self._metrics(ranked), "users": int(ranked.numel())}
        return out

    def _metrics(self, ranks: torch.Tensor) -> dict[str, float]:
        if not self.standard_errors:
            return hr_ndcg(ranks)
        return {**hr_ndcg(ranks), **hr_ndcg_se(ranks), "users": int(ranks.numel())}


def _full_ranks(scores: torch.Tensor, s_held: torch.Tensor, rows: torch.Tensor,
                cols: torch.Tensor, own: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """0-based full-ranking rank of each row's held-out item (score ``s_held``): how many
    items score at least as high, leaving out the excluded (rows, cols) entries and each
    row's ``other`` held-out item (own: 0 .. k - 1)."""
    beat = scores >= s_held[:, None]
    beat[rows, cols] = False
    beat[own, other] = False
    return beat.sum(dim=1)
