"""The distributed Skellam mechanism (DSkellam) of ``ddp-skellam``: encoding, decoding, accounting.

Agarwal, Kairouz and Liu, "The Skellam mechanism for differentially private federated
learning" (NeurIPS 2021), Algorithm 1, with the conditional randomised rounding and its
norm bound from Kairouz, Liu and Steinke, "The distributed discrete Gaussian mechanism
for federated learning with secure aggregation" (ICML 2021). One round:

client u (its clipped delta x_u, ||x_u||_2 <= C, flattened to d entries):

1. pad to d' = 2^ceil(log2 d) and rotate: y = H D x / sqrt(d'), D a diagonal of random
   signs drawn from a public per-round seed (the same for every client; the server knows
   it), H the Walsh-Hadamard matrix (:func:`hadamard`);
2. scale by gamma (:attr:`DdpPlan.scale`) and round each entry randomly to an integer
   (floor + Bernoulli(fraction)), again until ||round(gamma y)||_2 <= Delta_2, the
   rounded-norm bound of Kairouz et al. (:func:`rounded_l2_bound`, bias beta): so the
   integer vector's L2 norm is at most Delta_2 always, and its L1 norm at most
   Delta_1 = Delta_2 min(sqrt(d'), Delta_2) (:func:`rounded_l1_bound`);
3. add its share of the noise, Skellam of variance mu / n_t per entry
   (Poisson(mu / (2 n_t)) - Poisson(mu / (2 n_t))), n_t = the number of clients whose
   shares together must reach the target variance mu (:attr:`DdpPlan.noise_clients`);
4. reduce modulo 2^b and hand the b-bit integers to secure aggregation.

server: the modular sum of the clients' vectors (from secure aggregation, which shows it
nothing else), centred into [-2^(b-1), 2^(b-1)), divided by gamma, rotated back, cut to d
entries (:func:`decode`).

Neighbouring relation: user-level, one client's contribution to one round's sum present
or replaced by zero (the client still takes part and adds its noise share; who takes
part is a public, data-independent draw the aggregator knows). Trust model: each client
adds its noise share honestly; the server sees only the modular sum. The sum of Skellam
shares is Skellam (closed under summation), so with at least n_t honest shares in the
sum the noise is Skellam of variance >= mu; the round aborts (nothing released) when
fewer than n_t clients' inputs reach the sum, and up to (survivors - n_t) clients may
drop or collude (subtract their own shares) without the guarantee weakening.

Sensitivity: the L2 norm of one client's integer vector is at most Delta_2, its L1 norm
at most Delta_1 (both enforced by the conditional rounding, in the rotated integer
domain). RDP (Agarwal et al., the multi-dimensional Skellam mechanism, integer orders
alpha > 1), mu the variance per entry of the summed noise:

    eps(alpha) <= alpha Delta_2^2 / (2 mu)
                  + min(((2 alpha - 1) Delta_2^2 + 6 Delta_1) / (4 mu^2), 3 Delta_1 / (2 mu))

composed over rounds by adding RDP (no amplification by sampling is claimed: the cohort
is a fixed-size draw the aggregator sees), converted to (eps, delta) by dp-accounting's
RDP conversion. Modular reduction is post-processing: a wrap-around costs accuracy, not
privacy; its probability is bounded (:func:`wrap_bound`) and reported.

Randomness: the rotation's signs are the server's, public, keyed by (seed, ROTATION, round);
a client's rounding and its noise share are its own secrets (docs/design.md section 5, "Two
kinds of randomness"): keys from :class:`~fedem_private.privacy.client_secrets.ClientSecrets`
(the OS by default, or a client-secret seed the server is not given), the rounding's
uniforms by counter, the noise through numpy's Philox generator keyed at full width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedem_private import rng
from fedem_private.privacy.client_secrets import ClientSecrets

# key streams of this module (above rng.Stream's range, so no key collides with theirs)
ROTATION = 1001  # the public per-round signs of the rotation
DROPOUT = 1004  # --dropout: whether a participant drops, and when
COHORT = 1005  # the round's fixed-size cohort

# integer RDP orders (the Skellam bound is for integers alpha > 1)
RDP_ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (160, 192, 256, 384, 512, 1024)
# the conditional rounding's bias beta: exp(-1/2), the papers' choice
DEFAULT_BETA = math.exp(-0.5)
# the round's wrap-around probability bound that a derived scale gamma must meet
WRAP_TARGET = 1e-6
MAX_BITS = 32  # --ddp-bits' range is [2, MAX_BITS]: the modular sum's words are uint32
MAX_ROUNDING_TRIES = 1000


def padded_dim(d: int) -> int:
    """d' = the next power of two >= d (the Walsh-Hadamard transform's length)."""
    if d < 1:
        raise ValueError(f"dimension must be >= 1, got {d}")
    return 1 << (int(d) - 1).bit_length()


def hadamard(x: np.ndarray) -> np.ndarray:
    """H x / sqrt(d') along the last axis (d' a power of two): the orthonormal fast
    Walsh-Hadamard transform, its own inverse. float64, a new array."""
    out = np.array(x, dtype=np.float64, copy=True)
    n = out.shape[-1]
    if n & (n - 1):
        raise ValueError(f"length {n} is not a power of two")
    lead = out.shape[:-1]
    h = 1
    while h < n:
        v = out.reshape(*lead, n // (2 * h), 2, h)
        a = v[..., 0, :].copy()
        v[..., 0, :] += v[..., 1, :]
        v[..., 1, :] = a - v[..., 1, :]
        h *= 2
    return out / math.sqrt(n)


def rotation_signs(seed: int, round_: int, dim: int) -> np.ndarray:
    """The round's public random signs D (float64 +-1, length d'), keyed by (seed, round)."""
    u = rng.uniform(rng.key(seed, ROTATION, round_, 0), np.arange(dim, dtype=np.int64))
    return np.where(u < 0.5, -1.0, 1.0)


def rotate(x: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """H D x (rows of x padded with zeros to len(signs))."""
    d = x.shape[-1]
    pad = np.zeros((*x.shape[:-1], signs.shape[0]), dtype=np.float64)
    pad[..., :d] = x
    return hadamard(pad * signs)


def unrotate(y: np.ndarray, signs: np.ndarray, d: int) -> np.ndarray:
    """(H D)^-1 y = D H y, cut to its first d entries."""
    return (hadamard(y) * signs)[..., :d]


def rounded_l2_bound(scaled_clip: float, dim: int, beta: float) -> float:
    """Delta_2: the L2 bound of a randomly rounded vector of L2 norm <= gamma C in d'
    dimensions (Kairouz, Liu and Steinke 2021): min(gamma C + sqrt(d'),
    sqrt((gamma C)^2 + d'/4 + sqrt(2 ln(1/beta)) (gamma C + sqrt(d')/2))); with beta = 0
    (unconditional rounding) the first, which always holds."""
    first = scaled_clip + math.sqrt(dim)
    if beta == 0:
        return first
    second = math.sqrt(scaled_clip ** 2 + dim / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta))
                       * (scaled_clip + math.sqrt(dim) / 2.0))
    return min(first, second)


def rounded_l1_bound(l2: float, dim: int) -> float:
    """Delta_1 <= Delta_2 min(sqrt(d'), Delta_2): Cauchy-Schwarz, and |k| <= k^2 for
    integers."""
    return l2 * min(math.sqrt(dim), l2)


def skellam_rdp(orders: np.ndarray | tuple[int, ...], l1: float, l2: float, mu: float
                ) -> np.ndarray:
    """The multi-dimensional Skellam mechanism's RDP at integer ``orders`` (Agarwal et al.
    2021): sensitivities ``l1``, ``l2`` of integer vectors, ``mu`` the noise's variance per
    entry (Poisson(mu/2) - Poisson(mu/2))."""
    a = np.asarray(orders, dtype=np.float64)
    if not mu > 0:
        return np.full(a.shape, math.inf)
    extra = np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2), 3 * l1 / (2 * mu))
    return a * l2 ** 2 / (2 * mu) + extra


def rdp_epsilon(rdp: np.ndarray, delta: float, orders: tuple[int, ...] = RDP_ORDERS) -> float:
    """(eps at ``delta``) of an RDP curve, by dp-accounting's conversion."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not np.all(np.isfinite(rdp)):
        return math.inf
    return float(compute_epsilon(list(orders), list(np.asarray(rdp, dtype=np.float64)),
                                 delta)[0])


def skellam_epsilon(rounds: int, l1: float, l2: float, mu: float, delta: float) -> float:
    """eps of ``rounds`` compositions of the Skellam mechanism (RDP adds up)."""
    if rounds <= 0:
        return 0.0
    return rdp_epsilon(rounds * skellam_rdp(RDP_ORDERS, l1, l2, mu), delta)


def calibrate_variance(epsilon: float, rounds: int, l1: float, l2: float, delta: float
                       ) -> float:
    """The smallest summed-noise variance mu (per entry) whose ``rounds``-fold Skellam
    composition is (epsilon, delta)-DP (bisection in log mu; the result meets it)."""
    lo, hi = 1e-6 * l2 ** 2, 1e6 * l2 ** 2
    while skellam_epsilon(rounds, l1, l2, hi, delta) > epsilon:
        hi *= 100.0
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if skellam_epsilon(rounds, l1, l2, mid, delta) > epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return hi


def _log_tails(margin: float, parts: list[tuple[float, object]]) -> float:
    """The log of a sum of tail bounds, each part given as (its scale, the log of its tail
    bound at a margin), the margin split between the parts in proportion to their scales
    (any split is valid). In logs, as the (1 - beta)^-senders inflation it meets is: far
    tails underflow a float, and 0 times that inflation would claim a bound that is not."""
    total = sum(s for s, _ in parts)
    if margin <= 0:
        return math.inf
    if total == 0:
        return -math.inf
    logs = [log_tail(margin * s / total) for s, log_tail in parts if s > 0]  # type: ignore[operator]
    top = max(logs)
    return top + math.log(math.fsum(math.exp(v - top) for v in logs))


def wrap_bound(bits: int, scale: float, clip: float, dim: int, senders: int,
               variance: float, beta: float) -> float:
    """An upper bound on the probability that some entry of the round's sum leaves
    (-2^(b-1), 2^(b-1)) (and so may wrap around), ``senders`` inputs in it, summed noise
    variance ``variance`` per entry.

    Entry j of the sum is A + R + N: A = gamma (H D v)_j, v the sum of the clipped deltas
    (||v|| <= senders C; D's signs drawn independently of v and never conditioned: the
    rounding is redrawn, not D), sub-Gaussian by Hoeffding,
    P(|A| >= t) <= 2 exp(-t^2 d' / (2 gamma^2 ||v||^2)); N Skellam of variance V, by
    Bernstein P(|N| >= t) <= 2 exp(-t^2 / (2 (V + t / 3))); R the sum of the rounding
    errors, each in (-1, 1). Two bounds, the smaller reported: (a) |R| < senders always,
    the rest of the margin 2^(b-1) - 1 split between A and N; (b) R by Hoeffding
    (independent, zero-mean, range 1 before conditioning: 2 exp(-2 t^2 / senders)), every
    probability multiplied by (1 - beta)^-senders for the conditioning. Margins split in
    proportion to the scales; a union bound over the d' entries.
    """
    margin = 2.0 ** (bits - 1) - 1.0
    sa = scale * senders * clip / math.sqrt(dim)
    sn = math.sqrt(max(variance, 0.0))

    log2 = math.log(2.0)

    def tail_a(t: float) -> float:
        return log2 - t ** 2 * dim / (2.0 * (scale * senders * clip) ** 2)

    def tail_n(t: float) -> float:
        return log2 - t ** 2 / (2.0 * (variance + t / 3.0))

    def tail_r(t: float) -> float:
        return log2 - 2.0 * t ** 2 / senders

    sure = _log_tails(margin - senders, [(sa, tail_a), (sn, tail_n)])
    # the inflation in logs too: (1 - beta)^-senders overflows a float from ~760 senders
    inflate = -senders * math.log1p(-beta) if beta > 0 else 0.0
    hoeffding = inflate + _log_tails(margin, [(sa, tail_a), (math.sqrt(senders) / 2.0, tail_r),
                                              (sn, tail_n)])
    return math.exp(min(0.0, math.log(dim) + min(sure, hoeffding)))


@dataclass(frozen=True)
class DdpPlan:
    """One run's DSkellam parameters (the same every round).

    ``dim`` d (the encoded upload's entries) and ``padded`` d'; ``scale`` gamma;
    ``l2``, ``l1`` the integer vector's sensitivities Delta_2, Delta_1; ``variance`` mu,
    the target variance per entry of the summed noise; ``noise_clients`` n_t, the honest
    inputs that reach mu (each client adds mu / n_t); ``cohort`` K, the clients drawn per
    round; ``rounds`` T it was calibrated for; ``wrap`` the wrap-around bound with K inputs.
    """

    bits: int
    clip: float
    dim: int
    padded: int
    scale: float
    beta: float
    l2: float
    l1: float
    variance: float
    cohort: int
    noise_clients: int
    rounds: int
    delta: float
    wrap: float

    @property
    def client_variance(self) -> float:
        """Each client's noise share's variance per entry, mu / n_t."""
        return self.variance / self.noise_clients

    @property
    def noise_multiplier(self) -> float:
        """sqrt(mu) / Delta_2: the Gaussian-equivalent multiplier of the leading RDP term."""
        return math.sqrt(self.variance) / self.l2

    @property
    def epsilon_round(self) -> float:
        return skellam_epsilon(1, self.l1, self.l2, self.variance, self.delta)

    def epsilon(self, rounds: int) -> float:
        """eps of ``rounds`` released rounds (each with noise variance >= mu)."""
        return skellam_epsilon(rounds, self.l1, self.l2, self.variance, self.delta)

    @property
    def bytes_per_input(self) -> int:
        """The masked input's size: d' entries of b bits, packed."""
        return (self.padded * self.bits + 7) // 8

    def as_log(self) -> dict[str, float | int]:
        return {"ddp_bits": self.bits, "ddp_scale": self.scale, "ddp_l2": self.l2,
                "ddp_variance": self.variance, "ddp_noise_clients": self.noise_clients,
                "ddp_cohort": self.cohort, "ddp_wrap_bound": self.wrap}


def make_plan(*, bits: int, clip: float, dim: int, cohort: int, noise_clients: int,
              rounds: int, delta: float, epsilon: float | None = None,
              noise_multiplier: float | None = None, scale: float | None = None,
              beta: float = DEFAULT_BETA, wrap_target: float = WRAP_TARGET) -> DdpPlan:
    """Calibrate DSkellam: the noise variance mu from a total ``epsilon`` over ``rounds``
    (or mu = (z Delta_2)^2 from ``noise_multiplier`` z), and, unless given, the largest
    scale gamma whose wrap-around bound with ``cohort`` inputs is at most ``wrap_target``
    (bisection in log gamma: a larger gamma shrinks the rounding's relative inflation but
    fills the b bits)."""
    if (epsilon is None) == (noise_multiplier is None):
        raise ValueError("give exactly one of epsilon and noise_multiplier")
    padded = padded_dim(dim)

    def at(gamma: float) -> tuple[float, float, float, float]:
        l2 = rounded_l2_bound(gamma * clip, padded, beta)
        l1 = rounded_l1_bound(l2, padded)
        if noise_multiplier is not None:
            mu = (noise_multiplier * l2) ** 2
        else:
            assert epsilon is not None
            mu = calibrate_variance(epsilon, rounds, l1, l2, delta)
        return l2, l1, mu, wrap_bound(bits, gamma, clip, padded, cohort,
                                      mu * cohort / noise_clients, beta)

    if scale is None:
        lo, hi = 1e-6 / clip, 2.0 ** bits / clip
        if at(lo)[3] > wrap_target:
            raise ValueError(f"{bits} bits cannot hold the sum of {cohort} inputs of "
                             f"{padded} entries within a wrap-around bound of {wrap_target:g}")
        if at(hi)[3] <= wrap_target:
            lo = hi
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            if at(mid)[3] <= wrap_target:
                lo = mid
            else:
                hi = mid
            if hi / lo < 1 + 1e-4:
                break
        scale = lo
    l2, l1, mu, wrap = at(scale)
    return DdpPlan(bits=bits, clip=clip, dim=dim, padded=padded, scale=scale, beta=beta,
                   l2=l2, l1=l1, variance=mu, cohort=cohort, noise_clients=noise_clients,
                   rounds=rounds, delta=delta, wrap=wrap)


def smallest_bits(*, bits: int, **plan: Any) -> int | None:
    """The fewest bits above ``bits``, up to :data:`MAX_BITS`, with which :func:`make_plan`
    of the other arguments ``plan`` succeeds (None: not even that many), trying each in
    turn: what a refusal for too few bits names."""
    for more in range(int(bits) + 1, MAX_BITS + 1):
        try:
            make_plan(bits=more, **plan)
        except ValueError:
            continue
        return more
    return None


@dataclass
class Encoded:
    """Clients' b-bit vectors (``values``, (k, d') uint32 in [0, 2^b)) and figures for the
    log: the rounding attempts each client needed."""

    values: np.ndarray
    tries: np.ndarray
    raw: np.ndarray  # the same before the reduction mod 2^b (int64; a diagnostic)


def round_conditionally(y: np.ndarray, bound: float, *, secrets: ClientSecrets, round_: int,
                        clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of ``y`` rounded randomly to integers (floor + Bernoulli(fraction)), redrawn
    (the next attempt's keyed uniforms) until its L2 norm is <= ``bound``: int64 rows and
    the attempts each needed. RuntimeError after MAX_ROUNDING_TRIES (a bound too tight).
    The uniforms are the client's own secret (``secrets``), never the run seed's."""
    k, n = y.shape
    base = np.floor(y)
    frac = y - base
    out = np.empty((k, n), dtype=np.int64)
    tries = np.zeros(k, dtype=np.int64)
    todo = np.arange(k)
    keys = secrets.keys(b"rounding", round_, np.asarray(clients, dtype=np.int64))[:, None]
    ctr = np.arange(n, dtype=np.int64)[None, :]
    for attempt in range(MAX_ROUNDING_TRIES):
        u = rng.uniform(keys[todo], ctr + attempt * n)
        cand = base[todo] + (u < frac[todo])
        ok = np.sqrt(np.einsum("ij,ij->i", cand, cand)) <= bound
        tries[todo] += 1
        out[todo[ok]] = cand[ok].astype(np.int64)
        todo = todo[~ok]
        if todo.size == 0:
            return out, tries
    raise RuntimeError(f"conditional rounding found no vector within {bound:g} after "
                       f"{MAX_ROUNDING_TRIES} attempts")


def skellam_noise(shape: tuple[int, int], variance: float, *, secrets: ClientSecrets,
                  round_: int, clients: np.ndarray) -> np.ndarray:
    """Each client's (row's) Skellam share, Poisson(v/2) - Poisson(v/2) per entry, int64,
    from numpy's Philox keyed by the client's own secret key for (round, client)
    (``secrets``: the OS, or the client-secret seed; never the run seed)."""
    out = np.zeros(shape, dtype=np.int64)
    if variance <= 0:
        return out
    keys = secrets.keys(b"skellam", round_, np.asarray(clients, dtype=np.int64))
    lam = variance / 2.0
    for j, k in enumerate(keys.tolist()):
        g = np.random.Generator(np.random.Philox(key=int(k)))
        out[j] = g.poisson(lam, shape[1]) - g.poisson(lam, shape[1])
    return out


def encode(plan: DdpPlan, clipped: np.ndarray, *, seed: int, round_: int,
           clients: np.ndarray, secrets: ClientSecrets | None = None) -> Encoded:
    """Clients' clipped deltas ((k, d) float64, L2 norm <= C each) to their b-bit inputs:
    rotate (public signs keyed by ``seed``), scale, round conditionally, add the noise
    share, reduce mod 2^b. The rounding and the noise are the clients' secrets
    (``secrets``; None: the OS)."""
    secrets = ClientSecrets() if secrets is None else secrets
    if clipped.ndim != 2 or clipped.shape[1] != plan.dim:
        raise ValueError(f"expected (k, {plan.dim}) clipped deltas, got {clipped.shape}")
    signs = rotation_signs(seed, round_, plan.padded)
    y = rotate(clipped, signs) * plan.scale
    ints, tries = round_conditionally(y, plan.l2, secrets=secrets, round_=round_,
                                      clients=clients)
    ints += skellam_noise(ints.shape, plan.client_variance, secrets=secrets, round_=round_,
                          clients=clients)
    values = np.mod(ints, 1 << plan.bits).astype(np.uint32)
    return Encoded(values, tries, ints)


def centred(total: np.ndarray, bits: int) -> np.ndarray:
    """A modular sum in [0, 2^b) mapped to [-2^(b-1), 2^(b-1)) (int64)."""
    t = np.mod(np.asarray(total, dtype=np.int64), 1 << bits)
    return np.where(t >= 1 << (bits - 1), t - (1 << bits), t)


def decode(plan: DdpPlan, total: np.ndarray, *, seed: int, round_: int) -> np.ndarray:
    """The server's estimate of the sum of clipped deltas (d,) float64 from the modular sum
    (d',) of the inputs: centre, divide by gamma, rotate back."""
    signs = rotation_signs(seed, round_, plan.padded)
    return unrotate(centred(total, plan.bits).astype(np.float64) / plan.scale, signs,
                    plan.dim)
