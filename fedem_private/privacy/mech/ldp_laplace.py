"""``ldp-laplace``: local DP by L1 clipping and Laplace noise (docs/design.md section 5).

Neighbouring relation: user-level replace-one, the client's whole dataset replaced
by any other. Trust model: local, the server is not trusted and sees who took part.
Sensitivity: L1 2C (both clipped deltas lie in the L1 ball of radius C around the
public centre); b = 2C / eps_round makes each round eps_round-DP (pure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.privacy.mech.base import (
    CLIP_AUTO_OPTIONS,
    REPLACE_ONE,
    SHARED_OPTIONS,
    UPLOAD_BUDGET,
    UPLOAD_CAP,
    Mechanism,
)
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.mechanisms import RoundPrivacyStats
    from fedem_private.privacy.params import MechanismParams


class LocalUploadMechanism(Mechanism):
    """Shared by the mechanisms that clip each upload's delta from its public centre and
    noise it (ldp-laplace, ldp-gaussian, ldp-touched-rows): replace-one, gap 2C."""

    relation = REPLACE_ONE
    floor = "local"
    ldp_upload = True
    takes_budget = True
    amplification = "none: the server sees who took part"
    options = SHARED_OPTIONS + UPLOAD_BUDGET + UPLOAD_CAP + ("clip",)

    @classmethod
    def claimed_gap(cls, cfg: PrivacyConfig) -> tuple[int, float] | None:
        """Replace-one: two clipped deltas lie within 2C of each other in the clip's norm."""
        return (1 if cls.norm == "l1" else 2), 2.0 * cfg.clip


@register
class LdpLaplace(LocalUploadMechanism):
    """sent + clip_1(local - sent, C) + Lap(b) on every entry, b = 2C / eps_round."""
    audit_canaries = 200_000
    audit_confidence = 0.999

    name = "ldp-laplace"
    description = (
        "local DP (replace-one): L1-clip the delta to C, Laplace noise b = 2C/eps_round "
        "on every entry; eps_round-DP per round"
    )
    neighbouring = "user-level, replace-one: the client's whole dataset replaced by any other"
    trust_model = ("local: each client clips (L1) and noises its whole upload; the server "
                   "is not trusted")
    cli_clause = " (user-level local DP, replace-one; no amplification claimed)"
    claims_guarantee = True
    noise_kind = "laplace"
    norm = "l1"
    options = LocalUploadMechanism.options + CLIP_AUTO_OPTIONS

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """b = 2C / eps_round, eps_round from the budget (a total by the accountant)."""
        from fedem_private.privacy.params import _ldp_laplace_params

        return _ldp_laplace_params(cfg, rounds, secure=True)

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """:func:`~fedem_private.privacy.mechanisms.release_ldp_laplace`."""
        from fedem_private.privacy.mechanisms import release_ldp_laplace

        return release_ldp_laplace(params, sent, local, seed=seed, round_=round_,
                                   clients=clients, touched=touched)
