"""cvxpy references for the server's similarity weights (:mod:`fedem_private.server.aggregation`).

:func:`similarity_weights_cvxpy` solves equation 13 client by client, the
objective exactly as written in the paper, where the fast path projects onto
the simplex in closed form (:func:`~fedem_private.server.aggregation.similarity_weights`);
:func:`pca_similarity_weights_reference` is the FedEM code's ``pca`` similarity
with sklearn's PCA, a loop over pairs and cvxpy's QP
(:func:`~fedem_private.server.aggregation.pca_similarity_weights`). Slow; for
tests and benchmarks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedem_private.server.aggregation import PCA_SIM_CAP, _check_alpha, _participants


def _solve_reference_qp(problem: Any, client: int) -> None:
    """Solve a reference cvxpy QP with CLARABEL at tolerances of 1e-11; raise unless optimal."""
    import cvxpy as cp  # deferred: only the references need it

    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11,
                  tol_feas=1e-11, max_iter=500)
    if problem.status != cp.OPTIMAL:
        raise RuntimeError(f"cvxpy did not solve client {client}'s QP: {problem.status}")


def similarity_weights_cvxpy(p: Tensor, sq_dists: Tensor, alpha: float,
                             participating: Tensor | None = None) -> Tensor:
    """Reference for :func:`similarity_weights`: cvxpy solves equation 13 client by client.

    Uses the objective exactly as written in the paper and CLARABEL with
    tolerances of 1e-11. Slow; for tests and benchmarks.
    """
    import cvxpy as cp  # deferred: only the reference needs it

    _check_alpha(alpha)
    k, n = sq_dists.shape
    keep = _participants(n, participating, torch.device("cpu")).numpy()
    p_np = p.detach().cpu().to(torch.float64).numpy()[keep]
    s_all = 1.0 / (1.0 + sq_dists.detach().cpu().to(torch.float64).numpy()[:, keep])
    w = cp.Variable(int(keep.sum()))
    s = cp.Parameter(int(keep.sum()))
    objective = cp.sum_squares(w - p_np) + alpha * cp.sum_squares(w - s)
    problem = cp.Problem(cp.Minimize(objective), [w >= 0, cp.sum(w) == 1])
    out = np.zeros((k, n))
    for u in range(k):
        s.value = s_all[u]
        _solve_reference_qp(problem, u)
        out[u, keep] = w.value
    return torch.from_numpy(out)


def pca_similarity_weights_reference(p: Tensor, tables: Tensor, alpha: float,
                                     participating: Tensor | None = None) -> Tensor:
    """Slow reference for the ``pca`` similarity: per client sklearn's PCA, a loop over pairs
    and cvxpy solving min x'x - 2 (p + alpha s_u)'x on the simplex. For tests."""
    import cvxpy as cp  # deferred: only the reference needs it
    from sklearn.decomposition import PCA

    n = tables.shape[0]
    keep = _participants(n, participating, torch.device("cpu")).numpy()
    codes = []
    for u in range(n):
        z = PCA(n_components=1, svd_solver="full").fit_transform(
            tables[u].detach().cpu().double().numpy())[:, 0]
        codes.append(z if z[np.argmax(np.abs(z))] > 0 else -z)
    p_np = p.detach().cpu().double().numpy()
    ids = np.flatnonzero(keep)
    out = np.zeros((n, n))
    for u in range(n):
        s = np.array([1.0 / (1.0 + np.linalg.norm(codes[u] - codes[v])) for v in ids])
        s[s > PCA_SIM_CAP] = 1.0
        c = p_np[ids] + alpha * s
        x = cp.Variable(ids.shape[0])
        problem = cp.Problem(cp.Minimize(cp.sum_squares(x) - 2 * c @ x),
                             [x >= 0, cp.sum(x) == 1])
        _solve_reference_qp(problem, u)
        out[u, ids] = x.value
    return torch.from_numpy(out)
