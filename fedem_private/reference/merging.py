"""An MF client's round with the merge on every batch, one client at a time: the
reference :class:`~fedem_private.client.merging.BatchMergeRows` is tested against."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedem_private.models.base import LocalTrainConfig, epoch_orders, stops_early


def reference_batch_merge_client(q_start: Tensor, q_global: Tensor, p_start: Tensor,
                             weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                             items: np.ndarray, labels: np.ndarray, cfg: LocalTrainConfig,
                             adapter_lr: float, seed: int, round_: int, client: int
                             ) -> tuple[Tensor, Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
    """One MF client's round with the merge on every batch, written plainly (the
    reference :class:`BatchMergeRows` is tested against).

    q_start, q_global (m, d), p_start (d,), one client's adapter (weights
    (fan_in, fan_out), biases (fan_out,)); the batches and the early stop are
    those of :func:`~fedem_private.reference.models.mf_train_client`. Per batch:
    zero the adapter's gradient, merge the batch's rows, loss, backward, adapter
    Adam step; zero the table's and p's gradients, merge again, loss, backward,
    table and p Adam step. Returns (Q_l, p, weights, biases) trained.
    """
    q = torch.nn.Parameter(q_start.detach().clone())
    p = torch.nn.Parameter(p_start.detach().clone())
    ws = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    bs = [torch.nn.Parameter(b.detach().clone()) for b in biases]
    opt = torch.optim.Adam([q, p], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    opt_adapter = torch.optim.Adam([*ws, *bs], lr=adapter_lr, betas=(0.9, 0.999), eps=1e-8)
    items_t = torch.from_numpy(items)
    labels_t = torch.from_numpy(labels).to(q.dtype)

    def batch_loss(batch: Tensor) -> Tensor:
        ql, qg = q[items_t[batch]], q_global[items_t[batch]]
        h = torch.cat((qg - ql, ql), dim=-1)
        for j, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w + b
            h = torch.sigmoid(h) if j == len(ws) - 1 else torch.relu(h)
        merged = ql + h * (qg - ql)  # h: (B, 1), one rho per row
        return F.binary_cross_entropy_with_logits(merged @ p, labels_t[batch])

    n = items.shape[0]
    orders = epoch_orders(seed, round_, client, n, cfg.epochs) if n else []
    prev = None
    for order in orders:
        if prev is not None and stops_early(*prev, cfg.early_stop_tol):
            break  # the FedEM code's early stop, as in the MF reference
        epoch_loss = 0.0
        order_t = torch.from_numpy(order)
        for start in range(0, n, cfg.batch_size):
            batch = order_t[start: start + cfg.batch_size]
            opt_adapter.zero_grad()
            batch_loss(batch).backward()
            opt_adapter.step()
            opt.zero_grad()
            loss = batch_loss(batch)
            epoch_loss += float(loss.detach())
            loss.backward()
            if cfg.grad_clip is not None and q.grad.norm() > cfg.grad_clip:
                q.grad.mul_(cfg.grad_clip / q.grad.norm())
            opt.step()
        prev = (math.inf if prev is None else prev[1], epoch_loss)
    return (q.detach(), p.detach(), tuple(w.detach() for w in ws),
            tuple(b.detach() for b in bs))
