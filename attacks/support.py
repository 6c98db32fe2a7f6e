"""The ``support`` attack: which item rows did the upload change?

A client's local step only moves the rows it trained on: with a fresh Adam
state, a row that never gets a gradient keeps zero moments and a zero update,
so in a noise-free upload the changed rows are exactly the round's positives
and sampled negatives. Mechanisms that add noise only to touched rows (the
INSECURE ``ldp-touched-rows`` mode of docs/design.md, section 5) or upload sparse
updates leak the same set. Under noise on every entry (``ldp-laplace``,
``ldp-gaussian``) each row changes and the norm is mostly noise.

Score of (client u, item i): the L2 norm of row i of upload - sent
(:func:`support`), or 1/0 for "changed by more than ``atol``"
(:func:`changed_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import DEFAULT_CHUNK, blank_nonparticipants, delta_chunks
from .observations import Observation, PublicKnowledge
from .registry import Attack, Capabilities


def support(obs: Observation, public: PublicKnowledge, *, chunk: int = DEFAULT_CHUNK
            ) -> np.ndarray:
    """(k, m) L2 norm of each row of the delta; NaN rows for non-participants."""
    del public  # the attack needs nothing beyond what changed
    scores = np.empty((obs.n_clients, obs.n_items), dtype=np.float64)
    for sl, delta in delta_chunks(obs, chunk):
        scores[sl] = np.linalg.norm(delta, axis=2)
    return blank_nonparticipants(scores, obs)


def changed_rows(obs: Observation, public: PublicKnowledge, *, atol: float = 0.0,
                 chunk: int = DEFAULT_CHUNK) -> np.ndarray:
    """(k, m) 1.0 where the row's L2 change exceeds ``atol``, else 0.0; NaN for non-participants."""
    if atol < 0:
        raise ValueError("atol must be >= 0")
    norms = support(obs, public, chunk=chunk)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(norms), np.nan, (norms > atol).astype(np.float64))


@dataclass(frozen=True)
class SupportOptions:
    """``chunk``: clients per block of deltas (memory only; the scores do not depend on it)."""

    chunk: int = DEFAULT_CHUNK


class SupportAttack(Attack):
    """Registration of :func:`support`: reads the uploads (or the released aggregate)."""

    options = SupportOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        kind="item", observes=("uploads", "released-aggregate"))
    function = staticmethod(support)
