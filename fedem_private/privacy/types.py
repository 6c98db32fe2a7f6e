"""The privacy room's shared records and protocols: what a mechanism's hooks
(:class:`~fedem_private.privacy.mech.base.Mechanism`) receive and return, typed without
importing the modules that hold the mechanism registry's users.

The configuration (:mod:`~fedem_private.privacy.config`) and the per-round parameters
(:mod:`~fedem_private.privacy.params`) ask the registry for their mechanism, and the
mechanisms' base class names them in its hooks; so the base class types them by the
protocols here (:class:`PrivacySettings`, :class:`RoundParams`) and this module imports
nothing of the package at run time (docs/design.md section 1: no import circles). A
mechanism's own module names the concrete classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fedem_private.privacy.bounds import RoundMechanism
    from fedem_private.privacy.clipping import ClipStats


class PrivacySettings(Protocol):
    """A run's privacy settings as a mechanism's hooks receive them: a
    :class:`~fedem_private.privacy.config.PrivacyConfig` (every field of it; this protocol
    names the ones every mechanism shares)."""

    @property
    def mode(self) -> str: ...

    @property
    def delta(self) -> float: ...

    @property
    def clip(self) -> float: ...


class RoundParams(Protocol):
    """A mechanism's per-round parameters as its hooks receive them: a
    :class:`~fedem_private.privacy.params.MechanismParams` (this protocol names what the
    base class reads of it)."""

    @property
    def mode(self) -> str: ...

    @property
    def delta(self) -> float: ...

    @property
    def noise_kind(self) -> str | None: ...

    @property
    def noise_multiplier(self) -> float | None: ...

    def round_mechanism(self) -> RoundMechanism | None: ...


@dataclass(frozen=True, eq=False)
class RoundPrivacyStats:
    """What the privacy layer did in one round (for the per-round log).

    ``clip``: bound C (None if the mode does not clip the delta);
    ``fraction_clipped`` and ``mean_pre_clip_norm`` come from clipping (None
    without it); ``noise_scale``: b, sigma or lambda (0 for none);
    ``noised_fraction``: share of released entries that received noise.
    """

    mode: str
    n_clients: int
    norm: str | None
    clip: float | None
    fraction_clipped: float | None
    mean_pre_clip_norm: float | None
    noise_kind: str | None
    noise_scale: float
    noised_fraction: float
    clip_stats: ClipStats | None = None
    # mean over the round's clients of the mean |clipped delta| on the entries of the
    # rows each client trained (the signal the noise has to leave readable); None
    # where the mode does not clip a delta or no row was trained
    mean_abs_delta_trained: float | None = None

    def as_log(self) -> dict[str, object]:
        """JSON-ready dict (non-finite numbers written as None)."""
        def num(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else float(x)

        return {
            "mode": self.mode,
            "n_clients": self.n_clients,
            "norm": self.norm,
            "clip": self.clip,
            "fraction_clipped": num(self.fraction_clipped),
            "mean_pre_clip_norm": num(self.mean_pre_clip_norm),
            "noise_kind": self.noise_kind,
            "noise_scale": self.noise_scale,
            "noised_fraction": num(self.noised_fraction),
        }
