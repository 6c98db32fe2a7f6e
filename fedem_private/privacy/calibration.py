"""Per-round noise from a total budget: the inverse of :mod:`accounting`.

Given a target total (eps, delta), the number of rounds T a client may take
part in and an accountant, find the smallest noise multiplier z = noise
scale / sensitivity whose T-fold composition has eps <= target by that
accountant. Laplace: per-round eps = 1/z and b = 2C/eps_round; Gaussian:
sigma = 2Cz.

- basic, Laplace: closed form eps_round = eps / T.
- basic (Gaussian) and advanced: root of the accounting formula in log z
  (scipy's brentq).
- rdp, pld: dp-accounting's ``calibrate_dp_mechanism`` in log z with an
  ``ExplicitBracketInterval`` found beforehand.
- exact (Gaussian only): the analytic Gaussian curve.

Every result is checked, and nudged upwards if needed, so that the
accountant's eps at the returned z is <= the target; the root is found to a
relative tolerance of about 1e-7, so 0.999 z already exceeds the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting
from dp_accounting import mechanism_calibration as mc
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp
from scipy import optimize

from fedem_private.errors import UserError
from fedem_private.privacy.accounting import (
    BOUND_FUNCTIONS,
    CENTRAL_BOUND_FUNCTIONS,
    PLD_MAX_ROUND_EPS,
    RoundMechanism,
    dpfedavg_event,
    gaussian_exact_epsilon,
    pld_interval,
    repeated,
)

METHODS: tuple[str, ...] = ("basic", "advanced", "rdp", "pld", "exact")
_LOG_TOL = 1e-7
_MAX_STEPS = 200


def _check_target(kind: str, epsilon: float, delta: float, rounds: int, method: str) -> None:
    if kind not in ("laplace", "gaussian"):
        raise ValueError(f"unknown noise kind {kind!r}")
    if method not in METHODS or (method == "exact" and kind != "gaussian"):
        raise UserError(f"unknown accountant {method!r} for {kind} calibration")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise UserError(f"number of rounds to calibrate for must be an integer >= 1, got {rounds}")
    if not epsilon > 0:  # also rejects NaN
        raise UserError(f"target epsilon must be > 0, got {epsilon}")
    if not 0 <= delta < 1:
        raise UserError(f"target delta must be in [0, 1), got {delta}")
    if delta == 0 and kind == "gaussian":
        raise UserError("target delta = 0 is impossible with Gaussian noise (no pure DP)")
    if delta == 0 and method != "basic":
        raise UserError(f"target delta = 0 (pure DP) needs accountant 'basic', not {method!r}")
    if method == "pld" and math.isfinite(epsilon) and epsilon / rounds > PLD_MAX_ROUND_EPS:
        # the total is at most rounds x eps_round, so eps_round >= epsilon / rounds
        raise UserError(f"target eps={epsilon:g} over {rounds} rounds needs more than "
                        f"{PLD_MAX_ROUND_EPS:g} per round, beyond the PLD accountant's range; "
                        f"use accountant 'rdp' or 'basic'")


def _epsilon_function(kind: str, delta: float, rounds: int, method: str
                      ) -> Callable[[float], float]:
    """z -> eps of T rounds of noise multiplier z by the given method."""
    if method == "exact":
        def exact(z: float) -> float:
            value = gaussian_exact_epsilon(repeated(RoundMechanism(kind, z), rounds), delta)
            assert value is not None
            return value
        return exact
    bound = BOUND_FUNCTIONS[method]
    return lambda z: bound(repeated(RoundMechanism(kind, z), rounds), delta)


def _bracket(eps_fn: Callable[[float], float], target: float, z0: float,
             describe: str) -> tuple[float, float]:
    """(lo, hi) with eps(lo) > target >= eps(hi), stepping from z0 by factors 1.05, 1.05^2, ...

    The step factor squares each time, so a far-off start costs few evaluations.
    """
    factor = 1.05
    if eps_fn(z0) <= target:
        hi = z0
        for _ in range(_MAX_STEPS):
            lo = hi / factor
            if eps_fn(lo) > target:
                return lo, hi
            hi, factor = lo, min(factor * factor, 1e100)
        raise RuntimeError(f"no lower bracket for {describe}")  # pragma: no cover
    lo = z0
    for _ in range(_MAX_STEPS):
        hi = lo * factor
        if not math.isfinite(hi):
            break
        if eps_fn(hi) <= target:
            return lo, hi
        lo, factor = hi, min(factor * factor, 1e100)
    raise UserError(f"target {describe} cannot be reached with any noise level")


def _nudge_up(eps_fn: Callable[[float], float], target: float, z: float) -> float:
    """Smallest step up from z (relative 1e-12 and growing) until eps(z) <= target."""
    step = 1e-12
    while eps_fn(z) > target:
        z *= 1.0 + step
        step *= 2.0
    return z


def _accountant_factory(method: str, interval: float) -> Callable[[], object]:
    if method == "pld":
        return lambda: dp_pld.PLDAccountant(value_discretization_interval=interval)
    return dp_rdp.RdpAccountant


def _start(kind: str, epsilon: float, delta: float, rounds: int, accountant: str) -> float:
    """A cheap first guess of z: basic composition (Laplace; the RDP solution for PLD) or
    the exact Gaussian solution (a lower bound of z for every accountant)."""
    if kind == "gaussian":
        if accountant == "exact":
            return math.sqrt(2.0 * rounds * math.log(1.25 / delta)) / epsilon
        return noise_multiplier_for(kind, epsilon, delta, rounds, "exact")
    if accountant == "pld":
        return noise_multiplier_for(kind, epsilon, delta, rounds, "rdp")
    return rounds / epsilon


def noise_multiplier_for(kind: str, epsilon: float, delta: float, rounds: int,
                         accountant: str) -> float:
    """Smallest z (noise scale / sensitivity) with eps(T rounds) <= epsilon by ``accountant``.

    ``epsilon = inf`` gives z = 0 (no noise). Raises UserError for impossible
    targets (eps <= 0, delta = 0 with Gaussian noise or with a non-basic
    accountant, a bad round count).
    """
    epsilon, delta = float(epsilon), float(delta)
    _check_target(kind, epsilon, delta, rounds, accountant)
    if math.isinf(epsilon):
        return 0.0
    eps_fn = _epsilon_function(kind, delta, rounds, accountant)
    if kind == "laplace" and accountant == "basic":
        return _nudge_up(eps_fn, epsilon, rounds / epsilon)
    describe = f"eps={epsilon:g} at delta={delta:g} over {rounds} rounds ({accountant})"
    z0 = _start(kind, epsilon, delta, rounds, accountant)
    lo, hi = _bracket(eps_fn, epsilon, z0, describe)
    if accountant in ("rdp", "pld"):
        log_z = mc.calibrate_dp_mechanism(
            # the (finest) interval eps_fn uses at the bracket's high-noise end; the final
            # nudge makes eps_fn (the accountant's own interval at z) meet the target
            make_fresh_accountant=_accountant_factory(
                accountant, pld_interval(repeated(RoundMechanism(kind, hi), rounds))),
            make_event_from_param=lambda p: dp_accounting.SelfComposedDpEvent(
                RoundMechanism(kind, math.exp(p)).event(), rounds
            ),
            target_epsilon=epsilon,
            target_delta=delta,
            bracket_interval=mc.ExplicitBracketInterval(math.log(lo), math.log(hi)),
            tol=_LOG_TOL,
        )
    else:
        log_z = optimize.brentq(
            lambda p: eps_fn(math.exp(p)) - epsilon, math.log(lo), math.log(hi), xtol=_LOG_TOL
        )
    return _nudge_up(eps_fn, epsilon, math.exp(log_z))


def laplace_epsilon_round(epsilon: float, delta: float, rounds: int, accountant: str) -> float:
    """Per-round eps for Laplace noise (b = 2C / eps_round) meeting a total (eps, delta).

    Under replace-one local DP with L1 sensitivity 2C each round is
    eps_round-DP; the total over ``rounds`` rounds is <= epsilon by ``accountant``.
    """
    z = noise_multiplier_for("laplace", epsilon, delta, rounds, accountant)
    return math.inf if z == 0 else 1.0 / z


def gaussian_noise_multiplier(epsilon: float, delta: float, rounds: int, accountant: str) -> float:
    """Noise multiplier z (sigma = 2Cz) meeting a total (eps, delta) over ``rounds`` rounds.

    ``accountant`` may also be "exact" (the analytic Gaussian curve).
    """
    return noise_multiplier_for("gaussian", epsilon, delta, rounds, accountant)


def dpfedavg_noise_multiplier(epsilon: float, delta: float, sample_rate: float, rounds: int,
                              accountant: str = "pld") -> float:
    """Smallest z (sigma = z C) whose T rounds of DP-FedAvg are (epsilon, delta)-DP.

    The mechanism is :func:`~fedem_private.privacy.accounting.dpfedavg_event`:
    Poisson sampling at rate q = ``sample_rate``, L2 sensitivity C of the sum
    under add/remove of one client's data, Gaussian noise z C once per round.
    The target is the guarantee against observers of the released models
    (amplified by sampling); ``accountant`` is "pld" or "rdp". Found by
    dp-accounting's ``calibrate_dp_mechanism`` in log z on an explicit bracket,
    then nudged up until the accountant's eps at z is <= epsilon.
    ``epsilon = inf`` gives z = 0 (clip only, no guarantee).
    """
    epsilon, delta, q = float(epsilon), float(delta), float(sample_rate)
    if accountant not in CENTRAL_BOUND_FUNCTIONS:
        raise UserError(f"DP-FedAvg calibration needs accountant pld or rdp, not {accountant!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise UserError(f"number of rounds to calibrate for must be an integer >= 1, got {rounds}")
    if not epsilon > 0:
        raise UserError(f"target epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise UserError(f"target delta must be in (0, 1) for Gaussian noise, got {delta}")
    if not 0 < q <= 1:
        raise UserError(f"sample rate must be in (0, 1], got {q}")
    if math.isinf(epsilon):
        return 0.0
    bound = CENTRAL_BOUND_FUNCTIONS[accountant]

    def eps_fn(z: float) -> float:
        return bound(q, z, rounds, delta)

    describe = (f"eps={epsilon:g} at delta={delta:g} over {rounds} rounds at sample rate "
                f"{q:g} ({accountant})")
    lo, hi = _bracket(eps_fn, epsilon, 1.0, describe)
    log_z = mc.calibrate_dp_mechanism(
        make_fresh_accountant=_accountant_factory(
            accountant, pld_interval(repeated(RoundMechanism("gaussian", hi), rounds))),
        make_event_from_param=lambda p: dpfedavg_event(q, math.exp(p), rounds),
        target_epsilon=epsilon,
        target_delta=delta,
        bracket_interval=mc.ExplicitBracketInterval(math.log(lo), math.log(hi)),
        tol=_LOG_TOL,
    )
    return _nudge_up(eps_fn, epsilon, math.exp(log_z))
