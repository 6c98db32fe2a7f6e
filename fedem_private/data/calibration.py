"""The two rungs a calibrated population is fitted to reproduce (docs/design.md section 17).

A population drawn from :class:`~fedem_private.data.population.PopulationModel` at its
source's size should give the source's MostPop and EASE full-ranking HR@10 under the
project's leave-one-out split and ``strict`` protocol. The data room may not import the
baselines or the evaluation room (docs/design.md section 1), so the relations of
:mod:`fedem_private.baselines` and :mod:`fedem_private.evaluation.metrics` are written
here again in numpy, for the calibration's own use:

- MostPop (baselines/popularity.py): c_i = number of training interactions of item i,
  plus a keyed jitter in [0, 0.5) that breaks ties without reordering distinct counts.
- EASE (Steck 2019; baselines/models.py): S = X B with B = I - P diagMat(1 / diag P) and
  P = (X'X + lambda I)^-1, computed in the dual form of equation (C.1) when the users are
  fewer than the items: from a sparse X, a block of users' scores at a time
  (:func:`ease_hit_rate`), so neither an (m, m) nor an (n, m) array is ever held.
- Full-ranking HR@K (docs/design.md section 2): rank(u) = #{j outside u's training items
  and validation item, j != t_u : s_uj >= s_ut_u} (ties count against the model),
  HR@K = mean_u [rank(u) < K].

``benchmarks/probes/calibration.py`` checks these numbers against the project's own
baselines on the real data. :func:`solve` is the calibration's root finder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .split import Split

if TYPE_CHECKING:
    from scipy import sparse

#: a (users lo..hi, items) block of scores, for scores too large to hold at once
ScoreRows = Callable[[int, int], np.ndarray]

_BLOCK = 1 << 21  # entries of a (users, items) score block held at once
_JITTER = 0x5EED  # the "round" of MostPop's tie-break key (stream SYNTHETIC_POP)


def training_matrix(split: Split) -> np.ndarray:
    """X (n, m) float64, X_ui = 1 for u's training items."""
    x = np.zeros((split.n_users, split.n_items), dtype=np.float64)
    x[np.repeat(np.arange(split.n_users), split.train_counts), split.train_items] = 1.0
    return x


def training_csr(split: Split) -> sparse.csr_matrix:
    """X (n, m) as a sparse float64 CSR matrix, X_ui = 1 for u's training items."""
    from scipy import sparse

    data = np.ones(split.train_items.shape[0], dtype=np.float64)
    return sparse.csr_matrix((data, split.train_items, split.train_indptr),
                             shape=(split.n_users, split.n_items))


def mostpop_scores(split: Split, seed: int) -> np.ndarray:
    """MostPop's item scores c_i + j_i: training counts plus a keyed jitter j_i in [0, 0.5)."""
    from .. import rng  # here, not at import: rng loads torch

    counts = np.bincount(split.train_items, minlength=split.n_items).astype(np.float64)
    u = rng.uniform(rng.key(seed, rng.Stream.SYNTHETIC_POP, _JITTER, 0),
                    np.arange(split.n_items))
    return counts + 0.5 * u


def ease_scores(x: np.ndarray, lam: float) -> np.ndarray:
    """EASE's scores S = X B (Steck 2019, equation 8 and its closed form).

    Primal (m <= n): P = (X'X + lambda I)^-1, B = I - P diagMat(1 / diag P), S = X B.
    Dual (n < m), by the Woodbury identity, with K = (lambda I_n + X X')^-1 (n x n):

        P = (I - X'K X) / lambda,   X P = K X,   diag P_j = (1 - x_j' K x_j) / lambda,
        S = X - (K X) diagMat(1 / diag P)                                    (C.1)

    (x_j: column j of X). Equal in exact arithmetic; the dual costs O(n^2 m) instead of
    O(m^3), seconds instead of minutes on LastFM-2K (1,892 users, 17,632 items).
    """
    if not lam > 0:
        raise ValueError(f"lambda must be > 0, got {lam}")
    n, m = x.shape
    if m <= n:
        g = x.T @ x
        g[np.diag_indices_from(g)] += lam
        p = np.linalg.inv(g)
        b = -p / np.diag(p)[None, :]
        b[np.diag_indices_from(b)] = 0.0
        return x @ b
    gram = x @ x.T
    gram[np.diag_indices_from(gram)] += lam
    kx = np.linalg.solve(gram, x)
    diag_p = (1.0 - np.einsum("ij,ij->j", x, kx)) / lam
    return x - kx / diag_p[None, :]


def ease_dual(x: sparse.csr_matrix, lam: float, block: int = _BLOCK
              ) -> tuple[np.ndarray, np.ndarray]:
    """(K, diag P) of (C.1) from a sparse X (n, m), n < m, holding no (n, m) array:

        K = (lambda I_n + X X')^-1,   diag P_j = (1 - x_j' K x_j) / lambda,
        x_j' K x_j = sum_u X_uj (K X)_uj = sum_u X'_ju (X' K)_ju                 (C.2)

    (C.2)'s products X'K taken ``block`` entries of items at a time: O(n^3 + nnz n)."""
    if not lam > 0:
        raise ValueError(f"lambda must be > 0, got {lam}")
    n, m = x.shape
    gram = (x @ x.T).toarray()
    gram[np.diag_indices_from(gram)] += lam
    k = np.linalg.inv(gram)
    xt = x.T.tocsr()
    quad = np.empty(m)
    rows = max(1, block // n)
    for lo in range(0, m, rows):
        part = xt[lo:lo + rows]
        quad[lo:lo + rows] = np.asarray(part.multiply(part @ k).sum(axis=1)).ravel()
    return k, (1.0 - quad) / lam


def ease_rows(x: sparse.csr_matrix, k: np.ndarray, diag_p: np.ndarray, lo: int, hi: int
              ) -> np.ndarray:
    """Users lo..hi - 1 of EASE's S = X - (K X) diagMat(1 / diag P) of (C.1), from
    :func:`ease_dual`'s (K, diag P): K's rows times the sparse X, O((hi - lo) nnz)."""
    kx = np.asarray(x.T @ k[lo:hi].T).T
    return x[lo:hi].toarray() - kx / diag_p[None, :]


def ease_hit_rate(split: Split, lam: float, block: int = _BLOCK) -> float:
    """EASE's full HR@10 on ``split``: the dense primal of :func:`ease_scores` when
    m <= n, else the sparse dual of (C.1)-(C.2) a block of users at a time, so a source
    of 3,000 users and 34,000 items takes seconds, not the primal's m^3."""
    if split.n_items <= split.n_users:
        return hit_rate(split, ease_scores(training_matrix(split), lam), block=block)
    x = training_csr(split)
    k, diag_p = ease_dual(x, lam, block)
    return hit_rate(split, lambda lo, hi: ease_rows(x, k, diag_p, lo, hi), block=block)


def hit_rate(split: Split, scores: np.ndarray | ScoreRows, k: int = 10,
             block: int = _BLOCK) -> float:
    """Full-ranking HR@K of ``scores`` ((m,) for every user alike, (n, m), or a function
    of (lo, hi) giving users lo..hi - 1's rows): rank(u) is the number of items outside
    u's training items and validation item, the test item left out, that score at least
    as high as the test item (docs/design.md section 2). ``block`` entries at a time."""
    n, m = split.n_users, split.n_items
    rows = max(1, block // m)
    hits = 0
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        if callable(scores):
            chunk = np.asarray(scores(lo, hi), dtype=np.float64)
        else:
            chunk = (np.broadcast_to(scores, (hi - lo, m)) if scores.ndim == 1
                      else scores[lo:hi]).astype(np.float64, copy=True)
        own = np.arange(hi - lo)
        a, b = split.train_indptr[lo], split.train_indptr[hi]
        chunk[np.repeat(own, split.train_counts[lo:hi]), split.train_items[a:b]] = -np.inf
        chunk[own, split.val_items[lo:hi]] = -np.inf
        s_test = chunk[own, split.test_items[lo:hi]]
        rank = (chunk >= s_test[:, None]).sum(axis=1) - 1  # the test item beats itself
        hits += int((rank < k).sum())
    return hits / n


def rungs(split: Split, seed: int, ease_lambda: float) -> np.ndarray:
    """(MostPop, EASE) full HR@10 on ``split`` (EASE by :func:`ease_hit_rate`)."""
    return np.array([hit_rate(split, mostpop_scores(split, seed)),
                     ease_hit_rate(split, ease_lambda)])


def solve(residual: Callable[[np.ndarray], np.ndarray], theta: np.ndarray,
          lower: np.ndarray, upper: np.ndarray, evals: int, tol: float, step: float = 0.2
          ) -> tuple[np.ndarray, np.ndarray]:
    """Broyden's method for r(theta) = 0 in as many unknowns as equations (Broyden 1965).

    The Jacobian starts from forward differences of width ``step`` at ``theta``; each
    iterate takes the step theta' = theta - J^-1 r (shortened to length 1, kept in
    [lower, upper]) and updates J += (dr - J dtheta) dtheta' / (dtheta' dtheta). Stops when
    max |r| < ``tol`` or after ``evals`` evaluations; returns the best (theta, r) seen
    (smallest max |r|)."""
    theta = np.asarray(theta, dtype=np.float64)
    r = residual(theta)
    best = (theta, r)
    jac = np.empty((r.shape[0], theta.shape[0]))
    for j in range(theta.shape[0]):
        probe = theta.copy()
        probe[j] += step if probe[j] + step <= upper[j] else -step
        r_probe = residual(probe)
        jac[:, j] = (r_probe - r) / (probe[j] - theta[j])
        if np.abs(r_probe).max() < np.abs(best[1]).max():
            best = (probe, r_probe)
    used = 1 + theta.shape[0]
    while used < evals and np.abs(best[1]).max() >= tol:
        try:
            move = -np.linalg.solve(jac, r)
        except np.linalg.LinAlgError:
            break
        move *= min(1.0, 1.0 / max(float(np.linalg.norm(move)), 1e-12))
        nxt = np.clip(theta + move, lower, upper)
        r_next = residual(nxt)
        used += 1
        d_theta, d_r = nxt - theta, r_next - r
        if float(d_theta @ d_theta) > 0:
            jac += np.outer(d_r - jac @ d_theta, d_theta) / float(d_theta @ d_theta)
        theta, r = nxt, r_next
        if np.abs(r).max() < np.abs(best[1]).max():
            best = (theta, r)
    return best
