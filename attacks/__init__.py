"""Inference attacks of an honest-but-curious server, and their scoring (docs/design.md, section 6).

Item-level attacks (``ATTACKS``) take one :class:`Observation` and the
:class:`PublicKnowledge` and return a (clients, items) score array; see
:mod:`attacks.base`. Ground truth (:mod:`attacks.ground_truth`) is read only
by the scorer (:mod:`attacks.labels`, :mod:`attacks.scoring`,
:mod:`attacks.audit`).

``"imia"`` is the interaction-level membership inference of Yuan et al.
(WWW 2023, :mod:`attacks.imia`). ``attribute`` (:mod:`attacks.attribute`)
scores clients, not items: it also receives the server's side knowledge (the
attribute of a known fraction of clients, :class:`attacks.attribute.KnownAttributes`).
:mod:`attacks.canary` audits a privacy mechanism with coin-flipped canaries,
and :mod:`attacks.run` is the ``fedem-private attack`` command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from .base import ItemAttack
from .imia import imia
from .observations import (
    Observation,
    PublicKnowledge,
    load_observations,
    load_public,
    save_observation,
    save_public,
)
from .projection import projection
from .support import changed_rows, support

ATTACKS: Mapping[str, ItemAttack] = MappingProxyType({
    "support": support,
    "projection": projection,
    "imia": imia,
})


def run_attack(name: str, observations: Sequence[Observation], public: PublicKnowledge
               ) -> list[np.ndarray]:
    """Run the registered attack ``name`` on each observation (one (k, m) array per round)."""
    try:
        attack = ATTACKS[name]
    except KeyError:
        raise ValueError(f"unknown attack {name!r}; known: {', '.join(sorted(ATTACKS))}") from None
    return [attack(obs, public) for obs in observations]


__all__ = [
    "ATTACKS", "ItemAttack", "Observation", "PublicKnowledge", "changed_rows", "imia",
    "load_observations",
    "load_public", "projection", "run_attack", "save_observation", "save_public", "support",
]
