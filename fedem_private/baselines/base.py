"""A baseline's record and the registry of the baselines' fit functions (docs/design.md 14).

:func:`register` files a fit function ``(cfg, split) -> Fitted`` under its method name
(:mod:`fedem_private.baselines.registered` registers the built-ins);
:mod:`fedem_private.baselines` fits and evaluates them and re-exports these names. This
module imports neither of them (docs/design.md section 1: no import circles).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedem_private.data.split import Split
from fedem_private.simulation.config import RunConfig


@dataclass(frozen=True)
class Fitted:
    """A fitted baseline: its scores and what its summary says about it.

    ``scores``: (m,) item scores shared by every user, or (n, m) per user.
    ``privacy``: the summary's privacy block (mode ``none`` without a guarantee): what
    is released and how, never an un-noised figure of the data.
    ``info``: settings worth keeping (e.g. the architecture, k).
    ``clipping``: the summary's ``clipping`` block, simulator-only diagnostics of the
    clip (dp-mostpop: the users clipped at k, labelled not released), or None.
    """

    scores: np.ndarray
    privacy: dict[str, Any] = field(default_factory=lambda: {"mode": "none",
                                                              "guarantee": False})
    info: dict[str, Any] = field(default_factory=dict)
    model: str = "popularity"
    clipping: dict[str, Any] | None = None


FitFn = Callable[[RunConfig, Split], Fitted]
REGISTRY: dict[str, FitFn] = {}


def register(name: str) -> Callable[[FitFn], FitFn]:
    """Register ``fn`` as the fit function of baseline ``name``."""
    def wrap(fn: FitFn) -> FitFn:
        if name in REGISTRY:
            raise ValueError(f"baseline {name!r} registered twice")
        REGISTRY[name] = fn
        return fn
    return wrap
