"""DP-FTRL by tree aggregation: the math of ``--privacy dp-ftrl`` (docs/design.md section 5).

Kairouz, McMahan, Song, Thakkar, Thakurta and Xu, "Practical and Private (Deep)
Learning without Sampling or Shuffling" (ICML 2021), Algorithm 1 (DP-FTRL) with
the binary-tree mechanism for prefix sums (Dwork, Naor, Pitassi and Rothblum
2010; Chan, Shi and Song 2011), implemented here as follows.

**Participation: cyclic cohorts.** Each client's group is a keyed function of its
identity alone (:class:`CyclicCohorts`): g(u) = floor(G U(seed, key_u)), U the keyed
uniform of the stable key of u's source id, G = ceil(1/q) (q = ``--sample-rate``, the
cohort fraction), a public constant; group (t - 1) mod G takes part in round t. A
client therefore takes part in at most k = ceil(T/G) of T rounds, exactly G rounds
apart. The schedule is a public function of the run seed and the client's identity;
it never depends on data nor on which other clients exist, so adding or removing one
user moves no other client between rounds (issue 77: the cohorts were once a
permutation cut into n/G blocks, and removing one user moved up to G - 1 others).
The group sizes are Binomial(n, 1/G), not equal.

**The tree.** Round t's leaf x_t is the sum of the round's clipped deltas (each
L2 <= C). The tree's node e (e = 1, 2, ..., one per round) is the dyadic interval
[e - lowbit(e) + 1, e], lowbit(e) = e & -e (a Fenwick tree, eq. (1) below); its
noisy value is the sum of its leaves plus xi_e ~ N(0, sigma^2 I), a fresh draw keyed
by (run seed, node) (:func:`node_noise`). The prefix [1, t] is covered by the nodes of
the chain c(t) = t, t - lowbit(t), ... > 0 (popcount(t) <= floor(log2 t) + 1 nodes),
so the released noisy prefix sum is

    P~_t = sum_{s <= t} x_s + N_t,   N_t = sum_{e in c(t)} xi_e.          (2)

Node e is first used at round e, so releasing P~_1..P~_T is a bijective linear
map of releasing the T noisy nodes: the release IS the Gaussian mechanism on the
vector of node sums with i.i.d. noise sigma per entry.

**FTRL.** The model after round t is theta_t = theta_0 + P~_t / m with m the public
divisor (the layer's ``expected_count``: q N, N = ``--public-population`` or, unset, the
run's number of users, which the guarantee then takes as public) and server learning
rate 1: with no noise this is FedAvg with uniform weights and server rate 1. The server
is handed the increment theta_t = theta_{t-1} + (x_t + N_t - N_{t-1}) / m
(:class:`TreeSecureSum`), which equals theta_0 + P~_t / m whenever theta_{t-1} is the
previous release, and is post-processing of P~ in any case. The noise increment N_t -
N_{t-1} is data-free, so the aggregator needs no private state between rounds beyond the
secret node noise (regenerated from its key). Variant: the plain online tree, **no**
restarts and no Honaker variance reduction. Should the released table change shape (a
FedPEFT codec's warm-up ending), the new shape gets its own tree over the same round
indices (noise keyed by (seed, phase, node)), whose leaves before the switch are
zero: every node is still released in exactly one phase with at most the counts
below, so the bound holds unchanged.

**Sensitivity** (add/remove one client's whole data; the other clients' deltas
are unchanged because every release is shared public state). A client in group g
changes node e by the sum of its <= n_e(g) clipped deltas in e, where n_e(g) counts
the rounds of [e - lowbit(e) + 1, e] that are group g's. Its L2 change of the whole
node vector is at most C sqrt(s2_T(g)), s2_t(g) = sum_{e <= t} n_e(g)^2, with equality
when all its deltas are one vector of norm C (:func:`tree_squared_sensitivity`). For one
participation (G >= T) s2 = floor(log2 T) + 1 <= ceil(log2 T) + 1 (the paper's depth).
For k > 1 participations the tempting sqrt(k (log2 T + 1)) C is NOT a bound: two
leaves share ancestors (T = 2, both rounds: nodes (x1, x1 + x2) give 1 + 4 = 5 > 4);
the triangle inequality gives k sqrt(log2 T + 1) C, and the exact s2_T(g) above lies
between. :func:`tree_squared_sensitivity` computes it exactly in O(T G).

**Accounting.** The release up to round t is ONE Gaussian mechanism of multiplier
z_t = sigma / (C sqrt(S_t)), S_t = max_g s2_t(g) (rho = 1 / (2 z_t^2) zCDP); it is
reported at every round (:func:`release_multiplier`) and calibrated at t = T: sigma =
z C sqrt(S_T) with z the multiplier of one Gaussian release at the target (eps, delta)
(:func:`ftrl_params`). The per-client ledger (privacy_ledger.json) charges each
participation a Gaussian of multiplier z_p = sigma / (C sqrt(r)), with
r = max over prefixes t <= T and groups g of s2_t(g) / k_t(g) (k_t(g): g's participations
up to t): a client's k_t participations compose to z_p / sqrt(k_t) <= sigma / (C
sqrt(s2_t(g))), so its figure is a valid, more conservative upper bound at every round
(r k_max exceeds S_T by 10 to 25% at T = 100). No amplification by sampling or
shuffling is claimed.

**Strategies** (``--ftrl-strategy``, issue 81). The tree above is one factorisation of the
prefix sums; ``banded`` is another, a b-banded lower-triangular Toeplitz C with b <= G
(:mod:`fedem_private.privacy.mf`: the noise w = C^{-1} z streamed in O(b) memory, every
z_t N(0, sigma^2) keyed like node t, and the exact sensitivity, which for b <= G is also
that of any (k, G)-min-separated participation); ``blt`` a buffered-linear-Toeplitz C
(:mod:`fedem_private.privacy.blt`: c_k = sum_j omega_j theta_j^{k-1}, the noise streamed
through d buffers whatever G, and the exact sensitivity for non-negative, non-increasing
coefficients, again that of any (k, G)-min-separated participation). Everything else
above (participation, the release as ONE Gaussian of multiplier sigma / (C sqrt(S_t)),
calibration at T, the ledger's r) is the same, S_t and r being the strategy's
(:class:`FtrlPlan`).

**Amplified banded** (``--ftrl-sampling poisson``, issue 81): the banded strategy with b
groups instead of G cohorts, each member of round t's group in with probability p = q b,
accounted as DP-SGD with Poisson sampling at p over ceil(T/b) steps (Choquette-Choo et al.,
NeurIPS 2023; :func:`amplified_params`, :meth:`FtrlPlan.amplified`). Its plan keeps the
cyclic S_t and r at G = b: the unamplified bound and the ledger's charge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from fedem_private import rng
from fedem_private.privacy.central import AGGREGATE_KEY, SecureSum

if TYPE_CHECKING:
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.params import MechanismParams

# the client-id key of the tree's node noise, phase p at FTRL_NODE_KEY + p (no real client,
# nor cdp-gaussian's AGGREGATE_KEY and COUNT_KEY, has it); the round slot of the key is the
# node e
FTRL_NODE_KEY = AGGREGATE_KEY << 1
# the round slot that keys the cohort permutation (no real round has it)
COHORT_ROUND = 1 << 40


# ------------------------------------------------------------------------------ the tree
def lowbit(t: int) -> int:
    """The lowest set bit of t >= 1: node t covers ``lowbit(t)`` rounds."""
    if t < 1:
        raise ValueError(f"rounds are numbered from 1, got {t}")
    return t & -t


def node_start(node: int) -> int:
    """The first round of node ``node``'s dyadic interval [e - lowbit(e) + 1, e] (eq. (1))."""
    return node - lowbit(node) + 1


def covering_nodes(t: int) -> tuple[int, ...]:
    """The nodes whose intervals partition the prefix [1, t]: t, t - lowbit(t), ... > 0
    (the chain c(t) of eq. (2)), latest first."""
    out = []
    while t > 0:
        out.append(t)
        t -= lowbit(t)
    return tuple(out)


def groups_for(sample_rate: float) -> int:
    """G = ceil(1/q): the number of cyclic cohorts for the cohort fraction q."""
    q = float(sample_rate)
    if not 0 < q <= 1:
        raise ValueError(f"the cohort fraction must be in (0, 1], got {q}")
    return max(1, math.ceil(1.0 / q - 1e-9))


def node_counts(rounds: int, groups: int) -> np.ndarray:
    """n_e(g): how many rounds of node e's interval belong to group g, an int64 (T, G)
    array (row e - 1). Round t belongs to group (t - 1) mod G."""
    T, G = int(rounds), int(groups)
    out = np.zeros((T, G), dtype=np.int64)
    g = np.arange(G)
    for e in range(1, T + 1):
        a, length = node_start(e), lowbit(e)
        # rounds a .. e: offsets (t - 1) mod G run from (a - 1) mod G for ``length`` steps
        full, rest = divmod(length, G)
        out[e - 1] = full + (((g - (a - 1)) % G) < rest)
    return out


@functools.lru_cache(maxsize=16)
def _curves(rounds: int, groups: int) -> tuple[np.ndarray, float, int]:
    """(S_1..S_T with S_t = max_g s2_t(g), r, k_max): see :func:`tree_squared_sensitivity`."""
    T, G = int(rounds), int(groups)
    if T < 1 or G < 1:
        raise ValueError(f"need rounds >= 1 and groups >= 1, got {T}, {G}")
    s2 = np.zeros(G, dtype=np.float64)
    k = np.zeros(G, dtype=np.int64)
    g = np.arange(G)
    curve = np.empty(T, dtype=np.float64)
    ratio = 0.0
    for e in range(1, T + 1):
        a, length = node_start(e), lowbit(e)
        full, rest = divmod(length, G)
        n = full + (((g - (a - 1)) % G) < rest)
        s2 += n.astype(np.float64) ** 2  # node e is released from round e on
        k[(e - 1) % G] += 1
        seen = k > 0
        ratio = max(ratio, float((s2[seen] / k[seen]).max()))
        curve[e - 1] = s2.max()
    curve.setflags(write=False)
    return curve, ratio, int(k.max())


def tree_squared_sensitivity(rounds: int, groups: int) -> tuple[float, float, int]:
    """(S_T, r, k_max) for cyclic cohorts (module docstring), in units of C^2.

    s2_t(g) = sum_{e <= t} n_e(g)^2 is the squared L2 change of the node vector released
    up to round t when a client of group g, with all its clipped deltas equal to one
    vector of norm C, is added (the worst case: |sum of its deltas in e| <= n_e(g) C);
    S_t = max_g s2_t(g) is the release's squared sensitivity up to t;
    r = max_{t <= T, g: k_t(g) > 0} s2_t(g) / k_t(g) is the ledger's per-participation
    charge and k_max = ceil(T / G) the most participations. Exact; O(T G) time, O(G + T)
    memory (cached per (T, G)).
    """
    curve, ratio, k_max = _curves(int(rounds), int(groups))
    return float(curve[-1]), ratio, k_max


def node_noise(shape: tuple[int, ...] | torch.Size, sigma: float, *, seed: int, node: int,
               phase: int = 0) -> torch.Tensor:
    """xi_e ~ N(0, sigma^2 I) of node ``node`` (float64, CPU), a function of (seed, phase,
    node) alone (keyed through :func:`fedem_private.rng.client_noise`): the same numbers
    whatever the chunking, the device or the round it is drawn in."""
    n = math.prod(shape)
    noise = rng.client_noise(seed, int(node), np.array([FTRL_NODE_KEY + int(phase)]), n,
                             "gaussian", float(sigma), stream=rng.Stream.CENTRAL_NOISE)
    return noise.reshape(tuple(shape))


def prefix_noise(shape: tuple[int, ...] | torch.Size, sigma: float, *, seed: int, round_: int,
                 phase: int = 0) -> torch.Tensor:
    """N_t = sum of the noise of the nodes covering [1, t] (eq. (2)); zeros for t = 0."""
    out = torch.zeros(tuple(shape), dtype=torch.float64)
    if sigma > 0:
        for e in covering_nodes(int(round_)):
            out += node_noise(shape, sigma, seed=seed, node=e, phase=phase)
    return out


# ------------------------------------------------------------------- participation
@dataclass(frozen=True)
class CyclicCohorts:
    """The fixed cohorts of DP-FTRL's participation pattern (module docstring).

    Client u's group is floor(G U), U the keyed uniform of (seed, PARTICIPATION,
    COHORT_ROUND, key_u) and key_u the stable key of its source id
    (``Split.source_users``): a function of u's identity alone, so no other user's
    presence moves it. Group (t - 1) mod G takes part in round t; each client takes part
    every G rounds, at most ceil(T/G) times in T rounds. Public: a function of the seed
    and the identities only.
    """

    groups: int
    seed: int

    def group_of(self, keys: np.ndarray) -> np.ndarray:
        """The group of each client of identity ``keys``, an int64 array."""
        keys = np.asarray(keys, dtype=np.int64)
        u = rng.uniform(rng.key(self.seed, rng.Stream.PARTICIPATION, COHORT_ROUND, keys), 0)
        return rng.randbelow(u, int(self.groups))

    def participants(self, keys: np.ndarray, round_: int) -> np.ndarray:
        """The sorted indices (into ``keys``) of round ``round_``'s cohort, group
        (round - 1) mod G."""
        if round_ < 1:
            raise ValueError(f"rounds are numbered from 1, got {round_}")
        return np.flatnonzero(self.group_of(keys) == (int(round_) - 1) % int(self.groups))


# ------------------------------------------------------------------------- the plan
@functools.lru_cache(maxsize=16)
def _banded_curves(rounds: int, groups: int, coefs: tuple[float, ...]
                   ) -> tuple[np.ndarray, float, int]:
    from fedem_private.privacy import mf

    return mf.cyclic_squared_curve(np.asarray(coefs), rounds, groups)


def default_bands(rounds: int, groups: int) -> int:
    """b = min(G, T): the most bands whose columns never overlap for one cohort."""
    return max(1, min(int(groups), int(rounds)))


@functools.lru_cache(maxsize=16)
def _blt_curves(rounds: int, groups: int, omega: tuple[float, ...], theta: tuple[float, ...]
                ) -> tuple[np.ndarray, float, int]:
    from fedem_private.privacy import blt

    return blt.cyclic_squared_curve(omega, theta, rounds, groups)


@dataclass(frozen=True)
class FtrlPlan:
    """The strategy and participation pattern a run is accounted for (module docstring).

    ``strategy`` is "tree", "banded" (``coefs``: the banded C's c_0..c_{b-1}) or "blt"
    (``omega``, ``theta``: its d weights and decays, :mod:`fedem_private.privacy.blt`);
    the fields of the other strategies stay empty. ``tree_sq`` = S_T = max_g s2_T(g) is
    the whole release's squared sensitivity and ``participation_sq`` = r the ledger's per
    participation, both in units of C^2, whichever the strategy; ``max_participations`` =
    ceil(T/G). The whole release's L2 sensitivity is C sqrt(tree_sq) (what is reported);
    the per-client ledger's bound at T is that of C sqrt(r k_max) >= it (conservative,
    valid at every round).
    """

    rounds: int
    groups: int
    tree_sq: float
    participation_sq: float
    max_participations: int
    strategy: str = "tree"
    coefs: tuple[float, ...] = ()
    omega: tuple[float, ...] = ()
    theta: tuple[float, ...] = ()
    sampling: str = "cyclic"
    rate: float = 1.0

    @classmethod
    def amplified(cls, rounds: int, bands: int, rate: float,
                  coefs: tuple[float, ...] | None = None) -> FtrlPlan:
        """A banded plan under ``--ftrl-sampling poisson`` (:func:`amplified_params`): b =
        ``bands`` groups of b-min-sep sampling, each member of round t's group in with
        probability p = ``rate``; the b-banded C optimised by ``mf.optimise_banded(T, b,
        b)`` unless ``coefs`` are given. ``tree_sq`` and ``participation_sq`` are the
        cyclic ones at G = b: the unamplified bound of a client present in every round of
        its group (the per-client ledger's)."""
        T, b = int(rounds), int(bands)
        if coefs is None:
            from fedem_private.privacy import mf

            coefs = mf.optimise_banded(T, b, b)
        coefs = tuple(float(x) for x in coefs)
        if len(coefs) != b:
            raise ValueError(f"an amplified plan has b = {b} bands, got {len(coefs)} coefs")
        curve, ratio, k_max = _banded_curves(T, b, coefs)
        return cls(T, b, float(curve[-1]), ratio, k_max, "banded", coefs,
                   sampling="poisson", rate=float(rate))

    @property
    def column_sq(self) -> float:
        """||c||^2: the largest squared column norm of a banded C (its first column, whole
        since b <= T), in units of C^2; the amplified accounting's per-participation
        sensitivity."""
        return float(sum(x * x for x in self.coefs))

    @classmethod
    def for_run(cls, rounds: int, groups: int, strategy: str = "tree",
                bands: int | None = None, coefs: tuple[float, ...] | None = None,
                buffers: int | None = None,
                blt: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> FtrlPlan:
        """The plan of ``strategy`` for T = ``rounds`` and G = ``groups``; a banded one
        optimised for (T, b, G) (b = ``bands``, default :func:`default_bands`) unless its
        ``coefs`` are given, a BLT one for (T, d, G) (d = ``buffers``, default
        ``blt.DEFAULT_BUFFERS``) unless its ``blt`` = (omega, theta) are given (a logged
        plan read back)."""
        if strategy == "tree":
            tree_sq, ratio, k_max = tree_squared_sensitivity(rounds, groups)
            return cls(int(rounds), int(groups), tree_sq, ratio, k_max)
        if strategy == "blt":
            return cls._blt(int(rounds), int(groups), buffers, blt)
        if strategy != "banded":
            raise ValueError(f"unknown dp-ftrl strategy {strategy!r}")
        if coefs is None:
            from fedem_private.privacy import mf

            b = default_bands(rounds, groups) if bands is None else int(bands)
            coefs = mf.optimise_banded(int(rounds), b, int(groups))
        coefs = tuple(float(x) for x in coefs)
        curve, ratio, k_max = _banded_curves(int(rounds), int(groups), coefs)
        return cls(int(rounds), int(groups), float(curve[-1]), ratio, k_max, "banded", coefs)

    @classmethod
    def _blt(cls, rounds: int, groups: int, buffers: int | None,
             params: tuple[tuple[float, ...], tuple[float, ...]] | None) -> FtrlPlan:
        from fedem_private.privacy import blt

        if params is None:
            d = blt.DEFAULT_BUFFERS if not buffers else int(buffers)
            params = blt.optimise_blt(rounds, d, groups)
        omega, theta = (tuple(float(x) for x in part) for part in params)
        curve, ratio, k_max = _blt_curves(rounds, groups, omega, theta)
        return cls(rounds, groups, float(curve[-1]), ratio, k_max, "blt", omega=omega,
                   theta=theta)

    @property
    def bands(self) -> int | None:
        """b of a banded plan; None for the others."""
        return len(self.coefs) if self.strategy == "banded" else None

    @property
    def buffers(self) -> int | None:
        """d of a BLT plan; None for the others."""
        return len(self.omega) if self.strategy == "blt" else None

    def toeplitz_coefs(self, n: int) -> np.ndarray:
        """c_0..c_{n-1} of a banded or BLT plan's C (zeros past a banded one's b)."""
        if self.strategy == "blt":
            from fedem_private.privacy import blt

            return blt.blt_coefs(self.omega, self.theta, n)
        if self.strategy != "banded":
            raise ValueError("the tree is not a Toeplitz factorisation")
        out = np.zeros(int(n), dtype=np.float64)
        out[: min(len(self.coefs), int(n))] = self.coefs[: int(n)]
        return out

    def squared_at(self, round_: int) -> float:
        """S_t = max_g s2_t(g): the squared sensitivity (units of C^2) of the release up to
        round ``round_`` <= T (it does not depend on the rounds after it)."""
        if not 1 <= round_ <= self.rounds:
            raise ValueError(f"round {round_} outside the planned 1..{self.rounds}")
        if self.strategy == "banded":
            curve = _banded_curves(self.rounds, self.groups, self.coefs)[0]
        elif self.strategy == "blt":
            curve = _blt_curves(self.rounds, self.groups, self.omega, self.theta)[0]
        else:
            curve = _curves(self.rounds, self.groups)[0]
        return float(curve[int(round_) - 1])

    def as_log(self) -> dict[str, float | int]:
        out = {"rounds": self.rounds, "groups": self.groups, "tree_sq": self.tree_sq,
               "participation_sq": self.participation_sq,
               "max_participations": self.max_participations}
        if self.strategy == "banded":  # a tree plan logs as before issue 81
            out.update({"strategy": self.strategy, "bands": len(self.coefs),
                        "coefs": list(self.coefs)})
            if self.sampling == "poisson":  # a cyclic plan logs as before
                out.update({"sampling": self.sampling, "rate": self.rate})
        elif self.strategy == "blt":
            out.update({"strategy": self.strategy, "buffers": len(self.omega),
                        "omega": list(self.omega), "theta": list(self.theta)})
        return out


# ------------------------------------------------------------------- the secure sum
class TreeSecureSum(SecureSum):
    """One run's DP-FTRL aggregation: each round's clipped sum plus the tree's noise
    increment, released as theta_{t-1} + (x_t + N_t - N_{t-1}) / m (module docstring).

    Mechanism dp-ftrl. Neighbouring relation: user-level add/remove of one client's
    whole data. Trust model: the clipped deltas are summed under secure aggregation (or
    by a trusted server) and the aggregator adds the data-free noise increment; the node
    noise stays secret. Sensitivity: one round's sum moves by at most C (what the
    neighbour-world harness checks); the whole tree release by C sqrt(max_g s2_T(g))
    (:func:`tree_squared_sensitivity`). ``sigma`` is the noise std of every node.
    """

    def __init__(self, clip: float, sigma: float, expected_count: float, seed: int,
                 rounds: int) -> None:
        super().__init__(clip, sigma / clip if clip > 0 else 0.0, expected_count, seed)
        self.sigma = float(sigma)
        self.rounds = int(rounds)
        # per released shape (a phase): its index and the last round it released (N_prev)
        self._phases: dict[tuple[int, ...], tuple[int, int]] = {}

    def prefix_noise(self, shape: tuple[int, ...], round_: int) -> torch.Tensor:
        """N_t of the phase of ``shape`` (0 before its first release)."""
        phase = self._phases.get(shape, (len(self._phases), 0))[0]
        return prefix_noise(shape, self.sigma, seed=self.seed, round_=round_, phase=phase)

    def _noise_increment(self, shape: tuple[int, ...], phase: int, last: int,
                         t: int) -> torch.Tensor:
        """N_t - N_last of the phase (N_0 = 0): the data-free noise of the increment."""
        noise = prefix_noise(shape, self.sigma, seed=self.seed, round_=t, phase=phase)
        if last:
            noise -= prefix_noise(shape, self.sigma, seed=self.seed, round_=last, phase=phase)
        return noise

    def release(self, base: torch.Tensor) -> torch.Tensor:
        """The new encoded global: ``base`` + (x_t + N_t - N_prev) / m, in ``base``'s dtype.

        x_t is the round's sum of clipped deltas (zero with no participant); N_prev is the
        phase's prefix noise at the round it last released (0 for its first)."""
        t = self.round
        if not 1 <= t <= self.rounds:
            raise RuntimeError(f"dp-ftrl was accounted for rounds 1..{self.rounds}, not {t}")
        delta_sum = self._sum if self._sum is not None else torch.zeros_like(
            base, dtype=torch.float64)
        if delta_sum.shape != base.shape:
            raise ValueError(f"sum {tuple(delta_sum.shape)} and base {tuple(base.shape)} differ")
        if self._sum is not None:  # the log's noise-to-signal; not released
            self.stats.signal_abs_sum = float(self._sum.abs().sum())
            self.stats.signal_entries = int(torch.count_nonzero(self._sum))
        shape = tuple(delta_sum.shape)
        phase, last = self._phases.get(shape, (len(self._phases), 0))
        increment = delta_sum.detach().to(torch.float64, copy=True)
        if self.sigma > 0:
            increment.add_(self._noise_increment(shape, phase, last, t).to(increment.device))
        self._phases[shape] = (phase, t)
        self._sum = None
        increment.div_(self.expected_count)
        return (base.detach().to(torch.float64) + increment).to(base.dtype)


class NoiseStream(Protocol):
    """w = C^{-1} z streamed round by round (:class:`~fedem_private.privacy.mf.BandedNoise`,
    :class:`~fedem_private.privacy.blt.BLTNoise`): ``round`` steps taken so far."""

    round: int

    def step(self, z: torch.Tensor) -> torch.Tensor:
        """w_t from z_t, t = ``round`` + 1."""
        ...


class BandedSecureSum(TreeSecureSum):
    """One run's banded DP-FTRL aggregation (``--ftrl-strategy banded``): each round's
    clipped sum plus w_t = (C^{-1} z)_t, released as theta_{t-1} + (x_t + w_t) / m, so
    that theta_t = theta_0 + (A x + B z)_t / m with B = A C^{-1}
    (:mod:`fedem_private.privacy.mf`).

    Mechanism dp-ftrl, strategy banded. Neighbouring relation: user-level add/remove of
    one client's whole data. Trust model: as :class:`TreeSecureSum` (secure aggregation or
    a trusted server sums the clipped deltas; the aggregator adds the data-free noise,
    whose z stays secret). Sensitivity: one round's sum moves by at most C (the
    neighbour-world harness); the whole release C x + z by C sqrt(S_T) (the plan's,
    :func:`fedem_private.privacy.mf.cyclic_squared_curve`). ``sigma`` is every z_t's std.
    State: per released shape, the last b - 1 vectors w (O(b) memory; pickled with the
    run, so a resumed run continues the same noise).
    """

    def __init__(self, clip: float, sigma: float, expected_count: float, seed: int,
                 rounds: int, coefs: tuple[float, ...]) -> None:
        super().__init__(clip, sigma, expected_count, seed, rounds)
        self.coefs = tuple(float(x) for x in coefs)
        self._streams: dict[int, NoiseStream] = {}  # phase -> its noise stream

    def _noise_increment(self, shape: tuple[int, ...], phase: int, last: int,
                         t: int) -> torch.Tensor:
        """w_{last+1} + ... + w_t of the phase (rounds it did not release count as leaves
        of zero, their noise still summed): the prefix noise (B z)_t - (B z)_last."""
        stream = self._streams.get(phase)
        if stream is None:
            stream = self._streams[phase] = self._new_stream()
        assert stream.round == last
        out = torch.zeros(shape, dtype=torch.float64)
        for r in range(last + 1, t + 1):
            out += stream.step(node_noise(shape, self.sigma, seed=self.seed, node=r,
                                          phase=phase))
        return out

    def _new_stream(self) -> NoiseStream:
        """A fresh noise stream for a new phase: :class:`~fedem_private.privacy.mf.BandedNoise`."""
        from fedem_private.privacy.mf import BandedNoise

        return BandedNoise(self.coefs)


class BLTSecureSum(BandedSecureSum):
    """One run's BLT DP-FTRL aggregation (``--ftrl-strategy blt``): as
    :class:`BandedSecureSum`, with w = C^{-1} z streamed through d buffers
    (:class:`fedem_private.privacy.blt.BLTNoise`, eq. (2) there).

    Mechanism dp-ftrl, strategy blt. Neighbouring relation: user-level add/remove of one
    client's whole data. Trust model: as :class:`TreeSecureSum` (secure aggregation or a
    trusted server sums the clipped deltas; the aggregator adds the data-free noise, whose
    z stays secret). Sensitivity: one round's sum moves by at most C (the neighbour-world
    harness); the whole release C x + z by C sqrt(S_T) (the plan's,
    :func:`fedem_private.privacy.blt.cyclic_squared_curve`, exact since the BLT's
    coefficients are non-negative and non-increasing). ``sigma`` is every z_t's std. State:
    per released shape, the d buffers (O(d) memory; pickled with the run)."""

    def __init__(self, clip: float, sigma: float, expected_count: float, seed: int,
                 rounds: int, omega: tuple[float, ...], theta: tuple[float, ...]) -> None:
        # coefs (1.0,) is unused: the streams are BLTNoise (:meth:`_new_stream`)
        super().__init__(clip, sigma, expected_count, seed, rounds, coefs=(1.0,))
        self.omega = tuple(float(x) for x in omega)
        self.theta = tuple(float(x) for x in theta)

    def _new_stream(self) -> NoiseStream:
        """A fresh :class:`~fedem_private.privacy.blt.BLTNoise` (zero buffers)."""
        from fedem_private.privacy.blt import BLTNoise

        return BLTNoise(self.omega, self.theta)


def secure_sum_for(plan: FtrlPlan, clip: float, sigma: float, expected_count: float,
                   seed: int) -> TreeSecureSum:
    """The secure sum of ``plan``'s strategy."""
    if plan.strategy == "banded":
        return BandedSecureSum(clip, sigma, expected_count, seed, plan.rounds, plan.coefs)
    if plan.strategy == "blt":
        return BLTSecureSum(clip, sigma, expected_count, seed, plan.rounds, plan.omega,
                            plan.theta)
    return TreeSecureSum(clip, sigma, expected_count, seed, plan.rounds)


# ---------------------------------------------------------------------- calibration
def ftrl_params(cfg: PrivacyConfig, rounds: int) -> MechanismParams:
    """dp-ftrl's parameters for ``rounds`` planned rounds (module docstring, "Accounting").

    G = ceil(1/q) cohorts (q = ``cfg.sample_rate``); the plan's S_T gives the whole
    release's sensitivity C sqrt(S_T). Its multiplier z is ``cfg.noise_multiplier``, or the
    smallest z for which ONE Gaussian release is (``cfg.epsilon``, ``cfg.delta``)-DP by
    ``cfg.accountant`` (no composition over rounds: the tree is one mechanism; no
    amplification). Every node's std is sigma = z C sqrt(S_T). ``epsilon_round`` is one
    participation's eps as the ledger charges it (:func:`participation_multiplier`), and
    ``sample_rate`` becomes 1/G, so that the layer's expected count q N is the FTRL
    divisor m = N / G (N the public population).
    """
    from fedem_private.privacy.accounting import gaussian_epsilon
    from fedem_private.privacy.calibration import gaussian_noise_multiplier
    from fedem_private.privacy.params import MechanismParams

    if cfg.ftrl_sampling == "poisson":
        return amplified_params(cfg, rounds)
    groups = groups_for(cfg.sample_rate)
    check_bands(cfg.ftrl_bands, cfg.sample_rate)  # q final here (--cohort-size K: K / n)
    if cfg.ftrl_bands > rounds:
        from fedem_private.errors import UserError

        raise UserError(f"--ftrl-bands {cfg.ftrl_bands}: at most the {rounds} planned rounds")
    if cfg.ftrl_buffers > rounds:
        from fedem_private.errors import UserError

        raise UserError(f"--ftrl-buffers {cfg.ftrl_buffers}: at most the {rounds} planned "
                        f"rounds")
    plan = FtrlPlan.for_run(rounds, groups, cfg.ftrl_strategy, cfg.ftrl_bands or None,
                            buffers=cfg.ftrl_buffers or None)
    clip = float(cfg.clip)
    if cfg.noise_multiplier is not None:
        z = float(cfg.noise_multiplier)
    else:
        assert cfg.epsilon is not None
        z = gaussian_noise_multiplier(cfg.epsilon, cfg.delta, 1, cfg.accountant)
    sensitivity = clip * math.sqrt(plan.tree_sq)
    z_part = z * math.sqrt(plan.tree_sq / plan.participation_sq)
    eps_round = math.inf if z == 0 else gaussian_epsilon(1.0 / z_part, cfg.delta)
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm="l2", clip=clip, sensitivity=sensitivity,
        noise_kind="gaussian", noise_scale=z * sensitivity, noise_multiplier=z,
        epsilon_round=eps_round, sample_rate=1.0 / plan.groups, ftrl=plan,
    )


def check_bands(bands: int, rate: float) -> None:
    """UserError unless the cyclic cohorts' bands b are at most G = ceil(1/q): a client
    returns every G rounds, and more bands would overlap its columns (the banded
    sensitivity is exact only for b <= G)."""
    groups = groups_for(rate)
    if bands > groups:
        from fedem_private.errors import UserError

        raise UserError(f"--ftrl-bands {bands}: at most G = ceil(1/q) = {groups} bands under "
                        f"a rate q = {rate:g} a round (--sample-rate, or --cohort-size K / n; "
                        f"a client returns every G rounds; more bands would overlap its "
                        f"columns)")


#: the band counts ``--ftrl-bands 0`` compares under ``--ftrl-sampling poisson`` (those
#: allowed: b <= T and q b <= 1); a coarse grid, since each costs one calibration of z
AUTO_BANDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def amplified_error(rounds: int, bands: int, rate: float, epsilon: float, delta: float,
                    accountant: str = "pld") -> float:
    """The total squared error of the T noisy prefix sums of amplified banded MF with b =
    ``bands``, per coordinate and in units of C^2: z_b^2 ||c_b||^2 ||B_b||_F^2, where z_b
    calibrates ceil(T/b) Poisson-subsampled Gaussians at p = q b (q = ``rate``) to
    (``epsilon``, ``delta``) (:func:`amplified_params`), c_b are ``mf.optimise_banded(T, b,
    b)`` and ||B||_F^2 = sum_i (T - i) e_i^2 (:func:`~fedem_private.privacy.mf.
    decoder_squared_norm`; the objective of Choquette-Choo et al. 2023, section 4). A
    function of public quantities only (T, q, eps, delta): choosing b by it spends no
    privacy. b = 1 is DP-FedAvg's own error, z_1^2 T (T + 1) / 2."""
    from fedem_private.privacy import mf
    from fedem_private.privacy.calibration import dpfedavg_noise_multiplier

    T, b = int(rounds), int(bands)
    z = dpfedavg_noise_multiplier(epsilon, delta, float(rate) * b, math.ceil(T / b),
                                  accountant)
    coefs = mf.optimise_banded(T, b, b)
    return z * z * float(sum(x * x for x in coefs)) * mf.decoder_squared_norm(coefs, T)


@functools.lru_cache(maxsize=64)
def auto_bands(rounds: int, rate: float, epsilon: float, delta: float,
               accountant: str = "pld") -> int:
    """``--ftrl-bands 0`` under ``--ftrl-sampling poisson``: the b of :data:`AUTO_BANDS`
    (1 <= b <= T, q b <= 1) of least :func:`amplified_error`, the smallest on a tie.
    Deterministic and privacy-free (public T, q, eps, delta only). b = 1 is DP-FedAvg
    (Poisson at q, C = I), so the choice is never worse than DP-FedAvg by this measure."""
    T, q = int(rounds), float(rate)
    allowed = [b for b in AUTO_BANDS if b <= T and q * b <= 1 + 1e-9]
    errors = {b: amplified_error(T, b, q, epsilon, delta, accountant) for b in allowed}
    return min(allowed, key=lambda b: (errors[b], b))


def amplified_rate(cfg: PrivacyConfig, rounds: int) -> tuple[int, float]:
    """(b, p) of ``--ftrl-sampling poisson``: b = ``--ftrl-bands`` groups and bands (0: the b
    of least expected error, :func:`auto_bands`, which needs ``--epsilon``), p = q b (q =
    ``cfg.sample_rate``, the expected fraction of clients a round, K / n under
    ``--cohort-size`` K), so that the expected cohort n p / b is q n. UserError unless
    1 <= b <= T and p <= 1."""
    from fedem_private.errors import UserError

    b, q = int(cfg.ftrl_bands), float(cfg.sample_rate)
    if b == 0:
        if cfg.epsilon is None or cfg.noise_multiplier is not None:
            raise UserError("--ftrl-sampling poisson with --ftrl-bands 0 (b by expected "
                            "error) needs --epsilon, not --noise-multiplier: the error is "
                            "compared at the same eps; give --ftrl-bands b otherwise")
        b = auto_bands(int(rounds), q, float(cfg.epsilon), float(cfg.delta), cfg.accountant)
    if not 1 <= b <= rounds:
        raise UserError(f"--ftrl-sampling poisson needs --ftrl-bands b in 1..{rounds} (the "
                        f"planned rounds), got {b}")
    p = q * b
    if p > 1 + 1e-9:
        raise UserError(f"--ftrl-sampling poisson: --ftrl-bands {b} groups at a rate of "
                        f"{q:g} a round need p = q b = {p:g} <= 1: give at most "
                        f"{max(1, math.floor(1 / q + 1e-9))} bands")
    return b, min(p, 1.0)


def amplified_params(cfg: PrivacyConfig, rounds: int) -> MechanismParams:
    """dp-ftrl's parameters under ``--ftrl-sampling poisson`` (amplified banded MF).

    Choquette-Choo, McMahan, Rush, Thakurta et al., "(Amplified) Banded Matrix
    Factorization: A unified approach to private training" (NeurIPS 2023), Theorem 4:
    for a b-banded lower-triangular C whose columns have L2 norm at most 1 and b-min-sep
    sampling (a fixed partition into b groups; in step t only group t mod b may take part,
    each member independently with probability p), the matrix mechanism with noise
    N(0, sigma^2) per entry of C x + z is as private as DP-SGD with Poisson sampling at p
    and noise multiplier sigma run for ceil(T/b) steps: one client's columns are >= b
    apart, so their rows never overlap and each participation is an independent
    sampled Gaussian (also for adaptively chosen x). Here the columns are normalised by
    the largest, ||c|| (the first: c_0 = 1, the others no longer): z = sigma / (C ||c||)
    is the DP-SGD multiplier, C the clip. Neighbouring relation: add/remove of one
    client's whole data (the Poisson accounting's; replace-one is not claimed). Trust
    model: central, as the cyclic cohorts (the aggregator adds the noise and sees who
    took part; the amplified eps is for observers of the released models who are not
    told who took part). z is ``cfg.noise_multiplier``, or the smallest z for which
    ceil(T/b) compositions of the Poisson-subsampled Gaussian at p are (eps, delta)-DP by
    ``cfg.accountant`` (pld or rdp; :func:`~fedem_private.privacy.calibration.
    dpfedavg_noise_multiplier`, the path cdp-gaussian calibrates on). sigma = z C ||c||;
    ``sample_rate`` becomes p / b, so that the layer's divisor q N is the expected cohort.
    """
    from fedem_private.privacy.accounting import gaussian_epsilon
    from fedem_private.privacy.calibration import dpfedavg_noise_multiplier
    from fedem_private.privacy.params import MechanismParams

    b, p = amplified_rate(cfg, rounds)
    plan = FtrlPlan.amplified(rounds, b, p)
    clip = float(cfg.clip)
    if cfg.noise_multiplier is not None:
        z = float(cfg.noise_multiplier)
    else:
        assert cfg.epsilon is not None
        z = dpfedavg_noise_multiplier(cfg.epsilon, cfg.delta, p,
                                      plan.max_participations, cfg.accountant)
    sensitivity = clip * math.sqrt(plan.column_sq)
    eps_round = math.inf if z == 0 else gaussian_epsilon(
        math.sqrt(plan.participation_sq / plan.column_sq) / z, cfg.delta)
    return MechanismParams(
        mode=cfg.mode, delta=cfg.delta, norm="l2", clip=clip, sensitivity=sensitivity,
        noise_kind="gaussian", noise_scale=z * sensitivity, noise_multiplier=z,
        epsilon_round=eps_round, sample_rate=p / b, ftrl=plan,
    )


def participation_multiplier(params: MechanismParams) -> float:
    """z_p = sigma / (C sqrt(r)): what the per-client ledger charges one participation (k
    of them compose to z_p / sqrt(k), a valid bound at every round, module docstring;
    unamplified, also under ``--ftrl-sampling poisson``)."""
    assert params.ftrl is not None and params.noise_multiplier is not None
    plan = params.ftrl
    if plan.sampling == "poisson":  # noise_multiplier is sigma / (C ||c||) there
        return params.noise_multiplier * math.sqrt(plan.column_sq / plan.participation_sq)
    return params.noise_multiplier * math.sqrt(plan.tree_sq / plan.participation_sq)


def release_multiplier(params: MechanismParams, round_: int) -> float:
    """z_t = sigma / (C sqrt(S_t)): the multiplier of the whole release up to ``round_`` as
    ONE Gaussian mechanism (inf before round 1: nothing released; 0 without noise)."""
    assert params.ftrl is not None and params.clip is not None
    if round_ < 1:
        return math.inf
    if params.noise_scale == 0:
        return 0.0
    return params.noise_scale / (params.clip * math.sqrt(params.ftrl.squared_at(round_)))
