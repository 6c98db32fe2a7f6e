"""Banded Toeplitz matrix factorisation for DP-FTRL: the math of ``--ftrl-strategy banded``.

DP-FTRL releases the prefix sums P = A x of the rounds' clipped sums x_1..x_T (A the T x T
lower-triangular matrix of ones) as P~ = A x + B z, where A = B C is a factorisation and
z has i.i.d. N(0, sigma^2) entries (Denisov et al., NeurIPS 2022; Choquette-Choo et al.,
"Multi-epoch matrix factorization mechanisms", ICML 2023). Since P~ = B (C x + z), the
release is post-processing of the Gaussian mechanism C x + z, whose L2 sensitivity is
that of x -> C x over the participation patterns allowed; the binary tree
(:mod:`fedem_private.privacy.ftrl`) is one such C. This module builds another:

**The strategy.** C is lower-triangular Toeplitz with b bands: C[t, s] = c_{t-s} for
0 <= t - s < b, else 0, with c_0 = 1 (Choquette-Choo et al., "(Amplified) banded matrix
factorization", NeurIPS 2023). B = A C^{-1} is lower-triangular Toeplitz too: C^{-1} has
the coefficients d of the power series 1 / c(x) and B those of 1 / (c(x) (1 - x)), all
truncated at T (:func:`inverse_coefs`).

**The noise, streamed.** The model after round t is theta_0 + P~_t / m, so the server adds
the increment P~_t - P~_{t-1} = x_t + w_t with w = C^{-1} z, i.e. C w = z: the linear
recurrence w_t = z_t - sum_{j=1}^{b-1} c_j w_{t-j} (:class:`BandedNoise`). It keeps the last
b - 1 vectors w (O(b) memory of the model's size) and draws z_t from its key alone.

**Sensitivity.** A client taking part in rounds S (each clipped delta g_s, ||g_s|| <= C)
moves C x by C G, G the T x d matrix with rows g_s; ||C G||_F^2 = sum_{s, s' in S}
(C^T C)_{s s'} <g_s, g_s'>. Columns s and s' of a b-banded C have disjoint supports when
|s - s'| >= b, so for any pattern whose participations are at least b rounds apart the
cross terms vanish whatever the signs of the coefficients, and ||C G||_F^2 =
sum_{s in S} ||C[:, s]||^2 ||g_s||^2 <= C^2 sum_{s in S} ||C[:, s]||^2: exact, attained by
any unit g_s (Choquette-Choo et al. 2023, Theorem 2). Column s of the T-round matrix has
squared norm sum_{j < min(b, T - s + 1)} c_j^2, non-increasing in s, so the worst pattern
of at most k participations at least sep >= b apart takes the earliest rounds 1, 1 + sep,
..., and its squared sensitivity is at most k ||c||^2 (sqrt(k) x the largest column norm),
with equality when its k-th column is whole ((k - 1) sep + b <= T)
(:func:`minsep_squared_sensitivity`). DP-FTRL's cyclic cohorts (a client in every G-th
round, G = ceil(1/q)) are such a pattern with sep = G and k = ceil(T/G) whenever b <= G,
and group 0 is the earliest, so their exact sensitivity equals the (k, G)-min-separation
bound (:func:`cyclic_squared_curve`): the accounted guarantee then holds for any schedule a
deployment enforces by separation (a client returns no sooner than G rounds later) and a
cap of k participations. b > G is refused: the cross terms would no longer vanish and the
bound would need C^T C >= 0 entrywise, which the optimiser does not keep.

**Optimisation.** For the run's T and G, the b - 1 free coefficients minimise the total
squared error of the prefix sums at a fixed privacy level, ||B||_F^2 x sens^2 (the noise
is sigma = z sens; scale-free in c), i.e. log(sum_i (T - i) e_i^2) + log(||C v||^2), e the
coefficients of B and v the indicator of group 0's rounds (||C v||^2 is exactly that
group's squared sensitivity for b <= G), by L-BFGS from the coefficients of (1 - x)^{-1/2}
(the square-root factorisation, Fichtenberger et al. 2023), with exact gradients: de /
dc_j = -x^j e(x) d(x), d/dc_j ||C v||^2 = 2 sum_i (C v)_i v_{i-j}. Deterministic, cached per
(T, b, G). Amplified banded MF (``--ftrl-sampling poisson``) calls it with G = b: then
||C v||^2 = k ||c||^2 when b divides T (every one of group 0's k columns whole), so the
objective is the amplified one, ||B||_F^2 times the largest squared column norm, up to the
constant k (and the last column's truncation when b does not divide T).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def _impulse(n: int) -> np.ndarray:
    out = np.zeros(int(n), dtype=np.float64)
    out[0] = 1.0
    return out


def _check(coefs: np.ndarray) -> np.ndarray:
    c = np.asarray(coefs, dtype=np.float64).ravel()
    if c.size < 1 or c[0] != 1.0 or not np.all(np.isfinite(c)):
        raise ValueError("banded Toeplitz coefficients need c_0 = 1 and finite values")
    return c


def toeplitz_matrix(coefs: np.ndarray, n: int) -> np.ndarray:
    """The dense n x n lower-triangular Toeplitz matrix of ``coefs`` (tests, small n)."""
    c = _check(coefs)
    out = np.zeros((int(n), int(n)), dtype=np.float64)
    for j, value in enumerate(c[: int(n)]):
        out += value * np.eye(int(n), k=-j)
    return out


def inverse_coefs(coefs: np.ndarray, n: int) -> np.ndarray:
    """The coefficients d_0..d_{n-1} of C^{-1} (the power series 1 / c(x) to order n)."""
    from scipy import signal

    return np.asarray(signal.lfilter([1.0], _check(coefs), _impulse(n)), dtype=np.float64)


def decoder_coefs(coefs: np.ndarray, n: int) -> np.ndarray:
    """The coefficients e_0..e_{n-1} of B = A C^{-1} (1 / (c(x) (1 - x)) to order n)."""
    from scipy import signal

    c = _check(coefs)
    return np.asarray(signal.lfilter([1.0], np.convolve(c, [1.0, -1.0]), _impulse(n)),
                      dtype=np.float64)


def decoder_squared_norm(coefs: np.ndarray, n: int) -> float:
    """||B||_F^2 = sum_i (n - i) e_i^2: the total variance of the n noisy prefix sums per
    unit of sigma^2 (per coordinate)."""
    e = decoder_coefs(coefs, n)
    return float((n - np.arange(n)) @ (e * e))


def _cyclic_indicator(rounds: int, groups: int, group: int = 0) -> np.ndarray:
    v = np.zeros(int(rounds), dtype=np.float64)
    v[int(group)::int(groups)] = 1.0
    return v


def _objective(free: np.ndarray, rounds: int, v: np.ndarray) -> tuple[float, np.ndarray]:
    """log ||B||_F^2 + log ||C v||^2 and its gradient in c_1..c_{b-1} (module docstring)."""
    from scipy import signal

    T = int(rounds)
    c = np.concatenate(([1.0], free))
    e = signal.lfilter([1.0], np.convolve(c, [1.0, -1.0]), _impulse(T))
    d = signal.lfilter([1.0], c, _impulse(T))
    h = np.convolve(e, d)[:T]  # x^j e(x) d(x) is h shifted by j
    weights = T - np.arange(T, dtype=np.float64)
    u = weights * e
    loss = float(u @ e)
    y = np.convolve(c, v)[:T]
    sens = float(y @ y)
    lags = range(1, c.size)
    grad_loss = np.array([-2.0 * float(u[j:] @ h[: T - j]) for j in lags])
    grad_sens = np.array([2.0 * float(y[j:] @ v[: T - j]) for j in lags])
    return math.log(loss) + math.log(sens), grad_loss / loss + grad_sens / sens


def sqrt_coefs(bands: int) -> np.ndarray:
    """The first ``bands`` coefficients of (1 - x)^{-1/2}: binom(2j, j) / 4^j."""
    j = np.arange(1, int(bands), dtype=np.float64)
    return np.concatenate(([1.0], np.cumprod((2 * j - 1) / (2 * j))))


@functools.lru_cache(maxsize=32)
def optimise_banded(rounds: int, bands: int, groups: int) -> tuple[float, ...]:
    """The b = ``bands`` coefficients (c_0 = 1) minimising ||B||_F^2 x sens^2 for T =
    ``rounds`` under G = ``groups`` cyclic cohorts (module docstring); needs 1 <= b <=
    min(G, T). Deterministic."""
    from scipy import optimize

    T, b, G = int(rounds), int(bands), int(groups)
    if not 1 <= b <= min(G, T):
        raise ValueError(f"need 1 <= bands <= min(groups, rounds) = {min(G, T)}, got {b}")
    if b == 1:
        return (1.0,)
    v = _cyclic_indicator(T, G)
    start = sqrt_coefs(b)[1:]
    found = optimize.minimize(_objective, start, args=(T, v), jac=True, method="L-BFGS-B",
                              options={"maxiter": 5000, "gtol": 1e-10})
    best = found.x if found.fun <= _objective(start, T, v)[0] else start
    return (1.0, *(float(x) for x in best))


def column_squared_norms(coefs: np.ndarray, rounds: int) -> np.ndarray:
    """||C[:, s]||^2 for s = 1..T of the T x T matrix: sum_{j < min(b, T - s + 1)} c_j^2."""
    c = _check(coefs)
    T = int(rounds)
    csum = np.cumsum(c * c)
    length = np.minimum(c.size, T - np.arange(T))  # entries of column s = 1 + index
    return csum[length - 1]


def cyclic_squared_curve(coefs: np.ndarray, rounds: int, groups: int
                         ) -> tuple[np.ndarray, float, int]:
    """(S_1..S_T, r, k_max) of a b-banded C (b <= G) under G cyclic cohorts, in units of C^2.

    S_t = max_g sum_{s in group g, s <= t} ||C_t[:, s]||^2 is the exact squared L2
    sensitivity of the release up to round t (C_t: the first t rows and columns; module
    docstring: the columns of one group never overlap since b <= G); r = max over t and g
    with k_t(g) > 0 of S_t(g) / k_t(g) is the ledger's per-participation charge (at most
    ||c||^2) and k_max = ceil(T / G)."""
    c = _check(coefs)
    T, G = int(rounds), int(groups)
    if not 1 <= c.size <= G:
        raise ValueError(f"a {c.size}-banded strategy needs G >= {c.size} cohorts, got {G}")
    rows = np.arange(T)  # row t - 1
    curve = np.zeros(T, dtype=np.float64)
    ratio = 0.0
    for g in range(min(G, T)):  # group g takes part in rounds g + 1, g + 1 + G, ...
        since = rows - g  # rounds since the group's first: its latest column is lag back
        lag = np.where(since >= 0, since % G, c.size)
        # row t meets at most one of the group's columns (b <= G), lag rows below it
        part = np.where(lag < c.size, c[np.minimum(lag, c.size - 1)] ** 2, 0.0)
        cum = np.cumsum(part)  # S_t(g): the rows <= t
        count = np.where(since >= 0, since // G + 1, 0)  # k_t(g)
        seen = count > 0
        ratio = max(ratio, float((cum[seen] / count[seen]).max()))
        curve = np.maximum(curve, cum)
    curve.setflags(write=False)
    return curve, ratio, math.ceil(T / G)


def minsep_squared_sensitivity(coefs: np.ndarray, rounds: int, separation: int,
                               participations: int) -> float:
    """The squared sensitivity (units of C^2) of a b-banded C over T rounds for every
    pattern of at most k = ``participations`` participations at least ``separation`` >= b
    rounds apart: the earliest packing's column norms (module docstring), <= k ||c||^2."""
    c = _check(coefs)
    T, sep, k = int(rounds), int(separation), int(participations)
    if sep < c.size:
        raise ValueError(f"min-separation {sep} < {c.size} bands: the columns overlap")
    cols = column_squared_norms(c, T)
    return float(cols[0: sep * k: sep].sum()) if k > 0 else 0.0


# ------------------------------------------------------------------ the streamed noise
class BandedNoise:
    """w = C^{-1} z streamed: w_t = z_t - sum_{j=1}^{b-1} c_j w_{t-j} (module docstring).

    ``draw(t)`` is z_t ~ N(0, sigma^2 I) (a function of t alone, e.g. keyed by the run
    seed); :meth:`step` must be called for t = 1, 2, ... in order and keeps the last b - 1
    vectors w (float64): O(b) memory."""

    def __init__(self, coefs: np.ndarray | tuple[float, ...]) -> None:
        self.coefs = tuple(float(x) for x in _check(np.asarray(coefs)))
        self.round = 0
        self._past: deque[torch.Tensor] = deque(maxlen=max(len(self.coefs) - 1, 1))

    def step(self, z: torch.Tensor) -> torch.Tensor:
        """w_t from z_t (round t = the previous round + 1)."""
        import torch

        w = z.to(dtype=torch.float64, copy=True)
        if len(self.coefs) > 1:
            for j, past in enumerate(reversed(self._past), start=1):  # w_{t-1}, w_{t-2}, ...
                w.sub_(past, alpha=self.coefs[j])
            self._past.append(w.clone())
        self.round += 1
        return w
