"""What tuning on private data costs: a noisy validation score and the search's epsilon.

Tuning reads the users' validation items, so the setting it chooses is a function of
private data that no single run's epsilon covers (Papernot and Steinke, ICLR 2022).
``fedem-private tune`` with ``[tune.private]`` (docs/design.md section 14, "Tuning's own
privacy cost") runs each trial under ``cdp-gaussian`` at settings whose privacy event is
fixed in advance, releases each trial's score through :func:`noisy_score`, lets the
sampler see only that, and accounts for the whole search here.

Neighbouring relation: user-level, add/remove one client's whole data (its training
interactions and its validation item): the relation of ``cdp-gaussian``, the only
architecture this is built for.

Independence: both bounds compose independent runs. Each trial draws its own
randomness (its own ``train.nonce``: noise, participation, initialisation, negatives) and
the final run another (nonce 0), as ``fedem_private.experiments.tune`` arranges; until
issue 65 every trial shared the base seed's noise, and neither bound held.

Trust model: as ``cdp-gaussian``. A trial's training is DP-FedAvg (Poisson sampling at
rate q, each delta L2-clipped to C, N(0, z^2 C^2) added once to the sum under secure
aggregation). Its score is the number of users whose validation item ranks in the top 10
of its 100 candidates, summed the same way with N(0, sigma^2) added once.

Sensitivity of the score: 1. Given the released models, a user's hit depends on those
released values and on its own data only, so adding or removing one user moves the count
by at most one; the models themselves are paid for by the training's event (adaptive
composition: the score is chosen after the models are released). The item catalogue and
each user's candidate negatives are public or the user's own. The neighbour-world harness
checks it for every cdp-gaussian composition: with the releases shared, every other user
ranks its validation item the same in both worlds
(``tests/test_neighbour_worlds.py``, :func:`fedem_private.experiments.neighbours.
validation_ranks_pair`). A trial that diverges releases no score; whether it diverges is
read from released values (a non-finite contribution makes the noisy sum non-finite).

Two observers, two bounds (:func:`search_epsilon`):

- ``every_trial``: someone who sees every trial's released models and noisy scores (the
  participants receive each trial's broadcasts). The K trials compose (each trial's
  setting may depend on earlier noisy scores, so TPE is allowed); K is fixed before the
  search. eps of the K-fold composition, RDP and PLD from dp-accounting, the smaller
  reported.
- ``only_choice``: someone who receives only the chosen setting and its trial's outputs.
  With K drawn at random (Poisson, or truncated negative binomial including geometric
  and logarithmic) and the trials independent repetitions of one randomised trial
  (random search, not TPE), Papernot and Steinke's Theorems 2 and 6 bound the search by
  a small multiple of one trial's RDP: dp-accounting's ``RepeatAndSelectDpEvent``.

Both views are the observer's (amplification by Poisson sampling claimed) and the
aggregator's (no amplification, every round counted for every client: an upper bound on
the ledger's worst client). A final model trained again at the chosen setting is a
further release: :func:`search_epsilon` adds it when asked (``final_runs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dp_accounting
from dp_accounting import dp_event
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp
from scipy import stats

from fedem_private import rng
from fedem_private.privacy.accounting import (
    PLD_DISCRETIZATION,
    dpfedavg_event,
    quiet_absl,
)

#: L1 (= L2) sensitivity of the validation hit count under add/remove of one user
SCORE_SENSITIVITY = 1.0
#: a name per shape that dp-accounting's RepeatAndSelectDpEvent knows
SHAPES = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}


def noisy_score(hits: int, sigma: float, seed: int, trial: int) -> float:
    """The released score of one trial: ``hits + N(0, sigma^2)`` (the Gaussian mechanism on
    a count of sensitivity :data:`SCORE_SENSITIVITY`), one draw keyed by (seed, trial)."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"score noise must be a finite sigma > 0: {sigma}")
    k = rng.key(seed, rng.Stream.TUNE_SCORE, trial, 0)
    z = rng.normal_from_uniform(rng.uniform(k, 0), rng.uniform(k, 1))
    return float(hits) + sigma * float(z)


@dataclass(frozen=True)
class TrialCount:
    """The number of trials K drawn before the search (Papernot and Steinke 2022, section 2).

    ``shape`` is ``inf`` for Poisson(mean), 1 for geometric, 0 for logarithmic, any other
    positive number for the truncated negative binomial of that shape; ``mean`` >= 1.
    """

    mean: float
    shape: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and self.mean >= 1):
            raise ValueError(f"mean number of trials must be a finite number >= 1: {self.mean}")
        if math.isnan(self.shape) or self.shape < 0:
            raise ValueError(f"shape must be >= 0 (inf: Poisson): {self.shape}")

    @property
    def label(self) -> str:
        names = {v: k for k, v in SHAPES.items()}
        what = names.get(self.shape, f"truncated negative binomial, shape {self.shape:g}")
        return f"{what}, mean {self.mean:g}"

    def gamma(self) -> float:
        """The truncated negative binomial's halting probability whose mean is ``mean``
        (their Definition 1), by bisection; the upper end, so draws never average more
        trials than accounted."""
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            if mid <= 0 or _tnb_mean(mid, self.shape) > self.mean:
                lo = mid
            else:
                hi = mid
        return hi

    def distribution(self) -> Any:
        """A frozen scipy distribution of K (for K >= 1 with the truncated ones)."""
        if self.shape == math.inf:
            return stats.poisson(self.mean)
        gamma = self.gamma()
        if self.shape == 0:
            return stats.logser(1.0 - gamma)
        return _Truncated(stats.nbinom(self.shape, gamma))

    def draw(self, seed: int) -> int:
        """K, by inverting the distribution at one uniform keyed by ``seed``."""
        u = float(rng.uniform(rng.key(seed, rng.Stream.TUNE_TRIALS, 0, 0), 0))
        return int(self.distribution().ppf(u))


class _Truncated:
    """A discrete distribution on {0, 1, ...} conditioned on K >= 1."""

    def __init__(self, dist: Any) -> None:
        self.dist = dist
        self.p0 = float(dist.cdf(0))

    def ppf(self, u: float) -> float:
        return float(self.dist.ppf(self.p0 + u * (1.0 - self.p0)))

    def mean(self) -> float:
        return float(self.dist.mean()) / (1.0 - self.p0)


def _tnb_mean(gamma: float, shape: float) -> float:
    """Mean of the truncated negative binomial (their Definition 1)."""
    if shape == 0:
        return (1.0 - gamma) / (gamma * math.log(1.0 / gamma)) if gamma < 1 else 1.0
    if gamma >= 1:
        return 1.0
    return shape * (1.0 / gamma - 1.0) / (1.0 - gamma ** shape)


@dataclass(frozen=True)
class TrialEvent:
    """One trial's releases: ``rounds`` DP-FedAvg rounds (Poisson rate ``sample_rate``,
    noise multiplier ``noise_multiplier``) and one score with noise ``score_noise``."""

    sample_rate: float
    noise_multiplier: float
    rounds: int
    score_noise: float

    def training(self, view: str) -> dp_accounting.DpEvent:
        """The training rounds alone (a final run at the chosen setting), for ``view``:
        ``observer`` (sampling amplifies) or ``aggregator`` (it sees who took part: no
        amplification)."""
        if view == "observer":
            return dpfedavg_event(self.sample_rate, self.noise_multiplier, self.rounds)
        if view == "aggregator":
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.GaussianDpEvent(self.noise_multiplier), self.rounds)
        raise ValueError(f"unknown view {view!r}")

    def event(self, view: str) -> dp_accounting.DpEvent:
        """The whole trial for ``view``: its training, then its noisy score."""
        score = dp_accounting.GaussianDpEvent(self.score_noise / SCORE_SENSITIVITY)
        return dp_accounting.ComposedDpEvent([self.training(view), score])


VIEWS = ("observer", "aggregator")


def _rdp(event: dp_accounting.DpEvent, delta: float) -> float:
    with quiet_absl():
        accountant = dp_rdp.RdpAccountant()
        accountant.compose(event)
        return float(accountant.get_epsilon(delta))


def _pld(event: dp_accounting.DpEvent, delta: float) -> float:
    accountant = dp_pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def _bounds(event: dp_accounting.DpEvent, delta: float, pld: bool) -> dict[str, float]:
    out = {"rdp": _rdp(event, delta)}
    if pld:
        out["pld"] = _pld(event, delta)
    out["reported"] = min(out.values())
    return out


def _search_events(trial: TrialEvent, view: str, trials: int | None,
                   count: TrialCount | None, final_runs: int
                   ) -> dict[str, dp_accounting.DpEvent]:
    """The events :func:`search_epsilon` bounds for ``view``: one run, one trial, and the
    every-trial (``trials`` given) and only-the-choice (``count`` given) searches, each
    followed by ``final_runs`` final runs."""
    final = [trial.training(view)] * final_runs
    out = {"one_run": trial.training(view), "one_trial": trial.event(view)}
    if trials is not None:
        every = dp_accounting.SelfComposedDpEvent(trial.event(view), trials)
        out["every_trial"] = dp_accounting.ComposedDpEvent([every, *final])
    if count is not None:
        chosen = dp_event.RepeatAndSelectDpEvent(trial.event(view), count.mean, count.shape)
        out["only_choice"] = dp_accounting.ComposedDpEvent([chosen, *final])
    return out


#: what privacy.json says the bounds assume of the trials
INDEPENDENCE = ("each trial and the final run draw their own randomness (train.nonce): the "
                "trials are independent runs, as the composition theorems require")


def search_epsilon(trial: TrialEvent, delta: float, *, trials: int | None = None,
                   count: TrialCount | None = None, final_runs: int = 0,
                   pld: bool = True) -> dict[str, Any]:
    """eps at ``delta`` of a search, per view (module docstring), plus ``final_runs``
    further trainings at the chosen setting (composed after the search).

    ``trials``: the number of trials run, fixed in advance: the ``every_trial`` bound,
    the K-fold composition of ``trial``. ``count``: K drawn from that distribution and
    the trials independent: the ``only_choice`` bound (Papernot and Steinke, Theorems 2
    and 6; RDP only, as the theorem is stated in RDP).
    """
    if trials is None and count is None:
        raise ValueError("give the trials run, their distribution, or both")
    from fedem_private.privacy.mech.base import stated_relation

    out: dict[str, Any] = {"delta": delta, "neighbouring": stated_relation(
                               "user-level: add/remove one client's whole data"),
                           "score_sensitivity": SCORE_SENSITIVITY, "views": {},
                           "independence": INDEPENDENCE}
    for view in VIEWS:
        events = _search_events(trial, view, trials, count, final_runs)
        one: dict[str, Any] = {}
        for name, event in events.items():
            if name == "only_choice":  # the theorem is stated in RDP
                rdp = _rdp(event, delta)
                one[name] = {"rdp": rdp, "reported": rdp}
            else:
                one[name] = _bounds(event, delta, pld)
        out["views"][view] = one
    if trials is not None:
        out["trials"] = trials
    if count is not None:
        out["trial_count"] = {"mean": count.mean, "shape": count.shape, "label": count.label}
    out["final_runs"] = final_runs
    return out


def solve_trial_noise(total: float, delta: float, sample_rate: float, rounds: int,
                      score_noise: float, *, trials: int | None = None,
                      count: TrialCount | None = None, final_runs: int = 1) -> float:
    """The noise multiplier z of every trial's training that makes the search, plus
    ``final_runs`` final runs, cost ``total`` at ``delta`` for the observer: the
    only-the-choice bound with ``count``, else the every-trial bound over ``trials``
    (RDP, so PLD reports at most ``total``). Bisection on log z to 1e-6."""
    if not (0 < total < math.inf):
        raise ValueError(f"total epsilon must be finite and > 0: {total}")
    bound = "only_choice" if count is not None else "every_trial"

    def eps(z: float) -> float:  # only the bound solved for, not search_epsilon's others
        events = _search_events(TrialEvent(sample_rate, z, rounds, score_noise), "observer",
                                None if count is not None else trials, count, final_runs)
        return _rdp(events[bound], delta)

    lo, hi = math.log(1e-2), math.log(1e4)
    if eps(math.exp(hi)) > total:
        raise ValueError(f"total epsilon {total:g} is out of reach: the score noise alone "
                         f"(sigma {score_noise:g}) and the repetitions cost more")
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        if eps(math.exp(mid)) > total:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)

