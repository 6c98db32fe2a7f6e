"""``none``: no mechanism (docs/design.md section 5).

Neighbouring relation: none. Trust model: none, the server sees every upload
exactly. Sensitivity: unbounded (nothing is clipped). No guarantee.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.privacy.mech.base import NO_RELATION, Mechanism
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.mechanisms import RoundPrivacyStats
    from fedem_private.privacy.params import MechanismParams


@register
class NoPrivacy(Mechanism):
    """Upload the trained table as is: no clipping, no noise, no guarantee."""

    name = "none"
    description = "no clipping, no noise: no privacy guarantee"
    neighbouring = "none: no mechanism, no guarantee"
    trust_model = "none: the server sees every upload exactly"
    amplification = "none"
    relation = NO_RELATION
    perturbs = False
    no_budget_reason = "adds no noise"

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """No clip, no noise, eps_round = inf."""
        from fedem_private.privacy.params import _none_params

        return _none_params(cfg)

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """The upload is ``local`` itself
        (:func:`~fedem_private.privacy.mechanisms.release_none`)."""
        from fedem_private.privacy.mechanisms import release_none

        return release_none(params, sent, local, seed=seed, round_=round_, clients=clients,
                            touched=touched)
