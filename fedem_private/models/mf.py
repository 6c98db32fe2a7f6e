"""Matrix-factorisation clients trained in lock-step over a chunk of clients.

Each client u scores item i as sigmoid(p_u . q_i) (FedEM paper, equation 2)
and minimises the mean binary cross-entropy over batches of its positives and
sampled negatives with Adam (equation 12), for E local epochs. All clients of
a chunk train together as batched tensors: step s advances every client that
still has a batch at step s, so ragged batch counts cost nothing extra.

Only the item rows a client touches in a round (its positives and sampled
negatives) can move: with a fresh Adam state, a row that never receives a
gradient keeps zero moments and a zero update. Each client's touched rows are
therefore gathered into a compact table, trained there with a fused Adam, and
scattered back. This is exact, not an approximation: the per-client reference
loop (:mod:`fedem_private.reference`) runs ``torch.optim.Adam`` on the full
table and the tests check both give the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import rng
from ..data.negatives import sample_excluding


@dataclass(frozen=True)
class LocalTrainConfig:
    """Hyper-parameters of local training (paper: E = 10, B = 256, lr 0.1, 4 negatives)."""

    epochs: int = 10
    batch_size: int = 256
    lr: float = 0.1
    num_negatives: int = 4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = None  # L2 clip of each step's item-table gradient (paper mode)


@dataclass(frozen=True)
class ClientSamples:
    """One round's training samples for a list of clients (CSR over clients)."""

    indptr: np.ndarray  # (k + 1,)
    items: np.ndarray  # positives then negatives, per client
    labels: np.ndarray  # 1.0 / 0.0
    negatives_indptr: np.ndarray
    negatives: np.ndarray

    def of(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.indptr[j], self.indptr[j + 1]
        return self.items[a:b], self.labels[a:b]


def draw_samples(seed: int, round_: int, clients: np.ndarray, train_indptr: np.ndarray,
                 train_items: np.ndarray, excl_indptr: np.ndarray, excl_items: np.ndarray,
                 n_items: int, num_negatives: int) -> ClientSamples:
    """Positives plus ``num_negatives`` fresh negatives per positive for each client.

    Negative j of client u in round t is a pure function of (seed, t, u, j).
    """
    clients = np.asarray(clients, dtype=np.int64)
    npos = train_indptr[clients + 1] - train_indptr[clients]
    nneg = npos * num_negatives
    owner = np.repeat(clients, nneg)
    starts = np.repeat(np.cumsum(nneg) - nneg, nneg)
    counter = np.arange(owner.shape[0]) - starts
    u = rng.uniform(rng.key(seed, rng.Stream.NEGATIVES, round_, owner), counter)
    negs = sample_excluding(excl_indptr, excl_items, n_items, owner, u)
    neg_indptr = np.zeros(clients.shape[0] + 1, dtype=np.int64)
    neg_indptr[1:] = np.cumsum(nneg)
    items, labels = [], []
    for j, c in enumerate(clients.tolist()):
        pos = train_items[train_indptr[c]: train_indptr[c + 1]]
        neg = negs[neg_indptr[j]: neg_indptr[j + 1]]
        items.append(np.concatenate([pos, neg]))
        labels.append(np.concatenate([np.ones(pos.shape[0]), np.zeros(neg.shape[0])]))
    indptr = np.zeros(clients.shape[0] + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(npos + nneg)
    return ClientSamples(indptr, np.concatenate(items).astype(np.int64),
                         np.concatenate(labels).astype(np.float32), neg_indptr, negs)


def epoch_orders(seed: int, round_: int, client: int, n: int, epochs: int) -> np.ndarray:
    """(epochs, n) sample orders of one client, a pure function of (seed, round, client)."""
    g = rng.generator(seed, rng.Stream.SHUFFLE, round_, client)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(epochs)]).numpy()


def num_steps(n_samples: np.ndarray, cfg: LocalTrainConfig) -> np.ndarray:
    """Optimiser steps per client in a round: E * ceil(samples / B)."""
    return cfg.epochs * -(-np.asarray(n_samples) // cfg.batch_size)


@dataclass
class _Plan:
    """Compact lock-step schedule for one chunk (clients sorted by steps, descending).

    Batch slot (client j, epoch e, batch b) is row (j * E + e) * NB + b of
    the 2-D tables; ``loc`` already includes client j's offset j * rows into
    the flattened compact table, and ``wgt`` is 1 / (valid entries of the
    batch) on valid entries and 0 on padding, so the mean BCE gradient is
    (sigmoid(logit) - label) * wgt.
    """

    touched: list[np.ndarray]  # per client: sorted unique item ids it trains on
    rows: int  # padded compact table height
    loc: torch.Tensor  # (k * E * NB, B) flattened compact row index per batch slot
    lab: torch.Tensor  # (k * E * NB, B) labels
    wgt: torch.Tensor  # (k * E * NB, B) per-entry weight of the batch mean
    nb: torch.Tensor  # (k,) batches per epoch
    nb_max: int
    steps: np.ndarray  # (k,) total steps


def _plan(seed: int, round_: int, clients: np.ndarray, samples: ClientSamples,
          cfg: LocalTrainConfig, dtype: torch.dtype) -> _Plan:
    k, bsz, epochs = clients.shape[0], cfg.batch_size, cfg.epochs
    lengths = np.diff(samples.indptr)
    nb = -(-lengths // bsz)
    nb_max = int(max(nb.max(), 1))
    touched = []
    real = np.float32 if dtype == torch.float32 else np.float64
    loc = np.zeros((k, epochs, nb_max * bsz), dtype=np.int64)
    lab = np.zeros((k, epochs, nb_max * bsz), dtype=real)
    msk = np.zeros((k, epochs, nb_max * bsz), dtype=real)
    for j, c in enumerate(clients.tolist()):
        items, labels = samples.of(j)
        uniq, inv = np.unique(items, return_inverse=True)
        touched.append(uniq)
        n = items.shape[0]
        if n == 0:
            continue
        order = epoch_orders(seed, round_, c, n, epochs)
        loc[j, :, :n] = inv[order]
        lab[j, :, :n] = labels[order]
        msk[j, :, :n] = 1.0
    rows = max((t.shape[0] for t in touched), default=1) or 1
    loc += (np.arange(k) * rows)[:, None, None]
    shape = (k * epochs * nb_max, bsz)
    msk = msk.reshape(shape)
    wgt = msk / np.maximum(msk.sum(axis=1, keepdims=True), real(1.0))
    return _Plan(touched, rows, torch.from_numpy(loc.reshape(shape)),
                 torch.from_numpy(lab.reshape(shape)).to(dtype), torch.from_numpy(wgt).to(dtype),
                 torch.from_numpy(nb), nb_max, epochs * nb)


def train_chunk(q_start: torch.Tensor, p: torch.Tensor, clients: np.ndarray,
                samples: ClientSamples, cfg: LocalTrainConfig, seed: int,
                round_: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train a chunk of clients; return (q_local (k,m,d), p_new (k,d), touched (k,m) bool).

    ``clients`` must be sorted by number of steps, descending (see
    :func:`num_steps`), so the clients still training at any step are a
    prefix of the chunk. ``q_start`` is each client's starting item table (the
    server's table under static replacement, the merged table under FedEM).
    """
    k, m, d = q_start.shape
    if k == 0:
        return q_start.clone(), p.clone(), torch.zeros((0, m), dtype=torch.bool)
    steps = num_steps(np.diff(samples.indptr), cfg)
    if np.any(np.diff(steps) > 0):
        raise ValueError("clients must be sorted by number of steps, descending")
    plan = _plan(seed, round_, clients, samples, cfg, q_start.dtype)
    rows = plan.rows
    # gather each client's touched rows into a compact (k, rows, d) table
    gather = torch.zeros((k, rows), dtype=torch.long)
    valid = torch.zeros((k, rows), dtype=torch.bool)
    for j, t in enumerate(plan.touched):
        gather[j, : t.shape[0]] = torch.from_numpy(t)
        valid[j, : t.shape[0]] = True
    qc = torch.gather(q_start, 1, gather[:, :, None].expand(k, rows, d)).contiguous()
    pc = p.clone().contiguous()
    gq, mq, vq = torch.zeros_like(qc), torch.zeros_like(qc), torch.zeros_like(qc)
    gp, mp, vp = torch.zeros_like(pc), torch.zeros_like(pc), torch.zeros_like(pc)
    beta1, beta2 = cfg.betas
    total = int(plan.steps[0])
    nb, slots = plan.nb, torch.arange(k) * (cfg.epochs * plan.nb_max)
    qflat, gflat = qc.view(-1, d), gq.view(-1, d)
    for s in range(total):
        a = int(np.searchsorted(-plan.steps, -s, side="left"))  # clients with steps > s
        epoch = torch.div(s, nb[:a], rounding_mode="floor")
        slot = slots[:a] + epoch * plan.nb_max + (s - epoch * nb[:a])
        flat = plan.loc.index_select(0, slot).reshape(-1)  # (a * B,) rows of qflat
        y = plan.lab.index_select(0, slot)
        w = plan.wgt.index_select(0, slot)
        q_rows = qflat.index_select(0, flat).view(a, -1, d)
        pa = pc[:a]
        logits = torch.bmm(q_rows, pa[:, :, None]).squeeze(2)
        dlogit = (torch.sigmoid(logits) - y) * w  # d(mean BCE over the batch)/d logit
        gflat.index_add_(0, flat, (dlogit[:, :, None] * pa[:, None, :]).reshape(-1, d))
        gp[:a] = torch.bmm(dlogit[:, None, :], q_rows).squeeze(1)
        if cfg.grad_clip is not None:
            norms = gq[:a].reshape(a, -1).double().norm(dim=1)
            scale = torch.clamp(cfg.grad_clip / norms.clamp(min=1e-300), max=1.0).to(gq.dtype)
            gq[:a] *= scale[:, None, None]
        step = torch.tensor(float(s + 1))
        torch._fused_adam_([qc[:a], pc[:a]], [gq[:a], gp[:a]], [mq[:a], mp[:a]],
                           [vq[:a], vp[:a]], [], [step, step.clone()], lr=cfg.lr,
                           beta1=beta1, beta2=beta2, weight_decay=0.0, eps=cfg.eps,
                           amsgrad=False, maximize=False)
        gflat.index_fill_(0, flat, 0.0)
    q_local = q_start.clone()
    dest = (gather + torch.arange(k)[:, None] * m)[valid]
    q_local.view(-1, d)[dest] = qc[valid]
    touched = torch.zeros((k, m), dtype=torch.bool)
    touched.view(-1)[dest] = True
    return q_local, pc, touched
