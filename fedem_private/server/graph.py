"""GPFedRec's user graph on the server (Zhang et al., KDD 2024), by batched linear algebra.

From the round's uploaded item tables U_v (flattened to vectors of length
m d):

1. similarity: cosine between every pair, S = D^-1/2 (U U^T) D^-1/2 with
   D = diag(U U^T), from one Gram matrix (float64, chunked over rows);
2. neighbours: with ``topk`` k > 0, each user's k most similar users (itself
   included when it is among them) with weight 1/k; otherwise every user whose
   similarity exceeds ``threshold`` times the mean of S (all pairs, diagonal
   included), each with weight 1 / (their number), and a user with none keeps
   itself with weight 1 (the published defaults: threshold mode, factor 1);
3. propagation: P = A^L U with L = ``layers`` (default 1); user u's
   personalised table is row u of P, and the global table is the mean of the
   rows.

The published code computes "similarity" with scikit-learn's
``pairwise_distances(metric="cosine")``, which returns the cosine *distance*
1 - cos, and then treats it as a similarity, so its neighbours are the least
similar users. This module implements what the paper describes (cosine
similarity); :func:`fedem_private.reference.graph.graph_reference` is the plain
per-pair loop the tests compare it with.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 256


def cosine_similarity_matrix(tables: Tensor) -> Tensor:
    """(n, n) float64 cosine similarities of the flattened tables (n, ...).

    The Gram matrix is symmetric, so only its blocks on and above the diagonal
    are multiplied; each block below is the transpose of its mirror (half the
    multiply-adds; the Gram matrix is exactly symmetric).
    """
    n = tables.shape[0]
    flat = tables.reshape(n, -1)
    gram = torch.empty((n, n), dtype=torch.float64, device=tables.device)
    for a in range(0, n, CHUNK):
        block = flat[a:a + CHUNK].double()
        for b in range(a, n, CHUNK):
            part = block @ flat[b:b + CHUNK].double().T
            gram[a:a + CHUNK, b:b + CHUNK] = part
            if b != a:
                gram[b:b + CHUNK, a:a + CHUNK] = part.T
    norms = torch.sqrt(torch.clamp(torch.diagonal(gram), min=1e-300))
    return gram / norms[:, None] / norms[None, :]


def neighbour_weights(sim: Tensor, *, threshold: float = 1.0, topk: int = 0) -> Tensor:
    """Row-stochastic (n, n) weights A of step 2 of the module docstring."""
    n = sim.shape[0]
    if topk > 0:
        k = min(topk, n)
        idx = torch.topk(sim, k, dim=1).indices
        out = torch.zeros_like(sim)
        out.scatter_(1, idx, 1.0 / k)
        return out
    mask = sim > sim.mean() * threshold
    lonely = (mask.sum(dim=1) == 0).nonzero().squeeze(1)
    mask[lonely, lonely] = True
    return mask.double() / mask.sum(dim=1, keepdim=True)


def propagate(weights: Tensor, tables: Tensor, layers: int = 1) -> Tensor:
    """P = A^L U: (n, n) weights over (n, m, d) tables, in the tables' dtype."""
    n = tables.shape[0]
    out = tables.reshape(n, -1)
    a = weights.to(tables.dtype)
    for _ in range(layers):
        out = a @ out
    return out.reshape(tables.shape)


def graph_tables(tables: Tensor, *, threshold: float = 1.0, topk: int = 0,
                 layers: int = 1) -> tuple[Tensor, Tensor]:
    """(personalised tables (n, m, d), global table (m, d)) from the uploads (n, m, d)."""
    weights = neighbour_weights(cosine_similarity_matrix(tables), threshold=threshold, topk=topk)
    personal = propagate(weights, tables, layers)
    return personal, personal.double().mean(dim=0).to(tables.dtype)
