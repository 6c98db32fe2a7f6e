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
from fedem_private.data.split import PROTOCOLS, Split, evaluation_exclusion_csr, union_csr
from fedem_private.errors import UserError

KS = (10, 20)


@dataclass(frozen=True)
class EvalSets:
    """What each user is ranked against, fixed for a whole run.

    The per-user rows (``sampled``, the exclusion CSR, ``val_sampled``) cover the users in
    ``users`` (sorted ids), or every user when it is None; :meth:`rows` maps user ids to
    them. ``test_items`` and ``val_items`` are indexed by user id."""

    test_items: torch.Tensor  # (n,)
    sampled: torch.Tensor  # (k, 99) sampled negatives
    excl_indptr: np.ndarray  # items never ranked in full ranking (train + validation)
    excl_items: np.ndarray
    # validation (docs/design.md 2a): each user's validation item and its (k, 99) sampled
    # negatives, None when the run reports no validation metric
    val_items: torch.Tensor | None = None
    val_sampled: torch.Tensor | None = None
    # issue 66: the users the rows cover (sorted), None: every user, row u is user u
    users: np.ndarray | None = None

    def rows(self, users: np.ndarray) -> np.ndarray:
        """The rows of ``users`` (user ids); ValueError for a user the sets do not cover."""
        users = np.asarray(users, dtype=np.int64)
        if self.users is None:
            return users
        at = np.minimum(np.searchsorted(self.users, users), max(self.users.shape[0] - 1, 0))
        if self.users.shape[0] == 0 or not np.array_equal(self.users[at], users):
            raise ValueError("a user outside the evaluation sets' users was ranked")
        return at

    def exclusions(self, user: int) -> np.ndarray:
        """The items ``user`` never has ranked in full ranking (training and validation)."""
        r = int(self.rows(np.asarray([user]))[0])
        return self.excl_items[self.excl_indptr[r]:self.excl_indptr[r + 1]]


# what the validation item is ranked against: no validation metric, the test's own 99
# negatives (the authors' code, docs/design.md 2a), or a separate draw of 99 from the same pool
VALIDATIONS = (None, "shared", "separate")


def build_eval_sets(split: Split, protocol: str, seed: int, n_sampled: int = 99,
                    validation: str | None = None,
                    users: np.ndarray | None = None) -> EvalSets:
    """The 99 sampled candidates per user and the full-ranking exclusions.

    Sampled candidates come, under either protocol, from the items outside the user's
    training set, validation item and test item (``paper``: every item the user never
    interacted with in any split, as in the published code; ``strict``: outside the
    training set and validation item, other than the test item: the same set). Full
    ranking leaves out the training items and the validation item.

    ``validation`` (docs/design.md 2a): None, no validation metric; ``"shared"``, the
    validation item is ranked against the test's own 99 negatives (ONE set, as
    in the FedEM code); ``"separate"``, against 99 drawn separately from the
    same pool (keyed as the test's draw with evaluation round 1, not 0).

    ``users`` (issue 66): build the rows of these users only (``train.eval_users``), so
    the cost follows the evaluated sample, not the population. Every draw is keyed by
    (seed, user, position), so a user's rows are the same whichever users are built.
    """
    if validation not in VALIDATIONS:
        raise ValueError(f"unknown validation {validation!r}")
    if protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    rows = (np.arange(split.n_users, dtype=np.int64) if users is None
            else np.unique(np.asarray(users, dtype=np.int64)))
    indptr, items = union_csr(split, [split.val_items, split.test_items], rows)
    cand = _draw(split, indptr, items, rows, seed, 0, n_sampled)
    e_ptr, e_items = evaluation_exclusion_csr(split, rows)
    val_items = val_cand = None
    if validation is not None:
        val_items = torch.from_numpy(split.val_items)
        val_cand = (cand if validation == "shared"
                    else _draw(split, indptr, items, rows, seed, 1, n_sampled))
        val_cand = torch.from_numpy(val_cand)
    return EvalSets(torch.from_numpy(split.test_items), torch.from_numpy(cand), e_ptr, e_items,
                    val_items, val_cand, None if users is None else rows)


def _draw(split: Split, indptr: np.ndarray, items: np.ndarray, rows: np.ndarray, seed: int,
          evaluation: int, n_sampled: int) -> np.ndarray:
    """(k, n_sampled) items outside each row's exclusions, keyed by (seed, evaluation, user
    id, position): the same for a user whatever other rows are drawn."""
    k = rows.shape[0]
    counter = np.tile(np.arange(n_sampled), k)
    u = rng.uniform(rng.key(seed, rng.Stream.EVAL, evaluation, np.repeat(rows, n_sampled)),
                    counter)
    return sample_excluding(indptr, items, split.n_items,
                            np.repeat(np.arange(k), n_sampled), u).reshape(k, n_sampled)


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
        rows = sets.rows(users)  # the users' rows of the per-user sets
        rows_t = torch.from_numpy(rows)
        test = sets.test_items[users_t].to(dev)
        s_test = scores.gather(1, test[:, None]).squeeze(1)
        s_cand = scores.gather(1, sets.sampled[rows_t].to(dev))
        self.sampled[users_t] = ranks_sampled(s_test, s_cand).cpu()
        # full ranking: every item except training items, the validation item and the test item
        lo, hi = sets.excl_indptr[rows], sets.excl_indptr[rows + 1]
        at = torch.from_numpy(np.repeat(np.arange(len(users)), hi - lo)).to(dev)
        cols = torch.from_numpy(np.concatenate(
            [sets.excl_items[a:b] for a, b in zip(lo, hi, strict=True)])).to(dev)
        own = torch.arange(len(users), device=dev)
        self.full[users_t] = _full_ranks(scores, s_test, at, cols, own, test).cpu()
        if sets.val_items is not None and sets.val_sampled is not None:
            val = sets.val_items[users_t].to(dev)
            s_val = scores.gather(1, val[:, None]).squeeze(1)
            s_vcand = scores.gather(1, sets.val_sampled[rows_t].to(dev))
            self.val[users_t] = ranks_sampled(s_val, s_vcand).cpu()
            # the excluded entries hold the validation item itself; the test item is left out
            self.val_full[users_t] = _full_ranks(scores, s_val, at, cols, own, test).cpu()

    def per_user(self, source_users: np.ndarray) -> list[dict[str, int]]:
        """Each ranked user's test ranks (0-based: full over the catalogue, sampled among its
        candidates), keyed by its source id: ``ranks.csv`` of a run evaluated on a sample of
        users, for paired comparisons of runs ranked on the same users."""
        done = (self.sampled >= 0).nonzero().squeeze(1).numpy()
        return [{"user": int(source_users[u]), "full_rank": int(self.full[u]),
                 "sampled_rank": int(self.sampled[u])} for u in done.tolist()]

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
