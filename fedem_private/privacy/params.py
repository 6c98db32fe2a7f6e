"""Resolve a PrivacyConfig into the per-round parameters of its mechanism.

The engine calls :func:`resolve_params` once per run (with the planned number
of rounds) and logs :meth:`MechanismParams.as_log` with every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedem_private.errors import UserError
from fedem_private.privacy.accounting import RoundMechanism, compose, gaussian_epsilon
from fedem_private.privacy.calibration import (
    dpfedavg_noise_multiplier,
    gaussian_noise_multiplier,
    laplace_epsilon_round,
)
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.mech.base import Mechanism
from fedem_private.privacy.registry import mechanism_for


class LoggedPlan(Protocol):
    """What params needs of a mechanism's own plan (dp-ftrl's ``ftrl.FtrlPlan``): its log
    entry. A protocol, so that params imports no mechanism's module back."""

    def as_log(self) -> dict[str, float | int]: ...


@dataclass(frozen=True)
class MechanismParams:
    """Per-round parameters of one privacy mode.

    - ``clip``: C, the per-client bound on the delta (L1 for ldp-laplace and
      ldp-touched-rows, L2 for ldp-gaussian); None for none and paper.
    - ``sensitivity``: 2C, the replace-one sensitivity of the clipped delta
      in that norm; None where the mode clips no delta.
    - ``noise_scale``: Laplace b, Gaussian sigma, or the paper's lambda; 0.0
      when no noise is added.
    - ``noise_multiplier``: noise_scale / sensitivity (None without sensitivity).
    - ``epsilon_round``: per-round eps GUARANTEED under replace-one local DP
      (pure eps for ldp-laplace; for ldp-gaussian the eps of one round at
      ``delta``); inf when the mode gives no guarantee.
    - ``nominal_epsilon_round``: ldp-touched-rows only: the eps its noise would
      give if the set of touched rows were public. It is NOT a guarantee.
    - ``paper_clip``: Z for mode paper (gradient clip inside local training).
    - ``sample_rate``: cdp-gaussian only: the Poisson rate q of client sampling.

    cdp-gaussian (user-level central DP, add/remove one client's data): the
    sensitivity of the SUM of clipped deltas is C (not 2C: one client's
    clipped delta is present or absent), noise_scale = sigma = z C is added
    once to the sum, and ``epsilon_round`` is ONE round WITHOUT amplification
    (the aggregator's view, which knows who took part).
    """

    mode: str
    delta: float
    norm: str | None
    clip: float | None
    sensitivity: float | None
    noise_kind: str | None
    noise_scale: float
    noise_multiplier: float | None
    epsilon_round: float
    nominal_epsilon_round: float | None = None
    paper_clip: float | None = None
    sample_rate: float | None = None
    # cdp-gaussian with adaptive clipping (see _central_params): the target quantile gamma,
    # the clip's learning rate, the count's noise std sigma_b and the sum's own multiplier
    # z_sum; ``clip`` is then the initial clip C_1 and ``noise_multiplier`` the round's
    # effective z (what the accountant uses)
    clip_quantile: float | None = None
    clip_lr: float | None = None
    count_noise: float | None = None
    sum_noise_multiplier: float | None = None
    # cdp-gaussian with private row selection (see _central_params): rows kept K and the
    # counts' own multiplier z_c (sensitivity 1); ``sum_noise_multiplier`` is the table's z_s
    select_rows: int | None = None
    select_noise_multiplier: float | None = None
    # ldp-dpsgd (see _dpsgd_params): Poisson rate of positives per local step, steps per
    # round, negatives per step, local SGD learning rate; ``clip`` is then C_e
    dpsgd_rate: float | None = None
    dpsgd_steps: int | None = None
    dpsgd_negatives: int | None = None
    dpsgd_lr: float | None = None
    dpsgd_adapter_steps: int | None = None
    # dp-ftrl (privacy/ftrl.py): the tree and cyclic-cohort pattern it is accounted for;
    # ``noise_scale`` is then every node's std sigma, ``noise_multiplier`` the whole
    # release's accounted z = sigma / (C sqrt(r k_max)) and ``sample_rate`` 1/G
    ftrl: LoggedPlan | None = None

    @property
    def adaptive_clip(self) -> bool:
        """cdp-gaussian whose clip follows a quantile of the delta norms (Andrew et al.)."""
        return self.clip_quantile is not None

    @property
    def mechanism(self) -> type[Mechanism]:
        """The mechanism class of ``mode`` (from the registry)."""
        return mechanism_for(self.mode)

    @property
    def central(self) -> bool:
        """True for a mechanism on the aggregate (cdp-*), not on each upload."""
        return self.mechanism.central

    @property
    def dpsgd(self) -> bool:
        """True for ldp-dpsgd: local training is DP-SGD and the upload is post-processing."""
        return self.mechanism.in_training

    @property
    def guarantee(self) -> bool:
        """True only when a DP guarantee holds: ldp-laplace, ldp-gaussian, cdp-gaussian or
        ldp-dpsgd WITH noise (a mechanism that claims one).

        Clip-only runs (epsilon = inf, noise 0) give no finite guarantee.
        """
        return self.mechanism.claims_guarantee and math.isfinite(self.epsilon_round)

    @property
    def description(self) -> str:
        """One-line description of the mode (INSECURE / heuristic stated where it applies),
        as these parameters use it (:meth:`Mechanism.description_for`)."""
        return self.mechanism.description_for(self)

    def round_mechanism(self) -> RoundMechanism | None:
        """The accounting view of one round; None when the mode gives no guarantee."""
        if not self.guarantee:
            return None
        return self.mechanism.guaranteed_event(self)

    def nominal_round_mechanism(self) -> RoundMechanism | None:
        """ldp-touched-rows: the mechanism it would be if the touched rows were public."""
        return self.mechanism.nominal_event(self)

    def as_log(self) -> dict[str, object]:
        """JSON-ready summary (inf written as None)."""
        def num(x: float | None) -> float | None:
            return None if x is None or math.isinf(x) else float(x)

        out: dict[str, object] = {
            "mode": self.mode,
            "description": self.description,
            "delta": self.delta,
            "norm": self.norm,
            "clip": self.clip,
            "sensitivity": self.sensitivity,
            "noise_kind": self.noise_kind,
            "noise_scale": self.noise_scale,
            "noise_multiplier": self.noise_multiplier,
            "epsilon_round": num(self.epsilon_round),
            "nominal_epsilon_round": num(self.nominal_epsilon_round),
            "paper_clip": self.paper_clip,
            "sample_rate": self.sample_rate,
            "clip_quantile": self.clip_quantile,
            "clip_lr": self.clip_lr,
            "count_noise": self.count_noise,
            "sum_noise_multiplier": self.sum_noise_multiplier,
            "select_rows": self.select_rows,
            "select_noise_multiplier": self.select_noise_multiplier,
            "dpsgd_rate": self.dpsgd_rate,
            "dpsgd_steps": self.dpsgd_steps,
            "dpsgd_negatives": self.dpsgd_negatives,
            "dpsgd_lr": self.dpsgd_lr,
            "dpsgd_adapter_steps": self.dpsgd_adapter_steps,
        }
        if self.ftrl is not None:  # dp-ftrl only: the tree it is accounted for
            out["ftrl"] = self.ftrl.as_log()
        return out


def _laplace_epsilon_round(cfg: PrivacyConfig, rounds: int) -> float:
    if cfg.epsilon_round is not None:
        return float(cfg.epsilon_round)
    if cfg.noise_multiplier is not None:
        return math.inf if cfg.noise_multiplier == 0 else 1.0 / cfg.noise_multiplier
    assert cfg.epsilon is not None
    return laplace_epsilon_round(cfg.epsilon, cfg.delta, rounds, cfg.accountant)


def _gaussian_noise_multiplier(cfg: PrivacyConfig, rounds: int) -> float:
    if cfg.noise_multiplier is not None:
        return float(cfg.noise_multiplier)
    if cfg.epsilon_round is not None:
        return gaussian_noise_multiplier(cfg.epsilon_round, cfg.delta, 1, "exact")
    assert cfg.epsilon is not None
    return gaussian_noise_multiplier(cfg.epsilon, cfg.delta, rounds, cfg.accountant)


def resolve_params(cfg: PrivacyConfig, rounds: int,
                   n_clients: int | None = None) -> MechanismParams:
    """Per-round parameters of ``cfg`` for a run of ``rounds`` planned rounds.

    ``n_clients`` sets the default noise of adaptive clipping's count (q n / 20).

    A total ``epsilon`` is calibrated for a client that takes part in all
    ``rounds`` rounds (the worst case), or in ``cfg.max_uploads`` of them where a
    local mechanism's clients cap their uploads (``PrivacyLayer.admit``). Laplace:
    b = 2C / eps_round, L1 sensitivity 2C. Gaussian: sigma = z * 2C, L2 sensitivity 2C.
    The mechanism of ``cfg.mode`` does it
    (:meth:`~fedem_private.privacy.mech.base.Mechanism.calibrate`).
    """
    cfg.validate()
    if cfg.max_uploads:  # a local client uploads at most k times: its budget spans k releases
        rounds = min(int(rounds), int(cfg.max_uploads))
    return cfg.mechanism.calibrate(cfg, rounds, n_clients)


def _none_params(cfg: PrivacyConfig) -> MechanismParams:
    """No mechanism: nothing clipped, no noise, no guarantee."""
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm=None, clip=None, sensitivity=None,
        noise_kind=None, noise_scale=0.0, noise_multiplier=None, epsilon_round=math.inf,
    )


def _paper_params(cfg: PrivacyConfig) -> MechanismParams:
    """The paper's recipe: Laplace(lambda) on the upload, gradient clip Z; no guarantee."""
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm=None, clip=None, sensitivity=None,
        noise_kind="laplace", noise_scale=float(cfg.paper_lambda), noise_multiplier=None,
        epsilon_round=math.inf, paper_clip=float(cfg.paper_clip),
    )


def _ldp_gaussian_params(cfg: PrivacyConfig, rounds: int) -> MechanismParams:
    """ldp-gaussian: L2 clip C, sensitivity 2C (replace-one), sigma = z 2C."""
    sensitivity = 2.0 * float(cfg.clip)
    z = _gaussian_noise_multiplier(cfg, rounds)
    eps_round = math.inf if z == 0 else gaussian_epsilon(1.0 / z, cfg.delta)
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm="l2", clip=float(cfg.clip),
        sensitivity=sensitivity, noise_kind="gaussian", noise_scale=z * sensitivity,
        noise_multiplier=z, epsilon_round=eps_round,
    )


def _ldp_laplace_params(cfg: PrivacyConfig, rounds: int, secure: bool) -> MechanismParams:
    """ldp-laplace (``secure``) or ldp-touched-rows: L1 clip C, sensitivity 2C
    (replace-one), b = 2C / eps_round; without ``secure`` the eps is nominal only."""
    sensitivity = 2.0 * float(cfg.clip)
    eps_round = _laplace_epsilon_round(cfg, rounds)
    z = 0.0 if math.isinf(eps_round) else 1.0 / eps_round
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm="l1", clip=float(cfg.clip),
        sensitivity=sensitivity, noise_kind="laplace", noise_scale=z * sensitivity,
        noise_multiplier=z, epsilon_round=eps_round if secure else math.inf,
        nominal_epsilon_round=None if secure else eps_round,
    )


def _central_params(cfg: PrivacyConfig, rounds: int,
                    n_clients: int | None = None) -> MechanismParams:
    """cdp-gaussian (docs/design.md section 5): sigma = z C on the sum of the clipped deltas.

    z is given, or calibrated so that ``rounds`` rounds of the
    Poisson-subsampled Gaussian at q = ``cfg.sample_rate`` are
    (cfg.epsilon, cfg.delta)-DP for observers of the released models
    (:func:`~fedem_private.privacy.calibration.dpfedavg_noise_multiplier`).

    Adaptive clipping (``cfg.clip_quantile``; Andrew, Thakkar, McMahan and
    Ramaswamy, NeurIPS 2021, Theorem 1): a round releases two Gaussian sums,
    the clipped deltas with noise z_sum C_t and the centred count
    sum_u (b_u - 1/2), b_u = [||Delta_u|| <= C_t], with noise sigma_b. Under
    add/remove their sensitivities are C_t and 1/2, so the pair is the Gaussian
    mechanism with multiplier z where z^-2 = z_sum^-2 + (2 sigma_b)^-2: the
    accounting of z is unchanged and z_sum = (z^-2 - (2 sigma_b)^-2)^-1/2,
    which needs 2 sigma_b > z. C_t depends only on earlier releases.
    """
    clip, q = float(cfg.clip), float(cfg.sample_rate)
    if cfg.noise_multiplier is not None:
        z = float(cfg.noise_multiplier)
    else:
        assert cfg.epsilon is not None
        z = dpfedavg_noise_multiplier(cfg.epsilon, cfg.delta, q, rounds, cfg.accountant)
    eps_round = math.inf if z == 0 else gaussian_epsilon(1.0 / z, cfg.delta)
    extra: dict[str, float | None] = {}
    z_sum = z
    if cfg.clip_quantile is not None:
        sigma_b = 0.0
        if z > 0:
            if cfg.clip_count_noise is None and n_clients is None:
                raise ValueError("the default count noise q n / 20 needs n_clients")
            sigma_b = (float(cfg.clip_count_noise) if cfg.clip_count_noise is not None
                       else q * float(n_clients or 0) / 20.0)
            if not 2.0 * sigma_b > z:
                raise UserError(
                    f"adaptive clipping: the count's noise std {sigma_b:g} must exceed z / 2 = "
                    f"{z / 2:g} (z, the round's total multiplier, is split between the count "
                    f"and the sum); raise --clip-count-noise or the budget")
            z_sum = (z ** -2 - (2.0 * sigma_b) ** -2) ** -0.5
        extra = {"clip_quantile": float(cfg.clip_quantile), "clip_lr": float(cfg.clip_lr),
                 "count_noise": sigma_b, "sum_noise_multiplier": z_sum}
    if cfg.select_rows:
        # the counts (sensitivity 1) and the table (sensitivity C) share the round: with
        # z_c^-2 = f z^-2 and z_s^-2 = (1 - f) z^-2 the pair is the Gaussian mechanism at z
        share = float(cfg.select_share)
        z_sum = z / math.sqrt(1.0 - share) if z > 0 else 0.0
        extra = {"select_rows": int(cfg.select_rows), "sum_noise_multiplier": z_sum,
                 "select_noise_multiplier": z / math.sqrt(share) if z > 0 else 0.0}
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm="l2", clip=clip, sensitivity=clip,
        noise_kind="gaussian", noise_scale=z_sum * clip, noise_multiplier=z,
        epsilon_round=eps_round, sample_rate=q, **extra,
    )


def _dpsgd_params(cfg: PrivacyConfig, rounds: int) -> MechanismParams:
    """ldp-dpsgd (docs/design.md section 5): sigma C_e on every entry of every local step's sum.

    One step under add/remove of one interaction: the sum of the sampled
    positives' clipped gradients moves by at most C_e in L2 (the positive is
    in or out of the Poisson sample), so a step is the subsampled Gaussian
    mechanism of multiplier sigma at rate q_e. sigma is given, or calibrated so
    that ``rounds`` x ``dpsgd_steps`` such steps are (cfg.epsilon,
    cfg.delta)-DP (:func:`~fedem_private.privacy.calibration.dpfedavg_noise_multiplier`,
    the same event). A round also charges ``dpsgd_adapter_steps`` steps of EM's adapter
    (the same mechanism on the same data), every round, also the first, whose merge
    trains no adapter. ``epsilon_round`` is one round's steps.
    """
    q = float(cfg.dpsgd_rate)
    steps = int(cfg.dpsgd_steps) + int(cfg.dpsgd_adapter_steps)
    def mech(z: float) -> RoundMechanism:
        return RoundMechanism("sampled-gaussian", z, sample_rate=q, steps=steps)

    if cfg.noise_multiplier is not None:
        z = float(cfg.noise_multiplier)
    else:
        assert cfg.epsilon is not None
        z = dpfedavg_noise_multiplier(cfg.epsilon, cfg.delta, q, rounds * steps, cfg.accountant)
        # the ledger discretises the PLD per round of S steps, the calibration per step: both
        # are upper bounds, a hair apart; nudge z until the ledger's own figure meets the target
        while z > 0 and compose(mech(z), rounds, cfg.delta).reported > cfg.epsilon:
            z *= 1.0 + 1e-5
    eps_round = math.inf if z == 0 else compose(mech(z), 1, cfg.delta).reported
    clip = float(cfg.clip)
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm="l2", clip=clip, sensitivity=clip,
        noise_kind="gaussian", noise_scale=z * clip, noise_multiplier=z,
        epsilon_round=eps_round, dpsgd_rate=q, dpsgd_steps=int(cfg.dpsgd_steps),
        dpsgd_negatives=int(cfg.dpsgd_negatives), dpsgd_lr=float(cfg.dpsgd_lr),
        dpsgd_adapter_steps=int(cfg.dpsgd_adapter_steps),
    )


def paper_heuristic_epsilon(weights: np.ndarray, lr: float, paper_clip: float,
                            paper_lambda: float) -> np.ndarray:
    """The FedEM paper's HEURISTIC per-round eps_u = S_u / lambda, S_u = 2 p_u eta Z.

    ``weights`` are the clients' aggregation weights p_u = |D_u| / sum_v |D_v|.
    This is the paper's figure, reproduced for comparison; it is NOT a DP
    guarantee: S_u bounds the change of one SGD step with gradients clipped at
    Z, not of E epochs of Adam, and the merge with local state is ignored.
    """
    p = np.asarray(weights, dtype=np.float64)
    return 2.0 * p * float(lr) * float(paper_clip) / float(paper_lambda)
