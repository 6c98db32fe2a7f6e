"""``ldp-gaussian``: local DP by L2 clipping and Gaussian noise (docs/design.md section 5).

Neighbouring relation: user-level replace-one. Trust model: local, the server is
not trusted and sees who took part. Sensitivity: L2 2C; sigma = z 2C, one round
being the Gaussian mechanism with mu = 1/z; (eps, delta) by accounting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.privacy.mech.base import CLIP_AUTO_OPTIONS
from fedem_private.privacy.mech.ldp_laplace import LocalUploadMechanism
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.mechanisms import RoundPrivacyStats
    from fedem_private.privacy.params import MechanismParams


@register
class LdpGaussian(LocalUploadMechanism):
    """sent + clip_2(local - sent, C) + N(0, (2Cz)^2) on every entry."""
    audit_canaries = 50_000
    audit_gdp = True
    audit_at_delta = True

    name = "ldp-gaussian"
    description = (
        "local DP (replace-one): L2-clip the delta to C, Gaussian noise sigma = 2Cz "
        "on every entry; (eps, delta)-DP by accounting"
    )
    neighbouring = "user-level, replace-one: the client's whole dataset replaced by any other"
    trust_model = ("local: each client clips (L2) and noises its whole upload; the server "
                   "is not trusted")
    cli_clause = " (user-level local DP, replace-one; no amplification claimed)"
    claims_guarantee = True
    noise_kind = "gaussian"
    norm = "l2"
    options = LocalUploadMechanism.options + CLIP_AUTO_OPTIONS

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """sigma = z 2C, z from the budget (the analytic Gaussian or the accountant)."""
        from fedem_private.privacy.params import _ldp_gaussian_params

        return _ldp_gaussian_params(cfg, rounds)

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """:func:`~fedem_private.privacy.mechanisms.release_ldp_gaussian`."""
        from fedem_private.privacy.mechanisms import release_ldp_gaussian

        return release_ldp_gaussian(params, sent, local, seed=seed, round_=round_,
                                    clients=clients, touched=touched)
