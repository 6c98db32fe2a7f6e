"""Populations calibrated to a real dataset: any number of users drawn from a fitted model
(docs/design.md section 17).

:func:`fit_population` fits a :class:`PopulationModel` to a real dataset and keeps only
aggregates: item factors and biases, a Gaussian mixture over user factors, per-component
quantiles of activity, and two calibration scalars. :func:`draw_population` draws N users
from it; user u's factor, activity, items and order are a pure function of (model, seed,
u), so any subset of users is reproducible and no user's data depend on N.

The generative model. User u draws a mixture component c_u with probability pi_c, a taste

    z_u ~ N(mu_c, Sigma_c),  Sigma_c = L_c L_c'                               (P.1)

and an activity n_u = round(F_c^-1(a_u)), a_u ~ U(0, 1), F_c^-1 the fitted quantile
function of component c's interactions per user (clipped to [3, m - 1]). Its items are the
n_u largest of the Gumbel-perturbed logits

    l_ui = b_i + s z_u . v_i,   key_ui = l_ui + G_ui,  G_ui ~ Gumbel(0, 1)         (P.2)

(``FitOptions.taste = "bilinear"``, MF's own model, the default) or, with ``taste = "max"``,
F taste vectors a user (z_u = (z_u1, ..., z_uF), F = ``facets``) of which the item's best
match counts:

    l_ui = b_i + s max_f z_uf . v_i                                                 (P.2')

(Weston, Weiss and Yee, RecSys 2013, "MaxMF": a user's several interests; the score matrix
is then no rank-d product, so a dimension-d factor model such as FedMF's is misspecified
for it). Either way the draw takes the n_u items without replacement with probability
proportional to exp(l_ui) in sequence (the Gumbel-top-k trick: Vieira 2014; Kool, van
Hoof and Welling, ICML 2019). The user consumes its items in the order of a second,
independent race, weighted by popularity alone:

    time_ui = -(w b_i + G'_ui),  G'_ui ~ Gumbel(0, 1)                               (P.5)

so with w > 0 popular items come first and the leave-one-out split's validation and test
items (the latest two) lean to the user's less popular items, as on MovieLens (whose
sign-up asks for ratings of popular films first: ML-100K's test item sits at the 39th
percentile of its user's items' popularity, not the 50th); w = 0 makes them a uniformly
random pair. The item biases b are matched to the source's item counts (:func:`match_popularity`);
s (``taste_strength``) and w (``order_strength``) are the two calibration scalars
(:func:`calibrate`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from . import calibration
from .interactions import Interactions
from .split import leave_one_out

FIT_VERSION = 2  # bump when the fit changes: it keys the cache
#: the user-item score of (P.2) / (P.2'): FitOptions.taste
TASTES = ("bilinear", "max")
# the "round" field of the keyed draws (stream SYNTHETIC_POP, client = the user)
_PICK, _TASTE, _GUMBEL, _ORDER, _INIT = 0, 1, 2, 3, 4
# the calibration's draws use seeds no run is likely to, so seeds 0, 1, 2 stay out of sample
CALIBRATION_SEED = 1 << 40
_BLOCK = 1 << 21  # entries of a (users, items) grid drawn at once
_MIN_COMPONENT_USERS = 20  # fewer: the component draws activity from every user's quantiles
# the fit holds dense (n, m) matrices (float32 logits and their gradient, float64 EASE
# scores): ML-1M (22M entries) fits; ML-10M (746M) and larger are refused
MAX_FIT_ENTRIES = 1 << 28


@dataclass(frozen=True)
class FitOptions:
    """How :func:`fit_population` fits (every field keys the cache)."""

    dim: int = 16  # d, the width of item and user factors
    # lambda of (P.3), per interaction: of 0.3, 1 and 3 on ML-100K, 1 put the drawn data's
    # sampled MostPop / EASE ratio nearest the real one (0.71 against 0.63; 3 gave 0.79)
    reg: float = 1.0
    steps: int = 100  # full-batch Adam steps of (P.3)
    lr: float = 0.05
    components: int = 8  # Gaussian mixture components of (P.1)
    quantiles: int = 65  # points of each activity quantile function
    ease_lambda: float = 500.0  # EASE's lambda in the calibration (the baseline's default)
    draws: int = 2  # populations drawn per calibration evaluation (and real splits averaged)
    rounds: int = 2  # alternations of matching the popularity and solving (P.4)
    popularity_steps: int = 4  # steps of (P.6) per round
    evals: int = 10  # most evaluations of (P.4)'s search per round
    tolerance: float = 0.02  # stop when both rungs are within this relative error
    seed: int = 0  # the fit's initialisation and the mixture's
    taste: str = "bilinear"  # (P.2) "bilinear" or (P.2') "max" (:data:`TASTES`)
    facets: int = 4  # F of (P.2'): taste vectors a user under taste "max"

    def validate(self) -> None:
        """Refuse values the fit cannot use, with one line."""
        if self.taste not in TASTES:
            raise UserError(f"population fit: taste must be one of {', '.join(TASTES)}, got "
                            f"{self.taste!r}")
        for name in ("dim", "steps", "components", "draws", "rounds", "evals", "facets"):
            if getattr(self, name) < 1:
                raise UserError(f"population fit: {name} must be a positive integer")
        if self.popularity_steps < 0:
            raise UserError("population fit: popularity_steps must be >= 0")
        if self.quantiles < 2:
            raise UserError("population fit: quantiles must be at least 2")
        for name in ("reg", "lr", "ease_lambda", "tolerance"):
            if not getattr(self, name) > 0:
                raise UserError(f"population fit: {name} must be > 0")


@dataclass(frozen=True, eq=False)
class PopulationModel:
    """A fitted population: aggregates only, never a row of any user's data.

    ``item_bias`` b (m,) and ``item_factors`` V (m, d) of (P.2); the mixture of (P.1):
    ``mix_weights`` pi (k,), ``mix_means`` mu (k, d), ``mix_chol`` L (k, d, d); ``activity``
    (k, Q) the quantiles of interactions per user at probabilities 0, 1/(Q-1), ..., 1 for
    each component; ``taste_strength`` s of (P.2) and ``order_strength`` w of (P.5);
    ``targets`` the source's (MostPop, EASE) full HR@10 and ``achieved`` the calibration's
    populations' at the source's size (``source_users``). ``sha256`` is the content hash
    that names the model.
    """

    source: str
    source_sha256: str
    options: FitOptions
    item_bias: np.ndarray
    item_factors: np.ndarray
    mix_weights: np.ndarray
    mix_means: np.ndarray
    mix_chol: np.ndarray
    activity: np.ndarray
    taste_strength: float = 1.0
    order_strength: float = 0.0
    source_users: int = 0
    targets: np.ndarray = field(default_factory=lambda: np.full(2, np.nan))
    achieved: np.ndarray = field(default_factory=lambda: np.full(2, np.nan))

    @property
    def n_items(self) -> int:
        return int(self.item_bias.shape[0])

    @property
    def dim(self) -> int:
        return int(self.item_factors.shape[1])

    @property
    def facets(self) -> int:
        """F of (P.2'): 1 under the bilinear taste (P.2)."""
        return self.options.facets if self.options.taste == "max" else 1

    @cached_property
    def sha256(self) -> str:
        """SHA-256 over every array and scalar (:func:`_digest` of :func:`_arrays`)."""
        return _digest(_arrays(self))

    def summary(self) -> dict[str, Any]:
        """What a run's summary.json says about the population it drew from."""
        return {"source": self.source, "model_sha256": self.sha256,
                "source_sha256": self.source_sha256, "fit_version": FIT_VERSION,
                "taste_strength": self.taste_strength, "order_strength": self.order_strength,
                "targets_hr10_full": dict(zip(("mostpop", "ease"), self.targets.tolist(),
                                              strict=True)),
                "achieved_hr10_full": dict(zip(("mostpop", "ease"), self.achieved.tolist(),
                                               strict=True))}


# ---------------------------------------------------------------------------------------------
# fitting
# ---------------------------------------------------------------------------------------------


def fit_population(source: Interactions, options: FitOptions | None = None
                   ) -> PopulationModel:
    """Fit a :class:`PopulationModel` to ``source`` and calibrate it (:func:`calibrate`).

    Item factors by the multinomial likelihood of (P.3) (:func:`fit_factors`), the user
    factors' mixture (:func:`fit_mixture`), activity quantiles per component, then the
    popularity, s and w (:func:`calibrate`). On one core: 8 s for ML-100K, about three
    minutes for LastFM-2K (EASE's dual form takes 5 s a population there); sources of
    more than :data:`MAX_FIT_ENTRIES` user-item pairs are refused.
    """
    options = options or FitOptions()
    options.validate()
    if source.n_users * source.n_items > MAX_FIT_ENTRIES:
        raise UserError(f"--calibrate-to {source.name}: {source.n_users:,} users x "
                        f"{source.n_items:,} items is beyond the dense fit "
                        f"({MAX_FIT_ENTRIES:,} entries at most; ML-1M's size fits)")
    bias, items, users = fit_factors(source, options)
    weights, means, chol, labels = fit_mixture(users, options)
    counts = np.bincount(source.users, minlength=source.n_users)
    model = PopulationModel(
        source.name, source_sha256(source), options, bias, items, weights, means, chol,
        activity_quantiles(counts, labels, weights.shape[0], options.quantiles),
        source_users=source.n_users)
    return calibrate(model, source)


def fit_factors(source: Interactions, options: FitOptions
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(b, V, Z) maximising the multinomial likelihood of the binary matrix X (n, m):

        min  - sum_u sum_{i in D_u} log softmax_i(b + Z_u V')
             + lambda (||Z||^2 + ||V||^2 + ||b - mean b||^2)                        (P.3)

    the log-likelihood and the penalty both divided by the number of interactions. (P.3)
    is the likelihood of the first item of (P.2)'s draw and the multinomial model of
    Liang et al. (WWW 2018, Mult-VAE) with a linear decoder. Chosen over a truncated SVD
    because its logits are on the scale (P.2) draws on (an SVD's inner products are not
    log-odds), and over logistic MF because it needs no negatives and fits the sampler's
    first pick exactly. Full-batch Adam in float32 with torch on the CPU: 1.5 s for
    ML-100K (n x m = 1.6M logits), about a minute for LastFM-2K (33M); the torch threads
    the caller set are used (float32 sums may differ in the last bits between thread
    counts, so the model's hash names the fit that was made). b starts at centred
    log(1 + c_i), Z and V at N(0, 0.01^2) from the keyed generator. Under taste "max"
    Z_u V' is (P.2')'s max_f z_uf . v_i and Z is (n, F d) (:func:`taste_scores`).
    """
    import torch

    from .. import rng

    n, m, d = source.n_users, source.n_items, options.dim
    f = options.facets if options.taste == "max" else 1
    x = torch.zeros(n, m)
    x[torch.from_numpy(source.users), torch.from_numpy(source.items)] = 1.0
    gen = rng.generator(options.seed, rng.Stream.SYNTHETIC_POP, _INIT, 0)
    b = torch.log1p(x.sum(0))
    b = (b - b.mean()).requires_grad_(True)
    z = (0.01 * torch.randn(n, f * d, generator=gen)).requires_grad_(True)
    v = (0.01 * torch.randn(m, d, generator=gen)).requires_grad_(True)
    opt = torch.optim.Adam([b, z, v], lr=options.lr)
    nnz = float(x.sum())
    for _ in range(options.steps):
        opt.zero_grad(set_to_none=True)
        nll = -(x * torch.log_softmax(b + taste_scores(z, v, f), dim=1)).sum()
        penalty = (z * z).sum() + (v * v).sum() + ((b - b.mean()) ** 2).sum()
        ((nll + options.reg * penalty) / nnz).backward()
        opt.step()
    with torch.no_grad():
        return ((b - b.mean()).double().numpy(), v.double().numpy(), z.double().numpy())


def taste_scores(z: Any, v: Any, facets: int) -> Any:
    """Z V' of (P.2) (``facets`` 1) or max_f z_uf . v_i of (P.2') for each user and item:
    z (n, F d), v (m, d), numpy or torch alike; (n, m)."""
    if facets == 1:
        return z @ v.T
    n, d = z.shape[0], v.shape[1]
    best = z.reshape(n, facets, d) @ v.T
    return best.max(axis=1) if isinstance(best, np.ndarray) else best.max(dim=1).values


def fit_mixture(users: np.ndarray, options: FitOptions
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A Gaussian mixture over the fitted user factors Z (scikit-learn, full covariances,
    k-means start, seeded): (pi, mu, L with Sigma = L L', each user's component). At most
    n / 20 components, so each covariance is estimated from some 20 users or more."""
    from sklearn.mixture import GaussianMixture

    k = max(1, min(options.components, users.shape[0] // _MIN_COMPONENT_USERS))
    gmm = GaussianMixture(k, covariance_type="full", reg_covar=1e-6, max_iter=200,
                          random_state=options.seed).fit(users)
    chol = np.linalg.cholesky(gmm.covariances_)
    return (gmm.weights_.astype(np.float64), gmm.means_.astype(np.float64), chol,
            gmm.predict(users))


def activity_quantiles(counts: np.ndarray, labels: np.ndarray, k: int, q: int) -> np.ndarray:
    """(k, q) quantiles of interactions per user at probabilities j / (q - 1), per mixture
    component (a component of fewer than 20 users takes every user's quantiles)."""
    probs = np.linspace(0.0, 1.0, q)
    every = np.quantile(counts, probs)
    out = np.empty((k, q))
    for c in range(k):
        mine = counts[labels == c]
        out[c] = np.quantile(mine, probs) if mine.shape[0] >= _MIN_COMPONENT_USERS else every
    return out


def calibrate(model: PopulationModel, source: Interactions) -> PopulationModel:
    """Match the item biases to the source's popularity and choose s and w so that
    populations drawn at the source's size reproduce its MostPop and EASE full HR@10
    under strict leave-one-out:

        log HR_rung(s, w) - log HR*_rung = 0,   rung in (MostPop, EASE)            (P.4)

    HR* averaged over ``draws`` seeded splits of the source, HR(s, w) over ``draws``
    populations with seeds :data:`CALIBRATION_SEED` + j (common random numbers: every
    evaluation sees the same keyed draws). ``rounds`` times: :func:`match_popularity` at
    the current s, then (P.4) by Broyden's method
    (:func:`~fedem_private.data.calibration.solve`) in (log s, w) from the current point,
    log s in [-4, 4] and w in [-1, 1]. s changes which items are drawn, so the popularity
    is matched again at the new s (w does not: it only orders them)."""
    opts = model.options
    target = np.mean([calibration.rungs(leave_one_out(source, j), j, opts.ease_lambda)
                      for j in range(opts.draws)], axis=0)
    counts = np.bincount(source.items, minlength=source.n_items).astype(np.float64)
    theta, r = np.zeros(2), np.zeros(2)
    for _ in range(opts.rounds):
        model = match_popularity(replace(model, taste_strength=float(np.exp(theta[0]))),
                                 counts)

        def residual(th: np.ndarray, fixed: PopulationModel = model) -> np.ndarray:
            trial = replace(fixed, taste_strength=float(np.exp(th[0])),
                            order_strength=float(th[1]))
            return (np.log(np.maximum(measured(trial), 1e-4))
                    - np.log(np.maximum(target, 1e-4)))

        theta, r = calibration.solve(residual, theta, np.array([-4.0, -1.0]),
                                     np.array([4.0, 1.0]), opts.evals,
                                     float(np.log1p(opts.tolerance)))
    return replace(model, taste_strength=float(np.exp(theta[0])),
                   order_strength=float(theta[1]), targets=target,
                   achieved=target * np.exp(r))


def measured(model: PopulationModel) -> np.ndarray:
    """(MostPop, EASE) full HR@10 of the calibration's populations, at the source's size."""
    opts = model.options
    out = []
    for j in range(opts.draws):
        seed = CALIBRATION_SEED + j
        split = leave_one_out(draw_population(model, seed, model.source_users), seed)
        out.append(calibration.rungs(split, seed, opts.ease_lambda))
    return np.mean(out, axis=0)


def match_popularity(model: PopulationModel, counts: np.ndarray) -> PopulationModel:
    """Item biases whose draws reproduce the source's item counts c_i:

        b_i <- b_i + log((c_i + 1/2) / (c^_i + 1/2))                                (P.6)

    ``popularity_steps`` times, c^_i the mean count of item i over the calibration's
    ``draws`` populations at the source's size. (P.3)'s b matches the counts in
    expectation under sampling with replacement (its gradient in b_i is sum_u n_u p_ui -
    c_i); (P.2) samples without replacement, which caps a popular item at one pick per
    user and flattens the head, and the tastes are drawn from (P.1), not the fitted ones.
    The step is the iterative proportional fitting of a multinomial's margin (Deming and
    Stephan 1940), the 1/2 keeping items no draw picked finite."""
    opts = model.options
    for _ in range(opts.popularity_steps):
        drawn = np.mean([np.bincount(draw_population(model, CALIBRATION_SEED + j,
                                                     model.source_users).items,
                                     minlength=model.n_items)
                         for j in range(opts.draws)], axis=0)
        bias = model.item_bias + np.log((counts + 0.5) / (drawn + 0.5))
        model = replace(model, item_bias=bias - bias.mean())
    return model


# ---------------------------------------------------------------------------------------------
# drawing
# ---------------------------------------------------------------------------------------------


def draw_population(model: PopulationModel, seed: int, n_users: int,
                    block: int | None = None) -> Interactions:
    """Users 0 .. n_users - 1 of the population keyed by ``seed``, as :class:`Interactions`
    (named ``synthetic:<source>``; item i is the source's i-th item, users keep their
    numbers; the catalogue is the model's m items, drawn or not, so it is public: no
    user's presence changes it). Drawn ``block`` users at a time (default: about 2M grid
    entries), so memory holds the result and one block; the data do not depend on the
    block (:func:`draw_users`).
    """
    if n_users < 1:
        raise UserError(f"a population needs at least one user, got {n_users}")
    check_draw_fits(model, n_users)
    rows = block or max(1, _BLOCK // model.n_items)
    parts = [draw_users(model, seed, np.arange(lo, min(n_users, lo + rows)))
             for lo in range(0, n_users, rows)]
    counts = np.concatenate([p[0] for p in parts])
    items = np.concatenate([p[1] for p in parts])
    stamps = np.concatenate([p[2] for p in parts])
    users = np.repeat(np.arange(n_users, dtype=np.int64), counts)
    return Interactions(f"synthetic:{model.source}", users, items, stamps, n_users,
                        model.n_items, np.arange(n_users), np.arange(model.n_items),
                        public_catalogue=True)


def mean_activity(model: PopulationModel) -> float:
    """The expected interactions of a drawn user: the mixture's mean of each component's
    quantile function, interpolated linearly between its points as the draw is (the
    trapezoid rule is exact for that), clipped to the draw's [3, m - 1]."""
    q = np.clip(model.activity, 3, model.n_items - 1)
    weights = model.mix_weights / model.mix_weights.sum()
    return float(weights @ ((q[:, :-1] + q[:, 1:]) / 2).mean(axis=1))


# bytes :func:`draw_population` holds at its end per drawn interaction: items and timestamps
# (int64, float64) in the blocks and again concatenated, and the user ids (int64); per user:
# the counts, in the blocks and concatenated
_DRAW_BYTES, _USER_BYTES = 2 * (8 + 8) + 8, 2 * 8


def draw_bytes(model: PopulationModel, n_users: int) -> float:
    """The memory drawing ``n_users`` users takes, in expectation: what
    :func:`draw_population` holds at its end (the split and the run need more)."""
    return n_users * (mean_activity(model) * _DRAW_BYTES + _USER_BYTES)


def check_draw_fits(model: PopulationModel, n_users: int) -> None:
    """Refuse, in one line and before drawing, a population whose draw alone would not fit
    in the memory the host has available (``MemAvailable``; not checked where unknown):
    ``--users 1000000000`` would otherwise draw for hours and then be killed."""
    from ..hostmem import available_bytes, gib

    need, free = draw_bytes(model, n_users), available_bytes()
    if free is None or need <= free:
        return
    raise UserError(f"--users {n_users:,}: drawing the population needs about {gib(need)} "
                    f"({n_users:,} users x {mean_activity(model):.1f} interactions each on "
                    f"average over {model.n_items:,} items, {_DRAW_BYTES} B an interaction), "
                    f"and {gib(free)} is available; use fewer --users")


def draw_users(model: PopulationModel, seed: int, users: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_u per user, items, timestamps) of ``users``, grouped by user in the order given,
    each user's items in the order of (P.2)'s draw.

    Every draw is keyed by (seed, SYNTHETIC_POP, purpose, u) and indexed by position
    (:mod:`fedem_private.rng`): the component and activity uniforms (counters 0, 1), the
    taste's d normals, one Gumbel uniform per item for (P.2) and one per chosen item for
    (P.5) (counter = item in both). User u's data are therefore the same in any
    block, among any other users, on any machine that computes the same floats.
    """
    import torch

    from .. import rng

    stream = rng.Stream.SYNTHETIC_POP
    pick = rng.uniform_t(seed, stream, _PICK, users, 2).numpy()
    comp, n_u = _component_activity(model, pick)
    eps = rng.normal_t(seed, stream, _TASTE, users, model.mix_means.shape[1]).numpy()
    taste = model.mix_means[comp] + np.einsum("nij,nj->ni", model.mix_chol[comp], eps)
    logits = torch.from_numpy(model.item_bias[None, :] + model.taste_strength
                              * taste_scores(taste, model.item_factors, model.facets))
    gumbel = rng.uniform_t(seed, stream, _GUMBEL, users, model.n_items)
    logits -= gumbel.log_().neg_().log_()  # + Gumbel(0, 1) = - log(- log u)
    top = torch.topk(logits, int(n_u.max()), dim=1, sorted=True).indices
    keep = torch.arange(top.shape[1])[None, :] < torch.from_numpy(n_u)[:, None]
    items = top[keep]
    order = rng.uniform_t(seed, stream, _ORDER, users, top)[keep]  # G' = -log(-log u)
    stamps = order.log_().neg_().log_() - model.order_strength * torch.from_numpy(
        model.item_bias)[items]  # (P.5): -(w b_i + G'_ui)
    return n_u, items.numpy().astype(np.int64), stamps.numpy()


def _component_activity(model: PopulationModel, pick: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Each user's component (inverse CDF of pi at uniform pick[:, 0]) and activity
    round(F_c^-1(pick[:, 1])) by linear interpolation of the quantiles, in [3, m - 1]."""
    cdf = np.cumsum(model.mix_weights)
    comp = np.minimum(np.searchsorted(cdf / cdf[-1], pick[:, 0], side="right"),
                      cdf.shape[0] - 1)
    q = model.activity.shape[1]
    pos = pick[:, 1] * (q - 1)
    lo = np.minimum(pos.astype(np.int64), q - 2)
    frac = pos - lo
    rows = model.activity[comp]
    value = (1 - frac) * rows[np.arange(len(comp)), lo] + frac * rows[np.arange(len(comp)),
                                                                        lo + 1]
    return comp, np.clip(np.rint(value), 3, model.n_items - 1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# files, hashes and the cache
# ---------------------------------------------------------------------------------------------


def source_sha256(source: Interactions) -> str:
    """SHA-256 of what the fit reads: the re-indexed (user, item, timestamp) rows and sizes."""
    arrays = {"users": source.users, "items": source.items,
              "sizes": np.array([source.n_users, source.n_items])}
    if source.timestamps is not None:
        arrays["timestamps"] = source.timestamps
    return _digest(arrays)


def _arrays(model: PopulationModel) -> dict[str, np.ndarray]:
    """The model as named arrays; the scalars and strings in one JSON string ``meta``."""
    meta = {"source": model.source, "source_sha256": model.source_sha256,
            "options": options_record(model.options), "taste_strength": model.taste_strength,
            "order_strength": model.order_strength, "source_users": model.source_users,
            "fit_version": FIT_VERSION}
    return {"item_bias": model.item_bias, "item_factors": model.item_factors,
            "mix_weights": model.mix_weights, "mix_means": model.mix_means,
            "mix_chol": model.mix_chol, "activity": model.activity,
            "targets": model.targets, "achieved": model.achieved,
            "meta": np.array(json.dumps(meta, sort_keys=True))}


def options_record(options: FitOptions) -> dict[str, Any]:
    """The options as a dict for hashes and files; the taste's fields only where the taste
    is not the bilinear default, so a bilinear model's hash and cache key are those it had
    before the taste was an option."""
    out = asdict(options)
    if options.taste == "bilinear":
        out.pop("taste")
        out.pop("facets")
    return out


def _digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over each array's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_population(model: PopulationModel, path: str | Path) -> str:
    """Write ``model`` to ``path`` (.npz) atomically, its hash inside; returns the hash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.part")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, sha256=np.array(model.sha256), **_arrays(model))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return model.sha256


def load_population(path: str | Path) -> PopulationModel:
    """Read a model written by :func:`save_population`; a file whose content does not hash
    to the hash it holds (or that is not such a file) is a :class:`UserError`."""
    try:
        with np.load(Path(path), allow_pickle=False) as f:
            arrays = {name: f[name] for name in f.files}
        meta = json.loads(str(arrays.pop("meta")))
        stored = str(arrays.pop("sha256"))
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"population model {path}: not a readable model file ({exc})") from None
    model = PopulationModel(
        meta["source"], meta["source_sha256"], FitOptions(**meta["options"]),
        arrays["item_bias"], arrays["item_factors"], arrays["mix_weights"],
        arrays["mix_means"], arrays["mix_chol"], arrays["activity"], meta["taste_strength"],
        meta["order_strength"], meta["source_users"], arrays["targets"], arrays["achieved"])
    if model.sha256 != stored:
        raise UserError(f"population model {path}: content hash {model.sha256[:12]} does not "
                        f"match the stored {stored[:12]}; delete the file to fit it again")
    return model


_FITTED: dict[Path, PopulationModel] = {}  # this process's models, by cache file


def cache_path(source: Interactions, options: FitOptions, folder: Path) -> Path:
    """Where the fit of ``source`` with ``options`` is cached: keyed by the source's content
    hash, the options and :data:`FIT_VERSION`."""
    key = hashlib.sha256(json.dumps([source_sha256(source), options_record(options),
                                     FIT_VERSION],
                                    sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{source.name}-{key}.npz"


def cached_fit(source: Interactions, folder: Path, options: FitOptions | None = None
               ) -> PopulationModel:
    """The model fitted to ``source``: from this process, from ``folder``, or fitted now
    and saved there (once; the file is written atomically)."""
    options = options or FitOptions()
    path = cache_path(source, options, folder)
    if path not in _FITTED:
        _FITTED[path] = (load_population(path) if path.is_file()
                         else _fit_and_save(source, options, path))
    return _FITTED[path]


def _fit_and_save(source: Interactions, options: FitOptions, path: Path) -> PopulationModel:
    model = fit_population(source, options)
    save_population(model, path)
    return model
