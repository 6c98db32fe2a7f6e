"""Backbones: client-side score models, vectorised over clients, each with its reference.

:func:`build` is the registry the round loop asks for a backbone by name, so
the loop never names one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedem_private.models.base import Backbone

BACKBONES = ("mf", "ncf", "pfedrec")


def build(name: str, n_items: int, dim: int, seed: int, init_std: float) -> Backbone:
    """The backbone called ``name`` for a catalogue of ``n_items`` items."""
    if name == "mf":
        from fedem_private.models.mf import MFBackbone as cls
    elif name == "ncf":
        from fedem_private.models.ncf import NCFBackbone as cls
    elif name == "pfedrec":
        from fedem_private.models.pfedrec import PFedRecBackbone as cls
    else:
        raise ValueError(f"unknown backbone {name!r}")
    return cls(n_items, dim, seed, init_std)
