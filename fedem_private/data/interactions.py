"""Implicit-feedback interaction logs with re-indexed ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import UserError
from .keys import stable_keys


@dataclass(frozen=True)
class Interactions:
    """Every observed (user, item) pair is an implicit positive (label 1).

    Users and items are re-indexed to 0..n_users-1 and 0..n_items-1;
    ``user_ids[u]`` / ``item_ids[i]`` give the original ids back.
    ``timestamps`` is None for datasets without time. ``demographics`` maps
    an attribute name (e.g. "gender": 1 female, 0 male, -1 unknown) to an
    array indexed by the re-indexed user.

    ``public_catalogue``: ``item_ids`` is a public catalogue read before any user's data
    (ML-100K's ``u.item``), so it holds every item whether or not anyone interacted with
    it and removing a user never changes it; False: the catalogue is the set of items the
    interactions name (removing a user can shrink it). ``user_keys`` / ``item_keys`` are
    the source ids' stable 64-bit keys (:func:`~fedem_private.data.keys.stable_keys`),
    which no other user's presence changes.
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
    # repeated (user, item) rows the loader merged (the latest kept), said on the console
    duplicates: int = 0
    public_catalogue: bool = False

    @property
    def n_interactions(self) -> int:
        return int(self.users.shape[0])

    @cached_property
    def user_keys(self) -> np.ndarray:
        """(n_users,) int64: the stable key of each user's source id."""
        return stable_keys(self.user_ids)

    @cached_property
    def item_keys(self) -> np.ndarray:
        """(n_items,) int64: the stable key of each item's source id."""
        return stable_keys(self.item_ids)


def from_raw(name: str, raw_users: np.ndarray, raw_items: np.ndarray,
             timestamps: np.ndarray | None = None,
             demographics: dict[str, dict] | None = None,
             catalogue: np.ndarray | None = None) -> Interactions:
    """Re-index raw ids and drop repeated (user, item) pairs, keeping the latest.

    ``demographics`` maps an attribute to {raw user id: value}. ``catalogue``: the public
    item catalogue (raw ids, read before any user's data); the items are then indexed in
    it, items no one interacted with included, and an interaction naming an item outside
    it is a :class:`UserError`. None: the catalogue is the items the interactions name.
    """
    raw_users = np.asarray(raw_users)
    raw_items = np.asarray(raw_items)
    if raw_users.shape[0] == 0:
        raise UserError(f"dataset {name}: no interactions found")
    user_ids, users = np.unique(raw_users, return_inverse=True)
    if catalogue is None:
        item_ids, items = np.unique(raw_items, return_inverse=True)
    else:
        item_ids, items = _in_catalogue(name, raw_items, catalogue)
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
                        demo, duplicates=int(len(pair) - len(keep)),
                        public_catalogue=catalogue is not None)


def _in_catalogue(name: str, raw_items: np.ndarray, catalogue: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(the catalogue's sorted unique ids, each raw item's index in it); UserError when an
    interaction names an item the catalogue lacks."""
    item_ids = np.unique(np.asarray(catalogue))
    pos = np.searchsorted(item_ids, raw_items)
    found = (pos < item_ids.shape[0]) & (item_ids[np.minimum(pos, item_ids.shape[0] - 1)]
                                         == raw_items)
    if not found.all():
        missing = raw_items[~found]
        raise UserError(f"dataset {name}: the interactions name item {missing[0].item()!r}, "
                        f"which the item catalogue lacks ({np.unique(missing).shape[0]} such "
                        f"items)")
    return item_ids, pos


def without_rows(data: Interactions, drop: np.ndarray) -> Interactions:
    """The dataset the loader would have built from the same source without the rows
    ``drop`` (a boolean mask over ``data``'s rows): the raw ids are re-indexed again (so the
    users after a removed one move down), a derived catalogue loses the items only those
    rows named, a public one is kept whole. The neighbour-world checks
    (:mod:`fedem_private.experiments.neighbours`) build their neighbouring datasets with it.
    """
    keep = ~np.asarray(drop, dtype=bool)
    demo = {attr: dict(zip(data.user_ids.tolist(), values.tolist(), strict=True))
            for attr, values in data.demographics.items()}
    return from_raw(data.name, data.user_ids[data.users[keep]], data.item_ids[data.items[keep]],
                    None if data.timestamps is None else data.timestamps[keep], demo,
                    data.item_ids if data.public_catalogue else None)
