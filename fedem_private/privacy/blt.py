"""Buffered-linear-Toeplitz (BLT) factorisation for DP-FTRL: the math of ``--ftrl-strategy blt``.

Same release as the banded strategy (:mod:`fedem_private.privacy.mf`): the prefix sums
A x of the rounds' clipped sums are released as B (C x + z), A = B C, z i.i.d.
N(0, sigma^2), which is post-processing of the Gaussian mechanism C x + z. Only C differs.
Neighbouring relation, trust model and accounting are dp-ftrl's
(:mod:`fedem_private.privacy.ftrl`): user-level add/remove of one client's whole data; the
clipped deltas summed under secure aggregation or by a trusted server, which adds the
data-free noise; the whole release ONE Gaussian mechanism of L2 sensitivity C sqrt(S_T),
no amplification by sampling claimed.

**The strategy** (McMahan, Choquette-Choo et al., "Efficient and near-optimal noise
generation for streaming differential privacy", 2024). C is lower-triangular Toeplitz
with the generating coefficients

    c_0 = 1,   c_k = sum_{j=1}^{d} omega_j theta_j^{k-1}   (k >= 1),          (1)

d buffers with decays theta_j in (0, 1) and weights omega_j. Unlike a banded C it is
not truncated: every round's noise is correlated with all earlier ones, at O(d) cost.

**The noise, streamed.** Round t adds w_t = (C^{-1} z)_t, i.e. C w = z. By (1),
sum_{k >= 1} c_k w_{t-k} = sum_j omega_j buf_j with buf_j = sum_{k >= 1} theta_j^{k-1}
w_{t-k}, so

    w_t = z_t - sum_j omega_j buf_j,   then   buf_j <- theta_j buf_j + w_t    (2)

(buf_j = 0 before round 1): d vectors of the model's size, whatever T (:class:`BLTNoise`).

**The constraint.** Here omega_j >= 0 and sum_j omega_j < 1 (with theta_j in (0, 1)): the
coefficients are then non-negative and non-increasing, c_0 = 1 > c_1 >= c_2 >= ... >= 0. The
optimiser keeps them so by its parametrisation, and :func:`cyclic_squared_curve` refuses
any other, since the sensitivity rule below is proved only under it.

**Sensitivity.** A client taking part in rounds S with clipped deltas g_s (||g_s|| <= C)
moves C x by sum_{s in S} C[:, s] g_s^T, of squared norm sum_{s, s'} (C^T C)_{s s'}
<g_s, g_s'>. With non-negative coefficients C^T C >= 0 entrywise, so for a fixed S the
maximum is at all g_s one vector of norm C: C^2 ||C 1_S||^2 (exact). For s <= s',
(C^T C)_{s s'} = sum_{i=0}^{T-1-s'} c_i c_{i+s'-s} grows when s' moves earlier (more
terms, all >= 0) and when s' - s shrinks (c non-increasing). So among all patterns of at
most k participations at least ``sep`` apart, the earliest packing 0, sep, ..., (k-1) sep
(0-based) maximises every entry at once (its i-th round is no later than any pattern's
i-th, and its gaps are no wider; a pattern of fewer rounds drops terms that are >= 0), and
the squared sensitivity is exactly
||sum_{i<k} C[:, i sep]||^2 (:func:`minsep_squared_sensitivity`; argued here, and checked
by brute force over every pattern for T <= 9 in tests/test_ftrl_blt.py).
DP-FTRL's cyclic cohorts: cohort 0 takes part in rounds 0, G, 2G, ... (0-based); cohort g's
vector C 1_g is cohort 0's shifted down by g (Toeplitz), so cohort 0 is the worst at every
prefix, and its value is the (ceil(T/G), G)-min-separation bound: the guarantee holds for
any schedule enforcing that separation and cap, and no b <= G condition is needed.

**Optimisation.** For the run's T and G, the 2d parameters minimise the banded
optimiser's objective (:func:`fedem_private.privacy.mf._objective` on the T coefficients
of (1): log ||B||_F^2 + log ||C v||^2, v cohort 0's indicator, which is exactly its
squared sensitivity here) through the chain rule, by L-BFGS-B over unconstrained
parameters: theta_j = sigmoid(b_j), omega_j = exp(a_j) / (1 + sum_i exp(a_i)).
Deterministic (fixed starts), cached per (T, d, G).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from fedem_private.privacy import mf

if TYPE_CHECKING:
    import torch

#: --ftrl-buffers 0 means this many buffers
DEFAULT_BUFFERS = 3
#: the most buffers accepted (a BLT's point is a few)
MAX_BUFFERS = 8


def check_params(omega: np.ndarray | tuple[float, ...], theta: np.ndarray | tuple[float, ...]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(omega, theta) as float64 arrays, refused unless 1 <= d, theta_j in (0, 1),
    omega_j >= 0 and sum omega_j < 1 (module docstring, "The constraint")."""
    w = np.asarray(omega, dtype=np.float64).ravel()
    th = np.asarray(theta, dtype=np.float64).ravel()
    if w.size < 1 or w.size != th.size or not (np.all(np.isfinite(w)) and np.all(np.isfinite(th))):
        raise ValueError("a BLT needs d >= 1 finite weights and as many decays")
    if not (np.all(th > 0) and np.all(th < 1) and np.all(w >= 0) and w.sum() < 1):
        raise ValueError("a BLT here needs decays in (0, 1), weights >= 0 summing below 1 "
                         "(non-negative, non-increasing coefficients: the sensitivity rule)")
    return w, th


def blt_coefs(omega: np.ndarray | tuple[float, ...], theta: np.ndarray | tuple[float, ...],
              n: int) -> np.ndarray:
    """c_0..c_{n-1} of eq. (1)."""
    w, th = check_params(omega, theta)
    return _coefs(w, th, int(n))


def _coefs(w: np.ndarray, th: np.ndarray, n: int) -> np.ndarray:
    powers = th[None, :] ** np.arange(max(n - 1, 0), dtype=np.float64)[:, None]  # (n-1, d)
    return np.concatenate(([1.0], powers @ w))


# ------------------------------------------------------------------------ sensitivity
def _packed(c: np.ndarray, separation: int, participations: int) -> np.ndarray:
    """C 1_S for S = {0, sep, ..., (k-1) sep} below T = c.size (0-based rounds): y_i =
    sum_{s in S, s <= i} c_{i - s}."""
    T = c.size
    y = np.zeros(T, dtype=np.float64)
    for start in range(0, min(int(participations) * int(separation), T), int(separation)):
        y[start:] += c[: T - start]
    return y


def cyclic_squared_curve(omega: tuple[float, ...], theta: tuple[float, ...], rounds: int,
                         groups: int) -> tuple[np.ndarray, float, int]:
    """(S_1..S_T, r, k_max) of a BLT under G cyclic cohorts, in units of C^2.

    S_t = ||(C 1_0)_{1..t}||^2, 1_0 cohort 0's rounds 0, G, 2G, ... (0-based), is the exact
    squared L2 sensitivity of the release up to round t (module docstring: cohort 0 is the
    worst at every prefix, all its deltas one vector); r = max_t S_t / k_t (k_t: cohort 0's
    participations up to t; another cohort's ratios are cohort 0's at an earlier prefix) is
    the ledger's per-participation charge and k_max = ceil(T / G). Refuses parameters
    outside the constraint (:func:`check_params`)."""
    T, G = int(rounds), int(groups)
    if T < 1 or G < 1:
        raise ValueError(f"need rounds >= 1 and groups >= 1, got {T}, {G}")
    k_max = math.ceil(T / G)
    y = _packed(blt_coefs(omega, theta, T), G, k_max)
    curve = np.cumsum(y * y)
    ratio = float(np.max(curve / (np.arange(T) // G + 1)))
    curve.setflags(write=False)
    return curve, ratio, k_max


def minsep_squared_sensitivity(omega: tuple[float, ...], theta: tuple[float, ...],
                               rounds: int, separation: int, participations: int) -> float:
    """The squared sensitivity (units of C^2) over T rounds for every pattern of at most
    k = ``participations`` participations at least ``separation`` >= 1 rounds apart: the
    earliest packing's ||C 1_{0, sep, ..., (k-1) sep}||^2, exact (module docstring)."""
    T, sep, k = int(rounds), int(separation), int(participations)
    if sep < 1 or k < 0:
        raise ValueError(f"need separation >= 1 and participations >= 0, got {sep}, {k}")
    y = _packed(blt_coefs(omega, theta, T), sep, k)
    return float(y @ y)


# ----------------------------------------------------------------------- optimisation
def _unpack(free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(omega, theta) of the unconstrained parameters (a_1..a_d, b_1..b_d)."""
    d = free.size // 2
    a = np.exp(free[:d] - max(0.0, float(free[:d].max())))
    scale = math.exp(-max(0.0, float(free[:d].max())))  # exp(a) / (1 + sum exp(a)), stably
    omega = a / (scale + a.sum())
    theta = 1.0 / (1.0 + np.exp(-free[d:]))
    return omega, theta


def _objective(free: np.ndarray, rounds: int, v: np.ndarray) -> tuple[float, np.ndarray]:
    """The banded objective (:func:`mf._objective`) at the T coefficients of eq. (1), and
    its gradient in the unconstrained parameters by the chain rule."""
    T = int(rounds)
    omega, theta = _unpack(free)
    c = _coefs(omega, theta, T)
    value, grad_c = mf._objective(c[1:], T, v)  # d/dc_k, k = 1..T-1
    k = np.arange(T - 1, dtype=np.float64)  # k - 1 for c_k
    powers = theta[None, :] ** k[:, None]  # theta_j^{k-1}
    g_omega = grad_c @ powers
    lower = theta[None, :] ** np.maximum(k - 1, 0)[:, None]  # theta_j^{k-2}
    g_theta = omega * (grad_c @ (k[:, None] * lower))
    g_a = omega * (g_omega - float(g_omega @ omega))  # d omega_j / d a_i = omega_j (d_ij - omega_i)
    g_b = g_theta * theta * (1.0 - theta)
    return value, np.concatenate((g_a, g_b))


def _starts(rounds: int, buffers: int) -> list[np.ndarray]:
    """Fixed starts: decays spread geometrically in 1 - theta from T^{-1/(d+1)} to T^{-d/(d+1)},
    equal weights summing to 0.3, 0.5 or 0.7."""
    d, T = int(buffers), max(int(rounds), 2)
    gaps = T ** (-np.arange(1, d + 1, dtype=np.float64) / (d + 1))
    b = np.log((1.0 - gaps) / gaps)
    out = []
    for total in (0.3, 0.5, 0.7):
        a = np.full(d, math.log(total / d / (1.0 - total)))
        out.append(np.concatenate((a, b)))
    return out


@functools.lru_cache(maxsize=32)
def optimise_blt(rounds: int, buffers: int, groups: int
                 ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(omega, theta) of d = ``buffers`` buffers minimising ||B||_F^2 x sens^2 for T =
    ``rounds`` under G = ``groups`` cyclic cohorts (module docstring); the best of a few
    fixed starts by L-BFGS-B, or zero weights (independent noise) where none beats them.
    Deterministic."""
    from scipy import optimize

    T, d, G = int(rounds), int(buffers), int(groups)
    if not 1 <= d <= MAX_BUFFERS or T < 1 or G < 1:
        raise ValueError(f"need 1 <= buffers <= {MAX_BUFFERS}, rounds >= 1, groups >= 1; got "
                         f"{d}, {T}, {G}")
    if T == 1:  # one round: C = [1] whatever the parameters
        return _pack(*_unpack(_starts(T, d)[1]))
    v = mf._cyclic_indicator(T, G)
    # independent noise (C = I, every weight 0) is a BLT too, the limit the parametrisation
    # only approaches: kept where nothing beats it (e.g. G = 1)
    best, best_value = None, mf._objective(np.zeros(T - 1), T, v)[0]
    for start in _starts(T, d):
        found = optimize.minimize(_objective, start, args=(T, v), jac=True, method="L-BFGS-B",
                                  options={"maxiter": 2000, "gtol": 1e-9})
        omega, theta = _unpack(found.x)
        try:
            check_params(omega, theta)  # a decay rounded to 1 or 0 is not kept
        except ValueError:
            continue
        if found.fun < best_value:
            best, best_value = found.x, float(found.fun)
    if best is None:
        return _pack(np.zeros(d), _unpack(_starts(T, d)[1])[1])
    return _pack(*_unpack(best))


def _pack(omega: np.ndarray, theta: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return tuple(float(x) for x in omega), tuple(float(x) for x in theta)


def decoder_squared_norm(omega: tuple[float, ...], theta: tuple[float, ...], n: int) -> float:
    """||B||_F^2 of the n x n BLT factorisation (:func:`mf.decoder_squared_norm`)."""
    return mf.decoder_squared_norm(blt_coefs(omega, theta, n), n)


# ------------------------------------------------------------------ the streamed noise
class BLTNoise:
    """w = C^{-1} z streamed by eq. (2): d buffers, O(d) memory whatever T.

    :meth:`step` must be called for t = 1, 2, ... in order with z_t (any tensor shape; a
    function of t alone, e.g. keyed by the run seed). State: the d buffers (float64) and the
    round, pickled with the run, so a resumed run continues the same noise."""

    def __init__(self, omega: tuple[float, ...], theta: tuple[float, ...]) -> None:
        w, th = check_params(omega, theta)
        self.omega = tuple(float(x) for x in w)
        self.theta = tuple(float(x) for x in th)
        self.round = 0
        self._buffers: list[torch.Tensor] = []

    def step(self, z: torch.Tensor) -> torch.Tensor:
        """w_t from z_t (round t = the previous round + 1)."""
        import torch

        w = z.to(dtype=torch.float64, copy=True)
        if not self._buffers:  # round 1: the buffers were zero
            self._buffers = [w.clone() for _ in self.theta]
        else:
            for weight, buf in zip(self.omega, self._buffers, strict=True):
                w.sub_(buf, alpha=weight)
            for decay, buf in zip(self.theta, self._buffers, strict=True):
                buf.mul_(decay).add_(w)
        self.round += 1
        return w
