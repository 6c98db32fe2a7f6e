"""``dp-ftrl``: user-level central DP without sampling amplification (docs/design.md section 5).

DP-FTRL with tree aggregation (Kairouz, McMahan, Song, Thakkar, Thakurta and Xu,
ICML 2021); the math is in :mod:`fedem_private.privacy.ftrl`. Participation: fixed
cyclic cohorts, G = ceil(1/q) groups by a keyed hash of each client's identity, group
(t - 1) mod G in round t (each client at most ceil(T/G) times, G rounds apart). Each
participant's encoded delta is L2-clipped to C and summed under secure aggregation;
the server releases theta_0 + (noisy prefix sum of the sums) / (N / G), N the public
population (``--public-population``, else the run's number of users), the prefix sums
noised by the binary tree (every node N(0, sigma^2)). Neighbouring relation: user-level
add/remove of one client's whole data. Trust model: central, as cdp-gaussian (secure
aggregation or a trusted server adds the noise). Sensitivity: C per round's sum;
C sqrt(max_g s2_T(g)) for the whole release (exact, ``ftrl.tree_squared_sensitivity``).
The release is accounted as ONE Gaussian mechanism; no amplification is claimed.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fedem_private.privacy.mech.base import (
    ADD_REMOVE_CLIENT,
    SAMPLED_BUDGET,
    SHARED_OPTIONS,
    Mechanism,
    adversary_views,
)
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    from fedem_private.privacy.accounting import RoundMechanism
    from fedem_private.privacy.central import SecureSum
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.layer import PrivacyLayer
    from fedem_private.privacy.params import MechanismParams

PARTICIPATION = ("cyclic cohorts: each client's group is a keyed hash of its identity (its source "
                 "id) into G = ceil(1/q) groups, so no other user's presence moves it; group "
                 "(t - 1) mod G takes part in round t, so each client takes part at most "
                 "ceil(T/G) times, exactly G rounds apart (a public schedule, independent of "
                 "the data and of the other clients)")
VARIANT = ("online binary tree (Fenwick: node e covers rounds e - lowbit(e) + 1 .. e), "
           "no restarts, no Honaker variance reduction; model = initial + noisy prefix sum / "
           "(N / G), N the public population, server learning rate 1")
ACCOUNTING = ("the tree release up to round t is one Gaussian mechanism on the node sums "
              "(each node N(0, sigma^2)) of L2 sensitivity C sqrt(max_g sum_{e <= t} "
              "n_e(g)^2), computed exactly for the cyclic pattern; converted with "
              "dp-accounting (PLD, RDP) and the exact Gaussian curve, reported = min (zCDP's "
              "closed form beside it); calibrated at the planned last round. The per-client "
              "ledger (epsilon_ledger) charges each participation a Gaussian of multiplier "
              "sigma / (C sqrt(r)), r the largest squared sensitivity per participation over "
              "every prefix: valid at every round, more conservative. No amplification by "
              "sampling or shuffling")


_GROUPS: dict[tuple[int, int, int, bytes], np.ndarray] = {}


def _cohorts(keys: np.ndarray, groups: int, seed: int) -> np.ndarray:
    """Each client's group (kept for the run's keys: drawn once, not every round)."""
    from fedem_private.privacy.ftrl import CyclicCohorts

    keys = np.ascontiguousarray(keys, dtype=np.int64)
    # the keys' own digest identifies the population (a cheap hash of its bytes)
    tag = (keys.shape[0], int(groups), int(seed),
           hashlib.blake2b(keys.tobytes(), digest_size=16).digest())
    out = _GROUPS.get(tag)
    if out is None:
        if len(_GROUPS) >= 8:
            _GROUPS.clear()
        out = CyclicCohorts(int(groups), int(seed)).group_of(keys)
        out.setflags(write=False)
        _GROUPS[tag] = out
    return out


@register
class DpFtrl(Mechanism):
    """DP-FTRL: tree-aggregated noisy prefix sums of the cohorts' clipped deltas."""

    name = "dp-ftrl"
    description = (
        "user-level central DP-FTRL (Kairouz et al. 2021, add/remove one client's data): fixed "
        "cyclic cohorts (G = ceil(1/q) groups, each client every G rounds), L2-clip each delta "
        "to C, noisy prefix sums of the cohorts' sums by a binary tree (N(0, sigma^2) per "
        "node) under secure aggregation; no sampling amplification"
    )
    neighbouring = "user-level: add/remove one client's whole data"
    trust_model = ("central: clipped deltas summed under secure aggregation (or by a trusted "
                   "server); the aggregator adds the tree's noise increment, the node noise "
                   "stays secret")
    amplification = ("none: participation is a fixed public schedule of cyclic cohorts; "
                     "the guarantee is for observers of the released models (the aggregator "
                     "adds the noise itself and is trusted)")
    relation = ADD_REMOVE_CLIENT
    cli_clause = (" (user-level central DP-FTRL, tree aggregation, cyclic cohorts; no "
                  "amplification claimed)")
    floor = "central"
    central = True
    claims_guarantee = True
    takes_budget = True
    noise_kind = "gaussian"
    norm = "l2"
    # no adaptive clipping nor in-run canaries (privacy/canaries.py): both are built for
    # cdp-gaussian's round-by-round noise and Poisson sampling
    options = SHARED_OPTIONS + SAMPLED_BUDGET + ("clip", "sample_rate", "public_population")
    # the certified canary audit (attacks/canary.py, "dp-ftrl"): each canary is a client of
    # the group with the largest tree sensitivity, present or absent by a fair coin, through
    # every round of the run's own TreeSecureSum; scored by the Neyman-Pearson statistic of
    # the node vector; held to the whole release's eps (ONE Gaussian, mu = 1 / z)
    audit_canaries = 50_000
    audit_gdp = True
    audit_at_delta = True
    audit_claim_kind = "accounted eps of the whole tree release (one Gaussian, every round)"

    server_knows = (
        "the run seed, which keys the tree's node noise, and each round's clipped sum before "
        "it adds the noise (trust model: the aggregator adds the noise): it is trusted, and "
        "no guarantee holds against it; who took part (the public cohort schedule)")

    @classmethod
    def adversaries(cls, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Observer: the tree release's eps (one Gaussian, no amplification); aggregator:
        none, since it adds the noise to sums it reads first."""
        return adversary_views(
            ("observers of the released models (every one, told who took part or not)",
             (summary.get("epsilon") or {}).get("reported"),
             "the tree release as one Gaussian mechanism, no amplification"),
            ("the aggregator, which adds the tree noise", None,
             "no guarantee: it reads each round's clipped sum before adding the noise (a "
             "trusted aggregator; run ddp-skellam for noise the clients add)"))

    @classmethod
    def notes(cls, cfg: PrivacyConfig, rounds: int) -> list[tuple[str, str]]:
        """The cohort fraction actually used, 1/G, where it is not --sample-rate's q; a
        warning where the run ends before every cohort took part (rounds < G)."""
        from fedem_private.privacy.ftrl import groups_for

        q = float(cfg.sample_rate)
        groups = groups_for(q)
        out = []
        if abs(1.0 / groups - q) > 1e-9:
            out.append(("note", f"--privacy dp-ftrl --sample-rate {q:g}: the clients are "
                                f"split into G = ceil(1/q) = {groups} cyclic cohorts, so each "
                                f"round's cohort is a fraction 1/{groups} = {1 / groups:.4g} "
                                f"of them, not {q:g}"))
        if rounds < groups:
            # the smallest q of 4 decimals whose ceil(1/q) is at most the rounds
            enough = math.ceil(10_000 / rounds) / 10_000
            out.append(("warning", f"--privacy dp-ftrl: {rounds} round{'s' * (rounds > 1)} "
                                   f"reach {rounds} of the {groups} cyclic cohorts of "
                                   f"--sample-rate {q:g}; the clients of the other "
                                   f"{groups - rounds} ({(groups - rounds) / groups:.0%}) never "
                                   f"take part: give --rounds {groups} or more, or "
                                   f"--sample-rate {enough:g} or more"))
        return out

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """sigma per node from z and the tree's sensitivity
        (:func:`~fedem_private.privacy.ftrl.ftrl_params`)."""
        from fedem_private.privacy.ftrl import ftrl_params

        return ftrl_params(cfg, rounds)

    @classmethod
    def claimed_gap(cls, cfg: PrivacyConfig) -> tuple[int, float] | None:
        """Add/remove one client: one round's sum (hence, with the tree's noise shared, one
        round's released increment times m) moves by at most C in L2."""
        return 2, cfg.clip

    @classmethod
    def server_sum(cls, params: MechanismParams, cfg: PrivacyConfig, seed: int,
                   expected_count: float) -> SecureSum | None:
        """The run's tree aggregation (:class:`~fedem_private.privacy.ftrl.TreeSecureSum`)."""
        from fedem_private.privacy.ftrl import TreeSecureSum

        assert params.clip is not None and params.ftrl is not None
        return TreeSecureSum(params.clip, params.noise_scale, expected_count, seed,
                             params.ftrl.rounds)

    @classmethod
    def guaranteed_event(cls, params: MechanismParams) -> RoundMechanism:
        """One participation: the Gaussian of multiplier sigma / (C sqrt(r)) (privacy/ftrl.py,
        "Accounting"); k of them compose to a valid bound on the tree release."""
        from fedem_private.privacy.accounting import RoundMechanism
        from fedem_private.privacy.ftrl import participation_multiplier

        return RoundMechanism("gaussian", participation_multiplier(params))

    @classmethod
    def audit_claim(cls, params: MechanismParams) -> float | None:
        """The whole release's reported eps at the planned last round (:meth:`release_epsilon`):
        what the tree guarantees, to every observer (None: no guarantee)."""
        assert params.ftrl is not None
        return cls.release_epsilon(params, params.ftrl.rounds)["reported"]

    @classmethod
    def restore_params(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The logged plan ({rounds, groups, ...}) rebuilt as an
        :class:`~fedem_private.privacy.ftrl.FtrlPlan` (its exact sensitivities recomputed)."""
        from fedem_private.privacy.ftrl import FtrlPlan

        plan = values.get("ftrl")
        if isinstance(plan, dict):
            values = {**values, "ftrl": FtrlPlan.for_run(int(plan["rounds"]),
                                                          int(plan["groups"]))}
        return values

    # -- the layer's hooks for a central mechanism with its own participation -----------------
    @classmethod
    def participants(cls, params: MechanismParams, seed: int, round_: int,
                     clients: int | np.ndarray) -> np.ndarray:
        """Round ``round_``'s cohort: group (round - 1) mod G of the cyclic cohorts
        (:class:`~fedem_private.privacy.ftrl.CyclicCohorts`), sorted indices.
        ``clients``: each client's identity key (a count n: the keys 0..n-1)."""
        assert params.ftrl is not None
        if round_ < 1:
            raise ValueError(f"rounds are numbered from 1, got {round_}")
        from fedem_private import rng

        groups = params.ftrl.groups
        return np.flatnonzero(_cohorts(rng.identities(clients), groups, int(seed))
                              == (int(round_) - 1) % groups)

    @classmethod
    def release_epsilon(cls, params: MechanismParams, round_: int) -> dict[str, float | None]:
        """The eps of the whole release up to ``round_`` as ONE Gaussian mechanism of
        multiplier sigma / (C sqrt(S_t)) (:func:`~fedem_private.privacy.ftrl.release_multiplier`),
        every bound at the run's delta, JSON-ready (inf as None)."""
        from fedem_private.privacy.accounting import gaussian_release_bounds
        from fedem_private.privacy.ftrl import release_multiplier

        z = release_multiplier(params, round_)
        if math.isinf(z):  # nothing released yet
            return dict.fromkeys(("basic", "advanced", "rdp", "pld", "gaussian_exact",
                                  "reported", "zcdp"), 0.0)
        if z == 0 or not params.guarantee:
            return dict.fromkeys(("basic", "advanced", "rdp", "pld", "gaussian_exact",
                                  "reported", "zcdp"), None)
        return gaussian_release_bounds(z, params.delta)

    @classmethod
    def central_summary(cls, layer: PrivacyLayer, out: dict[str, Any]) -> dict[str, Any]:
        """The run's guarantee (one, for every observer: the tree release up to the last
        round, :meth:`release_epsilon`) and what it assumes; the per-client ledger's more
        conservative figure is kept as ``epsilon_ledger``."""
        p = layer.params
        plan, clip, sigma = p.ftrl, p.clip, p.noise_scale
        assert plan is not None and clip is not None and p.noise_multiplier is not None
        out.update({
            "epsilon": cls.release_epsilon(p, layer.round),
            "epsilon_ledger": out["epsilon"],
            "epsilon_view": ("observers of the released models (no amplification); none "
                             "against the aggregator, which adds the noise"),
            "sample_rate": layer.cfg.sample_rate,
            "expected_participants": layer.expected_count,
            "aggregation_weights": ("uniform: sum of clipped deltas over the expected cohort "
                                    "N / G (FedAvg's data-size weights are not used: they "
                                    "would raise the sensitivity)"),
            "participation": {"pattern": PARTICIPATION, "groups": plan.groups,
                              "max_participations": plan.max_participations,
                              "min_separation": plan.groups},
            "dp_ftrl": {
                "variant": VARIANT,
                "rounds_planned": plan.rounds,
                "rounds_released": layer.round,
                "noise_std_per_node": sigma,
                "sensitivity": p.sensitivity,
                "noise_multiplier": p.noise_multiplier,
                "participation_noise_multiplier": (
                    p.noise_multiplier * math.sqrt(plan.tree_sq / plan.participation_sq)),
                "epsilon_planned": cls.release_epsilon(p, plan.rounds),
                "accounting": ACCOUNTING,
            },
        })
        return out
