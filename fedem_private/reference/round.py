"""The slow, obvious round: one client at a time, ``torch.optim.Adam``.

The reference of :meth:`~fedem_private.simulation.loop.Simulation.step`, for
tests and benchmarks only: the vectorised engine must give the same tables
(same seeds) and is timed against this loop. Nothing here is batched or
clever on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedem_private import rng
from fedem_private.client.holdout import withheld
from fedem_private.models.base import ClientParams, ClientSamples, LocalTrainConfig, epoch_orders
from fedem_private.privacy.layer import server_sizes
from fedem_private.reference.models import (
    mf_train_client,
    reference_logits,
    reference_train_client,
)


def train_client(q_start: torch.Tensor, p_start: torch.Tensor, items: np.ndarray,
                 labels: np.ndarray, cfg: LocalTrainConfig, seed: int, round_: int,
                 client: int) -> tuple[torch.Tensor, torch.Tensor]:
    """E epochs of mini-batch Adam on one MF client's full (m, d) item table and p_u."""
    return mf_train_client(q_start, p_start, items, labels, cfg, seed, round_, client)


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
    from fedem_private.models.base import draw_samples

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
                         q_local: torch.Tensor, q_global: torch.Tensor, p_user: torch.Tensor | None,
                         batches: list[tuple[np.ndarray, np.ndarray]],
                         logits_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                         | None = None) -> None:
    """Equation 11 for one client: Adam on the adapter only, everything else frozen.

    ``logits_of`` maps merged item rows (B, d) and their item ids (B,) to the
    backbone's logits; by default the MF score q_i . p_user.
    """
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for items, labels in batches:
        it = torch.from_numpy(items)
        ql, qg = q_local[it], q_global[it]
        if strategy == "em":
            rho = net(torch.cat([qg - ql, ql], dim=1))
        else:
            rho = net(torch.cat([q_global - q_local, q_local], dim=1)).mean()
        merged = ql + rho * (qg - ql)
        logits = merged @ p_user if logits_of is None else logits_of(merged, it)
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()


def holdout_client(items: np.ndarray, labels: np.ndarray, seed: int, round_: int, client: int,
                   folds: int, num_negatives: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One client's round samples split for the ``holdout`` objective of equation 11.

    ``items``/``labels``: n positives then N = num_negatives negatives each,
    negatives i*N .. i*N + N - 1 belonging to positive i. Returns (local-training
    items, labels, adapter items, labels): the adapter gets fold round mod F_u
    (:func:`~fedem_private.client.holdout.withheld`) and those positives'
    negatives; local training the rest, both in their original order.
    """
    n_pos = items.shape[0] // (1 + num_negatives)
    held = withheld(seed, round_, client, n_pos, folds)
    positive_of = np.concatenate([np.arange(n_pos), np.arange(n_pos).repeat(num_negatives)])
    out = held[positive_of]
    return items[~out], labels[~out], items[out], labels[out]


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
    from fedem_private.reference.aggregation import similarity_weights_cvxpy

    n = uploads.shape[0]
    dists = torch.stack([((uploads.double() - uploads[u].double()) ** 2).sum(dim=(1, 2))
                         for u in range(n)])
    w = similarity_weights_cvxpy(p.double(), dists, alpha)
    out = torch.empty_like(uploads)
    for u in range(n):
        acc = torch.zeros_like(uploads[0], dtype=torch.float64)
        for v in range(n):
            acc += w[u, v] * uploads[v].double()
        out[u] = acc.to(out.dtype)
    return out


def _sampled_uploads(sim, n: int, t: int) -> torch.Tensor:
    """(n,) bool: the uploads round ``t`` aggregates under ``agg_clients_ratio`` q (docs/design.md
    2a), all n clients taking part: the ceil(q n) with the smallest keyed draws."""
    q = sim.cfg.federation.agg_clients_ratio
    chosen = torch.ones(n, dtype=torch.bool)
    if q < 1:
        k = max(1, math.ceil(q * n))
        draw = rng.uniform(rng.key(sim.seed, rng.Stream.AGG_SAMPLE, t, np.arange(n)), 0)
        chosen = torch.zeros(n, dtype=torch.bool)
        chosen[torch.from_numpy(np.argsort(draw, kind="stable")[:k])] = True
    return chosen


def _code_similarity(sim, q_local: torch.Tensor, sizes: torch.Tensor, t: int
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Similarity aggregation with the FedEM code's options (docs/design.md 2a), slowly: the
    uploads of a random ``agg_clients_ratio`` share (ceil(q n) smallest keyed draws) and,
    with ``similarity = "pca"``, sklearn's PCA and cvxpy's QP per client. Only the sampled
    clients' tables change. Returns (q_global, {"receiving": (n,) bool})."""
    from fedem_private.reference.aggregation import (
        pca_similarity_weights_reference,
        similarity_weights_cvxpy,
    )
    from fedem_private.server.aggregation import fedavg_weights

    fed, n = sim.cfg.federation, q_local.shape[0]
    chosen = _sampled_uploads(sim, n, t)
    p = fedavg_weights(sizes, chosen)
    if fed.similarity == "pca":
        w = pca_similarity_weights_reference(p, q_local, fed.alpha, chosen)
    else:
        flat = q_local.double().reshape(n, -1)
        w = similarity_weights_cvxpy(p, torch.cdist(flat, flat) ** 2, fed.alpha, chosen)
    q_global = sim.state.q_global.clone()
    for u in range(n):
        if chosen[u] or fed.agg_clients_ratio >= 1:
            q_global[u] = sum(w[u, v] * q_local[v].double() for v in range(n)
                              if chosen[v]).to(q_local.dtype)
    return q_global, {"receiving": chosen}


def simulation_round(sim) -> dict[str, Any]:
    """The next round of a :class:`~fedem_private.simulation.loop.Simulation`, one client at a time.

    Reads the simulation's configuration and state without changing them and
    returns the new ``q_local``, private groups (``p`` when the backbone has
    user vectors), ``dense`` groups, ``q_global``, ``dense_global`` and
    ``server`` (FedMerge: its refitted ``tables`` and ``logits``).
    Supports every backbone, merge and aggregation with full participation
    (``agg_clients_ratio`` below 1 too) and no privacy noise; each client trains through
    its backbone's reference (:func:`~fedem_private.reference.models.reference_train_client`,
    torch.optim, obvious code). Used by tests and by the speed benchmark as the slow
    counterpart of ``sim.step()``.
    """
    from fedem_private.models.base import draw_samples
    from fedem_private.server.aggregation import fedavg_weights

    st, split, cfg, bb = sim.state, sim.split, sim.local_cfg, sim.backbone
    t = st.round + 1
    n = split.n_users
    strategy, agg = sim.merge_cfg.strategy, sim.aggregation
    new_params: list[ClientParams] = []
    rhos: list[float] = []
    # the clients the last round's aggregation sent a table (agg_clients_ratio)
    receiving = getattr(sim.aggregator, "receiving", None)
    chosen = _sampled_uploads(sim, n, t)  # the uploads this round aggregates
    for u in range(n):
        s = draw_samples(sim.seed, t, np.array([u]), split.train_indptr, split.train_items,
                         *sim.excl, split.n_items, cfg.num_negatives)
        items, labels = s.of(0)
        own = st.params(torch.tensor([u]))
        if agg == "none":
            sent, dense_sent = st.q_local[u], own.dense
        else:
            sent = st.q_global if st.q_global.dim() == 2 else st.q_global[u]
            dense_sent = ({k: v[None] for k, v in sim.dense.params.items()}
                          if sim.dense is not None else {})
        anchor = sim.aggregator.anchor(torch.tensor([u])) if agg != "none" else None
        receives = receiving is None or bool(receiving[u])
        if not receives:  # agg_clients_ratio (docs/design.md 2a): no table, its own model, no merge
            sent, dense_sent = st.q_local[u], own.dense
        start = ClientParams(sent[None].clone(), dense_sent, own.private, anchor)
        if strategy != "sr" and t > 1 and receives:
            net = None
            if strategy in ("dm", "em"):
                ms = sim.merger.take(torch.tensor([u]))
                net = adapter_net([w[0] for w in ms.weights], [b[0] for b in ms.biases])
                extra = sim.merge_cfg.adapter_epochs
                if sim.merge_cfg.adapter_objective == "holdout":
                    items, labels, fit_items, fit_labels = holdout_client(
                        items, labels, sim.seed, t, u, sim.merge_cfg.adapter_folds,
                        cfg.num_negatives)
                    orders = epoch_orders(sim.seed, t, u, fit_items.shape[0], extra,
                                          rng.Stream.ADAPTER_SHUFFLE)
                else:
                    fit_items, fit_labels = items, labels
                    orders = epoch_orders(sim.seed, t, u, items.shape[0],
                                          cfg.epochs + extra)[cfg.epochs:]
                batches = [(fit_items[o[i: i + cfg.batch_size]],
                            fit_labels[o[i: i + cfg.batch_size]])
                           for o in orders for i in range(0, fit_items.shape[0], cfg.batch_size)]
                def logits_of(q, i, start=start):
                    return reference_logits(bb, start, q, i)

                train_adapter_client(net, strategy, sim.merge_cfg.adapter_lr, st.q_local[u],
                                     sent, None, batches, logits_of=logits_of)
            merged, rho = merge_client(net, strategy, sim.merge_cfg.rho, st.q_local[u], sent)
            if getattr(sim, "merge_seen", False):  # issue 69: rho' = 1 off the client's items
                own = split.train_items[split.train_indptr[u]: split.train_indptr[u + 1]]
                merged = torch.stack([merged[i] if i in set(own.tolist()) else sent[i]
                                      for i in range(merged.shape[0])])
            start.items = merged[None]
            rhos.append(rho)
        if getattr(sim, "prox_mu", 0.0) > 0:  # issue 69: + (mu / 2) ||Q_l - Q_g||^2 (MF)
            from fedem_private.reference.variants import prox_mf_train_client

            q, pu = prox_mf_train_client(start.items[0], start.private["p"][0], sent,
                                         sim.prox_mu, items, labels, cfg, sim.seed, t, u)
            new_params.append(ClientParams(q[None], {}, {"p": pu[None]}))
        else:
            new_params.append(reference_train_client(bb, start, items, labels, cfg, t, u))
    q_local = torch.cat([p.items for p in new_params])
    private = {k: torch.cat([p.private[k] for p in new_params]) for k in new_params[0].private}
    dense = {k: torch.cat([p.dense[k] for p in new_params]) for k in new_params[0].dense}
    # the sizes the server may use (docs/design.md §5): uniform under a mechanism unless public
    sizes = torch.from_numpy(server_sizes(split.train_counts, sim.cfg.privacy))
    server: dict[str, torch.Tensor] = {}  # an aggregator's own state where it keeps one
    if agg == "none":
        q_global = None
    elif agg == "similarity":
        fed = sim.cfg.federation
        if fed.agg_clients_ratio < 1 or fed.similarity != "eq13":
            q_global, server = _code_similarity(sim, q_local, sizes, t)
        else:
            q_global = similarity_tables(q_local, fedavg_weights(sizes), fed.alpha)
    elif agg == "graph":
        from fedem_private.reference.graph import graph_reference

        fed = sim.cfg.federation
        personal, q_global = graph_reference(q_local[chosen], threshold=fed.graph_threshold,
                                             topk=fed.graph_topk, layers=fed.graph_layers)
        q_global = q_global.to(q_local.dtype)
        anchors = sim.aggregator.personal.cpu().clone()
        anchors[chosen] = personal.to(anchors.dtype)
        server = {"personal": anchors, "receiving": chosen}
    elif agg == "fedmerge":
        from fedem_private.reference.fedmerge import fit_reference

        ag = sim.aggregator
        fitted = fit_reference(q_local, ag.tables, ag.logits, ag.fit_cfg)
        merged = []
        for u in range(n):
            w_u = torch.softmax(fitted.logits[u], dim=0)
            merged.append(sum(w_u[k] * fitted.tables[k] for k in range(w_u.shape[0])))
        q_global = torch.stack(merged).to(q_local.dtype)
        server = {"tables": fitted.tables, "logits": fitted.logits}
    else:
        c = chosen.double()
        w = sizes * c / (sizes * c).sum() if agg == "fedavg" else c / c.sum()
        q_global = sum(w[u] * q_local[u].double() for u in range(n)
                       if chosen[u]).to(q_local.dtype)
        server = {"receiving": chosen}
    dense_global = None
    if dense and agg != "none":  # FedAvg over the round's share (all under ratio 1)
        c = chosen.double()
        fw = sizes * c / (sizes * c).sum()
        dense_global = {k: sum(fw[u] * v[u].double() for u in range(n) if chosen[u]
                               ).to(v.dtype)
                        for k, v in dense.items()}
    rho_mean = sum(rhos) / len(rhos) if rhos and strategy != "sr" else None
    return {"q_local": q_local, "p": private.get("p"), "private": private, "dense": dense,
            "q_global": q_global, "dense_global": dense_global, "rho_mean": rho_mean,
            "server": server}
