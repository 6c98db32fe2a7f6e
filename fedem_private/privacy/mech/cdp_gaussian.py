"""``cdp-gaussian``: user-level central DP, DP-FedAvg (docs/design.md section 5).

Each client takes part with probability q (Poisson); its encoded delta is
L2-clipped to C; the clipped deltas are summed under secure aggregation and
N(0, z^2 C^2) is added once to the sum. Neighbouring relation: user-level
add/remove of one client's whole data. Trust model: central, a secure sum (or a
trusted server). Sensitivity of the sum: L2 C. Amplification: Poisson sampling,
claimed only against observers of the released models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedem_private.privacy.mech.base import (
    ADD_REMOVE_CLIENT,
    CENTRAL_OPTIONS,
    SAMPLED_BUDGET,
    SHARED_OPTIONS,
    Mechanism,
    adversary_views,
)
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    from fedem_private.privacy.central import SecureSum
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.params import MechanismParams


@register
class CdpGaussian(Mechanism):
    """The Gaussian mechanism on the sum of Poisson-sampled clipped deltas."""
    audit_canaries = 200_000
    audit_gdp = True
    audit_at_delta = True

    name = "cdp-gaussian"
    description = (
        "user-level central DP (DP-FedAvg, add/remove one client's data): Poisson sampling at "
        "rate q, L2-clip each delta to C, N(0, z^2 C^2) added once to the sum under secure "
        "aggregation, divided by q n; amplified eps for observers of the released models, "
        "unamplified eps for the aggregator"
    )
    neighbouring = "user-level: add/remove one client's whole data"
    trust_model = ("central: clipped deltas summed under secure aggregation (or by a "
                   "trusted server), Gaussian noise added once to the sum")
    amplification = ("Poisson sampling at rate q, claimed only against observers of the "
                     "released models; none against the aggregator")
    relation = ADD_REMOVE_CLIENT
    floor = "central"
    private_tuning = True
    central = True
    claims_guarantee = True
    takes_budget = True
    noise_kind = "gaussian"
    norm = "l2"
    options = (SHARED_OPTIONS + SAMPLED_BUDGET + ("clip",) + CENTRAL_OPTIONS
               + ("public_population", "select_rows", "select_share", "select_prior",
                  "select_blend"))

    server_knows = (
        "the run seed, which also keys the central noise: the aggregator figure holds only "
        "for the idealised trust model (clipped deltas summed under secure aggregation, the "
        "noise added by a trusted party before anyone reads the sum); who took part")

    @classmethod
    def adversaries(cls, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Observer: Poisson-amplified DP-FedAvg; aggregator: no amplification (it knows
        who took part), the worst client's rounds composed (the ledger's figure)."""
        guarantees = summary.get("guarantees") or {}
        observer = ((guarantees.get("observer") or {}).get("epsilon") or {}).get("reported")
        aggregator = (summary.get("epsilon_aggregator") or {}).get("reported")
        return adversary_views(
            ("observers of the released global models, not told who took part", observer,
             "Poisson subsampling amplification (dp-accounting PLD/RDP)"),
            ("the aggregator under secure aggregation: sees only the noisy sums, knows who "
             "took part", aggregator, "no amplification: the worst client's participations "
             "composed; assumes the noise is added before it reads the sum"))

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """sigma = z C on the sum; z given or calibrated for T Poisson-subsampled rounds
        (:func:`~fedem_private.privacy.params._central_params`)."""
        from fedem_private.privacy.params import _central_params

        return _central_params(cfg, rounds, n_clients)

    @classmethod
    def claimed_gap(cls, cfg: PrivacyConfig) -> tuple[int, float] | None:
        """Add/remove one client: the sum moves by at most C in L2."""
        return 2, cfg.clip

    @classmethod
    def server_sum(cls, params: MechanismParams, cfg: PrivacyConfig, seed: int,
                   expected_count: float) -> SecureSum | None:
        """The round's secure sum of clipped deltas, noised once (with adaptive clipping and
        the canary audit where configured; :mod:`fedem_private.privacy.central`)."""
        from fedem_private.privacy.canaries import CanaryAudit
        from fedem_private.privacy.central import AdaptiveClip, RowSelection, SecureSum

        p = params
        assert p.clip is not None and p.sample_rate is not None
        assert p.noise_multiplier is not None
        audit = (CanaryAudit(cfg.canaries, p.clip, p.noise_multiplier, p.sample_rate,
                             seed) if cfg.canaries else None)
        return SecureSum(p.clip, p.sum_noise_multiplier if p.sum_noise_multiplier is not None
                         else p.noise_multiplier, expected_count, seed,
                         adaptive=AdaptiveClip(p.clip_quantile, p.clip_lr, p.count_noise)
                         if p.adaptive_clip else None, canaries=audit,
                         selection=RowSelection(p.select_rows, p.select_noise_multiplier or 0.0)
                         if p.select_rows else None)
