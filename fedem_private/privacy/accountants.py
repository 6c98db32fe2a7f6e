"""Accountants behind one interface: a composition held as state, stepped, asked for eps.

Each accountant is one registered class (:func:`register`, :func:`accountant_class`)
with the interface of opacus's ``IAccountant`` in immutable form: ``step(mechanism,
count)`` returns the accountant with ``count`` more releases of ``mechanism`` composed
in, ``epsilon(delta)`` bounds the composition's total eps at ``delta``, ``state()`` is
its JSON-ready state (:meth:`Accountant.from_state` reads it back), ``name`` its
registered name. The math is :mod:`fedem_private.privacy.bounds`' (dp-accounting
underneath for RDP and PLD); a class adds only what the generic calibration
(:func:`fedem_private.privacy.calibration.calibrate_noise`) needs to know of it.
:class:`LocalBounds` is the accountant of every local bound at once (what the per-client
ledger holds and :func:`~fedem_private.privacy.accounting.epsilon_bounds` asks); it is no
``--accountant`` choice and is not registered. This module imports the bounds and is
imported by the accounting, never the reverse (docs/design.md section 1).

Neighbouring relation, trust model and sensitivity: an accountant bounds the
composition of the mechanisms it is stepped with, each described by a
:class:`~fedem_private.privacy.accounting.RoundMechanism` whose noise multiplier z is
the noise scale over the sensitivity under the relation the caller accounts for. The
local accountants (basic, advanced, rdp, pld, exact) are used for local DP under
replace-one of a client's whole data (sensitivity 2C of the clipped delta), against a
server that sees every upload and who sent it (no amplification by sampling, except
ldp-dpsgd's own Poisson sampling of a client's positives inside a round, kind
``sampled-gaussian``). The DP-FedAvg accountants (dpfedavg-rdp, dpfedavg-pld) are for
user-level central DP under add/remove of one client's whole data (L2 sensitivity C
of the clipped sum), against an observer of the released models who does not see who
was Poisson-sampled (McMahan et al. 2018): their history is of kind
``sampled-gaussian`` with one step and the client sampling rate. No accountant claims
more than the bound function it calls.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import dp_accounting
from dp_accounting import mechanism_calibration as mc
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp
from scipy import optimize

from fedem_private.privacy.bounds import (
    Composition,
    EpsilonBounds,
    RoundMechanism,
    advanced_epsilon,
    basic_epsilon,
    composition,
    dpfedavg_event,
    dpfedavg_pld_epsilon,
    dpfedavg_rdp_epsilon,
    gaussian_exact_epsilon,
    pld_epsilon,
    pld_interval,
    rdp_epsilon,
    repeated,
)

#: relative tolerance on log z of the calibrations' root finding
LOG_TOL = 1e-7


# ------------------------------------------------------------------------- families
@dataclass(frozen=True)
class LocalRounds:
    """T rounds of one local-DP release with noise multiplier z (the free parameter).

    ``kind`` is ``laplace`` (pure eps-DP per round, eps_round = 1/z) or ``gaussian``;
    replace-one of a client's data, sensitivity 2C of its clipped delta.
    """

    kind: str
    rounds: int

    def history(self, z: float) -> Composition:
        """The T-fold composition at multiplier z."""
        return repeated(RoundMechanism(self.kind, z), self.rounds)

    def plain(self, z: float) -> Composition:
        """The same rounds unsampled (what sizes the PLD interval): the history itself."""
        return self.history(z)

    def event(self, z: float) -> dp_accounting.DpEvent:
        """The dp-accounting event of the T rounds."""
        return dp_accounting.SelfComposedDpEvent(RoundMechanism(self.kind, z).event(),
                                                 self.rounds)

    def start(self, epsilon: float, delta: float) -> float:
        """A closed-form first guess of z: basic composition for Laplace (T / eps, its
        exact solution), the classical Gaussian mechanism's sqrt(2 T ln(1.25/delta)) / eps
        (Dwork & Roth 2014, Thm A.1, applied to the mu-GDP total) for Gaussian noise."""
        if self.kind == "gaussian":
            return math.sqrt(2.0 * self.rounds * math.log(1.25 / delta)) / epsilon
        return self.rounds / epsilon

    def describe(self, epsilon: float, delta: float, accountant: str) -> str:
        """The target in words (error messages)."""
        return f"eps={epsilon:g} at delta={delta:g} over {self.rounds} rounds ({accountant})"


@dataclass(frozen=True)
class DpFedAvgRounds:
    """T rounds of DP-FedAvg (:func:`~fedem_private.privacy.accounting.dpfedavg_event`):
    Poisson sampling of clients at rate q, Gaussian noise z C on the sum; add/remove of
    one client's data, L2 sensitivity C; the observer does not see who took part."""

    sample_rate: float
    rounds: int
    kind: ClassVar[str] = "sampled-gaussian"

    def history(self, z: float) -> Composition:
        """The T-fold composition at multiplier z (one sampled Gaussian step a round)."""
        return repeated(RoundMechanism("sampled-gaussian", z, self.sample_rate, 1), self.rounds)

    def plain(self, z: float) -> Composition:
        """The unsampled Gaussian rounds that size the PLD interval."""
        return repeated(RoundMechanism("gaussian", z), self.rounds)

    def event(self, z: float) -> dp_accounting.DpEvent:
        """The dp-accounting event of the T rounds."""
        return dpfedavg_event(self.sample_rate, z, self.rounds)

    def start(self, epsilon: float, delta: float) -> float:
        """First guess z = 1 (the bracket's search widens geometrically from it)."""
        return 1.0

    def describe(self, epsilon: float, delta: float, accountant: str) -> str:
        """The target in words (error messages)."""
        return (f"eps={epsilon:g} at delta={delta:g} over {self.rounds} rounds at sample rate "
                f"{self.sample_rate:g} ({accountant})")


Family = LocalRounds | DpFedAvgRounds


# ------------------------------------------------------------------------- interface
A = TypeVar("A", bound="Accountant")


@dataclass(frozen=True)
class Accountant(ABC):
    """A composition of releases and a bound on its total eps (module docstring).

    ``history`` is the composition so far, canonical
    (:func:`~fedem_private.privacy.accounting.composition`).
    """

    history: Composition = ()
    name: ClassVar[str] = ""

    def step(self: A, mechanism: RoundMechanism, count: int = 1) -> A:
        """This accountant with ``count`` more releases of ``mechanism`` composed in."""
        return type(self)(composition((*self.history, (mechanism, int(count)))))

    @abstractmethod
    def epsilon(self, delta: float) -> float:
        """An upper bound on the total eps of the history at ``delta`` (inf: none finite)."""

    def state(self) -> dict[str, Any]:
        """JSON-ready state: the accountant's name and its history."""
        return {"accountant": self.name,
                "history": [{"kind": m.kind, "noise_multiplier": m.noise_multiplier,
                             "sample_rate": m.sample_rate, "steps": m.steps, "count": n}
                            for m, n in self.history]}

    @classmethod
    def from_state(cls: type[A], state: dict[str, Any]) -> A:
        """The accountant :meth:`state` wrote (its name must be this class's)."""
        if state.get("accountant") != cls.name:
            raise ValueError(f"state of accountant {state.get('accountant')!r}, not {cls.name!r}")
        return cls(composition(
            (RoundMechanism(h["kind"], float(h["noise_multiplier"]), float(h["sample_rate"]),
                            int(h["steps"])), int(h["count"])) for h in state["history"]))

    # --- what the generic calibration asks of an accountant class
    @classmethod
    def accepts(cls, family: Family) -> bool:
        """Whether this accountant bounds the histories of ``family``."""
        return isinstance(family, LocalRounds)

    @classmethod
    def closed_form(cls, family: Family) -> bool:
        """Whether ``family.start`` already solves the calibration (up to rounding)."""
        return False

    @classmethod
    def guide(cls, family: Family) -> type[Accountant] | None:
        """A cheaper accountant whose calibrated z is the first guess for this one's
        (None: ``family.start``)."""
        return None

    @classmethod
    def solve(cls, family: Family, eps_fn: Callable[[float], float], epsilon: float,
              delta: float, lo: float, hi: float) -> float:
        """log z with eps(z) = epsilon on the bracket [lo, hi]: scipy's brentq in log z."""
        return float(optimize.brentq(lambda p: eps_fn(math.exp(p)) - epsilon,
                                     math.log(lo), math.log(hi), xtol=LOG_TOL))


class DpAccountingCalibrated(Accountant):
    """An accountant whose calibration is dp-accounting's ``calibrate_dp_mechanism`` in
    log z on an explicit bracket, with a fresh dp-accounting accountant of this kind."""

    @classmethod
    @abstractmethod
    def fresh(cls, interval: float) -> Callable[[], object]:
        """A factory of fresh dp-accounting accountants (``interval``: PLD discretisation)."""

    @classmethod
    def solve(cls, family: Family, eps_fn: Callable[[float], float], epsilon: float,
              delta: float, lo: float, hi: float) -> float:
        """dp-accounting's calibration; the interval is the bracket's high-noise end's (the
        finest eps_fn uses), and the caller's final nudge meets the target at z's own."""
        return float(mc.calibrate_dp_mechanism(
            make_fresh_accountant=cls.fresh(pld_interval(family.plain(hi))),
            make_event_from_param=lambda p: family.event(math.exp(p)),
            target_epsilon=epsilon, target_delta=delta,
            bracket_interval=mc.ExplicitBracketInterval(math.log(lo), math.log(hi)),
            tol=LOG_TOL))


class RdpCalibrated(DpAccountingCalibrated):
    """Calibrated with dp-accounting's RdpAccountant (default orders)."""

    @classmethod
    def fresh(cls, interval: float) -> Callable[[], object]:
        """RdpAccountant (the interval is a PLD's; unused)."""
        return dp_rdp.RdpAccountant


class PldCalibrated(DpAccountingCalibrated):
    """Calibrated with dp-accounting's PLDAccountant at the given interval."""

    @classmethod
    def fresh(cls, interval: float) -> Callable[[], object]:
        """PLDAccountant (pessimistic) at ``interval``."""
        return lambda: dp_pld.PLDAccountant(value_discretization_interval=interval)


# ------------------------------------------------------------------------- registry
_REGISTRY: dict[str, type[Accountant]] = {}
C = TypeVar("C", bound=type[Accountant])


def register(cls: C) -> C:
    """Make ``cls`` known under ``cls.name`` (a class decorator); a taken name is refused."""
    known = _REGISTRY.get(cls.name)
    if not cls.name or (known is not None and known is not cls):
        raise ValueError(f"accountant name {cls.name!r} is empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def accountant_class(name: str) -> type[Accountant]:
    """The accountant registered as ``name`` (KeyError if none)."""
    return _REGISTRY[name]


def accountant_names() -> tuple[str, ...]:
    """Every registered accountant's name, in registration order."""
    return tuple(_REGISTRY)


def _gaussian_guide(family: Family) -> type[Accountant] | None:
    """The exact Gaussian accountant for local Gaussian rounds (its z is a lower bound
    on every other accountant's), else none."""
    return _REGISTRY["exact"] if isinstance(family, LocalRounds) and family.kind == "gaussian" \
        else None


# ------------------------------------------------------------------------- local DP
@register
@dataclass(frozen=True)
class Basic(Accountant):
    """Basic composition (:func:`~fedem_private.privacy.accounting.basic_epsilon`): the sum
    of per-release eps; Laplace-only histories are pure DP (valid at delta = 0)."""

    name: ClassVar[str] = "basic"

    def epsilon(self, delta: float) -> float:
        """sum_i n_i eps_i, Gaussian rounds at delta / K each."""
        return basic_epsilon(self.history, delta)

    @classmethod
    def closed_form(cls, family: Family) -> bool:
        """Laplace rounds: eps = T / z, so z = T / eps."""
        return isinstance(family, LocalRounds) and family.kind == "laplace"

    @classmethod
    def guide(cls, family: Family) -> type[Accountant] | None:
        """The exact Gaussian accountant for Gaussian rounds."""
        return _gaussian_guide(family)


@register
@dataclass(frozen=True)
class Advanced(Accountant):
    """Dwork-Rothblum-Vadhan advanced composition
    (:func:`~fedem_private.privacy.accounting.advanced_epsilon`)."""

    name: ClassVar[str] = "advanced"

    def epsilon(self, delta: float) -> float:
        """sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^eps_i - 1)."""
        return advanced_epsilon(self.history, delta)

    @classmethod
    def guide(cls, family: Family) -> type[Accountant] | None:
        """The exact Gaussian accountant for Gaussian rounds."""
        return _gaussian_guide(family)


@register
@dataclass(frozen=True)
class Rdp(RdpCalibrated):
    """dp-accounting's RdpAccountant, default orders
    (:func:`~fedem_private.privacy.accounting.rdp_epsilon`)."""

    name: ClassVar[str] = "rdp"

    def epsilon(self, delta: float) -> float:
        """The RDP bound converted at delta (inf at delta = 0)."""
        return rdp_epsilon(self.history, delta)

    @classmethod
    def guide(cls, family: Family) -> type[Accountant] | None:
        """The exact Gaussian accountant for Gaussian rounds."""
        return _gaussian_guide(family)


@register
@dataclass(frozen=True)
class Pld(PldCalibrated):
    """dp-accounting's PLDAccountant, pessimistic discretisation
    (:func:`~fedem_private.privacy.accounting.pld_epsilon`)."""

    name: ClassVar[str] = "pld"

    def epsilon(self, delta: float) -> float:
        """The PLD bound at delta (inf at delta = 0 or beyond the PLD's range)."""
        return pld_epsilon(self.history, delta)

    @classmethod
    def guide(cls, family: Family) -> type[Accountant] | None:
        """The exact Gaussian accountant for Gaussian rounds, the RDP one for Laplace."""
        return _gaussian_guide(family) or _REGISTRY["rdp"]


@register
@dataclass(frozen=True)
class Exact(Accountant):
    """The exact curve of an all-Gaussian history, one Gaussian of mu = sqrt(sum n_i / z_i^2)
    (Dong, Roth & Su 2019; Balle & Wang 2018, Thm 8;
    :func:`~fedem_private.privacy.accounting.gaussian_exact_epsilon`)."""

    name: ClassVar[str] = "exact"

    def epsilon(self, delta: float) -> float:
        """The smallest eps with delta(eps) <= delta; ValueError for a non-Gaussian history."""
        value = gaussian_exact_epsilon(self.history, delta)
        if value is None:
            raise ValueError("the exact accountant is for all-Gaussian histories only")
        return value

    @classmethod
    def accepts(cls, family: Family) -> bool:
        """Local Gaussian rounds only."""
        return isinstance(family, LocalRounds) and family.kind == "gaussian"


# ------------------------------------------------------------------------- DP-FedAvg
class DpFedAvg(Accountant):
    """User-level central DP of DP-FedAvg (module docstring): each history entry is
    ``count`` rounds of ``RoundMechanism("sampled-gaussian", z, q, 1)``."""

    bound: ClassVar[Callable[[float, float, int, float], float]]

    def epsilon(self, delta: float) -> float:
        """The bound of :func:`~fedem_private.privacy.accounting.dpfedavg_event` for a
        history of one (q, z); several are composed by adding their eps (basic composition
        of the bounds: valid, loose)."""
        for mech, _ in self.history:
            if mech.kind != "sampled-gaussian" or mech.steps != 1:
                raise ValueError(f"DP-FedAvg accounts one sampled Gaussian step a round, not "
                                 f"{mech}")
        if len(self.history) > 1 and delta > 0:
            share = delta / len(self.history)
            return math.fsum(type(self)(((m, n),)).epsilon(share) for m, n in self.history)
        return math.fsum(type(self).bound(m.sample_rate, m.noise_multiplier, n, delta)
                         for m, n in self.history)

    @classmethod
    def accepts(cls, family: Family) -> bool:
        """DP-FedAvg rounds only."""
        return isinstance(family, DpFedAvgRounds)


@register
@dataclass(frozen=True)
class DpFedAvgRdp(DpFedAvg, RdpCalibrated):
    """DP-FedAvg by dp-accounting's RdpAccountant
    (:func:`~fedem_private.privacy.accounting.dpfedavg_rdp_epsilon`)."""

    name: ClassVar[str] = "dpfedavg-rdp"
    bound = staticmethod(dpfedavg_rdp_epsilon)


@register
@dataclass(frozen=True)
class DpFedAvgPld(DpFedAvg, PldCalibrated):
    """DP-FedAvg by dp-accounting's PLDAccountant
    (:func:`~fedem_private.privacy.accounting.dpfedavg_pld_epsilon`)."""

    name: ClassVar[str] = "dpfedavg-pld"
    bound = staticmethod(dpfedavg_pld_epsilon)


# ------------------------------------------------------------------------- every bound at once
@dataclass(frozen=True)
class LocalBounds(Accountant):
    """Every local bound of the history at once: basic, advanced, rdp and pld, and the
    exact curve when the history is all Gaussian; its eps is the smallest
    (:attr:`~fedem_private.privacy.bounds.EpsilonBounds.reported`). The per-client ledger's
    accountant (:class:`~fedem_private.privacy.ledger.PrivacyLedger`); not registered (no
    ``--accountant`` choice). Its bounds are cached per history."""

    name: ClassVar[str] = "reported"
    #: the accountants whose bounds it reports, by class (their names key the figures)
    members: ClassVar[tuple[type[Accountant], ...]] = (Basic, Advanced, Rdp, Pld)
    #: the exact curve, asked only of an all-Gaussian history
    exact: ClassVar[type[Accountant]] = Exact

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The figures it reports: each member's name, then ``reported``."""
        return (*(m.name for m in cls.members), "reported")

    def bounds(self, delta: float) -> EpsilonBounds:
        """Every bound of the history at ``delta`` (cached per history and delta)."""
        return _bounds(type(self), self.history, float(delta))

    def epsilon(self, delta: float) -> float:
        """The smallest of the valid bounds at ``delta``."""
        return self.bounds(delta).reported


@functools.lru_cache(maxsize=8192)
def _bounds(cls: type[LocalBounds], history: Composition, delta: float) -> EpsilonBounds:
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1): {delta}")
    values = {m.name: m(history).epsilon(delta) for m in cls.members}
    gaussian = all(m.kind == "gaussian" for m, _ in history)
    exact = cls.exact(history).epsilon(delta) if gaussian else None
    valid = list(values.values()) + ([exact] if exact is not None else [])
    return EpsilonBounds(delta=delta, gaussian_exact=exact, reported=min(valid), **values)
