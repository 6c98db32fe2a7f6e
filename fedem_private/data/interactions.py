"""Implicit-feedback interaction logs with re-indexed ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError


@dataclass(frozen=True)
class Interactions:
    """Every observed (user, item) pair is an implicit positive (label 1).

    Users and items are re-indexed to 0..n_users-1 and 0..n_items-1;
    ``user_ids[u]`` / ``item_ids[i]`` give the original ids back.
    ``timestamps`` is None for datasets without time. ``demographics`` maps
    an attribute name (e.g. "gender": 1 female, 0 male, -1 unknown) to an
    array indexed by the re-indexed user.
    """

    name: str
    users: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray | None
    n_users: int
    n_items: int
    user_ids: np.ndarray
    item_ids: np.ndarray
    demographics: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_interactions(self) -> int:
        return int(self.users.shape[0])


def from_raw(name: str, raw_users: np.ndarray, raw_items: np.ndarray,
             timestamps: np.ndarray | None = None,
             demographics: dict[str, dict] | None = None) -> Interactions:
    """Re-index raw ids and drop repeated (user, item) pairs, keeping the latest.

    ``demographics`` maps an attribute to {raw user id: value}.
    """
    raw_users = np.asarray(raw_users)
    raw_items = np.asarray(raw_items)
    if raw_users.shape[0] == 0:
        raise UserError(f"dataset {name}: no interactions found")
    user_ids, users = np.unique(raw_users, return_inverse=True)
    item_ids, items = np.unique(raw_items, return_inverse=True)
    users = users.astype(np.int64).ravel()
    items = items.astype(np.int64).ravel()
    ts = None if timestamps is None else np.asarray(timestamps, dtype=np.float64)
    # keep the last occurrence of each (user, item): order by time (stable), dedupe from the end
    order = np.arange(users.shape[0]) if ts is None else np.argsort(ts, kind="stable")
    pair = users[order] * len(item_ids) + items[order]
    _, last_rev = np.unique(pair[::-1], return_index=True)
    keep = np.sort(order[len(pair) - 1 - last_rev])
    users, items = users[keep], items[keep]
    ts = None if ts is None else ts[keep]
    demo: dict[str, np.ndarray] = {}
    for attr, mapping in (demographics or {}).items():
        demo[attr] = np.array([mapping.get(u, -1) for u in user_ids.tolist()], dtype=np.int64)
    return Interactions(name, users, items, ts, len(user_ids), len(item_ids), user_ids, item_ids,
                        demo)
