"""Backbones: client-side score models, vectorised over clients.

Each one's per-client reference is in :mod:`fedem_private.reference.models`.

:func:`build` is the registry the round loop asks for a backbone by name, so
the loop never names one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedem_private.models.base import Backbone

# the registry: a backbone's name -> "module:class"; a new backbone adds its module and one
# line here. Its capabilities are class variables of its class (Backbone), read through
# backbone_class / backbones_where, never listed by name elsewhere.
REGISTRY: dict[str, str] = {
    "mf": "fedem_private.models.mf:MFBackbone",
    "ncf": "fedem_private.models.ncf:NCFBackbone",
    "pfedrec": "fedem_private.models.pfedrec:PFedRecBackbone",
    "gpfedrec": "fedem_private.models.gpfedrec:GPFedRecBackbone",
    "fedrap": "fedem_private.models.fedrap:FedRAPBackbone",
}
BACKBONES = tuple(REGISTRY)


def register(name: str, target: str) -> None:
    """Make the backbone class ``target`` (``"module:Class"``) known as ``name``: a test's
    or a plugin's one line (:mod:`fedem_private.plugins`); ValueError if ``name`` is taken."""
    from fedem_private.lazy import add

    add(REGISTRY, name, target, "backbone")


def backbone_class(name: str) -> type[Backbone]:
    """The class registered as ``name`` (imported on first use)."""
    from fedem_private.lazy import resolve

    return resolve(REGISTRY, name, "backbone")


def backbones_where(capability: str, value: object = True) -> tuple[str, ...]:
    """The registered backbones whose class variable ``capability`` is ``value`` (or, for a
    tuple-valued one such as ``optimizers``, contains it), in registry order."""
    out = []
    for name in REGISTRY:
        have = getattr(backbone_class(name), capability)
        if have == value or (isinstance(have, tuple) and value in have):
            out.append(name)
    return tuple(out)


def build(name: str, n_items: int, dim: int, seed: int, init_std: float,
          config: Any = None) -> Backbone:
    """The backbone called ``name`` for a catalogue of ``n_items`` items.

    It builds from its own options (``Backbone.Options``, docs/design.md section 15), read
    from ``config`` (the run's ``[federation]`` section; None: the options' defaults).
    """
    cls = backbone_class(name)
    options = cls.Options() if config is None else cls.Options.from_config(config)
    return cls.from_options(n_items, dim, seed, init_std, options)
