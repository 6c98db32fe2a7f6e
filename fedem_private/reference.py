"""The slow, obvious reference: one client at a time, ``torch.optim.Adam``.

Kept for tests and benchmarks only: the vectorised engine must give the same
tables (same seeds) and is timed against this loop. Nothing here is batched
or clever on purpose.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .models.mf import ClientSamples, LocalTrainConfig, epoch_orders


def train_client(q_start: torch.Tensor, p_start: torch.Tensor, items: np.ndarray,
                 labels: np.ndarray, cfg: LocalTrainConfig, seed: int, round_: int,
                 client: int) -> tuple[torch.Tensor, torch.Tensor]:
    """E epochs of mini-batch Adam on one client's full (m, d) item table and p_u."""
    q = torch.nn.Parameter(q_start.detach().clone())
    p = torch.nn.Parameter(p_start.detach().clone())
    opt = torch.optim.Adam([q, p], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    n = items.shape[0]
    if n == 0:
        return q.detach(), p.detach()
    orders = epoch_orders(seed, round_, client, n, cfg.epochs)
    items_t = torch.from_numpy(items)
    labels_t = torch.from_numpy(labels).to(q.dtype)
    for epoch in range(cfg.epochs):
        order = torch.from_numpy(orders[epoch])
        for start in range(0, n, cfg.batch_size):
            batch = order[start: start + cfg.batch_size]
            logits = q[items_t[batch]] @ p
            loss = F.binary_cross_entropy_with_logits(logits, labels_t[batch])
            opt.zero_grad()
            loss.backward()
            if cfg.grad_clip is not None:  # L2 clip of the item-table gradient at Z
                norm = q.grad.norm()
                if norm > cfg.grad_clip:
                    q.grad.mul_(cfg.grad_clip / norm)
            opt.step()
    return q.detach(), p.detach()


def train_clients(q_start: torch.Tensor, p: torch.Tensor, clients: np.ndarray,
                  samples: ClientSamples, cfg: LocalTrainConfig, seed: int,
                  round_: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Loop :func:`train_client` over clients; same shapes as the vectorised engine."""
    q_out, p_out = [], []
    for j, c in enumerate(np.asarray(clients).tolist()):
        items, labels = samples.of(j)
        q, pu = train_client(q_start[j], p[j], items, labels, cfg, seed, round_, c)
        q_out.append(q)
        p_out.append(pu)
    return torch.stack(q_out), torch.stack(p_out)


def fedavg_round(q_global: torch.Tensor, p: torch.Tensor, round_: int, seed: int,
                 train_indptr: np.ndarray, train_items: np.ndarray, excl: tuple,
                 n_items: int, cfg: LocalTrainConfig) -> tuple[torch.Tensor, torch.Tensor,
                                                               torch.Tensor]:
    """One FedMF round (static replacement, FedAvg), one client at a time.

    Returns (new global table, new user vectors, uploads (n, m, d)).
    """
    from .models.mf import draw_samples

    n = p.shape[0]
    uploads, p_new = [], []
    sizes = np.diff(train_indptr).astype(np.float64)
    total = torch.zeros_like(q_global, dtype=torch.float64)
    for u in range(n):
        s = draw_samples(seed, round_, np.array([u]), train_indptr, train_items, *excl,
                         n_items, cfg.num_negatives)
        items, labels = s.of(0)
        q, pu = train_client(q_global, p[u], items, labels, cfg, seed, round_, u)
        uploads.append(q)
        p_new.append(pu)
        total += (sizes[u] / sizes.sum()) * q.double()
    return total.float(), torch.stack(p_new), torch.stack(uploads)
