"""What every item-level attack looks like, and the helpers they share.

An item-level attack is a pure function ``attack(obs, public, **options) ->
scores`` of one :class:`~attacks.observations.Observation` and the
:class:`~attacks.observations.PublicKnowledge`, returning a float64 array
(k, m): one score per (recorded client, item), higher meaning "more likely a
training positive of that client". Rows of clients that did not take part
are NaN (the server saw nothing from them). Options are keyword-only scalars
with defaults. By construction an attack never sees ground truth: it is not
among its inputs, and no attack module imports :mod:`attacks.ground_truth`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from .observations import Observation, PublicKnowledge

DEFAULT_CHUNK = 64


class ItemAttack(Protocol):
    """Signature of an item-level membership attack (see the module docstring)."""

    def __call__(self, obs: Observation, public: PublicKnowledge) -> np.ndarray: ...


def delta_chunks(obs: Observation, chunk: int = DEFAULT_CHUNK
                 ) -> Iterator[tuple[slice, np.ndarray]]:
    """(client slice, upload - sent in float64) over chunks of ``chunk`` clients.

    Bounds memory to about ``chunk * m * d`` doubles whatever the number of clients.
    """
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    for start in range(0, obs.n_clients, chunk):
        stop = min(start + chunk, obs.n_clients)
        yield slice(start, stop), obs.delta(start, stop)


def blank_nonparticipants(scores: np.ndarray, obs: Observation) -> np.ndarray:
    """Set the rows of clients that did not take part to NaN (in place) and return ``scores``."""
    scores[~obs.participated] = np.nan
    return scores
