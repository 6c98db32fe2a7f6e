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

``--ftrl-strategy banded`` (issue 81) replaces the tree by a b-banded Toeplitz
factorisation, b <= G (:mod:`fedem_private.privacy.mf`): the same relation, trust model,
participation and accounting; the sensitivity C sqrt(S_T) is the banded C's, exact for the
cyclic cohorts and equal to the bound for any participation at least G rounds apart and at
most ceil(T/G) times (its columns never overlap), so the guarantee also holds for a
deployment that enforces only that separation and cap.

``--ftrl-strategy blt`` replaces it by a buffered-linear-Toeplitz factorisation with d
buffers (:mod:`fedem_private.privacy.blt`, McMahan, Choquette-Choo et al. 2024): the same
relation, trust model, participation and accounting; its coefficients are non-negative and
non-increasing, so the sensitivity C sqrt(S_T) = C ||C 1_0|| (cohort 0's rounds) is exact
for the cyclic cohorts and equal to the bound for any participation at least G rounds
apart and at most ceil(T/G) times, for every G.

``--ftrl-sampling poisson`` (issue 81, banded only) is amplified banded MF (Choquette-Choo,
McMahan, Rush, Thakurta et al., "(Amplified) Banded Matrix Factorization", NeurIPS 2023, the
amplification theorem for b-banded C under b-min-sep sampling): b-min-sep sampling with b =
``--ftrl-bands`` groups by the same keyed hash of identity (G = b); in round t only group
(t - 1) mod b may take part, each member independently with probability p = q b (a keyed
uniform of (seed, round, identity): removing a user moves no other client). Conditions, as
the theorem states them: C lower-triangular and b-banded (C[t, s] = 0 for t - s >= b),
every column of L2 norm at most 1 (here normalised by the largest, ||c||: c_0 = 1 and the
first column is whole), a fixed partition into b groups (the theorem needs no equal sizes;
ours are Binomial), independent Poisson draws within the group. Then the release C x + z
(z_t ~ N(0, sigma^2)) is as private as DP-SGD with Poisson sampling at p and noise multiplier
z = sigma / (C ||c||) over ceil(T/b) steps: the same relation (add/remove of one client's
whole data, the Poisson accountant's; replace-one is not claimed), the same trust model;
accounted by dp-accounting's PLD and RDP of the Poisson-subsampled Gaussian (as
cdp-gaussian), for observers of the released models who are not told who took part. The
aggregator, which sees who took part, gets no amplification: the per-client ledger and the
unamplified release bound (one Gaussian of sensitivity C sqrt(S_T) at G = b, valid for every
participation pattern the schedule allows) stay beside it.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fedem_private.privacy.mech.base import (
    ADD_REMOVE_CLIENT,
    FTRL_OPTIONS,
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
# --ftrl-strategy: name -> when it applies (``fedem-private list``, ``run --help``)
STRATEGIES: dict[str, str] = {
    "tree": ("the online binary tree (Kairouz et al. 2021), the default: any G; each round's "
             "noise sums ~log2 T nodes and the sensitivity grows as participations share "
             "ancestors"),
    "banded": ("a b-banded Toeplitz factorisation (Choquette-Choo et al. 2023) optimised for "
               "the run's T, b <= G (--ftrl-bands, default min(G, T)): less error than the "
               "tree at every G; its guarantee holds for any participation at least G "
               "rounds apart, at most ceil(T/G) times"),
    "blt": ("a buffered-linear-Toeplitz factorisation (McMahan et al. 2024) with d buffers "
            "(--ftrl-buffers, default 3), optimised for T and G: noise memory d model-sized "
            "vectors whatever G (banded keeps b - 1 <= G - 1); error between the tree's and "
            "banded's, close to banded's once G >= T; any G; its guarantee holds for any "
            "participation at least G rounds apart, at most ceil(T/G) times"),
}
# --ftrl-sampling: name -> when it applies (``fedem-private list``, ``run --help``)
SAMPLINGS: dict[str, str] = {
    "cyclic": ("the default: G = ceil(1/q) fixed cohorts by a keyed hash of identity, cohort "
               "(t - 1) mod G wholly in round t; every strategy; no amplification claimed"),
    "poisson": ("--ftrl-strategy banded only, with --ftrl-bands b (1 <= b <= 1/q; 0: the b "
                "of least expected error of the prefix sums at the run's T, q and eps): b-min-sep "
                "sampling, b groups by a keyed hash of identity, each member of round t's "
                "group (t - 1) mod b in with probability p = q b; accounted as DP-SGD with "
                "Poisson sampling at p over ceil(T/b) steps (amplified banded MF, "
                "Choquette-Choo et al. 2023); helps most where p is small (few bands)"),
}
POISSON_PARTICIPATION = (
    "b-min-sep Poisson sampling: each client's group is a keyed hash of its identity into b "
    "groups (b the bands), so no other user's presence moves it; in round t only group "
    "(t - 1) mod b may take part, each member independently with probability p (a keyed "
    "uniform of the seed, the round and its identity); each client at most ceil(T/b) times, "
    "at least b rounds apart")
POISSON_ACCOUNTING = (
    "amplified banded MF (Choquette-Choo et al. 2023): the b-banded C's columns normalised "
    "by the largest, ||c||, a client's columns never overlap (b-min-sep), so the release is "
    "as private as DP-SGD with Poisson sampling at p and noise multiplier z = sigma / (C "
    "||c||) over ceil(t/b) steps: dp-accounting PLD (pessimistic) and RDP of the "
    "Poisson-subsampled Gaussian, calibrated at the planned last round; reported = min of "
    "those and the unamplified bound (the release as one Gaussian of sensitivity C "
    "sqrt(S_t) at G = b). The per-client ledger (epsilon_ledger) charges each participation "
    "a Gaussian of multiplier sigma / (C sqrt(r)), unamplified")
POISSON_AMPLIFICATION = "Poisson within b-min-sep groups"
POISSON_DESCRIPTION = (
    "user-level central DP-FTRL, amplified banded MF (Choquette-Choo et al. 2023, add/remove "
    "one client's data): b groups by a keyed hash of identity, round t's group sampled "
    "Poisson at p, L2-clip each delta to C, noisy prefix sums of the sums by a b-banded "
    "matrix factorisation under secure aggregation; amplification: Poisson within b-min-sep "
    "groups, for observers not told who took part")
POISSON_VARIANT = ("banded Toeplitz matrix factorisation A = B C (C lower-triangular Toeplitz, "
                   "b bands, c_0 = 1, optimised for T and G = b by L-BFGS on ||B||_F^2 x "
                   "sens^2); each round adds w_t = (C^{-1} z)_t by the recurrence C w = z (O(b) "
                   "memory); model = initial + noisy prefix sum / (q N), q N = p N / b the "
                   "expected cohort, server learning rate 1")
# printed under privacy.participation beside PARTICIPATION for a banded plan
MINSEP = ("min-separation: the banded strategy's b <= G columns never overlap, so the "
          "accounted sensitivity is also the bound for every participation at least G rounds "
          "apart and at most ceil(T/G) times (Choquette-Choo et al. 2023, Theorem 2): the "
          "guarantee holds for any schedule a deployment enforces by that separation and cap")
# the same, for a BLT plan: its coefficients are non-negative and non-increasing
BLT_MINSEP = ("min-separation: the BLT's coefficients are non-negative and non-increasing, so "
              "the earliest rounds 1, 1 + G, ... are the worst pattern and the accounted "
              "sensitivity is also the bound for every participation at least G rounds apart "
              "and at most ceil(T/G) times: the guarantee holds for any schedule a deployment "
              "enforces by that separation and cap")
BLT_VARIANT = ("buffered-linear-Toeplitz matrix factorisation A = B C (C lower-triangular "
               "Toeplitz, c_0 = 1, c_k = sum_j omega_j theta_j^(k-1), d buffers, omega_j >= 0 "
               "summing below 1, theta_j in (0, 1), optimised for T and G by L-BFGS-B on "
               "||B||_F^2 x sens^2); each round adds w_t = (C^{-1} z)_t through d buffers "
               "(O(d) memory); model = initial + noisy prefix sum / (N / G), server learning "
               "rate 1")
BANDED_VARIANT = ("banded Toeplitz matrix factorisation A = B C (C lower-triangular Toeplitz, "
                  "b bands, c_0 = 1, optimised for T and G by L-BFGS on ||B||_F^2 x sens^2); "
                  "each round adds w_t = (C^{-1} z)_t by the recurrence C w = z (O(b) memory); "
                  "model = initial + noisy prefix sum / (N / G), server learning rate 1")


def strategy_help() -> str:
    """``--ftrl-strategy``'s help: each strategy and when it applies."""
    return "dp-ftrl's factorisation of the prefix sums: " + "; ".join(
        f"{name}: {text}" for name, text in STRATEGIES.items())


def sampling_help() -> str:
    """``--ftrl-sampling``'s help: each participation and when it applies."""
    return "dp-ftrl's participation: " + "; ".join(
        f"{name}: {text}" for name, text in SAMPLINGS.items())


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

BANDED_ACCOUNTING = ("the release up to round t is one Gaussian mechanism C x + z (each z_t "
                     "N(0, sigma^2)) of L2 sensitivity C sqrt(max_g sum_{s in g, s <= t} "
                     "||C_t[:, s]||^2), exact for the cyclic pattern (b <= G: one client's "
                     "columns never overlap); converted with dp-accounting (PLD, RDP) and the "
                     "exact Gaussian curve, reported = min (zCDP's closed form beside it); "
                     "calibrated at the planned last round. The per-client ledger "
                     "(epsilon_ledger) charges each participation a Gaussian of multiplier "
                     "sigma / (C sqrt(r)), r <= ||c||^2 the largest squared sensitivity per "
                     "participation over every prefix: valid at every round. No amplification "
                     "by sampling or shuffling")


BLT_ACCOUNTING = ("the release up to round t is one Gaussian mechanism C x + z (each z_t "
                  "N(0, sigma^2)) of L2 sensitivity C ||(C 1_0)_{1..t}||, 1_0 the first "
                  "cohort's rounds: exact for the cyclic pattern since C^T C >= 0 entrywise "
                  "(all of a client's deltas one vector is the worst) and the first cohort's "
                  "columns are the earliest; converted with dp-accounting (PLD, RDP) and the "
                  "exact Gaussian curve, reported = min (zCDP's closed form beside it); "
                  "calibrated at the planned last round. The per-client ledger "
                  "(epsilon_ledger) charges each participation a Gaussian of multiplier "
                  "sigma / (C sqrt(r)), r the largest squared sensitivity per participation "
                  "over every prefix: valid at every round. No amplification by sampling or "
                  "shuffling")
# per strategy: (variant, accounting, also_valid_for) in the run's summary
_SUMMARY_TEXTS: dict[str, tuple[str, str, str | None]] = {
    "tree": (VARIANT, ACCOUNTING, None),
    "banded": (BANDED_VARIANT, BANDED_ACCOUNTING, MINSEP),
    "blt": (BLT_VARIANT, BLT_ACCOUNTING, BLT_MINSEP),
}


_GROUPS: dict[tuple[int, int, int, bytes], np.ndarray] = {}


def poisson_members(seed: int, round_: int, keys: np.ndarray, rate: float) -> np.ndarray:
    """Which of round ``round_``'s group members take part under ``--ftrl-sampling
    poisson``: each independently with probability ``rate`` = p, by the keyed uniform of
    (seed, POISSON, round, identity) (:func:`fedem_private.privacy.central.
    poisson_participants`, cdp-gaussian's sampler): a function of the member's identity
    and the round alone, so removing a user moves no other client, and independent of
    the group hash (another stream) and across rounds. Sorted indices into ``keys``."""
    from fedem_private.privacy.central import poisson_participants

    return poisson_participants(int(seed), int(round_), np.asarray(keys, dtype=np.int64),
                                float(rate))


def amplified_epsilon(params: MechanismParams, round_: int) -> dict[str, float | None]:
    """The eps of the release up to ``round_`` >= 1 under ``--ftrl-sampling poisson``,
    JSON-ready: ``rdp`` and ``pld`` are dp-accounting's bounds on ceil(t/b) compositions of
    the Poisson-subsampled Gaussian at p with multiplier z = sigma / (C ||c||)
    (:func:`~fedem_private.privacy.accounting.dpfedavg_bounds`; amplified banded MF,
    module docstring); ``unamplified`` the release as one Gaussian of multiplier
    sigma / (C sqrt(S_t)) at G = b (valid for every pattern the schedule allows, told who
    took part); ``reported`` the minimum of the three."""
    from fedem_private.privacy.accounting import dpfedavg_bounds, gaussian_release_bounds
    from fedem_private.privacy.ftrl import release_multiplier

    plan = params.ftrl
    assert plan is not None and params.noise_multiplier is not None
    z = float(params.noise_multiplier)
    if z == 0:
        return dict.fromkeys(("rdp", "pld", "unamplified", "reported"), None)
    steps = math.ceil(int(round_) / plan.groups)
    amp = dpfedavg_bounds(plan.rate, z, steps, params.delta).as_dict()
    plain = gaussian_release_bounds(release_multiplier(params, round_), params.delta)
    out = {"rdp": amp["rdp"], "pld": amp["pld"], "unamplified": plain["reported"]}
    finite = [v for v in out.values() if v is not None]
    out["reported"] = min(finite) if finite else None
    return out


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
        "node) or a banded or BLT matrix factorisation (--ftrl-strategy) under secure "
        "aggregation; "
        "no sampling amplification"
    )
    neighbouring = "user-level: add/remove one client's whole data"
    trust_model = ("central: clipped deltas summed under secure aggregation (or by a trusted "
                   "server); the aggregator adds the tree's noise increment, the node noise "
                   "stays secret")
    amplification = ("none: participation is a fixed public schedule of cyclic cohorts; "
                     "the guarantee is for observers of the released models (the aggregator "
                     "adds the noise itself and is trusted)")
    relation = ADD_REMOVE_CLIENT
    cli_clause = (" (user-level central DP-FTRL, tree, banded or BLT factorisation "
                  "(--ftrl-strategy), cyclic cohorts; no amplification claimed)")
    # a run under --ftrl-sampling poisson (:meth:`run_clause`)
    poisson_clause = (" (user-level central DP-FTRL, banded factorisation, b-min-sep Poisson "
                      "sampling; amplification: Poisson within b-min-sep groups, for observers "
                      "not told who took part)")
    floor = "central"
    central = True
    claims_guarantee = True
    takes_budget = True
    noise_kind = "gaussian"
    norm = "l2"
    # no adaptive clipping nor in-run canaries (privacy/canaries.py): both are built for
    # cdp-gaussian's round-by-round noise and Poisson sampling
    options = (SHARED_OPTIONS + SAMPLED_BUDGET + ("clip", "sample_rate", "public_population")
               + FTRL_OPTIONS)
    # the certified canary audit (attacks/canary.py, "dp-ftrl"): each canary is a client of
    # the group with the largest tree sensitivity, present or absent by a fair coin, through
    # every round of the run's own TreeSecureSum; scored by the Neyman-Pearson statistic of
    # the node vector; held to the whole release's eps (ONE Gaussian, mu = 1 / z)
    audit_canaries = 50_000
    audit_gdp = True
    audit_at_delta = True
    audit_claim_kind = ("accounted eps of the whole tree release (or banded or BLT, "
                        "--ftrl-strategy; one Gaussian, every round)")

    server_knows = (
        "the run seed, which keys the tree's node noise, and each round's clipped sum before "
        "it adds the noise (trust model: the aggregator adds the noise): it is trusted, and "
        "no guarantee holds against it; who took part (the public cohort schedule)")

    @classmethod
    def description_for(cls, params: MechanismParams) -> str:
        """:attr:`description`, or the amplified one under ``--ftrl-sampling poisson``."""
        poisson = params.ftrl is not None and params.ftrl.sampling == "poisson"
        return POISSON_DESCRIPTION if poisson else cls.description

    @classmethod
    def run_clause(cls, privacy: dict[str, Any]) -> str:
        """The cyclic clause, or :attr:`poisson_clause` for a run under ``--ftrl-sampling
        poisson`` (its summary's ``sampling``)."""
        return cls.poisson_clause if privacy.get("sampling") == "poisson" else cls.cli_clause

    @classmethod
    def adversaries(cls, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Observer: the tree release's eps (one Gaussian, no amplification); aggregator:
        none, since it adds the noise to sums it reads first."""
        if summary.get("sampling") == "poisson":
            eps = summary.get("epsilon") or {}
            return adversary_views(
                ("observers of the released models, not told who took part",
                 eps.get("reported"),
                 f"amplified banded MF: Poisson within b-min-sep groups (an observer told who "
                 f"took part: {eps.get('unamplified')}, the release as one Gaussian at G = b, "
                 f"no amplification)"),
                ("the aggregator, which adds the noise and sees who took part", None,
                 "no guarantee: it reads each round's clipped sum before adding the noise (a "
                 "trusted aggregator; run ddp-skellam for noise the clients add)"))
        return adversary_views(
            ("observers of the released models (every one, told who took part or not)",
             (summary.get("epsilon") or {}).get("reported"),
             "the tree release as one Gaussian mechanism, no amplification"),
            ("the aggregator, which adds the tree noise", None,
             "no guarantee: it reads each round's clipped sum before adding the noise (a "
             "trusted aggregator; run ddp-skellam for noise the clients add)"))

    @classmethod
    def validate(cls, cfg: PrivacyConfig) -> None:
        """--ftrl-strategy one of :data:`STRATEGIES`; --ftrl-bands an integer, only with
        banded, in 0..G (0: min(G, T)): more bands than cohorts would overlap one
        client's columns, which the sensitivity here does not cover; --ftrl-buffers an
        integer, only with blt, in 0..blt.MAX_BUFFERS (0: blt.DEFAULT_BUFFERS)."""
        from fedem_private.errors import UserError
        from fedem_private.privacy.ftrl import check_bands

        if cfg.ftrl_strategy not in STRATEGIES:
            raise UserError(f"unknown --ftrl-strategy {cfg.ftrl_strategy!r} (choose one of "
                            f"{', '.join(STRATEGIES)})")
        b = cfg.ftrl_bands
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise UserError(f"--ftrl-bands (privacy.ftrl_bands) must be an integer >= 0, "
                            f"got {b!r}")
        if b and cfg.ftrl_strategy != "banded":
            raise UserError(f"--ftrl-bands is for --ftrl-strategy banded, not "
                            f"{cfg.ftrl_strategy!r}")
        cls._validate_buffers(cfg)
        if cls._validate_sampling(cfg):
            return  # b <= 1/q is checked at calibration, where q is final (--cohort-size)
        if cfg.sample_rate < 1:  # at 1 a --cohort-size may set q later: checked at calibration
            check_bands(b, cfg.sample_rate)

    @staticmethod
    def _validate_sampling(cfg: PrivacyConfig) -> bool:
        """--ftrl-sampling one of :data:`SAMPLINGS`; poisson only with banded (--ftrl-bands
        b, the groups and the bands, whose choice trades the amplification of p = q b
        against the noise's correlation; 0: the b of least expected error,
        :func:`~fedem_private.privacy.ftrl.auto_bands`). True for poisson."""
        from fedem_private.errors import UserError

        sampling = cfg.ftrl_sampling
        if sampling not in SAMPLINGS:
            raise UserError(f"unknown --ftrl-sampling {sampling!r} (choose one of "
                            f"{', '.join(SAMPLINGS)})")
        if sampling == "cyclic":
            return False
        if cfg.ftrl_strategy != "banded":
            raise UserError(f"--ftrl-sampling poisson is for --ftrl-strategy banded, not "
                            f"{cfg.ftrl_strategy!r} (its amplification needs a b-banded C)")
        return True

    @staticmethod
    def _validate_buffers(cfg: PrivacyConfig) -> None:
        from fedem_private.errors import UserError
        from fedem_private.privacy.blt import MAX_BUFFERS

        d = cfg.ftrl_buffers
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_BUFFERS:
            raise UserError(f"--ftrl-buffers (privacy.ftrl_buffers) must be an integer in "
                            f"0..{MAX_BUFFERS}, got {d!r}")
        if d and cfg.ftrl_strategy != "blt":
            raise UserError(f"--ftrl-buffers is for --ftrl-strategy blt, not "
                            f"{cfg.ftrl_strategy!r}")

    @classmethod
    def listed(cls) -> list[tuple[str, str, str]]:
        """``fedem-private list``'s rows for its strategies: (kind, name, note)."""
        return ([("ftrl-strategy", name, f"--privacy dp-ftrl --ftrl-strategy {name}: {text}")
                 for name, text in STRATEGIES.items()]
                + [("ftrl-sampling", name, f"--privacy dp-ftrl --ftrl-sampling {name}: {text}")
                   for name, text in SAMPLINGS.items()])

    @classmethod
    def notes(cls, cfg: PrivacyConfig, rounds: int) -> list[tuple[str, str]]:
        """The cohort fraction actually used, 1/G, where it is not --sample-rate's q; a
        warning where the run ends before every cohort took part (rounds < G)."""
        from fedem_private.privacy.ftrl import groups_for

        q = float(cfg.sample_rate)
        if cfg.ftrl_sampling == "poisson":
            return []  # p = q b: the expected cohort is q n whatever b
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
        """The run's aggregation: :class:`~fedem_private.privacy.ftrl.TreeSecureSum`, or
        :class:`~fedem_private.privacy.ftrl.BandedSecureSum` for a banded plan."""
        from fedem_private.privacy.ftrl import FtrlPlan, secure_sum_for

        assert params.clip is not None and isinstance(params.ftrl, FtrlPlan)
        return secure_sum_for(params.ftrl, params.clip, params.noise_scale, expected_count,
                              seed)

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
        what the tree guarantees, to every observer (None: no guarantee). Under
        ``--ftrl-sampling poisson`` the canaries take part in every round of their group
        (none is sampled out), so what they audit is the unamplified bound, the release as
        one Gaussian at G = b; the amplification by sampling is not audited."""
        assert params.ftrl is not None
        eps = cls.release_epsilon(params, params.ftrl.rounds)
        return eps["unamplified"] if params.ftrl.sampling == "poisson" else eps["reported"]

    @classmethod
    def restore_params(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The logged plan ({rounds, groups, ...}) rebuilt as an
        :class:`~fedem_private.privacy.ftrl.FtrlPlan` (its exact sensitivities recomputed)."""
        from fedem_private.privacy.ftrl import FtrlPlan

        plan = values.get("ftrl")
        if isinstance(plan, dict):
            coefs = plan.get("coefs")
            blt = None
            if plan.get("omega") is not None:
                blt = (tuple(float(x) for x in plan["omega"]),
                       tuple(float(x) for x in plan["theta"]))
            if plan.get("sampling") == "poisson":
                assert coefs is not None
                values = {**values, "ftrl": FtrlPlan.amplified(
                    int(plan["rounds"]), int(plan["groups"]), float(plan["rate"]),
                    coefs=tuple(float(x) for x in coefs))}
                return values
            values = {**values, "ftrl": FtrlPlan.for_run(
                int(plan["rounds"]), int(plan["groups"]), str(plan.get("strategy", "tree")),
                coefs=None if coefs is None else tuple(float(x) for x in coefs), blt=blt)}
        return values

    # -- the layer's hooks for a central mechanism with its own participation -----------------
    @classmethod
    def participants(cls, params: MechanismParams, seed: int, round_: int,
                     clients: int | np.ndarray) -> np.ndarray:
        """Round ``round_``'s cohort: group (round - 1) mod G of the cyclic cohorts
        (:class:`~fedem_private.privacy.ftrl.CyclicCohorts`), sorted indices; under
        ``--ftrl-sampling poisson`` (G = b) each of its members independently with
        probability p (:func:`poisson_members`). ``clients``: each client's identity key
        (a count n: the keys 0..n-1)."""
        assert params.ftrl is not None
        if round_ < 1:
            raise ValueError(f"rounds are numbered from 1, got {round_}")
        from fedem_private import rng

        groups = params.ftrl.groups
        keys = rng.identities(clients)
        members = np.flatnonzero(_cohorts(keys, groups, int(seed))
                                 == (int(round_) - 1) % groups)
        if params.ftrl.sampling != "poisson":
            return members
        return members[poisson_members(seed, round_, keys[members], params.ftrl.rate)]

    @classmethod
    def release_epsilon(cls, params: MechanismParams, round_: int) -> dict[str, float | None]:
        """The eps of the whole release up to ``round_`` as ONE Gaussian mechanism of
        multiplier sigma / (C sqrt(S_t)) (:func:`~fedem_private.privacy.ftrl.release_multiplier`),
        every bound at the run's delta, JSON-ready (inf as None)."""
        from fedem_private.privacy.accounting import gaussian_release_bounds
        from fedem_private.privacy.ftrl import release_multiplier

        assert params.ftrl is not None
        if params.ftrl.sampling == "poisson" and round_ >= 1 and params.guarantee:
            return amplified_epsilon(params, round_)
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
        from fedem_private.privacy.ftrl import participation_multiplier

        p = layer.params
        plan, clip, sigma = p.ftrl, p.clip, p.noise_scale
        assert plan is not None and clip is not None and p.noise_multiplier is not None
        banded = plan.strategy == "banded"
        poisson = plan.sampling == "poisson"
        variant, accounting, minsep = _SUMMARY_TEXTS[plan.strategy]
        participation = {"pattern": POISSON_PARTICIPATION if poisson else PARTICIPATION,
                         "groups": plan.groups,
                         "max_participations": plan.max_participations,
                         "min_separation": plan.groups}
        if poisson:
            variant, accounting = POISSON_VARIANT, POISSON_ACCOUNTING
            participation["poisson_rate"] = plan.rate
        elif minsep is not None:
            participation["also_valid_for"] = minsep
        out.update({
            "epsilon": cls.release_epsilon(p, layer.round),
            "epsilon_ledger": out["epsilon"],
            "epsilon_view": (("observers of the released models, not told who took part "
                              "(amplification: Poisson within b-min-sep groups); none "
                              "against the aggregator, which adds the noise and sees who "
                              "took part") if poisson else
                             ("observers of the released models (no amplification); none "
                              "against the aggregator, which adds the noise")),
            **({"sampling": plan.sampling, "amplification": POISSON_AMPLIFICATION}
               if poisson else {}),
            "sample_rate": layer.cfg.sample_rate,
            "expected_participants": layer.expected_count,
            "aggregation_weights": ("uniform: sum of clipped deltas over the expected cohort "
                                    f"{'q N' if poisson else 'N / G'} (FedAvg's data-size "
                                    "weights are not used: they would raise the "
                                    "sensitivity)"),
            "participation": participation,
            "dp_ftrl": {
                "strategy": plan.strategy,
                "bands": plan.bands,
                "coefficients": list(plan.coefs) if banded else None,
                **({"buffers": plan.buffers, "omega": list(plan.omega),
                    "theta": list(plan.theta)} if plan.strategy == "blt" else {}),
                "variant": variant,
                "rounds_planned": plan.rounds,
                "rounds_released": layer.round,
                "noise_std_per_node": sigma,  # per row of C x + z for banded
                "sensitivity": p.sensitivity,
                "noise_multiplier": p.noise_multiplier,
                "participation_noise_multiplier": participation_multiplier(p),
                **({"dpsgd_equivalent": {
                    "sample_rate": plan.rate, "noise_multiplier": p.noise_multiplier,
                    "steps_planned": plan.max_participations,
                    "steps_released": math.ceil(layer.round / plan.groups)}}
                   if poisson else {}),
                "epsilon_planned": cls.release_epsilon(p, plan.rounds),
                "accounting": accounting,
            },
        })
        return out
