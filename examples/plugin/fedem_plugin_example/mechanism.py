"""``ldp-gaussian-boxed``: local Gaussian DP on the clipped delta, then a public box.

Release of client u in a round, with Q_c the public table the server sent it, C the clip
and z the noise multiplier (both public)::

    D    = clip_2(L_u - Q_c, C)                  the delta, L2-clipped to C
    R    = D + N(0, (2Cz)^2 I)                   the Gaussian mechanism
    out  = Q_c + clamp(R, -C, C)                 every entry boxed into [-C, C]

Neighbouring relation: user-level, replace-one (u's whole dataset replaced by any other).
Trust model: local; each client clips, noises and boxes its own upload; the server is not
trusted and sees who took part (no amplification claimed).
Sensitivity: the L2 sensitivity of D is 2C (both clipped deltas lie in the L2 ball of
radius C), so one round is the Gaussian mechanism with mu = 1/z (Dong, Roth and Su,
"Gaussian differential privacy", 2022), and the run's (eps, delta) comes from the
project's accountant over the rounds the client took part in, exactly as for
``ldp-gaussian``. The box is post-processing of R with the public C: it changes no
guarantee (Dwork and Roth 2014, Proposition 2.1).

Why the box: every entry of D already lies in [-C, C] (|D_ij| <= ||D||_2 <= C), so the
box is the projection onto a convex set that contains D; each released entry is therefore
never farther from D than the unboxed one, and much nearer when sigma >> C. The price is
bias: E[clamp(R)] != D, growing with sigma / C. The box does not make the mechanism
"more private" than ldp-gaussian at the same z; it only spends the same budget on a
lower-error, biased release.

The budget is given as ``privacy.noise_multiplier`` z only: this example calibrates
nothing from an epsilon (``ldp-gaussian`` does).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import torch

from fedem_private.errors import UserError
from fedem_private.privacy.accounting import gaussian_epsilon
from fedem_private.privacy.mech.base import REPLACE_ONE, SHARED_OPTIONS, Mechanism
from fedem_private.privacy.mechanisms import RoundPrivacyStats, clipped_delta, draw_noise
from fedem_private.privacy.params import MechanismParams

if TYPE_CHECKING:
    import numpy as np

    from fedem_private.privacy.config import PrivacyConfig


class LdpGaussianBoxed(Mechanism):
    """Q_c + clamp(clip_2(L - Q_c, C) + N(0, (2Cz)^2), -C, C) on every entry."""

    name: ClassVar[str] = "ldp-gaussian-boxed"
    description: ClassVar[str] = (
        "example plugin, local DP (replace-one): L2-clip the delta to C, Gaussian noise "
        "sigma = 2Cz, each entry clamped to [-C, C]; (eps, delta)-DP by accounting")
    neighbouring: ClassVar[str] = (
        "user-level, replace-one: the client's whole dataset replaced by any other")
    trust_model: ClassVar[str] = (
        "local: each client clips (L2), noises and clamps its whole upload; the server is "
        "not trusted")
    amplification: ClassVar[str] = "none: the server sees who took part"
    relation: ClassVar[str] = REPLACE_ONE
    cli_clause: ClassVar[str] = " (user-level local DP, replace-one; no amplification claimed)"
    claims_guarantee: ClassVar[bool] = True
    takes_budget: ClassVar[bool] = True
    ldp_upload: ClassVar[bool] = True
    noise_kind: ClassVar[str | None] = "gaussian"
    norm: ClassVar[str | None] = "l2"
    floor: ClassVar[str | None] = "local"
    options: ClassVar[tuple[str, ...]] = SHARED_OPTIONS + ("noise_multiplier", "clip")

    @classmethod
    def validate(cls, cfg: PrivacyConfig) -> None:
        """Only a noise multiplier is taken as the budget (no calibration from epsilon)."""
        if cfg.epsilon is not None or cfg.epsilon_round is not None:
            raise UserError(f"privacy {cls.name!r} takes its noise as privacy.noise_multiplier "
                            f"(--noise-multiplier z), not an epsilon")

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """sigma = z 2C (L2 sensitivity 2C under replace-one); one round's eps at delta is
        the Gaussian mechanism's with mu = 1/z (inf when z = 0: no guarantee)."""
        z = float(cfg.noise_multiplier)
        sensitivity = 2.0 * float(cfg.clip)
        eps_round = math.inf if z == 0 else gaussian_epsilon(1.0 / z, cfg.delta)
        return MechanismParams(mode=cfg.mode, delta=cfg.delta, norm="l2", clip=float(cfg.clip),
                               sensitivity=sensitivity, noise_kind="gaussian",
                               noise_scale=z * sensitivity, noise_multiplier=z,
                               epsilon_round=eps_round)

    @classmethod
    def claimed_gap(cls, cfg: PrivacyConfig) -> tuple[int, float] | None:
        """With the noise shared, the two worlds' releases differ by at most the clipped
        deltas' difference entry by entry (clamping is 1-Lipschitz): L2 gap <= 2C."""
        return 2, 2.0 * cfg.clip

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """(k, ...) released tables: the module docstring's ``out``, noise keyed by
        (seed, round, client) as the built-in mechanisms'."""
        if sent.shape != local.shape:
            raise ValueError(f"sent {tuple(sent.shape)} and local {tuple(local.shape)} differ")
        delta, clip = clipped_delta(params, sent, local)
        noise = draw_noise(params, delta.shape, seed=seed, round_=round_, clients=clients,
                           device=delta.device)
        if noise is not None:
            delta.add_(noise)
        assert params.clip is not None
        delta.clamp_(-params.clip, params.clip)
        out = (delta + sent.detach().to(torch.float64)).to(torch.float32)
        stats = RoundPrivacyStats(
            mode=params.mode, n_clients=local.shape[0], norm="l2", clip=params.clip,
            fraction_clipped=clip.fraction_clipped, mean_pre_clip_norm=clip.mean_norm,
            noise_kind="gaussian" if noise is not None else None,
            noise_scale=params.noise_scale, noised_fraction=1.0 if noise is not None else 0.0,
            clip_stats=clip)
        return out, stats


def register() -> None:
    """The entry point (pyproject.toml): register the mechanism under its name."""
    from fedem_private.privacy.registry import register as add

    add(LdpGaussianBoxed)
