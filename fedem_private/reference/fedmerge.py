"""The FedMerge fit (12.2) one client and one table at a time, the reference for
:func:`fedem_private.server.fedmerge.fit` (slow; for tests)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedem_private.server.fedmerge import MAX_HALVINGS, FitConfig, FitResult


def fit_reference(uploads: Tensor, tables: Tensor, logits: Tensor,
                  cfg: FitConfig) -> FitResult:
    """The same fit, one client and one table at a time in float64 (slow; for tests).

    The logits' gradient comes from autograd on client u's own term of (12.2);
    a step is accepted when that term, computed afresh, does not increase.
    """
    n, k = logits.shape
    g = [tables[j].double().clone() for j in range(k)]
    a = [logits[u].double().clone() for u in range(n)]
    ups = [uploads[u].double() for u in range(n)]

    def merged(au: Tensor) -> Tensor:
        wu = torch.softmax(au, dim=0)
        out = torch.zeros_like(g[0])
        for j in range(k):
            out = out + wu[j] * g[j]
        return out

    def term(u: int, au: Tensor) -> Tensor:
        return ((ups[u] - merged(au)) ** 2).sum()

    def objective() -> float:
        return float(sum(float(term(u, a[u])) for u in range(n)))

    trace: list[float] = []
    for _ in range(cfg.steps):
        trace.append(objective())
        w = [torch.softmax(a[u], dim=0) for u in range(n)]
        res = [ups[u] - merged(a[u]) for u in range(n)]
        wtw = torch.zeros((k, k), dtype=torch.float64)
        for u in range(n):
            for i in range(k):
                for j in range(k):
                    wtw[i, j] += w[u][i] * w[u][j]
        lam = float(torch.linalg.eigvalsh(wtw)[-1])
        if lam > 0:
            for j in range(k):
                grad = torch.zeros_like(g[j])
                for u in range(n):
                    grad = grad - 2.0 * w[u][j] * res[u]  # d(12.2)/dG_j
                g[j] = g[j] - (cfg.lr / (2.0 * lam)) * grad
        trace.append(objective())
        if k == 1:
            continue
        h = torch.zeros((k, k), dtype=torch.float64)
        for i in range(k):
            for j in range(k):
                h[i, j] = (g[i] * g[j]).sum()
        p = torch.eye(k, dtype=torch.float64) - 1.0 / k
        la = 2.0 * float(torch.linalg.eigvalsh(p @ h @ p)[-1])
        if la <= 0:
            continue
        for u in range(n):
            au = a[u].clone().requires_grad_(True)
            before = term(u, au)
            (grad_a,) = torch.autograd.grad(before, au)
            step = cfg.lr / la
            for _ in range(MAX_HALVINGS + 1):
                trial = a[u] - step * grad_a
                if float(term(u, trial)) <= float(before.detach()):
                    a[u] = trial
                    break
                step *= 0.5
    trace.append(objective())
    return FitResult(torch.stack(g), torch.stack(a), trace)
