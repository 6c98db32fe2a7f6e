"""GPFedRec's user graph one pair and one user at a time, the reference for
:func:`fedem_private.server.graph.graph_tables` (slow; for tests)."""

from __future__ import annotations

import torch
from torch import Tensor


def graph_reference(tables: Tensor, *, threshold: float = 1.0, topk: int = 0,
                    layers: int = 1) -> tuple[Tensor, Tensor]:
    """The same, one pair and one user at a time in float64 (slow; for tests)."""
    n = tables.shape[0]
    flat = [tables[u].double().reshape(-1) for u in range(n)]
    sim = [[float(flat[u] @ flat[v] / (flat[u].norm() * flat[v].norm())) for v in range(n)]
           for u in range(n)]
    mean = sum(sum(row) for row in sim) / (n * n)
    weights = [[0.0] * n for _ in range(n)]
    for u in range(n):
        if topk > 0:
            order = sorted(range(n), key=lambda v: sim[u][v], reverse=True)[:min(topk, n)]
            for v in order:
                weights[u][v] = 1.0 / len(order)
        else:
            near = [v for v in range(n) if sim[u][v] > mean * threshold]
            for v in near or [u]:
                weights[u][v] = 1.0 / len(near or [u])
    current = flat
    for _ in range(layers):
        current = [sum(weights[u][v] * current[v] for v in range(n)) for u in range(n)]
    personal = torch.stack([c.reshape(tables.shape[1:]) for c in current])
    return personal, personal.mean(dim=0)
