"""Per-round noise from a total budget: the inverse of :mod:`accounting`.

Given a target total (eps, delta), the number of rounds T a client may take
part in and an accountant, find the smallest noise multiplier z = noise
scale / sensitivity whose T-fold composition has eps <= target by that
accountant. Laplace: per-round eps = 1/z and b = 2C/eps_round; Gaussian:
sigma = 2Cz.

One generic calibration, :func:`calibrate_noise`, does it for every registered
accountant (:mod:`fedem_private.privacy.accountants`) and mechanism family
(local rounds, DP-FedAvg rounds): a first guess (the family's closed form, or
the z a cheaper "guide" accountant calibrates to), a bracket found by
geometric steps from it, a root in log z, and a final nudge up. What differs
between accountants is only the root finder:

- basic, Laplace: closed form eps_round = eps / T (the first guess), nudged;
- basic (Gaussian), advanced, exact: root of the accounting formula in log z
  (scipy's brentq);
- rdp, pld (and DP-FedAvg's): dp-accounting's ``calibrate_dp_mechanism`` in
  log z with an ``ExplicitBracketInterval`` found beforehand.

Every result is checked, and nudged upwards if needed, so that the
accountant's eps at the returned z is <= the target; the root is found to a
relative tolerance of about 1e-7, so 0.999 z already exceeds the target.
:func:`calibrate` also solves for the other two unknowns: eps given (z, delta)
(the accountant's own bound) and the smallest delta given (z, eps).

The functions below the generic ones (:func:`noise_multiplier_for`,
:func:`gaussian_noise_multiplier`, :func:`laplace_epsilon_round`,
:func:`dpfedavg_noise_multiplier`) check their arguments and call it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import optimize

from fedem_private.errors import UserError
from fedem_private.privacy.accountants import (
    LOG_TOL,
    Accountant,
    DpFedAvgRounds,
    Family,
    LocalRounds,
    accountant_class,
)
from fedem_private.privacy.accounting import PLD_MAX_ROUND_EPS

METHODS: tuple[str, ...] = ("basic", "advanced", "rdp", "pld", "exact")
CENTRAL_METHODS: tuple[str, ...] = ("rdp", "pld")
_MAX_STEPS = 200
#: the smallest delta :func:`calibrate_delta` searches down to
DELTA_FLOOR = 1e-300


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


def calibrate_noise(accountant: type[Accountant], family: Family, epsilon: float,
                    delta: float, label: str | None = None) -> float:
    """Smallest z whose ``family`` history has eps <= ``epsilon`` at ``delta`` by ``accountant``.

    The generic calibration (module docstring): first guess, bracket, the accountant's
    root finder in log z, nudge up. ``epsilon = inf`` gives z = 0 (no noise); a target
    no noise level reaches is a UserError. ``label`` names the accountant in messages
    (default its registered name). The caller checks the target is meaningful.
    """
    if not accountant.accepts(family):
        raise ValueError(f"accountant {accountant.name!r} does not account {family}")
    if math.isinf(epsilon):
        return 0.0

    def eps_fn(z: float) -> float:
        return accountant(family.history(z)).epsilon(delta)

    if accountant.closed_form(family):
        return _nudge_up(eps_fn, epsilon, family.start(epsilon, delta))
    guide = accountant.guide(family)
    z0 = (family.start(epsilon, delta) if guide is None
          else calibrate_noise(guide, family, epsilon, delta))
    describe = family.describe(epsilon, delta, label or accountant.name)
    lo, hi = _bracket(eps_fn, epsilon, z0, describe)
    log_z = accountant.solve(family, eps_fn, epsilon, delta, lo, hi)
    return _nudge_up(eps_fn, epsilon, math.exp(log_z))


def calibrate_epsilon(accountant: type[Accountant], family: Family, noise_multiplier: float,
                      delta: float) -> float:
    """The total eps of ``family``'s history at multiplier z and ``delta`` by ``accountant``
    (its own bound: the inverse of :func:`calibrate_noise`)."""
    if not accountant.accepts(family):
        raise ValueError(f"accountant {accountant.name!r} does not account {family}")
    return accountant(family.history(noise_multiplier)).epsilon(delta)


def calibrate_delta(accountant: type[Accountant], family: Family, noise_multiplier: float,
                    epsilon: float) -> float:
    """The smallest delta (down to :data:`DELTA_FLOOR`) at which ``family``'s history at
    multiplier z has eps <= ``epsilon`` by ``accountant``: 0 if it holds at delta = 0
    (pure DP), else a root in log delta (brentq) nudged up until it holds. UserError
    if no delta < 1 meets the target."""
    history = accountant(family.history(noise_multiplier)) if accountant.accepts(family) \
        else None
    if history is None:
        raise ValueError(f"accountant {accountant.name!r} does not account {family}")

    def eps_at(delta: float) -> float:
        return history.epsilon(delta)

    if eps_at(0.0) <= epsilon:
        return 0.0
    hi = 1e-6
    while eps_at(hi) > epsilon:  # towards 1: 1e-3, 0.03, 0.18, 0.42, ...
        hi = math.sqrt(hi)
        if hi > 1.0 - 1e-9:
            raise UserError(f"eps={epsilon:g} is not reached at noise multiplier "
                            f"{noise_multiplier:g} for any delta < 1 ({accountant.name})")
    lo = hi
    while eps_at(lo) <= epsilon:  # towards 0: 1e-12, 1e-24, ...
        if lo <= DELTA_FLOOR:
            return lo
        lo = max(lo * lo, DELTA_FLOOR)
    delta = math.exp(float(optimize.brentq(lambda p: eps_at(math.exp(p)) - epsilon,
                                           math.log(lo), math.log(hi), xtol=LOG_TOL)))
    step = 1e-12
    while eps_at(delta) > epsilon:
        delta = min(delta * (1.0 + step), hi)
        step *= 2.0
    return delta


def calibrate(accountant: type[Accountant], family: Family, *, epsilon: float | None = None,
              delta: float | None = None, noise_multiplier: float | None = None) -> float:
    """The one of (epsilon, delta, noise_multiplier) left out, given the other two:
    :func:`calibrate_noise`, :func:`calibrate_epsilon` or :func:`calibrate_delta`."""
    given = (epsilon is not None, delta is not None, noise_multiplier is not None)
    if sum(given) != 2:
        raise ValueError("give exactly two of epsilon, delta and noise_multiplier")
    if noise_multiplier is None:
        return calibrate_noise(accountant, family, float(epsilon), float(delta))  # type: ignore
    if epsilon is None:
        return calibrate_epsilon(accountant, family, float(noise_multiplier), float(delta))  # type: ignore
    return calibrate_delta(accountant, family, float(noise_multiplier), float(epsilon))


def noise_multiplier_for(kind: str, epsilon: float, delta: float, rounds: int,
                         accountant: str) -> float:
    """Smallest z (noise scale / sensitivity) with eps(T rounds) <= epsilon by ``accountant``.

    ``epsilon = inf`` gives z = 0 (no noise). Raises UserError for impossible
    targets (eps <= 0, delta = 0 with Gaussian noise or with a non-basic
    accountant, a bad round count). :func:`calibrate_noise` over :class:`LocalRounds`.
    """
    epsilon, delta = float(epsilon), float(delta)
    _check_target(kind, epsilon, delta, rounds, accountant)
    return calibrate_noise(accountant_class(accountant), LocalRounds(kind, rounds), epsilon,
                           delta)


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
    if accountant not in CENTRAL_METHODS:
        raise UserError(f"DP-FedAvg calibration needs accountant pld or rdp, not {accountant!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise UserError(f"number of rounds to calibrate for must be an integer >= 1, got {rounds}")
    if not epsilon > 0:
        raise UserError(f"target epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise UserError(f"target delta must be in (0, 1) for Gaussian noise, got {delta}")
    if not 0 < q <= 1:
        raise UserError(f"sample rate must be in (0, 1], got {q}")
    return calibrate_noise(accountant_class(f"dpfedavg-{accountant}"), DpFedAvgRounds(q, rounds),
                           epsilon, delta, label=accountant)
