"""Slow, obvious references of the elastic-merging variants (issue 69;
:mod:`fedem_private.client.variants`): one client, one item at a time, ``torch.optim.Adam``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedem_private.models.base import LocalTrainConfig, epoch_orders


def seen_merge_client(q_local: Tensor, q_global: Tensor, rho: Tensor | float,
                      own_items: np.ndarray) -> Tensor:
    """Equation 10 with rho' for one client, item by item: row i is Q_l[i] + rho_i (Q_g[i] -
    Q_l[i]) when i is one of ``own_items`` (I_u), Q_g[i] otherwise. ``rho``: a number or
    (m,)."""
    own = {int(i) for i in np.asarray(own_items).tolist()}
    rows = []
    for i in range(q_local.shape[0]):
        if i in own:
            r = rho if isinstance(rho, float) else float(rho.reshape(-1)[i if rho.numel() > 1
                                                                          else 0])
            rows.append(q_local[i] + r * (q_global[i] - q_local[i]))
        else:
            rows.append(q_global[i].clone())
    return torch.stack(rows)


def prox_mf_train_client(q_start: Tensor, p_start: Tensor, anchor: Tensor, mu: float,
                         items: np.ndarray, labels: np.ndarray, cfg: LocalTrainConfig,
                         seed: int, round_: int, client: int) -> tuple[Tensor, Tensor]:
    """E epochs of mini-batch Adam on one MF client's full table and p_u, each batch's loss
    mean BCE + (mu / 2) sum over the round's items i (its positives and negatives) of
    ||q_i - anchor_i||^2."""
    q = torch.nn.Parameter(q_start.detach().clone())
    p = torch.nn.Parameter(p_start.detach().clone())
    opt = torch.optim.Adam([q, p], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    n = items.shape[0]
    if n == 0:
        return q.detach(), p.detach()
    round_items = torch.from_numpy(np.unique(items))
    items_t = torch.from_numpy(items)
    labels_t = torch.from_numpy(labels).to(q.dtype)
    for order in epoch_orders(seed, round_, client, n, cfg.epochs):
        order_t = torch.from_numpy(order)
        for a in range(0, n, cfg.batch_size):
            batch = order_t[a: a + cfg.batch_size]
            bce = F.binary_cross_entropy_with_logits(q[items_t[batch]] @ p, labels_t[batch])
            prox = 0.5 * mu * ((q[round_items] - anchor[round_items]) ** 2).sum()
            opt.zero_grad()
            (bce + prox).backward()
            opt.step()
    return q.detach(), p.detach()
