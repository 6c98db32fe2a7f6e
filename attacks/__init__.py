"""Inference attacks of an honest-but-curious server, and their scoring (docs/design.md, section 6).

Every attack is listed once, in :mod:`attacks.registry`, with its options and
capabilities. Item-level attacks take one :class:`Observation` and the
:class:`PublicKnowledge` and return a (clients, items) score array; see
:mod:`attacks.base`; ``ATTACKS`` is the read-only view name -> scoring function
of the registered item attacks. Ground truth (:mod:`attacks.ground_truth`) is
read only by the scorer (:mod:`attacks.labels`, :mod:`attacks.scoring`,
:mod:`attacks.audit`).

``"imia"`` is the interaction-level membership inference of Yuan et al.
(WWW 2023, :mod:`attacks.imia`); ``"poplabel"`` the popularity-direction
label inference (:mod:`attacks.poplabel`). ``attribute``
(:mod:`attacks.attribute`) scores clients, not items: it also receives the
server's side knowledge. :mod:`attacks.canary` audits a privacy mechanism with
coin-flipped canaries, and :mod:`attacks.run` is the ``fedem-private attack``
command.

The package is light to import: the attack modules (torch, scikit-learn) load on
first use of a name below, so the registry's names are read without them. ``imia``,
``projection`` and ``support`` name submodules; their scoring functions are
``attacks.imia.imia`` and so on (a lazy name equal to a submodule's would turn into
the module once anything imported it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from . import registry

_LAZY = {
    "ItemAttack": "attacks.base", "changed_rows": "attacks.support",
    **{n: "attacks.observations" for n in ("Observation", "PublicKnowledge", "load_observations",
                                           "load_public", "save_observation", "save_public")},
}

_SUBMODULES = ("imia", "projection", "support")


def _item_attacks() -> MappingProxyType:
    return MappingProxyType({n: registry.attack_class(n).function
                             for n in registry.names_where(kind="item")})


def __getattr__(name: str) -> Any:
    if name == "ATTACKS":
        return _item_attacks()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"attacks.{name}")
    raise AttributeError(f"module 'attacks' has no attribute {name!r}")


def run_attack(name: str, observations: Sequence[Any], public: Any) -> list[Any]:
    """Run the registered item attack ``name`` on each observation (one (k, m) array per
    round), with its default options."""
    if name not in registry.names_where(kind="item"):
        raise ValueError(f"unknown attack {name!r}; known: "
                         f"{', '.join(sorted(registry.names_where(kind='item')))}")
    cls = registry.attack_class(name)
    return [cls.scores(obs, public) for obs in observations]


__all__ = [
    "ATTACKS", "ItemAttack", "Observation", "PublicKnowledge", "changed_rows", "imia",
    "load_observations", "load_public", "projection", "registry", "run_attack",
    "save_observation", "save_public", "support",
]
