"""Stable 64-bit keys of source ids (docs/design.md sections 2 and 5).

A dataset's users and items are re-indexed to 0..n-1 (:mod:`.interactions`), and those
positions shift when one user is removed from the data: every user after it moves down
one, and an item only that user had leaves the catalogue. Randomness that must be a
function of one user's own data (its leave-one-out tie-break, DP-MostPop's k-subset, a
client's local noise) is therefore keyed by the *source* ids the loader read, which no
other user's presence changes, mapped to 64-bit integers by :func:`stable_keys`.
"""

from __future__ import annotations

import hashlib

import numpy as np


def stable_keys(ids: np.ndarray) -> np.ndarray:
    """A 64-bit integer key (int64) per source id, the same in every run and process.

    Integer ids (the MovieLens, FilmTrust and LastFM loaders, the synthetic generator) are
    their own key. Any other id (the CSV loader's strings) is keyed by the first 8 bytes of
    the BLAKE2b digest of ``str(id)`` in UTF-8, read as a little-endian signed integer: it
    depends on the id alone, not on the other ids, their order or ``PYTHONHASHSEED``.
    Distinct integer ids get distinct keys; distinct hashed ids collide with probability
    about n^2 / 2^65 over n ids (1e-10 at a million ids).
    """
    arr = np.asarray(ids)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    out = np.empty(arr.shape[0], dtype=np.int64)
    for j, value in enumerate(arr.tolist()):
        digest = hashlib.blake2b(str(value).encode("utf-8"), digest_size=8).digest()
        out[j] = int.from_bytes(digest, "little", signed=True)
    return out
