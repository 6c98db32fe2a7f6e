"""Uniform sampling of items outside a per-user exclusion set, vectorised over users."""

from __future__ import annotations

import numpy as np
import torch


def row_positions(indptr: np.ndarray) -> np.ndarray:
    """Each entry's position inside its CSR row: 0 .. len - 1 per row, concatenated."""
    return np.arange(indptr[-1], dtype=np.int64) - np.repeat(indptr[:-1], np.diff(indptr))


def _rows_of(users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct users, each entry's index into them): ``np.unique(users,
    return_inverse=True)``, found from the runs of equal entries first, so the usual input,
    each client's draws side by side, costs one pass and a sort of the clients only."""
    if users.shape[0] == 0:
        return users, users
    starts = np.concatenate(([0], np.flatnonzero(users[1:] != users[:-1]) + 1))
    rows, run_inv = np.unique(users[starts], return_inverse=True)
    return rows, np.repeat(run_inv.reshape(-1), np.diff(np.append(starts, users.shape[0])))


def sample_excluding(indptr: np.ndarray, excluded: np.ndarray, n_items: int,
                     users: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """For each (users[j], uniforms[j]) return an item not in that user's exclusion set.

    ``excluded[indptr[u]:indptr[u+1]]`` must be sorted and unique. The j-th
    draw is the r-th allowed item of users[j] in increasing id order, with
    r = floor(uniforms[j] * (number of allowed items)): exact, no rejection.
    With sorted exclusions e_0 < e_1 < ..., the r-th allowed item is r + j*
    where j* = #{k : e_k - k <= r} (the excluded items at or below it).
    """
    users = np.asarray(users, dtype=np.int64)
    # only the rows of the users drawn for are read, so a round's cost follows its
    # cohort, not the population (issue 66): rows[inv] == users
    rows, inv = _rows_of(users)
    counts = indptr[rows + 1] - indptr[rows]
    allowed = n_items - counts[inv]
    if np.any(allowed <= 0):
        raise ValueError("a user has no item left to sample from")
    r = np.minimum((uniforms * allowed).astype(np.int64), allowed - 1)
    sub_indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    sub_indptr[1:] = np.cumsum(counts)
    within = row_positions(sub_indptr)
    sub = excluded[np.repeat(indptr[rows], counts) + within]
    adjusted = sub - within  # non-decreasing inside each user's block
    owner = np.repeat(np.arange(rows.shape[0]), counts)
    stride = n_items + 1
    keys = owner * stride + adjusted
    pos = np.searchsorted(keys, inv * stride + r, side="right")
    return r + (pos - sub_indptr[inv])


def sample_excluding_t(indptr: np.ndarray, excluded: np.ndarray, n_items: int,
                       users: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`sample_excluding` as tensor operations on the device of ``users`` (int64)
    and ``uniforms`` (float64): the same rule, so the same items whatever the device
    (the product r = floor(u * allowed) is one IEEE float64 multiply on either).
    ``indptr`` and ``excluded`` (numpy, as there) are moved beside ``users``."""
    dev = users.device
    ip = torch.as_tensor(indptr, dtype=torch.int64).to(dev)
    ex = torch.as_tensor(excluded, dtype=torch.int64).to(dev)
    counts = ip[1:] - ip[:-1]
    allowed = n_items - counts[users]
    if bool((allowed <= 0).any()):
        raise ValueError("a user has no item left to sample from")
    r = torch.minimum((uniforms * allowed.to(torch.float64)).to(torch.int64), allowed - 1)
    owner = torch.repeat_interleave(torch.arange(counts.shape[0], device=dev), counts)
    within = torch.arange(ex.shape[0], device=dev) - ip[:-1][owner]
    stride = n_items + 1
    keys = owner * stride + (ex - within)  # sorted: by owner, then non-decreasing
    pos = torch.searchsorted(keys, users * stride + r, right=True)
    return r + (pos - ip[users])
