"""Leave-one-out splits and the two evaluation protocols (docs/design.md section 2)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from .interactions import Interactions

PROTOCOLS = ("strict", "paper")


@dataclass(frozen=True)
class Split:
    """Per-user leave-one-out split in CSR form over the kept users.

    ``train_items[train_indptr[u]:train_indptr[u+1]]`` are u's training
    positives (sorted); ``val_items[u]`` is the second-latest and
    ``test_items[u]`` the latest interaction. ``users`` maps a split user to
    its index in the source :class:`Interactions`.

    ``source_users`` (n_users,) and ``source_items`` (n_items,) are the stable 64-bit keys
    of the users' and items' source ids (``Interactions.user_keys[users]`` and
    ``Interactions.item_keys``; :mod:`fedem_private.data.keys`): unlike the indices, they
    do not move when another user is removed from the data, so randomness that must
    depend on one user's own data only (DP-MostPop's k-subsets) is keyed by them. A split
    built without them gets the indices (``users`` and 0..n_items-1), which do move.
    """

    n_users: int
    n_items: int
    train_indptr: np.ndarray
    train_items: np.ndarray
    val_items: np.ndarray
    test_items: np.ndarray
    users: np.ndarray
    dropped_users: int
    source_users: np.ndarray = None  # type: ignore[assignment]  # filled in __post_init__
    source_items: np.ndarray = None  # type: ignore[assignment]  # filled in __post_init__
    duplicates: int = 0  # repeated (user, item) rows the loader merged before the split

    def __post_init__(self) -> None:
        if self.source_users is None:
            object.__setattr__(self, "source_users", np.asarray(self.users, dtype=np.int64))
        if self.source_items is None:
            object.__setattr__(self, "source_items", np.arange(self.n_items, dtype=np.int64))
        if self.source_users.shape != (self.n_users,):
            raise ValueError(f"source_users has shape {self.source_users.shape}, expected "
                             f"({self.n_users},)")
        if self.source_items.shape != (self.n_items,):
            raise ValueError(f"source_items has shape {self.source_items.shape}, expected "
                             f"({self.n_items},)")

    @property
    def train_counts(self) -> np.ndarray:
        return np.diff(self.train_indptr)

    def digest(self) -> str:
        """SHA-256 (hex) of every field, arrays by dtype, shape and bytes: two splits with
        the same digest are the same split (a resumed run checks the split it reads again
        against its checkpoint's; about a second for 10^8 interactions)."""
        h = hashlib.sha256()
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            h.update(f.name.encode())
            if isinstance(v, np.ndarray):
                a = np.ascontiguousarray(v)
                h.update(f"{a.dtype.str}{a.shape}".encode())
                h.update(memoryview(a).cast("B"))
            else:
                h.update(repr(v).encode())
        return h.hexdigest()

    def train_of(self, u: int) -> np.ndarray:
        return self.train_items[self.train_indptr[u]: self.train_indptr[u + 1]]


def leave_one_out(data: Interactions, seed: int, min_interactions: int = 3,
                  first_seen: bool = False) -> Split:
    """Latest interaction = test, second latest = validation, the rest = training.

    Order is by timestamp; ties, and datasets without timestamps, use a
    seeded random order: row (u, i) is ranked by a uniform keyed by (seed, stream SPLIT,
    u's source key) at counter i's source key (:mod:`fedem_private.data.keys`), so a
    user's split is a function of the seed and its own rows only; removing another user
    from the data changes no one else's validation or test item (the re-indexed positions
    it used before shift). Users with fewer than ``min_interactions``
    interactions are dropped and counted in ``dropped_users`` (the authors'
    code drops users with fewer than 10: ``--min-user-ratings 10``, docs/design.md 2a).

    ``first_seen`` (docs/design.md 2a, the authors' code for FilmTrust and LastFM-2K):
    a dataset without timestamps is ordered by the position at which each item
    first appears in the file (an item first seen later counts as later), not
    by a seeded random order. A dataset with timestamps is refused.
    """
    from .. import rng  # here, not at import: rng loads torch, and validation must not

    n = data.n_interactions
    tie = rng.uniform(rng.key(seed, rng.Stream.SPLIT, 0, data.user_keys[data.users]),
                      data.item_keys[data.items])
    if first_seen:
        if data.timestamps is not None:
            raise UserError(f"dataset {data.name} has timestamps; --first-seen-order orders "
                            f"datasets without them")
        ts = first_seen_positions(data.items, data.n_items)
    else:
        ts = data.timestamps if data.timestamps is not None else np.zeros(n)
    order = np.lexsort((tie, ts, data.users))
    users, items = data.users[order], data.items[order]
    counts = np.bincount(users, minlength=data.n_users)
    keep_user = counts >= min_interactions
    dropped = int((counts > 0).sum() - keep_user.sum())
    if not keep_user.any():
        raise UserError(f"dataset {data.name}: every user has fewer than {min_interactions} "
                        f"interactions, nothing left to train on")
    _check_items_left(data, counts, keep_user)
    mask = keep_user[users]
    users, items = users[mask], items[mask]
    kept = np.flatnonzero(keep_user)
    new_id = np.full(data.n_users, -1, dtype=np.int64)
    new_id[kept] = np.arange(kept.shape[0])
    users = new_id[users]
    cnt = np.bincount(users, minlength=kept.shape[0])
    ends = np.cumsum(cnt)
    test = items[ends - 1]
    val = items[ends - 2]
    is_train = np.ones(users.shape[0], dtype=bool)
    is_train[ends - 1] = False
    is_train[ends - 2] = False
    tu, ti = users[is_train], items[is_train]
    srt = np.lexsort((ti, tu))
    tu, ti = tu[srt], ti[srt]
    indptr = np.zeros(kept.shape[0] + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(tu, minlength=kept.shape[0]))
    return Split(kept.shape[0], data.n_items, indptr, ti.astype(np.int64), val.astype(np.int64),
                 test.astype(np.int64), kept, dropped, data.user_keys[kept], data.item_keys,
                 duplicates=data.duplicates)


def _check_items_left(data: Interactions, counts: np.ndarray, keep_user: np.ndarray) -> None:
    """Refuse a dataset where a kept user interacted with every item: no item is left to sample
    as that user's negative (a one-user file is the common case)."""
    full = np.flatnonzero(keep_user & (counts >= data.n_items))
    if full.shape[0]:
        who = (f"its only user ({data.user_ids[full[0]]})" if data.n_users == 1 else
               f"{full.shape[0]} of its {data.n_users} users (e.g. {data.user_ids[full[0]]})")
        raise UserError(f"dataset {data.name}: {who} interacted with every one of its "
                        f"{data.n_items} items, so no item is left to sample as a negative; "
                        f"the data needs items each user has not interacted with")


def cold_share(split: Split, held_out: np.ndarray | None = None) -> float:
    """The fraction of users whose held-out item (default: the test item) appears in no
    user's training positives: a model trained on the training interactions meets such an
    item only as a sampled negative, so it cannot learn to rank it high (e.g. 0.2% of
    ML-100K's test items, 13% of LastFM-2K's, 64% under LastFM-2K's first-seen order)."""
    items = split.test_items if held_out is None else held_out
    if items.shape[0] == 0:
        return 0.0
    popularity = np.bincount(split.train_items, minlength=split.n_items)
    return float((popularity[items] == 0).mean())


def first_seen_positions(items: np.ndarray, n_items: int) -> np.ndarray:
    """For each row, the row index at which its item first appears (file order), as float."""
    first = np.full(n_items, items.shape[0], dtype=np.int64)
    np.minimum.at(first, items, np.arange(items.shape[0], dtype=np.int64))
    return first[items].astype(np.float64)


def exclusion_csr(split: Split, protocol: str) -> tuple[np.ndarray, np.ndarray]:
    """Items a user's training negatives must avoid, as sorted CSR (indptr, items).

    ``paper``: every item the user interacted with in any split (train,
    validation, test): held-out items are never trained as negatives, which
    reproduces the published numbers but leaks. ``strict``: the training
    items only, so held-out items can be drawn as negatives, as in reality.
    """
    if protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    if protocol == "strict":
        return split.train_indptr, split.train_items
    return union_csr(split, [split.val_items, split.test_items])


def union_csr(split: Split, extra: list[np.ndarray],
              rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted CSR of each user's training items and its entries of every per-user array in
    ``extra``, without repeats: one row per user, or per user in ``rows`` (sorted ids; the
    evaluated sample, issue 66), each row the same as in the full build."""
    if rows is None:
        rows = np.arange(split.n_users, dtype=np.int64)
        train = split.train_items
        counts = np.asarray(split.train_counts, dtype=np.int64)
    else:
        ip = split.train_indptr
        counts = ip[rows + 1] - ip[rows]
        starts = np.cumsum(counts) - counts  # each row's first entry in the gathered block
        train = split.train_items[np.arange(int(counts.sum()), dtype=np.int64)
                                  + np.repeat(ip[rows] - starts, counts)]
    k = rows.shape[0]
    local = np.arange(k, dtype=np.int64)
    owner = np.concatenate([np.repeat(local, counts)] + [local] * len(extra))
    items = np.concatenate([train] + [np.asarray(e)[rows] for e in extra]).astype(np.int64)
    key = np.unique(owner * split.n_items + items)
    indptr = np.zeros(k + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(key // split.n_items, minlength=k))
    return indptr, (key % split.n_items).astype(np.int64)


def evaluation_exclusion_csr(split: Split,
                             rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Items never ranked as candidates: training items plus the validation item (of every
    user, or of the users in ``rows``: :func:`union_csr`).

    The validation interaction precedes the test one in time, so at test time
    it is already consumed, like the training items. Used by both protocols'
    full ranking.
    """
    return union_csr(split, [split.val_items], rows)


def set_aside(split: Split, min_interactions: int) -> dict[str, Any]:
    """What the loader and the split set aside (issue 67): repeated (user, item) rows
    merged (the latest kept) and users dropped for having fewer than ``min_interactions``
    interactions, with a one-line warning when either happened."""
    merged, dropped = int(split.duplicates), int(split.dropped_users)
    said = []
    if merged:
        said.append(f"{merged:,} repeated (user, item) rows merged (the latest kept)")
    if dropped:
        said.append(f"{dropped:,} users with fewer than {min_interactions} interactions "
                    f"dropped (--min-user-ratings)")
    return {"duplicates_merged": merged, "users_dropped": dropped,
            "warning": "; ".join(said) + f"; {split.n_users:,} users kept" if said else None}
