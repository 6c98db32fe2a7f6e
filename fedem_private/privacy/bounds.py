"""The bounds on the total eps of a composition of releases: the math of
:mod:`fedem_private.privacy.accounting` (its docstring states each bound, its relation and
its validity), with the records they fill.

A round is a :class:`RoundMechanism`; a client's history a :data:`Composition`. Each bound
function here is wrapped by one accountant class (:mod:`fedem_private.privacy.accountants`);
:mod:`fedem_private.privacy.accounting` asks those classes and re-exports every name of
this module. It imports nothing else of the package, so the accountants and the
accounting both build on it (docs/design.md section 1: no import circles).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp
from scipy import optimize, special

# "sampled-gaussian": a round of ldp-dpsgd, ``steps`` Poisson-subsampled Gaussian steps
KINDS: tuple[str, ...] = ("laplace", "gaussian", "sampled-gaussian")
PLD_DISCRETIZATION = 1e-3
PLD_MAX_BINS = 20000
# dp-accounting's Laplace PLD overflows (eps = inf) above about 700 per round
PLD_MAX_ROUND_EPS = 700.0


@dataclass(frozen=True, order=True)
class RoundMechanism:
    """One round's release: ``kind`` noise with multiplier z = noise scale / sensitivity.

    z = 0 means no noise (no finite guarantee). Kind ``sampled-gaussian`` (a
    round of ldp-dpsgd's local DP-SGD) is ``steps`` steps, each the Gaussian
    mechanism of multiplier z on a Poisson sample at rate ``sample_rate`` of
    the client's interactions; the other kinds ignore the two fields (1, 1).
    """

    kind: str
    noise_multiplier: float
    sample_rate: float = 1.0
    steps: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown mechanism kind {self.kind!r}")
        if not 0 <= self.noise_multiplier < math.inf:
            raise ValueError(f"noise multiplier must be finite and >= 0: {self.noise_multiplier}")
        if self.kind != "sampled-gaussian" and (self.sample_rate, self.steps) != (1.0, 1):
            raise ValueError(f"sample_rate and steps are for kind sampled-gaussian, not "
                             f"{self.kind!r}")
        if not 0 < self.sample_rate <= 1 or self.steps < 1:
            raise ValueError(f"need 0 < sample_rate <= 1 and steps >= 1: {self.sample_rate}, "
                             f"{self.steps}")

    def event(self) -> dp_accounting.DpEvent:
        """The dp-accounting event of one round (sensitivity normalised to 1)."""
        if self.kind == "laplace":
            return dp_accounting.LaplaceDpEvent(self.noise_multiplier)
        if self.kind == "gaussian":
            return dp_accounting.GaussianDpEvent(self.noise_multiplier)
        return dpfedavg_event(self.sample_rate, self.noise_multiplier, self.steps)


Composition = tuple[tuple[RoundMechanism, int], ...]


def composition(items: Iterable[tuple[RoundMechanism, int]]) -> Composition:
    """Canonical form of a history: counts merged per mechanism, zeros dropped, sorted."""
    merged: dict[RoundMechanism, int] = {}
    for mech, count in items:
        if count < 0:
            raise ValueError(f"negative round count {count}")
        if count:
            merged[mech] = merged.get(mech, 0) + int(count)
    return tuple(sorted(merged.items()))


def repeated(mechanism: RoundMechanism, rounds: int) -> Composition:
    """The history of ``rounds`` identical rounds."""
    return composition([(mechanism, rounds)])


def _has_no_noise(comp: Composition) -> bool:
    return any(m.noise_multiplier == 0 for m, _ in comp)


def gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) of a mu-GDP mechanism."""
    a = float(special.ndtr(-eps / mu + mu / 2))
    b = float(special.log_ndtr(-eps / mu - mu / 2)) + eps
    return a - math.exp(min(b, 0.0))  # e^eps Phi(.) <= Phi(.) <= 1, so b <= 0 exactly


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta for a Gaussian with mu = sensitivity / sigma.

    Returns inf for delta = 0 or mu = inf and 0 for mu = 0. The root is
    nudged upwards until delta(eps) <= delta holds in float64.
    """
    if delta <= 0 or math.isinf(mu):
        return math.inf
    if mu == 0 or gaussian_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gaussian_delta(hi, mu) > delta:
        hi *= 2.0
    eps = float(optimize.brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, hi, xtol=1e-13))
    while gaussian_delta(eps, mu) > delta:
        eps += max(1e-13, eps * 1e-13)
    return eps


def _round_epsilons(comp: Composition, gaussian_delta_each: float) -> list[tuple[float, int]]:
    """Per-round (eps_i, count): Laplace 1/z (pure); Gaussian at the given per-round delta.

    A sampled-gaussian round of S steps is bounded WITHOUT its sampling (S
    unsampled Gaussian steps are one Gaussian of mu = sqrt(S) / z): valid, and
    loose; the rdp and pld bounds account the sampling.
    """
    out = []
    for mech, count in comp:
        if mech.noise_multiplier == 0:
            out.append((math.inf, count))
        elif mech.kind == "laplace":
            out.append((1.0 / mech.noise_multiplier, count))
        else:
            mu = math.sqrt(mech.steps) / mech.noise_multiplier
            out.append((gaussian_epsilon(mu, gaussian_delta_each), count))
    return out


def _gaussian_rounds(comp: Composition) -> int:
    return sum(c for m, c in comp if m.kind != "laplace")


def basic_epsilon(comp: Composition, delta: float) -> float:
    """Basic composition: sum_i n_i eps_i (Gaussian rounds at delta/K each, K Gaussian rounds)."""
    k = _gaussian_rounds(comp)
    if k and delta <= 0:
        return math.inf
    return math.fsum(e * n for e, n in _round_epsilons(comp, delta / k if k else 0.0))


def advanced_epsilon(comp: Composition, delta: float) -> float:
    """DRV advanced composition: sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^eps_i - 1).

    delta' = delta (Laplace only) or delta/2 with delta/(2K) per Gaussian round.
    """
    if not comp:
        return 0.0
    if delta <= 0:
        return math.inf
    k = _gaussian_rounds(comp)
    delta_prime = delta / 2 if k else delta
    eps = _round_epsilons(comp, delta / (2 * k) if k else 0.0)
    if any(math.isinf(e) for e, _ in eps):
        return math.inf
    try:
        drift = math.fsum(n * e * math.expm1(e) for e, n in eps)
    except OverflowError:
        return math.inf
    spread = math.sqrt(2.0 * math.log(1.0 / delta_prime) * math.fsum(n * e * e for e, n in eps))
    return spread + drift


@contextlib.contextmanager
def quiet_absl() -> Iterator[None]:
    """Silence dp-accounting's absl warnings for the block.

    It logs a WARNING for each small order whose subsampled-Gaussian RDP does not
    converge at small z, and leaves that order out. The bound over the remaining
    orders is still a valid upper bound.
    """
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


def _event(comp: Composition) -> dp_accounting.DpEvent:
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(m.event(), n) for m, n in comp]
    )


def rdp_epsilon(comp: Composition, delta: float) -> float:
    """eps from dp-accounting's RdpAccountant (default orders) at delta; inf at delta = 0."""
    if not comp:
        return 0.0
    if delta <= 0 or _has_no_noise(comp):
        return math.inf
    with quiet_absl():
        accountant = dp_rdp.RdpAccountant()
        accountant.compose(_event(comp))
        return float(accountant.get_epsilon(delta))


def pld_interval(comp: Composition) -> float:
    """PLD discretisation interval: PLD_DISCRETIZATION, or wider when a round's loss is huge.

    A Laplace round's privacy loss lies in [-1/z, 1/z]; a Gaussian round's is
    measured by its eps at delta 1e-12. The interval is widened so the
    largest such range holds at most PLD_MAX_BINS intervals.
    """
    scale = max((e for e, _ in _round_epsilons(comp, 1e-12)), default=0.0)
    if not math.isfinite(scale):
        return PLD_DISCRETIZATION
    return max(PLD_DISCRETIZATION, 2.0 * scale / PLD_MAX_BINS)


def pld_epsilon(comp: Composition, delta: float) -> float:
    """eps from dp-accounting's PLDAccountant (pessimistic, see pld_interval); inf at delta 0."""
    if not comp:
        return 0.0
    if delta <= 0 or _has_no_noise(comp):
        return math.inf
    if max(e for e, _ in _round_epsilons(comp, 1e-12)) > PLD_MAX_ROUND_EPS:
        return math.inf
    accountant = dp_pld.PLDAccountant(value_discretization_interval=pld_interval(comp))
    accountant.compose(_event(comp))
    return float(accountant.get_epsilon(delta))


def gaussian_exact_epsilon(comp: Composition, delta: float) -> float | None:
    """Exact eps of an all-Gaussian history: one Gaussian with mu = sqrt(sum n_i / z_i^2).

    None if the history has Laplace rounds.
    """
    if any(m.kind != "gaussian" for m, _ in comp):
        return None
    if not comp:
        return 0.0
    if _has_no_noise(comp):
        return math.inf
    mu = math.sqrt(math.fsum(n / m.noise_multiplier**2 for m, n in comp))
    return gaussian_epsilon(mu, delta)


def opacus_rdp_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """Cross-check: opacus's RDP analysis of ``rounds`` unsampled Gaussian rounds (q = 1).

    Uses dp-accounting's default RDP orders, so it should match :func:`rdp_epsilon`.
    opacus is imported here, lazily (it is slow to import).
    """
    from opacus.accountants.analysis import rdp as opacus_rdp

    if rounds == 0:
        return 0.0
    if delta <= 0 or noise_multiplier == 0:
        return math.inf
    orders = [float(a) for a in dp_rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS]
    curve = opacus_rdp.compute_rdp(
        q=1.0, noise_multiplier=noise_multiplier, steps=rounds, orders=orders
    )
    eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=curve, delta=delta)
    return float(eps)


@dataclass(frozen=True)
class EpsilonBounds:
    """Total eps of a history at ``delta`` by every bound; ``reported`` is their minimum."""

    delta: float
    basic: float
    advanced: float
    rdp: float
    pld: float
    gaussian_exact: float | None
    reported: float

    def as_dict(self) -> dict[str, float | None]:
        """JSON-ready dict: inf (no finite guarantee) is written as None."""
        return {f.name: _json_eps(getattr(self, f.name)) for f in fields(self)}


def _json_eps(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else float(value)


# the bound functions by name; the accountant classes (privacy.accountants) wrap them
BOUND_FUNCTIONS = {
    "basic": basic_epsilon,
    "advanced": advanced_epsilon,
    "rdp": rdp_epsilon,
    "pld": pld_epsilon,
}


# ---------------------------------------------------------------------------------------------
# DP-FedAvg (cdp-gaussian, docs/design.md section 5): user-level central DP with Poisson sampling


def dpfedavg_event(sample_rate: float, noise_multiplier: float,
                   rounds: int) -> dp_accounting.DpEvent:
    """``rounds`` rounds of the Poisson-subsampled Gaussian mechanism (McMahan et al. 2018).

    One round: every client is included independently with probability q =
    ``sample_rate``, the sum of the included clients' deltas (each L2-clipped
    to C) gets N(0, z^2 C^2) on every entry. Under add/remove of one client's
    whole data the sum's L2 sensitivity is C, so normalised by C this is
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``; q = 1 is the plain
    ``GaussianDpEvent(z)``. This is the view of an observer who sees the
    released models but not who took part (amplification by sampling holds).
    """
    gauss = dp_accounting.GaussianDpEvent(noise_multiplier)
    one = gauss if sample_rate >= 1.0 else dp_accounting.PoissonSampledDpEvent(sample_rate, gauss)
    return dp_accounting.SelfComposedDpEvent(one, rounds)


def _check_dpfedavg(sample_rate: float, noise_multiplier: float, rounds: int) -> None:
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1]: {sample_rate}")
    if not 0 <= noise_multiplier < math.inf:
        raise ValueError(f"noise multiplier must be finite and >= 0: {noise_multiplier}")
    if rounds < 0:
        raise ValueError(f"negative round count {rounds}")


def dpfedavg_rdp_epsilon(sample_rate: float, noise_multiplier: float, rounds: int,
                         delta: float) -> float:
    """eps of :func:`dpfedavg_event` by dp-accounting's RdpAccountant (default orders).

    T rounds of one (q, z) compose to T times one round's RDP curve (RDP's composition,
    Mironov 2017, Proposition 1, which is what the accountant itself does for a
    ``SelfComposedDpEvent``), so the one-round curve is computed once per (q, z)
    (:func:`_sampled_gaussian_rdp`) and only the conversion to (eps, delta) runs per
    call: a run's per-round log costs microseconds instead of a fresh accountant.
    :func:`dpfedavg_rdp_epsilon_composed` is the accountant over the whole event, the
    reference it is tested against (identical floats)."""
    _check_dpfedavg(sample_rate, noise_multiplier, rounds)
    if rounds == 0:
        return 0.0
    if delta <= 0 or noise_multiplier == 0:
        return math.inf
    orders, step = _sampled_gaussian_rdp(float(sample_rate), float(noise_multiplier))
    with quiet_absl():
        return float(dp_rdp.rdp_privacy_accountant.compute_epsilon(
            orders, int(rounds) * step, delta)[0])


@functools.lru_cache(maxsize=256)
def _sampled_gaussian_rdp(sample_rate: float, noise_multiplier: float
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of ONE round of :func:`dpfedavg_event`, from
    dp-accounting's RdpAccountant with its default orders (read from the accountant
    after composing one round; read-only arrays, shared by the cache)."""
    with quiet_absl():
        accountant = dp_rdp.RdpAccountant()
        accountant.compose(dpfedavg_event(sample_rate, noise_multiplier, 1))
    orders = np.array(accountant._orders, dtype=np.float64)  # noqa: SLF001
    step = np.array(accountant._rdp, dtype=np.float64)  # noqa: SLF001
    orders.setflags(write=False)
    step.setflags(write=False)
    return orders, step


def dpfedavg_rdp_epsilon_composed(sample_rate: float, noise_multiplier: float, rounds: int,
                                  delta: float) -> float:
    """The slow, obvious reference of :func:`dpfedavg_rdp_epsilon`: a fresh RdpAccountant
    composing the whole T-round event."""
    _check_dpfedavg(sample_rate, noise_multiplier, rounds)
    if rounds == 0:
        return 0.0
    if delta <= 0 or noise_multiplier == 0:
        return math.inf
    with quiet_absl():
        accountant = dp_rdp.RdpAccountant()
        accountant.compose(dpfedavg_event(sample_rate, noise_multiplier, rounds))
        return float(accountant.get_epsilon(delta))


def dpfedavg_pld_epsilon(sample_rate: float, noise_multiplier: float, rounds: int,
                         delta: float) -> float:
    """eps of :func:`dpfedavg_event` by dp-accounting's PLDAccountant (pessimistic).

    The discretisation interval is that of the unsampled rounds
    (:func:`pld_interval`), never finer than PLD_DISCRETIZATION; inf when one
    unsampled round's eps exceeds PLD_MAX_ROUND_EPS (out of the PLD's range).
    With q < 1 one round's PLD is built once per (q, z) (:func:`_sampled_gaussian_pld`)
    and self-composed T times, as the accountant does for a ``SelfComposedDpEvent``
    (it then composes that with the identity PLD): tested against
    :func:`dpfedavg_pld_epsilon_composed` (within 1e-9). q = 1 (every client every
    round) keeps the accountant, which composes the T Gaussian rounds in closed form.
    """
    _check_dpfedavg(sample_rate, noise_multiplier, rounds)
    if rounds == 0:
        return 0.0
    if delta <= 0 or noise_multiplier == 0:
        return math.inf
    if sample_rate >= 1.0:
        return dpfedavg_pld_epsilon_composed(sample_rate, noise_multiplier, rounds, delta)
    interval = _dpfedavg_pld_interval(float(noise_multiplier))
    if interval is None:
        return math.inf
    one = _sampled_gaussian_pld(float(sample_rate), float(noise_multiplier), interval)
    return float(one.self_compose(int(rounds)).get_epsilon_for_delta(delta))


def _dpfedavg_pld_interval(noise_multiplier: float) -> float | None:
    """:func:`pld_interval` of the unsampled rounds (the same for any T: the rounds are
    identical), None where one unsampled round is out of the PLD's range."""
    plain = repeated(RoundMechanism("gaussian", noise_multiplier), 1)
    if max(e for e, _ in _round_epsilons(plain, 1e-12)) > PLD_MAX_ROUND_EPS:
        return None
    return pld_interval(plain)


@functools.lru_cache(maxsize=64)
def _sampled_gaussian_pld(sample_rate: float, noise_multiplier: float, interval: float
                          ) -> Any:
    """One round's PLD of :func:`dpfedavg_event` (q < 1), as dp-accounting's PLDAccountant
    builds it (pessimistic, add/remove, discretisation ``interval``)."""
    return dp_pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, value_discretization_interval=interval,
        sampling_prob=sample_rate)


def dpfedavg_pld_epsilon_composed(sample_rate: float, noise_multiplier: float, rounds: int,
                                  delta: float) -> float:
    """The slow, obvious reference of :func:`dpfedavg_pld_epsilon`: a fresh PLDAccountant
    composing the whole T-round event."""
    _check_dpfedavg(sample_rate, noise_multiplier, rounds)
    if rounds == 0:
        return 0.0
    if delta <= 0 or noise_multiplier == 0:
        return math.inf
    plain = repeated(RoundMechanism("gaussian", noise_multiplier), rounds)
    if max(e for e, _ in _round_epsilons(plain, 1e-12)) > PLD_MAX_ROUND_EPS:
        return math.inf
    accountant = dp_pld.PLDAccountant(value_discretization_interval=pld_interval(plain))
    accountant.compose(dpfedavg_event(sample_rate, noise_multiplier, rounds))
    return float(accountant.get_epsilon(delta))


@dataclass(frozen=True)
class CentralBounds:
    """Total eps of T rounds of DP-FedAvg at ``delta`` for an observer of the released models.

    ``rdp`` and ``pld`` are dp-accounting's bounds on :func:`dpfedavg_event`;
    ``reported`` is their minimum (both are valid upper bounds).
    """

    delta: float
    sample_rate: float
    noise_multiplier: float
    rounds: int
    rdp: float
    pld: float
    reported: float

    def as_dict(self) -> dict[str, float | None]:
        """JSON-ready epsilon dict (keys rdp, pld, reported; inf written as None)."""
        return {key: _json_eps(getattr(self, key)) for key in ("rdp", "pld", "reported")}


# DP-FedAvg's bound functions by name (the dpfedavg-rdp / dpfedavg-pld accountants wrap them)
CENTRAL_BOUND_FUNCTIONS = {"rdp": dpfedavg_rdp_epsilon, "pld": dpfedavg_pld_epsilon}


# ---------------------------------------------------------------------------------------------
# DP-FTRL (dp-ftrl, docs/design.md section 5; fedem_private.privacy.ftrl): the whole tree
# release is ONE Gaussian mechanism, of multiplier z = sigma / sensitivity


def zcdp_epsilon(rho: float, delta: float) -> float:
    """eps = rho + 2 sqrt(rho ln(1/delta)): rho-zCDP implies (eps, delta)-DP (Bun and
    Steinke 2016, Proposition 1.3). A closed-form upper bound, looser than the exact curve;
    the Gaussian mechanism of multiplier z is rho = 1 / (2 z^2)-zCDP (their Prop. 1.6)."""
    if rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if rho == 0:
        return 0.0
    if delta <= 0 or math.isinf(rho):
        return math.inf
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


