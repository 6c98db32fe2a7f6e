"""``ddp-skellam``: user-level distributed DP under simulated secure aggregation.

The distributed Skellam mechanism (Agarwal, Kairouz and Liu, NeurIPS 2021) with the
conditional rounding of Kairouz, Liu and Steinke (ICML 2021); math in
:mod:`fedem_private.privacy.skellam`, the round in :mod:`fedem_private.privacy.ddp`, the
protocol in :mod:`fedem_private.privacy.secagg`. Unlike ``cdp-gaussian``, whose noise is
added "once to the sum" by no party (an idealisation), every client here adds its own
share of integer noise before secure aggregation, and the server sees only masked
integers and their modular sum.

Neighbouring relation: user-level, one client's contribution to one round's sum present
or replaced by zero (the client still takes part and adds its noise share; the fixed-size
cohort is a public draw the aggregator knows). Sensitivity: Delta_2 (L2) and Delta_1 (L1)
of the rotated, scaled, conditionally rounded integer vector. Trust model: clients add
their noise honestly; the server sees only the secure-aggregation transcript and the
modular sum; the guarantee holds while n_t = floor((1 - tolerance) K) honest inputs are in
the sum (rounds with fewer abort). Accounting: RDP of the Skellam mechanism, composed over
each client's released participations, no sampling amplification.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fedem_private.errors import UserError
from fedem_private.privacy.mech.base import (
    DDP_OPTIONS,
    SAMPLED_BUDGET,
    SHARED_OPTIONS,
    ZERO_OUT_CLIENT,
    Mechanism,
    adversary_views,
)
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    from fedem_private.privacy.accounting import RoundMechanism
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.ddp import DdpSecureSum
    from fedem_private.privacy.layer import PrivacyLayer
    from fedem_private.privacy.params import MechanismParams

RELATION = ("user-level: one client's contribution to one round's sum present or replaced by "
            "zero (the client still takes part and adds its noise share; the cohort is a "
            "public fixed-size draw)")
TRUST = ("distributed: each client clips, rotates, scales, rounds and adds its share of "
         "Skellam noise itself, then masks its b-bit integers for secure aggregation "
         "(simulated protocol: X25519, AES-CTR masks, Shamir shares, SecAgg+ graph); the "
         "server sees only masked integers and their modular sum; assumed: clients add their "
         "noise honestly, at least n_t of a round's inputs are honest (m - n_t may collude or "
         "drop), fewer than t neighbours of any client collude with the server")
ACCOUNTING = ("Skellam RDP (Agarwal et al. 2021: alpha D2^2/(2 mu) + min(((2 alpha - 1) D2^2 + "
              "6 D1)/(4 mu^2), 3 D1/(2 mu)), integer alpha), D2 the conditional rounding's norm "
              "bound (Kairouz et al. 2021), D1 = D2 min(sqrt(d'), D2); composed over a client's "
              "released participations (fixed-size cohorts, no amplification), converted by "
              "dp-accounting; rounds with fewer than n_t inputs abort and charge nobody")


@register
class DdpSkellam(Mechanism):
    """Distributed Skellam noise under simulated secure aggregation."""

    name = "ddp-skellam"
    description = ("user-level distributed DP (DSkellam, Agarwal et al. 2021): clients clip, "
                   "rotate, scale, round, add Skellam noise shares and mask b-bit integers for "
                   "secure aggregation; the server decodes the modular sum")
    neighbouring = RELATION
    trust_model = TRUST
    amplification = "none: fixed-size cohorts the aggregator sees"
    # zero-out, not add/remove: the aggregator sees who sends, the cohort has a fixed size
    # and the abort rule counts the inputs, so one client's presence is not hidden
    relation = ZERO_OUT_CLIENT
    cli_clause = " (user-level distributed DP, Skellam noise under simulated secure aggregation)"
    floor = "central"
    central = True
    claims_guarantee = True
    takes_budget = True
    noise_kind = None  # Skellam: accounted by its own RDP, not the ledger's Gaussian
    norm = "l2"
    options = (SHARED_OPTIONS + SAMPLED_BUDGET + ("clip", "sample_rate", "public_population")
               + DDP_OPTIONS)

    server_knows = (
        "the run seed (the cohort, the secagg graph, the rotation's signs, the dropout draws), "
        "the public keys, the encrypted shares it relays, the masked inputs, the unmasking "
        "shares and the modular sum; not the clients' secrets (key pairs, mask seeds, "
        "rounding, noise shares: the OS, or a --client-secret-seed it is never given)")

    @classmethod
    def adversaries(cls, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Both adversaries see the same decoded sum: the Skellam eps of the worst client's
        released participations, under the assumptions of the trust model."""
        eps = (summary.get("epsilon") or {}).get("reported")
        basis = ("the clients add the noise: the aggregator sees masked inputs (uniform to it) "
                 "and the noisy modular sum, the observer the decoded model; assumed: honest "
                 "noise shares, at least n_t honest inputs a round, fewer than t colluding "
                 "neighbours of any client")
        return adversary_views(("observers of the released models", eps, basis),
                               ("the aggregator running secure aggregation", eps, basis))

    @classmethod
    def validate(cls, cfg: PrivacyConfig) -> None:
        from fedem_private.privacy.skellam import MAX_BITS

        bits = cfg.ddp_bits
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= MAX_BITS:
            raise UserError(f"--ddp-bits must be an integer in [2, {MAX_BITS}], got {bits!r}")
        if cfg.ddp_scale is not None and not 0 < float(cfg.ddp_scale) < math.inf:
            raise UserError(f"--ddp-scale must be finite and > 0, got {cfg.ddp_scale}")
        if not 0 <= float(cfg.ddp_tolerance) < 1:
            raise UserError(f"--ddp-tolerance must be in [0, 1), got {cfg.ddp_tolerance}")
        if not 0 <= float(cfg.dropout) < 1:
            raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout}")

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """The Gaussian-equivalent multiplier z (the leading RDP term; the run's Skellam plan,
        which needs the upload's dimension, is made at the first contribution)."""
        from fedem_private.privacy.params import MechanismParams
        from fedem_private.privacy.skellam import calibrate_variance, skellam_epsilon

        if cfg.noise_multiplier is not None:
            z = float(cfg.noise_multiplier)
        else:
            assert cfg.epsilon is not None
            z = (0.0 if math.isinf(cfg.epsilon)
                 else math.sqrt(calibrate_variance(cfg.epsilon, rounds, 0.0, 1.0, cfg.delta)))
        eps_round = math.inf if z == 0 else skellam_epsilon(1, 0.0, 1.0, z * z, cfg.delta)
        return MechanismParams(mode=cfg.mode, delta=cfg.delta, norm="l2", clip=float(cfg.clip),
                               sensitivity=float(cfg.clip), noise_kind=None,
                               noise_scale=z * float(cfg.clip), noise_multiplier=z,
                               epsilon_round=eps_round, sample_rate=float(cfg.sample_rate))

    @classmethod
    def claimed_gap(cls, cfg: PrivacyConfig) -> tuple[int, float] | None:
        """Nominal: C (the run's own bound, Delta_2 / gamma, is the secure sum's
        ``claimed_gap``, which the harness asks)."""
        return 2, cfg.clip

    @classmethod
    def ledger_event(cls, params: MechanismParams) -> RoundMechanism | None:
        """Nothing in the Gaussian ledger: the secure sum composes the Skellam RDP of each
        client's released participations (:meth:`central_summary`)."""
        return None

    @classmethod
    def server_sum(cls, params: MechanismParams, cfg: PrivacyConfig, seed: int,
                   expected_count: float) -> DdpSecureSum | None:  # type: ignore[override]
        from fedem_private.privacy.ddp import DdpSecureSum

        z = params.noise_multiplier
        return DdpSecureSum(
            clip=float(cfg.clip), bits=cfg.ddp_bits, scale=cfg.ddp_scale,
            tolerance=cfg.ddp_tolerance, dropout=cfg.dropout, expected_count=expected_count,
            # rounds: the layer sets the planned rounds through ``configure``
            cohort=max(1, round(expected_count)), seed=seed, rounds=1,
            delta=cfg.delta, epsilon=None if cfg.noise_multiplier is not None else cfg.epsilon,
            noise_multiplier=cfg.noise_multiplier if cfg.noise_multiplier is not None
            else (None if cfg.epsilon is not None and math.isfinite(cfg.epsilon) else z),
            client_secret_seed=cfg.client_secret_seed)

    @classmethod
    def participants(cls, params: MechanismParams, seed: int, round_: int,
                     clients: int | np.ndarray) -> np.ndarray:
        """A fixed-size cohort of round(q n) clients, a draw per round keyed by each
        client's identity (``clients``: the identity keys, or a count n)."""
        from fedem_private import rng
        from fedem_private.privacy.ddp import fixed_cohort

        q = params.sample_rate if params.sample_rate is not None else 1.0
        keys = rng.identities(clients)
        return fixed_cohort(seed, round_, keys, max(1, round(q * keys.shape[0])))

    @classmethod
    def central_summary(cls, layer: PrivacyLayer, out: dict[str, Any]) -> dict[str, Any]:
        """The worst client's eps over its released participations, the plan, the rounds
        released and aborted, the wrap-around bound and the costs (privacy.json)."""
        sec = layer.secure
        plan = getattr(sec, "plan", None)
        records = getattr(sec, "records", [])
        released = [r for r in records if r.released]
        eps = sec.epsilon_spent() if sec is not None else 0.0  # type: ignore[union-attr]
        costs = released[-1].costs if released else {}
        out.update({
            "epsilon": {"reported": None if math.isinf(eps) else eps, "rdp": eps},
            "epsilon_view": "every observer, the aggregator included (no amplification)",
            "worst_client_rounds": getattr(sec, "worst_rounds", None),
            # one released participation's eps under the run's plan (the calibration's
            # Gaussian-equivalent figure stays in the params as the plan's guide)
            "epsilon_round": None if plan is None else plan.epsilon(1),
            "client_secrets": (sec.secrets.describe()  # type: ignore[union-attr]
                               if sec is not None else None),
            "sample_rate": layer.cfg.sample_rate,
            "expected_participants": layer.expected_count,
            "aggregation_weights": "uniform: decoded sum of clipped deltas over q n",
            "ddp_skellam": None if plan is None else {
                "bits": plan.bits, "scale_gamma": plan.scale, "clip": plan.clip,
                "dim": plan.dim, "padded_dim": plan.padded, "beta": plan.beta,
                "l2_sensitivity_int": plan.l2, "l1_sensitivity_int": plan.l1,
                "noise_variance_per_entry_int": plan.variance,
                "client_noise_variance_int": plan.client_variance,
                "gaussian_equivalent_multiplier": plan.noise_multiplier,
                "cohort": plan.cohort, "noise_clients": plan.noise_clients,
                "tolerance": layer.cfg.ddp_tolerance, "dropout": layer.cfg.dropout,
                "rounds_planned": plan.rounds,
                "epsilon_planned": plan.epsilon(plan.rounds),
                "wrap_bound_per_round": plan.wrap,
                "rounds_released": len(released),
                "rounds_aborted": [{"round": r.round, "reason": r.reason}
                                   for r in records if not r.released],
                "min_slack": min((r.slack for r in released), default=None),
                "wrapped_entries_total": sum(r.wrapped_entries for r in released),
                "bytes_per_client": {"masked_input": plan.bytes_per_input, **{
                    k: v for k, v in costs.items() if k.endswith("bytes")}},
                "cpu_seconds_last_round": {k: v for k, v in costs.items()
                                           if k.endswith("seconds")},
                "accounting": ACCOUNTING,
                "protocol": ("simulated secure aggregation" if sec.simulate_protocol
                             else "plain modular sum (benchmark shortcut: same senders, "
                             "aborts and sum; no cryptography, no costs)"),
            },
        })
        return out
