"""The slow, obvious reference: one client at a time, ``torch.optim.Adam``.

Kept for tests and benchmarks only: the vectorised engine must give the same
tables (same seeds) and is timed against this loop. Nothing here is batched
or clever on purpose.
"""

from __future__ import annotations

from typing import Any

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


def adapter_net(weights: list[torch.Tensor], biases: list[torch.Tensor]) -> torch.nn.Sequential:
    """One client's adapter (equation 9) as a plain nn.Sequential with the given parameters."""
    modules: list[torch.nn.Module] = []
    for j, (w, b) in enumerate(zip(weights, biases, strict=True)):
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(w.T)
            lin.bias.copy_(b)
        modules += [lin, torch.nn.Sigmoid() if j == len(weights) - 1 else torch.nn.ReLU()]
    return torch.nn.Sequential(*modules)


def train_adapter_client(net: torch.nn.Sequential, strategy: str, lr: float,
                         q_local: torch.Tensor, q_global: torch.Tensor, p_user: torch.Tensor,
                         batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Equation 11 for one client: Adam on the adapter only, everything else frozen."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for items, labels in batches:
        it = torch.from_numpy(items)
        ql, qg = q_local[it], q_global[it]
        if strategy == "em":
            rho = net(torch.cat([qg - ql, ql], dim=1))
        else:
            rho = net(torch.cat([q_global - q_local, q_local], dim=1)).mean()
        logits = (ql + rho * (qg - ql)) @ p_user
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()


def merge_client(net: torch.nn.Sequential | None, strategy: str, rho_fixed: float,
                 q_local: torch.Tensor, q_global: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Equation 10 for one client: Q_l + rho (Q_g - Q_l), and the mean of rho."""
    if strategy == "sr":
        return q_global.clone(), 1.0
    if strategy == "sm":
        return q_local + rho_fixed * (q_global - q_local), float(rho_fixed)
    with torch.no_grad():
        rho = net(torch.cat([q_global - q_local, q_local], dim=1))
        if strategy == "dm":
            rho = rho.mean()
    return q_local + rho * (q_global - q_local), float(rho.double().mean())


def similarity_tables(uploads: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    """Equation 13 per client with cvxpy, then Q_g[u] = sum_v w_uv Q_v, one client at a time."""
    from .aggregation import similarity_weights_cvxpy

    n = uploads.shape[0]
    dists = torch.stack([((uploads.double() - uploads[u].double()) ** 2).sum(dim=(1, 2))
                         for u in range(n)])
    w = similarity_weights_cvxpy(p.double(), dists, alpha)
    out = torch.empty_like(uploads)
    for u in range(n):
        acc = torch.zeros_like(uploads[0], dtype=torch.float64)
        for v in range(n):
            acc += w[u, v] * uploads[v].double()
        out[u] = acc.float()
    return out


def simulation_round(sim) -> dict[str, Any]:
    """The next round of a :class:`~fedem_private.simulation.Simulation`, one client at a time.

    Reads the simulation's configuration and state without changing them and
    returns the new ``q_local``, ``p`` and ``q_global``. Supports every
    method with full participation and no privacy noise; used by tests and by
    the speed benchmark as the slow, obvious counterpart of ``sim.step()``.
    """
    from .aggregation import fedavg_weights
    from .models.mf import draw_samples

    st, split, cfg = sim.state, sim.split, sim.local_cfg
    t = st.round + 1
    n = split.n_users
    strategy, agg = sim.merge_cfg.strategy, sim.aggregation
    q_local, p = st.q_local.clone(), st.p.clone()
    rhos: list[float] = []
    for u in range(n):
        s = draw_samples(sim.seed, t, np.array([u]), split.train_indptr, split.train_items,
                         *sim.excl, split.n_items, cfg.num_negatives)
        items, labels = s.of(0)
        if agg == "none":
            sent = st.q_local[u]
        elif st.q_global.dim() == 2:
            sent = st.q_global
        else:
            sent = st.q_global[u]
        start = sent
        if strategy != "sr" and not (t == 1 and agg != "none"):
            net = None
            if strategy in ("dm", "em"):
                ms = st.merge_state
                net = adapter_net([w[u] for w in ms.weights], [b[u] for b in ms.biases])
                extra = sim.merge_cfg.adapter_epochs
                orders = epoch_orders(sim.seed, t, u, items.shape[0], cfg.epochs + extra)
                batches = [(items[o[i: i + cfg.batch_size]], labels[o[i: i + cfg.batch_size]])
                           for o in orders[cfg.epochs:]
                           for i in range(0, items.shape[0], cfg.batch_size)]
                train_adapter_client(net, strategy, sim.merge_cfg.adapter_lr, st.q_local[u],
                                     sent, st.p[u], batches)
            start, rho = merge_client(net, strategy, sim.merge_cfg.rho, st.q_local[u], sent)
            rhos.append(rho)
        q_local[u], p[u] = train_client(start, st.p[u], items, labels, cfg, sim.seed, t, u)
    sizes = torch.from_numpy(split.train_counts.astype(np.float64))
    if agg == "none":
        q_global = None
    elif agg == "similarity":
        q_global = similarity_tables(q_local, fedavg_weights(sizes), sim.cfg.federation.alpha)
    else:
        w = sizes / sizes.sum() if agg == "fedavg" else torch.full((n,), 1.0 / n,
                                                                     dtype=torch.float64)
        q_global = sum(w[u] * q_local[u].double() for u in range(n)).float()
    rho_mean = sum(rhos) / len(rhos) if rhos and strategy != "sr" else None
    return {"q_local": q_local, "p": p, "q_global": q_global, "rho_mean": rho_mean}
