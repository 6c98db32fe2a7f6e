"""The adapter's held-out objective: ``--adapter-objective holdout`` (issue 17, item 5).

Equation 11 trains the merge adapter on the client's data D_u. As published
(objective ``train``) D_u is the round's training samples, the very samples
the client's local table Q_l was fitted to in earlier rounds: on them Q_l
already scores well, so the loss rewards keeping Q_l and rho (the weight on
Q_g, equation 10) drifts toward 0. Under ``holdout`` each round takes one
fold of the client's training positives out of local training and trains
the adapter on that fold alone, so rho is chosen by how well the merged
table generalises to positives the round's local training does not see.

Fold rule. Client u has n_u training positives, at positions 0 .. n_u - 1
of its training list, and F = ``adapter_folds`` (>= 2):

- it has F_u = min(F, n_u) folds when n_u >= 2, and none when n_u <= 1;
- a fixed permutation pi_u of 0 .. n_u - 1, keyed by (seed, client) alone
  (stream HOLDOUT_FOLDS, round 0), puts position pi_u[r] in fold r mod F_u:
  the folds are disjoint, cover the positives, are never empty and differ
  in size by at most one;
- round t withholds fold t mod F_u (with n_u >= F this is fold t mod F).

Edge cases: a client with 2 <= n_u < F has one positive per fold, and at
least n_u - 1 >= 1 positives always stay in local training (a client with
n_u >= F keeps n_u - ceil(n_u / F) >= 1). A client with n_u <= 1 withholds
nothing: its adapter gets no batch, so its weights (and Adam step count)
are left as they are, and it still merges with that unchanged adapter.

Negatives. :func:`~fedem_private.models.base.draw_samples` draws
``num_negatives`` N fresh negatives per positive, negative j of client u in
round t a pure function of (seed, t, u, j). Negatives iN .. iN + N - 1
belong to positive i and go wherever it goes, so the round's samples are
only split, never re-drawn: local training gets the kept positives and
their negatives, the adapter the withheld ones and theirs, and the two
parts together are exactly the ``train`` objective's samples.

Order. Adapter epoch e visits the fold's samples in order e of
:func:`~fedem_private.models.base.epoch_orders` in stream ADAPTER_SHUFFLE,
keyed by (seed, round, client); local training keeps stream SHUFFLE over
its own (smaller) sample list.
"""

from __future__ import annotations

import numpy as np
import torch

from fedem_private import rng
from fedem_private.client.merges import ADAPTER_OBJECTIVES
from fedem_private.models.base import ClientSamples

OBJECTIVES = ADAPTER_OBJECTIVES


def client_folds(n_pos: int, folds: int) -> int:
    """F_u: the number of folds of a client with ``n_pos`` positives (0 when n_pos <= 1),
    i.e. how its equation-11 data rotates under ``holdout``: min(F, n_pos) when n_pos >= 2."""
    return min(folds, n_pos) if n_pos >= 2 else 0


def fold_ids(seed: int, client: int, n_pos: int, folds: int) -> np.ndarray:
    """Fold of each positive position 0 .. n_pos - 1 of a client: (n_pos,) int64.

    Position pi_u[r] is in fold r mod F_u, pi_u a permutation keyed by (seed,
    client) alone (so the folds never change between rounds); -1 where the
    client has no folds (n_pos <= 1). The data of equation 11's D_u under the
    ``holdout`` objective; see the module docstring.
    """
    f_u = client_folds(n_pos, folds)
    if f_u == 0:
        return np.full(n_pos, -1, dtype=np.int64)
    perm = torch.randperm(n_pos, generator=rng.generator(seed, rng.Stream.HOLDOUT_FOLDS, 0,
                                                         client)).numpy()
    out = np.empty(n_pos, dtype=np.int64)
    out[perm] = np.arange(n_pos, dtype=np.int64) % f_u
    return out


def withheld(seed: int, round_: int, client: int, n_pos: int, folds: int) -> np.ndarray:
    """(n_pos,) bool: the positives round t keeps out of local training (fold t mod F_u).

    They are the positives the adapter trains on in round t (equation 11 on
    the held-out fold); all False for a client with n_pos <= 1.
    """
    f_u = client_folds(n_pos, folds)
    if f_u == 0:
        return np.zeros(n_pos, dtype=bool)
    return fold_ids(seed, client, n_pos, folds) == round_ % f_u


def withheld_counts(round_: int, n_pos: np.ndarray, folds: int) -> np.ndarray:
    """How many positives each client withholds in round t, from the counts alone: (k,).

    Fold r of a client with F_u folds holds ceil((n_u - r) / F_u) positions,
    so this equals ``withheld(...).sum()`` without drawing the permutations
    (the loop sorts clients by their round's workload with it).
    """
    n = np.asarray(n_pos, dtype=np.int64)
    f_u = np.where(n >= 2, np.minimum(folds, n), 0)
    safe = np.maximum(f_u, 1)
    r = round_ % safe
    return np.where(f_u > 0, (n - r + safe - 1) // safe, 0)


def split_samples(samples: ClientSamples, clients: np.ndarray, seed: int, round_: int,
                  folds: int, num_negatives: int) -> tuple[ClientSamples, ClientSamples]:
    """A chunk's round samples as (local training, adapter): the ``holdout`` split.

    ``samples`` are :func:`~fedem_private.models.base.draw_samples`'s for
    ``clients`` (per client: n positives, then n * num_negatives negatives).
    The first part keeps, per client, the positives outside fold t mod F_u
    and their negatives, in their original order (stream SHUFFLE); the second
    holds the withheld fold and its negatives, the data of equation 11, with
    stream ADAPTER_SHUFFLE for its orders.
    """
    clients = np.asarray(clients, dtype=np.int64)
    k = clients.shape[0]
    lengths = np.diff(samples.indptr)
    nneg = np.diff(samples.negatives_indptr)
    npos = lengths - nneg
    if np.any(nneg != npos * num_negatives):
        raise ValueError(f"samples do not hold {num_negatives} negatives per positive")
    held_pos = [withheld(seed, round_, int(c), int(n), folds)
                for c, n in zip(clients.tolist(), npos.tolist(), strict=True)]
    held_neg = [np.repeat(h, num_negatives) for h in held_pos]
    empty = np.zeros(0, dtype=bool)
    held = np.concatenate([x for h, hn in zip(held_pos, held_neg, strict=True) for x in (h, hn)]
                          or [empty])
    held_negs = np.concatenate(held_neg or [empty])
    owner = np.repeat(np.arange(k), lengths)
    neg_owner = np.repeat(np.arange(k), nneg)

    def part(take: np.ndarray, take_neg: np.ndarray, stream: int) -> ClientSamples:
        indptr = np.zeros(k + 1, dtype=np.int64)
        indptr[1:] = np.cumsum(np.bincount(owner[take], minlength=k))
        neg_indptr = np.zeros(k + 1, dtype=np.int64)
        neg_indptr[1:] = np.cumsum(np.bincount(neg_owner[take_neg], minlength=k))
        return ClientSamples(indptr, samples.items[take], samples.labels[take], neg_indptr,
                             samples.negatives[take_neg], stream=stream)

    return (part(~held, ~held_negs, rng.Stream.SHUFFLE),
            part(held, held_negs, rng.Stream.ADAPTER_SHUFFLE))
