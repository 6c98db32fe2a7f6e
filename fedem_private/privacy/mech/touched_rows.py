"""``ldp-touched-rows``, INSECURE: ldp-laplace with noise on trained rows only.

Kept to show the leak (docs/design.md section 5). Neighbouring relation it claims:
user-level replace-one; it has none, since the set of rows a client trained on is
released in the clear. Trust model: local. Sensitivity it claims: L1 2C, b = 2C /
eps_round; that eps is nominal (what it would give were the touched rows public).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.privacy.mech.ldp_laplace import LocalUploadMechanism
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.privacy.accounting import RoundMechanism
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.mechanisms import RoundPrivacyStats
    from fedem_private.privacy.params import MechanismParams


@register
class LdpTouchedRows(LocalUploadMechanism):
    """sent + clip_1(local - sent, C) + Lap(b) on the touched rows; no guarantee."""
    audit_canaries = 20_000
    audit_confidence = 0.999

    name = "ldp-touched-rows"
    description = (
        "INSECURE: like ldp-laplace but noise only on touched rows; the set of touched "
        "rows leaks, so there is no DP guarantee at any noise level"
    )
    neighbouring = ("none: INSECURE, the set of rows a client trained on is released in "
                    "the clear; no DP guarantee")
    trust_model = "local: noise only on the rows the client trained"
    amplification = "none"
    cli_warning = " (INSECURE: the touched rows leak at any eps)"
    floor = None  # no guarantee: nothing to beat
    nominal_only = True
    noise_kind = "laplace"
    norm = "l1"

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """ldp-laplace's b, its eps kept as nominal only."""
        from fedem_private.privacy.params import _ldp_laplace_params

        return _ldp_laplace_params(cfg, rounds, secure=False)

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """:func:`~fedem_private.privacy.mechanisms.release_touched_rows`."""
        from fedem_private.privacy.mechanisms import release_touched_rows

        return release_touched_rows(params, sent, local, seed=seed, round_=round_,
                                    clients=clients, touched=touched)

    @classmethod
    def nominal_event(cls, params: MechanismParams) -> RoundMechanism | None:
        """The Laplace mechanism it would be if the touched rows were public."""
        from fedem_private.privacy.accounting import RoundMechanism

        assert params.noise_multiplier is not None
        return RoundMechanism("laplace", params.noise_multiplier)
