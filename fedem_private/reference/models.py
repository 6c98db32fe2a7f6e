"""Each backbone's local training, one client at a time: the obvious code the vectorised
``train_chunk`` of :mod:`fedem_private.models` is tested against.

One client (k = 1), ``nn.Linear`` / ``nn.Sequential`` where the backbone has an
MLP or a head, ``torch.optim.Adam`` (or ``torch.optim.SGD`` with its
per-batch ExponentialLR where the backbone builds ``--optimizer sgd``) on the
full tables, the batches of :func:`reference_batches` (the vectorised order).

:func:`reference_train_client` and :func:`reference_logits` take the backbone
as their first argument and run its own reference (looked up along its class's
method resolution order, so a subclass without one of its own runs its
parent's, as a method would); :func:`mf_train_client` is FedMF's on plain
tensors (q, p_u).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedem_private.models.base import (
    Backbone,
    ClientParams,
    LocalTrainConfig,
    epoch_orders,
    sgd_rates,
    stops_early,
)
from fedem_private.models.fedrap import FedRAPBackbone
from fedem_private.models.gpfedrec import GPFedRecBackbone
from fedem_private.models.mf import MFBackbone
from fedem_private.models.ncf import NCFBackbone
from fedem_private.models.pfedrec import PFedRecBackbone

# ------------------------------------------------------------------ shared


def reference_optimizer(groups: dict[str, list[Tensor]], cfg: LocalTrainConfig, round_: int
                        ) -> tuple[torch.optim.Optimizer,
                                   torch.optim.lr_scheduler.LRScheduler | None]:
    """One client's torch optimiser for a reference path: Adam over every group, or, under
    ``optimizer == "sgd"``, torch.optim.SGD with a rate per group ("items", "head", "user";
    :func:`~fedem_private.models.base.sgd_rates`), weight decay, and an ExponentialLR to
    step after every batch."""
    if cfg.optimizer != "sgd":
        params = [t for group in groups.values() for t in group]
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps), None
    first = {g: float(r[0]) for g, r in sgd_rates(cfg, round_, 1).items()}
    opt = torch.optim.SGD([{"params": ts, "lr": first[g]} for g, ts in groups.items()],
                          lr=first["items"], weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=cfg.lr_batch_decay)


def reference_batches(seed: int, round_: int, client: int, n: int,
                      cfg: LocalTrainConfig) -> Iterator[Tensor]:
    """One client's batches (sample positions), epoch by epoch, in the vectorised order."""
    if n == 0:
        return
    for order in epoch_orders(seed, round_, client, n, cfg.epochs):
        order_t = torch.from_numpy(order)
        for a in range(0, n, cfg.batch_size):
            yield order_t[a: a + cfg.batch_size]


# ------------------------------------------------------------------ dispatch

TrainFn = Callable[[Backbone, ClientParams, np.ndarray, np.ndarray, LocalTrainConfig, int, int],
                   ClientParams]
LogitsFn = Callable[[Backbone, ClientParams, Tensor, Tensor], Tensor]


def _own(table: dict[type, Callable], backbone: Backbone) -> Callable:
    """The entry of ``table`` for the backbone's class or its nearest base class."""
    for cls in type(backbone).__mro__:
        if cls in table:
            return table[cls]
    raise TypeError(f"no reference for backbone {backbone.name!r}")


def reference_train_client(backbone: Backbone, start: ClientParams, items: np.ndarray,
                           labels: np.ndarray, cfg: LocalTrainConfig, round_: int,
                           client: int) -> ClientParams:
    """One client (k = 1) of ``backbone``: its E local epochs, the obvious way.

    ``start`` holds the client's starting parameters (client axis of length 1);
    ``items``/``labels`` its round samples. Returns its trained parameters.
    """
    return _own(_TRAIN, backbone)(backbone, start, items, labels, cfg, round_, client)


def reference_logits(backbone: Backbone, params: ClientParams, q_items: Tensor,
                     items: Tensor) -> Tensor:
    """One client's logits for item rows (B, d) of items ``items`` (B,), differentiable in
    q_items (the adapter of elastic merging trains through it)."""
    return _own(_LOGITS, backbone)(backbone, params, q_items, items)


# ------------------------------------------------------------------ MF


def mf_train_client(q_start: Tensor, p_start: Tensor, items: np.ndarray,
                    labels: np.ndarray, cfg: LocalTrainConfig, seed: int, round_: int,
                    client: int) -> tuple[Tensor, Tensor]:
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
    prev = None
    for epoch in range(cfg.epochs):
        order = torch.from_numpy(orders[epoch])
        epoch_loss = 0.0
        if prev is not None and cfg.early_stop_tol > 0 and stops_early(*prev, cfg.early_stop_tol):
            break  # the epoch loss barely moved: stop (docs/design.md 2a, the FedEM code)
        for start in range(0, n, cfg.batch_size):
            batch = order[start: start + cfg.batch_size]
            logits = q[items_t[batch]] @ p
            loss = F.binary_cross_entropy_with_logits(logits, labels_t[batch])
            epoch_loss += float(loss.detach())
            opt.zero_grad()
            loss.backward()
            if cfg.grad_clip is not None:  # L2 clip of the item-table gradient at Z
                norm = q.grad.norm()
                if norm > cfg.grad_clip:
                    q.grad.mul_(cfg.grad_clip / norm)
            opt.step()
        prev = (math.inf if prev is None else prev[1], epoch_loss)
    return q.detach(), p.detach()


def _mf_train(bb: MFBackbone, start: ClientParams, items: np.ndarray, labels: np.ndarray,
              cfg: LocalTrainConfig, round_: int, client: int) -> ClientParams:
    """One client (k = 1), E epochs of mini-batch torch.optim.Adam on the full table."""
    q, p = mf_train_client(start.items[0], start.private["p"][0], items, labels, cfg,
                           bb.seed, round_, client)
    return ClientParams(q[None], {}, {"p": p[None]})


def _mf_logits(bb: MFBackbone, params: ClientParams, q_items: Tensor,
               items: Tensor) -> Tensor:
    """One client's logits for item rows (B, d), differentiable in q_items."""
    return q_items @ params.private["p"][0]


# ------------------------------------------------------------------ FedNCF


def reference_net(bb: NCFBackbone, params: ClientParams) -> torch.nn.Sequential:
    """One client's MLP as a plain nn.Sequential holding copies of its weights."""
    mods: list[torch.nn.Module] = []
    for j, (fan_in, fan_out) in enumerate(bb.shapes):
        lin = torch.nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            lin.weight.copy_(params.dense[f"w{j}"][0].T)
            lin.bias.copy_(params.dense[f"b{j}"][0])
        mods.append(lin)
        if j < len(bb.shapes) - 1:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def _ncf_train(bb: NCFBackbone, start: ClientParams, items: np.ndarray, labels: np.ndarray,
               cfg: LocalTrainConfig, round_: int, client: int) -> ClientParams:
    """One client (k = 1): E epochs of torch.optim.Adam on q (full table), p_u and the MLP."""
    q = torch.nn.Parameter(start.items[0].detach().clone())
    p = torch.nn.Parameter(start.private["p"][0].detach().clone())
    net = reference_net(bb, start)
    opt = torch.optim.Adam([q, p, *net.parameters()], lr=cfg.lr, betas=cfg.betas,
                           eps=cfg.eps)
    items_t, labels_t = torch.from_numpy(items), torch.from_numpy(labels).to(q.dtype)
    for batch in reference_batches(bb.seed, round_, client, items.shape[0], cfg):
        qi = q[items_t[batch]]
        logits = net(torch.cat([p.expand(qi.shape[0], -1), qi], dim=1)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, labels_t[batch])
        opt.zero_grad()
        loss.backward()
        if cfg.grad_clip is not None and q.grad.norm() > cfg.grad_clip:
            q.grad.mul_(cfg.grad_clip / q.grad.norm())
        opt.step()
    dense: dict[str, Tensor] = {}
    linears = [mod for mod in net if isinstance(mod, torch.nn.Linear)]
    for j, lin in enumerate(linears):
        dense[f"w{j}"] = lin.weight.detach().T.clone()[None]
        dense[f"b{j}"] = lin.bias.detach().clone()[None]
    return ClientParams(q.detach()[None], dense, {"p": p.detach()[None]})


def _ncf_logits(bb: NCFBackbone, params: ClientParams, q_items: Tensor, items: Tensor) -> Tensor:
    """One client's logits for item rows (B, d), differentiable in q_items."""
    net = reference_net(bb, params)
    p = params.private["p"][0]
    return net(torch.cat([p.expand(q_items.shape[0], -1), q_items], dim=1)).squeeze(1)


# ------------------------------------------------------------------ GPFedRec


def _gpfedrec_train(bb: GPFedRecBackbone, start: ClientParams, items: np.ndarray,
                    labels: np.ndarray, cfg: LocalTrainConfig, round_: int,
                    client: int) -> ClientParams:
    """One client (k = 1): Adam on q, p_u and its MLP; BCE + reg * MSE(q, anchor)."""
    q = torch.nn.Parameter(start.items[0].detach().clone())
    p = torch.nn.Parameter(start.private["p"][0].detach().clone())
    net = reference_net(bb, ClientParams(start.items, bb._mlp(start), start.private))
    anchor = start.anchor[0] if (start.anchor is not None and bb.reg > 0) else None
    # Adam, or the published code's SGD with its three rates (and our decay options)
    opt, sched = reference_optimizer({"items": [q], "user": [p],
                                      "head": list(net.parameters())}, cfg, round_)
    items_t, labels_t = torch.from_numpy(items), torch.from_numpy(labels).to(q.dtype)
    for batch in reference_batches(bb.seed, round_, client, items.shape[0], cfg):
        qi = q[items_t[batch]]
        logits = net(torch.cat([p.expand(qi.shape[0], -1), qi], dim=1)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, labels_t[batch])
        if anchor is not None:
            loss = loss + bb.reg * F.mse_loss(q, anchor)
        opt.zero_grad()
        loss.backward()
        if cfg.grad_clip is not None and q.grad.norm() > cfg.grad_clip:
            q.grad.mul_(cfg.grad_clip / q.grad.norm())
        opt.step()
        if sched is not None:
            sched.step()
    private: dict[str, Tensor] = {"p": p.detach()[None].clone()}
    linears = [mod for mod in net if isinstance(mod, torch.nn.Linear)]
    for j, lin in enumerate(linears):
        private[f"w{j}"] = lin.weight.detach().T.clone()[None]
        private[f"b{j}"] = lin.bias.detach().clone()[None]
    return ClientParams(q.detach()[None], {}, private)


def _gpfedrec_logits(bb: GPFedRecBackbone, params: ClientParams, q_items: Tensor,
                     items: Tensor) -> Tensor:
    mlp_params = ClientParams(params.items, bb._mlp(params), params.private)
    return _ncf_logits(bb, mlp_params, q_items, items)


# ------------------------------------------------------------------ PFedRec


def _pfedrec_head(bb: PFedRecBackbone, params: ClientParams) -> torch.nn.Linear:
    head = torch.nn.Linear(bb.dim, 1)
    with torch.no_grad():
        head.weight.copy_(params.private["w"][0][None])
        head.bias.copy_(params.private["b"][0][None])
    return head


def _pfedrec_train(bb: PFedRecBackbone, start: ClientParams, items: np.ndarray,
                   labels: np.ndarray, cfg: LocalTrainConfig, round_: int,
                   client: int) -> ClientParams:
    """One client (k = 1): per batch, an Adam (or SGD) step on the head, then one on the
    table; under SGD each optimiser's ExponentialLR steps after every batch."""
    q = torch.nn.Parameter(start.items[0].detach().clone())
    head = _pfedrec_head(bb, start)
    opt_head, sched_head = reference_optimizer({"head": list(head.parameters())}, cfg,
                                               round_)
    opt_items, sched_items = reference_optimizer({"items": [q]}, cfg, round_)
    items_t, labels_t = torch.from_numpy(items), torch.from_numpy(labels).to(q.dtype)
    for batch in reference_batches(bb.seed, round_, client, items.shape[0], cfg):
        for opt in (opt_head, opt_items):
            logits = head(q[items_t[batch]]).squeeze(1)
            loss = F.binary_cross_entropy_with_logits(logits, labels_t[batch])
            opt_head.zero_grad()
            opt_items.zero_grad()
            loss.backward()
            if (opt is opt_items and cfg.grad_clip is not None
                    and q.grad.norm() > cfg.grad_clip):
                q.grad.mul_(cfg.grad_clip / q.grad.norm())
            opt.step()
        for sched in (sched_head, sched_items):
            if sched is not None:
                sched.step()
    private = {"w": head.weight.detach()[0].clone()[None],
               "b": head.bias.detach().clone()}
    return ClientParams(q.detach()[None], {}, private)


def _pfedrec_logits(bb: PFedRecBackbone, params: ClientParams, q_items: Tensor,
                    items: Tensor) -> Tensor:
    """One client's logits for item rows (B, d), differentiable in q_items."""
    return q_items @ params.private["w"][0] + params.private["b"][0]


# ------------------------------------------------------------------ FedRAP


def _fedrap_train(bb: FedRAPBackbone, start: ClientParams, items: np.ndarray,
                  labels: np.ndarray, cfg: LocalTrainConfig, round_: int,
                  client: int) -> ClientParams:
    """One client (k = 1): torch.optim.Adam on the head, P_u and C (full tables)."""
    c = torch.nn.Parameter(start.items[0].detach().clone())
    p = torch.nn.Parameter(start.private["personal"][0].detach().clone())
    head = torch.nn.Linear(bb.dim, 1)
    with torch.no_grad():
        head.weight.copy_(start.private["w"][0][None])
        head.bias.copy_(start.private["b"][0][None])
    # Adam, or the published code's SGD: per-group rates, per-batch decay
    opt, sched = reference_optimizer({"items": [c, p], "head": list(head.parameters())},
                                     cfg, round_)
    items_t, labels_t = torch.from_numpy(items), torch.from_numpy(labels).to(c.dtype)
    for sel in reference_batches(bb.seed, round_, client, items.shape[0], cfg):
        pi, ci = p[items_t[sel]], c[items_t[sel]]
        logits = head(pi + ci).squeeze(1)
        loss = (F.binary_cross_entropy_with_logits(logits, labels_t[sel])
                - bb.lam * F.mse_loss(pi, ci)
                + bb.mu * F.l1_loss(ci, torch.zeros_like(ci)))
        opt.zero_grad()
        loss.backward()
        if cfg.grad_clip is not None and c.grad.norm() > cfg.grad_clip:
            c.grad.mul_(cfg.grad_clip / c.grad.norm())
        opt.step()
        if sched is not None:
            sched.step()
    private = {"personal": p.detach()[None].clone(), "w": head.weight.detach()[0][None].clone(),
               "b": head.bias.detach().clone()}
    return ClientParams(c.detach()[None].clone(), {}, private)


def _fedrap_logits(bb: FedRAPBackbone, params: ClientParams, c_items: Tensor,
                   items: Tensor) -> Tensor:
    """One client's logits for common rows (B, d) of items ``items``, differentiable."""
    p_items = params.private["personal"][0][items]
    return (p_items + c_items) @ params.private["w"][0] + params.private["b"][0]


_TRAIN: dict[type, TrainFn] = {
    MFBackbone: _mf_train, NCFBackbone: _ncf_train, GPFedRecBackbone: _gpfedrec_train,
    PFedRecBackbone: _pfedrec_train, FedRAPBackbone: _fedrap_train,
}
_LOGITS: dict[type, LogitsFn] = {
    MFBackbone: _mf_logits, NCFBackbone: _ncf_logits, GPFedRecBackbone: _gpfedrec_logits,
    PFedRecBackbone: _pfedrec_logits, FedRAPBackbone: _fedrap_logits,
}
