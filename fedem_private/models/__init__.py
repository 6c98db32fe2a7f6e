"""Backbones: client-side score models, vectorised over clients.

Each one's per-client reference is in :mod:`fedem_private.reference.models`.

:func:`build` is the registry the round loop asks for a backbone by name, so
the loop never names one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedem_private.models.base import Backbone

BACKBONES = ("mf", "ncf", "pfedrec", "gpfedrec", "fedrap")


def build(name: str, n_items: int, dim: int, seed: int, init_std: float,
          options: dict[str, float] | None = None) -> Backbone:
    """The backbone called ``name`` for a catalogue of ``n_items`` items.

    ``options`` holds every backbone's hyper-parameters (``gpfedrec_reg``,
    ``fedrap_lambda``, ``fedrap_mu``); each backbone takes its own.
    """
    opts = options or {}
    if name == "mf":
        from fedem_private.models.mf import MFBackbone
        return MFBackbone(n_items, dim, seed, init_std)
    if name == "ncf":
        from fedem_private.models.ncf import NCFBackbone
        return NCFBackbone(n_items, dim, seed, init_std)
    if name == "pfedrec":
        from fedem_private.models.pfedrec import PFedRecBackbone
        return PFedRecBackbone(n_items, dim, seed, init_std)
    if name == "gpfedrec":
        from fedem_private.models.gpfedrec import GPFedRecBackbone
        return GPFedRecBackbone(n_items, dim, seed, init_std, reg=opts.get("gpfedrec_reg", 1.0))
    if name == "fedrap":
        from fedem_private.models.fedrap import FedRAPBackbone
        return FedRAPBackbone(n_items, dim, seed, init_std, lam=opts.get("fedrap_lambda", 0.1),
                              mu=opts.get("fedrap_mu", 0.1))
    raise ValueError(f"unknown backbone {name!r}")
