"""``ldp-dpsgd``: interaction-level local DP by DP-SGD (docs/design.md section 5).

Each local step Poisson-samples the client's positives at rate q_e, clips each
positive's gradient to L2 norm C, adds N(0, sigma^2 C^2) to every entry of the sum
and steps; the upload is post-processing. Neighbouring relation: add/remove one
training interaction (a positive) of one client. Trust model: local, the server
sees every upload and who took part. Sensitivity of a step's sum: L2 C.
Amplification: the Poisson sample of the client's own positives.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fedem_private.errors import UserError
from fedem_private.privacy.mech.base import (
    ADD_REMOVE_INTERACTION,
    DPSGD_OPTIONS,
    SAMPLED_BUDGET,
    SHARED_OPTIONS,
    Mechanism,
)
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.models.base import Backbone, ClientParams
    from fedem_private.privacy.accounting import RoundMechanism
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.dpsgd import DpsgdStats
    from fedem_private.privacy.mechanisms import RoundPrivacyStats
    from fedem_private.privacy.params import MechanismParams


@register
class LdpDpsgd(Mechanism):
    """Local DP-SGD: noise inside every local step; the trained table is uploaded as is."""
    audit_canaries = 1_000_000
    audit_at_delta = True

    name = "ldp-dpsgd"
    description = (
        "interaction-level local DP (add/remove one positive): local DP-SGD, Poisson sample of "
        "positives at rate q_e per step, each positive's gradient L2-clipped to C, N(0, "
        "sigma^2 C^2) on every entry of every step's sum, data-independent negatives; "
        "(eps, delta) per client over all its steps by accounting"
    )
    neighbouring = ("interaction-level: add/remove one training interaction (a positive) "
                    "of one client")
    trust_model = ("local: each client trains with DP-SGD (per-positive clipping, Gaussian "
                   "noise on every entry of every step's gradient); the server is not "
                   "trusted and sees every upload")
    amplification = ("Poisson sampling of the client's own positives at each local step "
                     "(the server never sees which); none over clients: the server sees "
                     "who took part")
    relation = ADD_REMOVE_INTERACTION
    floor = "interaction-local"
    cli_clause = (" (interaction-level local DP: one positive added or removed; amplified "
                  "only by sampling a client's own positives)")
    in_training = True
    claims_guarantee = True
    takes_budget = True
    noise_kind = "gaussian"
    norm = "l2"
    options = SHARED_OPTIONS + SAMPLED_BUDGET + ("clip",) + DPSGD_OPTIONS

    @classmethod
    def validate(cls, cfg: PrivacyConfig) -> None:
        """The DP-SGD settings' ranges (types are checked by PrivacyConfig) and a budget of
        the subsampled Gaussian: a total epsilon or a noise multiplier, delta > 0."""
        rate, lr = float(cfg.dpsgd_rate), float(cfg.dpsgd_lr)
        if not 0 < rate <= 1:
            raise UserError(f"--dpsgd-rate (privacy.dpsgd_rate) must be in (0, 1], got {rate}")
        if cfg.dpsgd_steps < 1:
            raise UserError(f"--dpsgd-steps (privacy.dpsgd_steps) must be >= 1, got "
                            f"{cfg.dpsgd_steps}")
        if cfg.dpsgd_adapter_steps < 0:
            raise UserError(f"--dpsgd-adapter-steps (privacy.dpsgd_adapter_steps) must be >= 0, "
                            f"got {cfg.dpsgd_adapter_steps}")
        if cfg.dpsgd_negatives < 0:
            raise UserError(f"--dpsgd-negatives (privacy.dpsgd_negatives) must be >= 0, got "
                            f"{cfg.dpsgd_negatives}")
        if not 0 < lr < math.inf:
            raise UserError(f"--dpsgd-lr (privacy.dpsgd_lr) must be finite and > 0, got {lr}")
        cfg.validate_sampled_gaussian_budget("a total budget over all local steps")

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """sigma given or calibrated for rounds x steps subsampled Gaussian steps
        (:func:`~fedem_private.privacy.params._dpsgd_params`)."""
        from fedem_private.privacy.params import _dpsgd_params

        return _dpsgd_params(cfg, rounds)

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """The DP-SGD-trained table as is (post-processing;
        :func:`~fedem_private.privacy.mechanisms.release_dpsgd`)."""
        from fedem_private.privacy.mechanisms import release_dpsgd

        return release_dpsgd(params, sent, local, seed=seed, round_=round_, clients=clients,
                             touched=touched)

    @classmethod
    def train_chunk(cls, params: MechanismParams, backbone: Backbone, start: ClientParams,
                    clients: np.ndarray, pos_indptr: np.ndarray, pos_items: np.ndarray,
                    num_negatives: int, seed: int, round_: int
                    ) -> tuple[ClientParams, DpsgdStats]:
        """A chunk's local DP-SGD in round ``round_``
        (:func:`~fedem_private.privacy.dpsgd.train_chunk`)."""
        from fedem_private.privacy.dpsgd import DpsgdSettings, train_chunk

        settings = DpsgdSettings.of(params, num_negatives)
        return train_chunk(backbone, start, clients, pos_indptr, pos_items, settings, seed,
                           round_)

    @classmethod
    def train_adapter(cls, params: MechanismParams, backbone: Backbone,
                      private: dict[str, torch.Tensor], weights: tuple[torch.Tensor, ...],
                      biases: tuple[torch.Tensor, ...], q_local: torch.Tensor,
                      q_global: torch.Tensor, clients: np.ndarray, pos_indptr: np.ndarray,
                      pos_items: np.ndarray, num_negatives: int, seed: int, round_: int
                      ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], DpsgdStats]:
        """EM's adapters trained by DP-SGD, ``dpsgd_adapter_steps`` steps
        (:func:`~fedem_private.privacy.dpsgd.train_adapter_chunk`)."""
        from fedem_private.privacy.dpsgd import DpsgdSettings, train_adapter_chunk

        assert params.dpsgd_adapter_steps
        settings = DpsgdSettings.of(params, num_negatives)
        return train_adapter_chunk(backbone, private, weights, biases, q_local, q_global,
                                   clients, pos_indptr, pos_items, settings,
                                   params.dpsgd_adapter_steps, seed, round_)

    @classmethod
    def guaranteed_event(cls, params: MechanismParams) -> RoundMechanism:
        """One round: steps + adapter steps of the subsampled Gaussian at rate q_e."""
        from fedem_private.privacy.accounting import RoundMechanism

        assert params.noise_multiplier is not None
        assert params.dpsgd_rate is not None and params.dpsgd_steps is not None
        return RoundMechanism("sampled-gaussian", params.noise_multiplier,
                              sample_rate=params.dpsgd_rate,
                              steps=params.dpsgd_steps + (params.dpsgd_adapter_steps or 0))
