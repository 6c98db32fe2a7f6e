"""``rownorm``: an item-membership attack that reads only the released uploads.

An honest-but-curious server scores item i for client u by the L_p norm of row i of the
client's released delta, upload_u - sent_u (both of which it saw): the rows a client
trained on move, the others move only by the mechanism's noise. Higher score: more
likely a training item. It needs no shadow model and no side knowledge; under a local
DP mechanism its advantage is bounded by that mechanism's guarantee, like any attack
on the releases (post-processing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attacks.base import blank_nonparticipants
from attacks.registry import Attack, Capabilities


@dataclass(frozen=True)
class RowNormOptions:
    """``p``: the norm of each row (1 or 2; default 2)."""

    p: int = 2


def row_norm_scores(obs: Any, public: Any, *, p: int = 2) -> np.ndarray:
    """(k, m) scores: ||upload_u[i] - sent_u[i]||_p; NaN for clients that did not take part."""
    del public
    if p not in (1, 2):
        raise ValueError(f"rownorm: p must be 1 or 2, got {p}")
    delta = obs.delta()
    scores = np.linalg.norm(delta, ord=p, axis=2) if delta.ndim == 3 else np.abs(delta)
    return blank_nonparticipants(np.asarray(scores, dtype=np.float64), obs)


class RowNormAttack(Attack):
    """The ``rownorm`` item attack (module docstring); not run unless named."""

    options: ClassVar[type] = RowNormOptions
    capabilities: ClassVar[Capabilities] = Capabilities(kind="item", observes=("uploads",),
                                                        default=False)
    function = staticmethod(row_norm_scores)


def register() -> None:
    """The entry point (pyproject.toml): register the attack as ``rownorm``."""
    from attacks.registry import register as add

    add("rownorm", RowNormAttack)
