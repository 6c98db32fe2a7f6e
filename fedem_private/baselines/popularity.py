"""Item popularity over the training interactions, plain and released under DP (docs/design.md 14).

``mostpop`` ranks every item by its number of training interactions c_i =
sum_u x_ui (x_ui = 1 when item i is among u's training items): the same
ranking for every user; the evaluation leaves out each user's own training
items. Integer counts tie often, and the metric counts a tie against the
model, so ties are broken by a seeded random order of the items (a jitter in
[0, 0.5), below the gap of 1 between distinct counts; it never reorders them).

``dp-mostpop`` releases the count vector once under one of four privacy
architectures; each function's docstring states its neighbouring relation,
trust model and sensitivity, and the accountant its epsilon comes from:

- :func:`central_gaussian_counts`: user level, central (secure aggregation);
- :func:`local_oue_counts`: user level, local (optimal unary encoding);
- :func:`interaction_laplace_counts`: interaction level, Laplace per count once,
  on the securely aggregated sum;
- :func:`local_interaction_laplace_counts`: interaction level, local: every client
  adds Laplace noise to its own count vector (the floor matched to ``ldp-dpsgd``).

The released (noisy) counts are the scores; ranking is post-processing, so
the guarantee of the release covers every recommendation made from it.

Every random draw that must depend on one user's data alone (its k-subset, its local
report's noise) is keyed by the stable keys of the user's and the items' source ids
(``Split.source_users``, ``Split.source_items``; :mod:`fedem_private.data.keys`), not by
their re-indexed positions, which shift when another user is removed; the noise added
once to a sum is keyed by the items' source keys, so two neighbouring datasets share it
item by item (the neighbour-world check
:func:`fedem_private.experiments.neighbours.dp_mostpop_pair` relies on both). Every
relation is stated with the assumption that the item catalogue is public
(:func:`fedem_private.privacy.mech.base.stated_relation`).

What the releases do not hold: the number of users whose training set exceeds k
(``users_clipped``) is a function of every user's data with no noise on it; it is a
simulator-only diagnostic in :attr:`Release.diagnostics` (summary.json's ``clipping``
block, where a federated run keeps its fraction clipped and pre-clip norms), never in
the released privacy block.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedem_private import rng
from fedem_private.data.split import Split
from fedem_private.privacy.accounting import (
    RoundMechanism,
    dpfedavg_bounds,
    epsilon_bounds,
    repeated,
)
from fedem_private.privacy.calibration import dpfedavg_noise_multiplier, noise_multiplier_for
from fedem_private.privacy.mech.base import stated_relation

# purposes of the draws below: the numpy SeedSequence entropy (seed, purpose) of MostPop's
# jitter, and the stream of the keyed draws (rng.key(seed, purpose, round, client); the
# purposes lie outside rng.Stream's values, so no draw of a simulation shares their keys)
_TIEBREAK, _SUBSET, _CENTRAL, _LOCAL, _INTERACTION = 4201, 4202, 4203, 4204, 4205
_LOCAL_INTERACTION = 4206

# what a release's diagnostics are (summary.json's ``clipping`` block of a dp-mostpop run)
DIAGNOSTIC_NOTE = ("simulator-only diagnostic, not released: an exact function of every "
                   "user's data that the release's guarantee does not cover")


def _generator(seed: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), purpose]))


def _uniforms(seed: int, purpose: int, draw: int, owners: np.ndarray | int,
              items: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), one per (owner, item): keyed by (seed, purpose, draw, the owner's
    source key) at counter the item's source key (broadcasting ``owners`` (r, 1) against
    ``items`` (m,) gives (r, m)). A value depends on those keys alone, not on positions."""
    return rng.uniform(rng.key(seed, purpose, draw, owners), items)


def _clip_diagnostics(split: Split, k: int) -> dict[str, Any]:
    """The k-clip's diagnostics: how many users had more than k training items (exact,
    un-noised: not part of the release)."""
    return {"users_clipped": int((split.train_counts > k).sum()), "k": k,
            "clipped": "users' training sets (at k items)", "note": DIAGNOSTIC_NOTE}


def train_counts(split: Split) -> np.ndarray:
    """c_i = number of users with item i among their training items (float64, (m,))."""
    return np.bincount(split.train_items, minlength=split.n_items).astype(np.float64)


def tiebreak(n_items: int, seed: int) -> np.ndarray:
    """A seeded jitter in [0, 0.5) per item: added to integer counts it breaks their ties
    without reordering distinct counts."""
    return 0.5 * _generator(seed, _TIEBREAK).random(n_items)


def mostpop_scores(split: Split, seed: int) -> np.ndarray:
    """MostPop's item scores: training counts c_i plus :func:`tiebreak`."""
    return train_counts(split) + tiebreak(split.n_items, seed)


def k_subsets(split: Split, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each user's contribution (CSR indptr, items, sorted per user): its training items,
    or, when it has more than ``k``, a uniformly random k of them (k is public).

    User u's item i gets the uniform keyed by (seed, u's source key) at counter i's source
    key (``Split.source_users``, ``Split.source_items``), and u keeps its k items of
    smallest uniform: k of the user's items, each k-set equally likely. The choice is a
    function of the seed, the user's source id and its own training items' source ids
    alone, so it runs on the client, and adding or removing another user (which moves
    the re-indexed positions of users and, with a catalogue derived from the data, of
    items) changes no one else's subset: the sensitivity argument of
    :func:`central_gaussian_counts` needs this."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    owner = np.repeat(np.arange(split.n_users), split.train_counts)
    items = split.train_items
    score = _uniforms(seed, _SUBSET, 0, split.source_users[owner], split.source_items[items])
    order = np.lexsort((split.source_items[items], score, owner))  # per user, by its uniform
    rank = np.arange(order.shape[0]) - split.train_indptr[owner[order]]
    chosen = np.sort(order[rank < k])  # back to (user, item) order: sorted within each user
    indptr = np.zeros(split.n_users + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.minimum(split.train_counts, k))
    return indptr, items[chosen].astype(np.int64)


@dataclass(frozen=True)
class Release:
    """A released count vector and what it cost.

    ``estimate``: (m,) unbiased estimate of the (clipped) counts; ``epsilon``:
    the accountant's bounds (JSON-ready, inf as None) with ``reported`` among
    them; ``noise_std``: the standard deviation of one count's noise (for the
    local oracle, at a count of 0); ``privacy``: the run summary's privacy block,
    what is released and how (public settings and the noisy release's parameters
    only); ``diagnostics``: exact, un-noised figures of the data for the simulator's
    reader (summary.json's ``clipping`` block, labelled :data:`DIAGNOSTIC_NOTE`), never
    part of the release.
    """

    estimate: np.ndarray
    epsilon: dict[str, float | None]
    noise_std: float
    privacy: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)


def central_gaussian_counts(split: Split, k: int, epsilon: float, delta: float, seed: int,
                            accountant: str = "pld") -> Release:
    """User-level central DP: the sum of k-clipped one-hot vectors plus Gaussian noise, once.

    Each user u sends v_u in {0, 1}^m with at most k ones (its :func:`k_subsets`),
    the server learns only S = sum_u v_u through secure aggregation, and
    S + N(0, sigma^2 I) is released with sigma = z sqrt(k). ``epsilon = inf`` releases S
    itself (z = 0: the k-clip without noise, no guarantee), to separate what the clip and
    what the noise do to the ranking.

    - Neighbouring relation: add/remove one user (all of its interactions); the item
      catalogue is public (fixed before any user's data is seen).
    - Trust model: clients trust the secure aggregation and the party that adds
      the noise inside it (as ``cdp-gaussian``); the server and every observer see
      only the noisy sum.
    - Sensitivity: ||v_u||_2 <= sqrt(k) (at most k entries equal to 1), so the L2
      sensitivity of S under add/remove is sqrt(k): every other user's v_u is the same
      in both worlds, its k-subset being keyed by source ids (:func:`k_subsets`). The
      noise of item i is keyed by i's source id, so neighbouring datasets share it.
    - Accounting: S / sqrt(k) + N(0, z^2) is one Gaussian mechanism of multiplier z
      at sample rate 1, the same event ``cdp-gaussian`` composes per round
      (:func:`~fedem_private.privacy.accounting.dpfedavg_event` with q = 1, T = 1);
      z is the smallest that meets (epsilon, delta) by ``accountant`` (PLD default)
      and the reported eps is min(RDP, PLD) at z.
    """
    z = _central_multiplier(float(epsilon), float(delta), accountant)
    sigma = z * math.sqrt(k)
    indptr, items = k_subsets(split, k, seed)
    counts = np.bincount(items, minlength=split.n_items).astype(np.float64)
    noise = sigma * rng.normal_from_uniform(_uniforms(seed, _CENTRAL, 0, 0, split.source_items),
                                            _uniforms(seed, _CENTRAL, 1, 0, split.source_items))
    bounds = dpfedavg_bounds(1.0, z, 1, delta)
    eps = bounds.as_dict()
    privacy = {
        "mode": "central-gaussian",
        "architecture": "central",
        "neighbouring": stated_relation("add/remove one user (all of its interactions)"),
        "trust_model": ("secure aggregation of the clients' k-clipped one-hot vectors; the "
                        "server and observers see only the noisy sum"),
        "amplification": "none (every user contributes, one release)",
        "sensitivity": f"L2 sqrt(k) = {math.sqrt(k):.6g}",
        "k": k, "noise_multiplier": z, "noise_scale": sigma, "delta": delta,
        "epsilon": eps, "guarantee": math.isfinite(epsilon),
        "accountant": f"dp-accounting {accountant} "
        "(DP-FedAvg event, q = 1, one round; reported = min(rdp, pld))",
    }
    return Release(counts + noise, eps, sigma, privacy, _clip_diagnostics(split, k))


@functools.lru_cache(maxsize=64)
def _central_multiplier(epsilon: float, delta: float, accountant: str) -> float:
    """z of one unsampled DP-FedAvg round meeting (epsilon, delta) (cached: calibration
    takes a second)."""
    return dpfedavg_noise_multiplier(epsilon, delta, 1.0, 1, accountant)


def oue_probabilities(epsilon_bit: float) -> tuple[float, float]:
    """Optimal unary encoding (Wang et al. 2017, section 4.4): p = Pr[report 1 | bit 1] = 1/2,
    q = Pr[report 1 | bit 0] = 1 / (e^eps + 1), so that p (1 - q) / ((1 - p) q) = e^eps."""
    return 0.5, 1.0 / (math.exp(epsilon_bit) + 1.0)


def local_oue_counts(split: Split, k: int, epsilon: float, seed: int,
                     chunk: int = 256) -> Release:
    """User-level local DP: optimal unary encoding of each user's k-subset; the server debiases.

    User u encodes its :func:`k_subsets` as x_u in {0, 1}^m (at most k ones) and reports
    y_u with y_ui ~ Bernoulli(p) where x_ui = 1 and Bernoulli(q) where x_ui = 0, the
    probabilities of :func:`oue_probabilities` at eps_bit = epsilon / k. The server
    releases the unbiased estimate (Wang et al. 2017, equation 2)

        f_i = (sum_u y_ui - n q) / (p - q),   E[f_i] = sum_u x_ui.

    - Neighbouring relation: replace one user's data by any other (local DP: any two
      inputs of one client), so any two k-subsets x, x'; the item catalogue is public
      (fixed before any user's data is seen).
    - Trust model: nobody is trusted; each client randomises on its own device and the
      server (and anyone) sees every report y_u. Its coins for item i are keyed by (seed,
      its source id) at i's source id, so a user's report does not depend on who else is
      in the data.
    - Sensitivity: x and x' differ in at most 2k coordinates, k going 1 -> 0 and k going
      0 -> 1; a pair of such coordinates changes the likelihood of any y by at most
      p (1 - q) / ((1 - p) q) = e^eps_bit, so the report is (k eps_bit = epsilon)-LDP,
      pure (delta = 0). The epsilon is this worst-case ratio, computed from p and q.
    """
    if not math.isfinite(epsilon):
        raise ValueError("the local oracle needs a finite epsilon (eps = inf is no oracle: "
                         "use mostpop, or the central architecture's k-clipped counts)")
    p, q = oue_probabilities(epsilon / k)
    reports = oue_reports(split, k, epsilon, seed, chunk)
    reported = np.zeros(split.n_items, dtype=np.float64)
    for y in reports:
        reported += y.sum(axis=0)
    n = split.n_users
    estimate = (reported - n * q) / (p - q)
    eps_pure = k * math.log(p * (1 - q) / ((1 - p) * q))
    eps = {"basic": eps_pure, "reported": eps_pure}
    std0 = math.sqrt(n * q * (1 - q)) / (p - q)
    privacy = {
        "mode": "ldp-oue",
        "architecture": "local",
        "neighbouring": stated_relation(
            "replace one user's data (any two k-subsets of one client)"),
        "trust_model": "none trusted: each client randomises its k-hot vector on its device",
        "amplification": "none",
        "sensitivity": "2k coordinates (k removed, k added), each pair a likelihood ratio "
                       "of at most e^(epsilon / k)",
        "k": k, "p": p, "q": q, "epsilon_bit": epsilon / k, "noise_scale": std0,
        "delta": 0.0, "epsilon": eps, "guarantee": True,
        "accountant": "pure epsilon-LDP, k * ln(p (1 - q) / ((1 - p) q)) (Wang et al. 2017)",
    }
    return Release(estimate, eps, std0, privacy, _clip_diagnostics(split, k))


def oue_reports(split: Split, k: int, epsilon: float, seed: int, chunk: int = 256
                ) -> Iterator[np.ndarray]:
    """The users' optimal-unary-encoding reports y_u of :func:`local_oue_counts`, as boolean
    blocks of up to ``chunk`` rows (users in split order) by n_items columns.

    User u's coin for item i is the uniform keyed by (seed, u's source key) at i's source
    key: a report is a function of the seed, the user's source id and its own k-subset
    (:func:`k_subsets`) only."""
    p, q = oue_probabilities(epsilon / k)
    indptr, items = k_subsets(split, k, seed)
    n = split.n_users
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        x = np.zeros((stop - start, split.n_items), dtype=bool)
        lo, hi = indptr[start], indptr[stop]
        rows = np.repeat(np.arange(stop - start), np.diff(indptr[start:stop + 1]))
        x[rows, items[lo:hi]] = True
        u = _uniforms(seed, _LOCAL, 0, split.source_users[start:stop, None], split.source_items)
        yield np.where(x, u < p, u < q)


def interaction_laplace_counts(split: Split, epsilon: float, delta: float,
                               seed: int) -> Release:
    """Interaction-level DP: every training count plus Laplace noise of scale 1 / epsilon.

    - Neighbouring relation: add/remove one (user, item) training interaction; a user's
      other interactions stay (a user with many interactions is protected per
      interaction only, not as a whole); the item catalogue is public (fixed before any
      user's data is seen).
    - Trust model: the counts are summed by secure aggregation (or a trusted curator)
      and the noise is added once to the released sum; the server and observers see
      only the noisy counts.
    - Sensitivity: one interaction moves one count by 1, so the L1 sensitivity of the
      count vector is 1 and Laplace noise of scale b = z * 1 gives eps = 1 / z
      (``epsilon = inf``: z = 0, the plain counts, no guarantee). The noise of item i is
      keyed by i's source id, so neighbouring datasets share it.
    - Accounting: one round of :class:`~fedem_private.privacy.accounting.RoundMechanism`
      ("laplace", z), z calibrated by the basic (pure) accountant, and the bounds of
      :func:`~fedem_private.privacy.accounting.epsilon_bounds` (reported = their min).
    """
    z = noise_multiplier_for("laplace", epsilon, delta, 1, "basic")
    counts = train_counts(split)
    noise = rng.laplace_from_uniform(_uniforms(seed, _INTERACTION, 0, 0, split.source_items), z)
    bounds = epsilon_bounds(repeated(RoundMechanism("laplace", z), 1), float(delta))
    eps = bounds.as_dict()
    privacy = {
        "mode": "idp-laplace",
        "architecture": "interaction",
        "neighbouring": stated_relation("add/remove one (user, item) interaction"),
        "trust_model": ("secure aggregation (or a trusted curator) of the counts; the server "
                        "and observers see only the noisy counts"),
        "amplification": "none",
        "sensitivity": "L1 1 (one interaction moves one count by 1)",
        "noise_multiplier": z, "noise_scale": z * math.sqrt(2.0), "laplace_b": z,
        "delta": delta, "epsilon": eps, "guarantee": math.isfinite(epsilon),
        "accountant": "fedem_private.privacy.accounting, one Laplace round (reported = min)",
    }
    return Release(counts + noise, eps, z * math.sqrt(2.0), privacy)


def local_interaction_laplace_counts(split: Split, epsilon: float, delta: float, seed: int,
                                     chunk: int = 256) -> Release:
    """Interaction-level local DP: each client reports its own 0/1 training vector plus
    Laplace noise of scale 1 / epsilon on every item; the server sums the reports.

    User u holds x_u in {0, 1}^m (x_ui = 1 when i is among its training items) and sends
    y_u = x_u + Lap(b)^m with b = 1 / epsilon; the release is S = sum_u y_u, an unbiased
    estimate of the counts whose per-count noise has variance 2 n b^2.

    - Neighbouring relation: add/remove one (user, item) training interaction, the
      relation of ``ldp-dpsgd`` (one positive added or removed); the item catalogue is
      public (fixed before any user's data is seen).
    - Trust model: nobody is trusted; every client's report y_u is seen by the server
      (and anyone), as under ``ldp-dpsgd``, so this is the floor matched to it.
    - Sensitivity: one interaction moves one coordinate of x_u by 1, so the L1
      sensitivity of a report is 1 and Laplace(1 / epsilon) per coordinate makes it
      pure epsilon-DP; the sum is post-processing of the reports.
    - Accounting: one Laplace round of :mod:`fedem_private.privacy.accounting` (as
      :func:`interaction_laplace_counts`; the difference is n times the noise, the
      price of trusting nobody). The noise of client u on item i is keyed by (seed,
      u's source id) at i's source id, whatever its data and whoever else is in the
      data, so two neighbouring datasets get the same noise (the tests check the reports
      differ in one coordinate by 1).
    """
    if not math.isfinite(epsilon):
        raise ValueError("the local interaction release needs a finite epsilon "
                         "(eps = inf is no noise: use mostpop)")
    z = noise_multiplier_for("laplace", epsilon, delta, 1, "basic")
    total = np.zeros(split.n_items, dtype=np.float64)
    for y in interaction_reports(split, z, seed, chunk):
        total += y.sum(axis=0)
    n = split.n_users
    bounds = epsilon_bounds(repeated(RoundMechanism("laplace", z), 1), float(delta))
    eps = bounds.as_dict()
    std = z * math.sqrt(2.0 * n)
    privacy = {
        "mode": "ldp-interaction-laplace",
        "architecture": "interaction-local",
        "neighbouring": stated_relation("add/remove one (user, item) interaction"),
        "trust_model": ("none trusted: each client adds Laplace noise to its own count vector "
                        "on its device; the server sees every report"),
        "amplification": "none",
        "sensitivity": "L1 1 per report (one interaction moves one coordinate by 1)",
        "noise_multiplier": z, "noise_scale": std, "laplace_b": z,
        "delta": delta, "epsilon": eps, "guarantee": True,
        "accountant": "fedem_private.privacy.accounting, one Laplace round per report "
                      "(reported = min)",
    }
    return Release(total, eps, std, privacy)


def interaction_reports(split: Split, laplace_b: float, seed: int, chunk: int = 256
                        ) -> Iterator[np.ndarray]:
    """The users' reports y_u = x_u + Lap(b)^m of :func:`local_interaction_laplace_counts`,
    as float64 blocks of up to ``chunk`` rows (users in split order) by n_items columns.

    User u's noise on item i is keyed by (seed, u's source key) at i's source key: a report
    is a function of the seed, the user's source id and its own training items only."""
    n = split.n_users
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        lo, hi = split.train_indptr[start], split.train_indptr[stop]
        rows = np.repeat(np.arange(stop - start), split.train_counts[start:stop])
        u = _uniforms(seed, _LOCAL_INTERACTION, 0, split.source_users[start:stop, None],
                      split.source_items)
        y = rng.laplace_from_uniform(u, laplace_b)
        y[rows, split.train_items[lo:hi]] += 1.0
        yield y


def dp_counts(split: Split, architecture: str, k: int, epsilon: float, delta: float,
              seed: int) -> Release:
    """The release of ``architecture`` (central, local, interaction or interaction-local)."""
    if architecture == "central":
        return central_gaussian_counts(split, k, epsilon, delta, seed)
    if architecture == "local":
        return local_oue_counts(split, k, epsilon, seed)
    if architecture == "interaction":
        return interaction_laplace_counts(split, epsilon, delta, seed)
    if architecture == "interaction-local":
        return local_interaction_laplace_counts(split, epsilon, delta, seed)
    raise ValueError(f"unknown architecture {architecture!r}")
