"""Composition of per-round local-DP releases over many rounds.

A round is described by a :class:`RoundMechanism`: the noise kind and the
noise multiplier z = noise scale / sensitivity, where the sensitivity is the
replace-one sensitivity of the clipped delta (2C: the client's whole dataset
replaced by any other moves the clipped delta anywhere in the radius-C ball).
dp-accounting's unsampled ``LaplaceDpEvent(z)`` / ``GaussianDpEvent(z)`` are
exactly "a sensitivity-1 query plus Laplace(z) / N(0, z^2) noise", so they
describe our rounds once the delta is normalised by 2C.

A client's history is a composition: a multiset of (mechanism, count). The
bounds on its total eps at a target delta:

- basic: sum of per-round eps. Laplace rounds are pure eps-DP (eps = 1/z),
  so for Laplace-only histories this is the pure-DP (delta = 0) figure.
  Gaussian rounds are split evenly: each of the K Gaussian rounds is
  (eps_i(delta/K), delta/K)-DP by the analytic Gaussian mechanism.
- advanced: Dwork-Rothblum-Vadhan 2010 (Dwork & Roth 2014, Thm 3.20):
  eps = sqrt(2 ln(1/delta') sum_i eps_i^2) + sum_i eps_i (e^eps_i - 1); the
  Azuma argument of its proof holds round by round, so differing eps_i are
  allowed. With Gaussian rounds, delta' = delta/2 and each of the K Gaussian
  rounds gets delta/(2K).
- rdp: dp-accounting's RdpAccountant (default orders).
- pld: dp-accounting's PLDAccountant, pessimistic discretisation (a valid
  upper bound at any interval; it is inf at delta = 0). The interval is
  PLD_DISCRETIZATION, widened for very large per-round eps so that one
  round's privacy loss spans at most PLD_MAX_BINS intervals (memory and time
  stay bounded; the bound loosens by at most one interval per round).
  dp-accounting overflows for a per-round eps above about 700, so beyond
  PLD_MAX_ROUND_EPS the PLD bound is inf (no finite figure from it).
- gaussian_exact (all-Gaussian histories): a composition of Gaussian
  mechanisms is one Gaussian mechanism with mu = sqrt(sum_i n_i / z_i^2)
  (Dong, Roth & Su 2019), whose exact curve is
  delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
  (Balle & Wang 2018, Thm 8); solved for eps.

``reported`` is the minimum of these valid bounds. Each bound is also an accountant
class behind one interface (:mod:`fedem_private.privacy.accountants`); :func:`epsilon_bounds`
asks the accountant of them all (:class:`~fedem_private.privacy.accountants.LocalBounds`)
and :func:`dpfedavg_bounds` the two DP-FedAvg accountants, by their classes.

Layout (docs/design.md section 1: no import circles): the bound functions and the records
live in :mod:`fedem_private.privacy.bounds`, the accountant classes that wrap them in
:mod:`fedem_private.privacy.accountants`, and this module, which imports both and is
imported by neither, asks the accountants; every name of ``bounds`` is importable from
here. No amplification by
subsampling is applied: the server sees who took part.

Numbers here are floats; inf means "no finite guarantee" (e.g. z = 0, or
delta = 0 for a bound that needs delta > 0). ``EpsilonBounds.as_dict`` gives
the JSON-ready form, where inf is written as None.
"""

from __future__ import annotations

import functools
import math

from fedem_private.privacy.accountants import DpFedAvgPld, DpFedAvgRdp, LocalBounds
from fedem_private.privacy.bounds import (  # noqa: F401  (re-exported: the bounds' math)
    BOUND_FUNCTIONS,
    CENTRAL_BOUND_FUNCTIONS,
    KINDS,
    PLD_DISCRETIZATION,
    PLD_MAX_BINS,
    PLD_MAX_ROUND_EPS,
    CentralBounds,
    Composition,
    EpsilonBounds,
    RoundMechanism,
    _check_dpfedavg,
    _event,
    _gaussian_rounds,
    _has_no_noise,
    _json_eps,
    _round_epsilons,
    advanced_epsilon,
    basic_epsilon,
    composition,
    dpfedavg_event,
    dpfedavg_pld_epsilon,
    dpfedavg_rdp_epsilon,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_exact_epsilon,
    opacus_rdp_epsilon,
    pld_epsilon,
    pld_interval,
    quiet_absl,
    rdp_epsilon,
    repeated,
    zcdp_epsilon,
)

#: the local bounds by name, as :class:`EpsilonBounds` holds them (the accountants of
#: :class:`~fedem_private.privacy.accountants.LocalBounds`)
BOUNDS: tuple[str, ...] = tuple(cls.name for cls in LocalBounds.members)
#: DP-FedAvg's two bounds, as :class:`CentralBounds` holds them
CENTRAL_BOUNDS: tuple[str, ...] = ("rdp", "pld")


@functools.lru_cache(maxsize=8192)
def epsilon_bounds(comp: Composition, delta: float) -> EpsilonBounds:
    """All bounds on the total eps of history ``comp`` at ``delta`` (cached per history):
    the accountant of every local bound,
    :class:`~fedem_private.privacy.accountants.LocalBounds`."""
    return LocalBounds(comp).bounds(delta)


def compose(mechanism: RoundMechanism, rounds: int, delta: float) -> EpsilonBounds:
    """Bounds on the total eps of ``rounds`` identical rounds of ``mechanism`` at ``delta``."""
    return epsilon_bounds(repeated(mechanism, rounds), float(delta))


@functools.lru_cache(maxsize=1024)
def dpfedavg_bounds(sample_rate: float, noise_multiplier: float, rounds: int,
                    delta: float) -> CentralBounds:
    """Both bounds of :func:`dpfedavg_event` at ``delta`` (cached): the dpfedavg-rdp and
    dpfedavg-pld accountants of :mod:`~fedem_private.privacy.accountants`."""
    _check_dpfedavg(sample_rate, noise_multiplier, rounds)
    history = repeated(RoundMechanism("sampled-gaussian", float(noise_multiplier),
                                      float(sample_rate), 1), int(rounds))
    rdp, pld = (cls(history).epsilon(delta) for cls in (DpFedAvgRdp, DpFedAvgPld))
    return CentralBounds(delta=float(delta), sample_rate=float(sample_rate),
                         noise_multiplier=float(noise_multiplier), rounds=int(rounds),
                         rdp=rdp, pld=pld, reported=min(rdp, pld))


def gaussian_release_bounds(noise_multiplier: float, delta: float) -> dict[str, float | None]:
    """One Gaussian mechanism of multiplier z at ``delta``, JSON-ready (inf as None): every
    bound of :func:`compose` for one release (dp-accounting's RDP and PLD of
    ``GaussianDpEvent(z)``, the exact curve) and the closed-form zCDP figure
    (:func:`zcdp_epsilon`, rho = 1 / (2 z^2)); ``reported`` is the minimum of the first."""
    z = float(noise_multiplier)
    out = compose(RoundMechanism("gaussian", z), 1, delta).as_dict()
    rho = math.inf if z == 0 else 1.0 / (2.0 * z * z)
    out["zcdp"] = _json_eps(zcdp_epsilon(rho, delta))
    return out
