"""What every backbone shares: its parameter groups, its training samples, its lock-step plan.

A backbone (docs/design.md sections 9-10) is a client-side score model. It declares
three parameter groups, each with the client axis first:

- the **item table** (k, m, d): shared, aggregated by the chosen aggregator,
  and the group a merge (SR/SM/DM/EM) acts on;
- **dense** shared groups (e.g. FedNCF's MLP): uploaded with the table and
  always averaged with FedAvg weights, never merged;
- **private** groups (user vector, score head): never leave the client.

It trains a chunk of clients in lock-step (step s advances every client that
still has a batch at step s), scores all items for evaluation, and gives the
adapter of elastic merging its score function. Each backbone has a
per-client reference (one client at a time, ``torch.optim.Adam``, obvious
code; :mod:`fedem_private.reference.models`) that the vectorised path is
tested against. A backbone never
knows which aggregator, merge, codec or privacy mechanism runs.

Devices: the ``init_*`` methods draw on the CPU (keyed generators) and the
round loop moves their tensors to the run's device; training and scoring run
on the device of the tensors they are given, every tensor they make is made
there, and the per-chunk :class:`Plan` is moved there once.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from fedem_private import rng
from fedem_private.data.negatives import row_positions, sample_excluding, sample_excluding_t
from fedem_private.models.options import PartOptions

SERVER = 1 << 40  # client id that keys the server's own random draws

# logits (a, B) from the active rows (a,), their user-side vectors (a, d'), item rows
# (a, B, d) and the item ids those rows belong to (a, B)
ScoreFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


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
    # docs/design.md 2a (the FedEM code): a client stops after the epoch whose loss (the sum of its
    # batch losses) changed by less than this relative to the previous epoch's; 0: off
    early_stop_tol: float = 0.0
    # "adam" or "sgd" (torch.optim.SGD without momentum; backbones that build it only). Under
    # sgd: the head's and the user embedding's rates (None: lr), L2 weight decay, the rates'
    # factor per step and per round (see :func:`sgd_rates`)
    optimizer: str = "adam"
    lr_head: float | None = None
    lr_user: float | None = None
    weight_decay: float = 0.0
    lr_batch_decay: float = 1.0
    lr_round_decay: float = 1.0


def stops_early(prev: float, cur: float, tol: float) -> bool:
    """Whether an epoch loss ``cur`` after ``prev`` stops local training (docs/design.md 2a):
    |cur - prev| / |prev| < tol (the FedEM code's early stop; tol 0 never stops)."""
    return tol > 0 and abs(cur - prev) < tol * abs(prev)


def sgd_rates(cfg: LocalTrainConfig, round_: int, steps: int) -> dict[str, np.ndarray]:
    """The learning rates of local steps 0 .. steps - 1 in round ``round_`` (1-based), per
    parameter group: "items" (the item-side tables, lr), "head" (a private head or MLP,
    lr_head) and "user" (a user embedding, lr_user); the last two default to lr.

    Step s of round t runs at rate * lr_round_decay^(t - 1) * lr_batch_decay^s: a rate
    that decays per round, and within the round an ExponentialLR stepped after every
    batch (the published FedRAP code's schedule, fresh for each client each round).
    """
    factor = cfg.lr_round_decay ** (round_ - 1) * cfg.lr_batch_decay ** np.arange(steps)
    base = {"items": cfg.lr, "head": cfg.lr if cfg.lr_head is None else cfg.lr_head,
            "user": cfg.lr if cfg.lr_user is None else cfg.lr_user}
    return {group: rate * factor for group, rate in base.items()}


def sgd_step(param: Tensor, grad: Tensor, lr: float, weight_decay: float) -> None:
    """One torch.optim.SGD step without momentum, in place: p -= lr * (g + weight_decay * p)."""
    step = torch.add(grad, param, alpha=weight_decay) if weight_decay else grad
    param.add_(step, alpha=-lr)


class LocalOptimizer:
    """The step of a backbone that trains (k, ...) parameters in lock-step itself: fused
    Adam over the first ``a`` clients (the default), or, under ``cfg.optimizer == "sgd"``,
    :func:`sgd_step` with each parameter's group rate at step s (:func:`sgd_rates`).

    ``groups`` names each parameter's group ("items", "head" or "user"); ``steps`` is
    the chunk's longest client. ``grads`` are the zeroed gradient buffers the backbone
    fills before each :meth:`step`.
    """

    def __init__(self, params: list[Tensor], groups: list[str], cfg: LocalTrainConfig,
                 round_: int, steps: int) -> None:
        self.params, self.cfg = params, cfg
        self.sgd = cfg.optimizer == "sgd"
        if self.sgd:  # no moments
            self.grads = [torch.zeros_like(t) for t in params]
            self.group_rates = sgd_rates(cfg, round_, steps)
            self.rates = [self.group_rates[g] for g in groups]
        else:
            self.grads, self.m1, self.m2 = adam_buffers(params)

    def step(self, a: int, s: int) -> None:
        """Step s (0-based) of the first ``a`` clients."""
        if self.sgd:
            for t, g, rates in zip(self.params, self.grads, self.rates, strict=True):
                sgd_step(t[:a], g[:a], float(rates[s]), self.cfg.weight_decay)
        else:
            fused_adam([t[:a] for t in self.params], [g[:a] for g in self.grads],
                       [t[:a] for t in self.m1], [t[:a] for t in self.m2], s + 1, self.cfg)


@dataclass(frozen=True)
class ClientSamples:
    """One round's training samples for a list of clients (CSR over clients)."""

    indptr: np.ndarray  # (k + 1,)
    items: np.ndarray  # positives then negatives, per client
    labels: np.ndarray  # 1.0 / 0.0
    negatives_indptr: np.ndarray
    negatives: np.ndarray
    # the rng stream of :meth:`order_grid`: SHUFFLE for local training (and the adapter of the
    # ``train`` objective); ADAPTER_SHUFFLE for the withheld fold of the ``holdout`` objective
    stream: int = rng.Stream.SHUFFLE

    def of(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.indptr[j], self.indptr[j + 1]
        return self.items[a:b], self.labels[a:b]

    def order_grid_t(self, seed: int, round_: int, clients: np.ndarray, first_epoch: int,
                     epochs: int, device: torch.device | None = None) -> Tensor:
        """Orders of epochs first_epoch .. first_epoch + epochs - 1 of every row, in one
        call (:func:`fedem_private.rng.epoch_orders_t`), on ``device`` (None: the CPU):
        (k, epochs, max n), row j's first n_j entries a permutation of its samples, then
        padding (n_j .. max n - 1).

        Row j's order of epoch e is :func:`epoch_orders` of client ``clients[j]``, epoch e,
        whatever else is drawn: the adapter of elastic merging takes epochs E .. E + e - 1
        of the stream whose epochs 0 .. E - 1 train (docs/design.md section 16). For a
        run on the CPU the grid is drawn as a CPU draw (rng's rule) and moved there.
        """
        on = None if device is None or torch.device(device).type == "cpu" else device
        grid = rng.epoch_orders_t(seed, self.stream, round_, clients, np.diff(self.indptr),
                                  first_epoch, epochs, device=on)
        return grid if device is None else grid.to(device)

    def order_grid(self, seed: int, round_: int, clients: np.ndarray, first_epoch: int,
                   epochs: int) -> np.ndarray:
        """:meth:`order_grid_t` on the CPU, as numpy."""
        return self.order_grid_t(seed, round_, clients, first_epoch, epochs).numpy()

    def slots(self, order: Tensor, rows: Tensor, epochs: Tensor, batches: Tensor,
              batch_size: int) -> tuple[Tensor, Tensor]:
        """Where batch slots read their samples: slot j is batch ``batches[j]`` of epoch
        ``epochs[j]`` of row ``rows[j]``, positions b B .. b B + B - 1 of that epoch's
        order (an :meth:`order_grid_t` grid; the index tensors beside it). Returns
        (sample index, real) both (slots, B), beside them: only the slots' entries are
        gathered (one flat ``take``), and past a row's samples the index is 0 and the
        entry padding."""
        pos = batches[:, None] * batch_size + rows.new_tensor(np.arange(batch_size))[None, :]
        valid = pos < rows.new_tensor(np.diff(self.indptr))[rows][:, None]
        if not order.numel():
            return torch.zeros_like(pos), valid
        n_epochs, width = order.shape[1], order.shape[2]
        flat = ((rows * n_epochs + epochs) * width)[:, None] + pos.clamp(max=width - 1)
        starts = rows.new_tensor(self.indptr[:-1])[rows][:, None]
        return torch.where(valid, starts + torch.take(order, flat), 0), valid


def draw_samples(seed: int, round_: int, clients: np.ndarray, train_indptr: np.ndarray,
                 train_items: np.ndarray, excl_indptr: np.ndarray, excl_items: np.ndarray,
                 n_items: int, num_negatives: int,
                 device: torch.device | None = None) -> ClientSamples:
    """Positives plus ``num_negatives`` fresh negatives per positive for each client.

    Negative j of client u in round t is a pure function of (seed, t, u, j): the item
    :func:`~fedem_private.data.negatives.sample_excluding` picks with the keyed uniform
    ``rng.uniform(rng.key(seed, NEGATIVES, t, u), j)``. On a GPU ``device`` the uniforms
    and the search are drawn there in one call (:func:`negatives_t`), the same numbers as
    on the CPU; the samples come back as numpy either way.
    """
    clients = np.asarray(clients, dtype=np.int64)
    npos = train_indptr[clients + 1] - train_indptr[clients]
    nneg = npos * num_negatives
    neg_indptr = np.zeros(clients.shape[0] + 1, dtype=np.int64)
    neg_indptr[1:] = np.cumsum(nneg)
    if device is not None and torch.device(device).type != "cpu":
        negs = negatives_t(seed, round_, clients, nneg, excl_indptr, excl_items, n_items,
                           torch.device(device)).cpu().numpy()
    else:
        owner = np.repeat(clients, nneg)
        u = rng.uniform(rng.key(seed, rng.Stream.NEGATIVES, round_, owner),
                        row_positions(neg_indptr))
        negs = sample_excluding(excl_indptr, excl_items, n_items, owner, u)
    # client j's samples: its positives, then its negatives
    indptr = np.zeros(clients.shape[0] + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(npos + nneg)
    items = np.empty(indptr[-1], dtype=np.int64)
    labels = np.zeros(indptr[-1], dtype=np.float32)
    pos_ptr = np.concatenate([[0], np.cumsum(npos)])
    at = row_positions(pos_ptr)
    dest = np.repeat(indptr[:-1], npos) + at
    items[dest] = train_items[np.repeat(train_indptr[clients], npos) + at]
    labels[dest] = 1.0
    items[np.repeat(indptr[:-1] + npos, nneg) + row_positions(neg_indptr)] = negs
    return ClientSamples(indptr, items, labels, neg_indptr, negs)


def negatives_t(seed: int, round_: int, clients: np.ndarray, nneg: np.ndarray,
                excl_indptr: np.ndarray, excl_items: np.ndarray, n_items: int,
                device: torch.device) -> Tensor:
    """Every client's ``nneg`` keyed negatives (:func:`draw_samples`' rule) as tensor
    operations on ``device``, concatenated in client order."""
    counts = torch.as_tensor(nneg, dtype=torch.int64).to(device)
    owner = torch.repeat_interleave(torch.as_tensor(clients, dtype=torch.int64).to(device),
                                    counts)
    starts = torch.cumsum(counts, 0) - counts
    ctr = torch.arange(owner.shape[0], dtype=torch.int64, device=device)
    ctr -= torch.repeat_interleave(starts, counts)
    u = rng.uniform_keyed_t(seed, rng.Stream.NEGATIVES, round_, owner, ctr)
    return sample_excluding_t(excl_indptr, excl_items, n_items, owner, u)


def epoch_orders(seed: int, round_: int, client: int, n: int, epochs: int,
                 stream: int = rng.Stream.SHUFFLE, first_epoch: int = 0) -> np.ndarray:
    """(epochs, n) sample orders of one client, a pure function of (seed, stream, round,
    client, epoch); ``stream`` is SHUFFLE for local training.

    The per-client reference of :func:`fedem_private.rng.epoch_orders_t`, written the
    obvious way: position i of epoch e draws the keyed 64 bits at counter (e << 32) + i,
    and the order is a stable argsort of their top 43 bits.
    """
    k = rng.key(seed, stream, round_, client)
    rows = []
    for e in range(first_epoch, first_epoch + epochs):
        ctr = (np.uint64(e) << np.uint64(rng.EPOCH_SHIFT)) + np.arange(n, dtype=np.uint64)
        top = rng.bits(k, ctr) >> np.uint64(64 - (63 - rng.INDEX_BITS))
        rows.append(np.argsort(top, kind="stable"))
    return np.stack(rows) if rows else np.zeros((0, n), dtype=np.int64)


def num_steps(n_samples: np.ndarray, cfg: LocalTrainConfig) -> np.ndarray:
    """Optimiser steps per client in a round: E * ceil(samples / B)."""
    return cfg.epochs * -(-np.asarray(n_samples) // cfg.batch_size)


@dataclass
class ClientParams:
    """The parameters of k clients, client axis first (see the module docstring)."""

    items: Tensor  # (k, m, d)
    dense: dict[str, Tensor] = field(default_factory=dict)  # shared, averaged, (k, ...)
    private: dict[str, Tensor] = field(default_factory=dict)  # never uploaded, (k, ...)
    # a table the server sent as the target of the backbone's regulariser (GPFedRec's
    # personalised table), (k, m, d); None when the aggregator sends none
    anchor: Tensor | None = None


def linear_init(fan_in: int, fan_out: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """torch.nn.Linear's default init, weight as (fan_in, fan_out) and bias (fan_out,).

    Weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn weight first in
    nn.Linear's (fan_out, fan_in) order, so a reference nn.Linear can copy them.
    """
    bound = 1.0 / math.sqrt(fan_in)
    w = torch.empty((fan_out, fan_in)).uniform_(-bound, bound, generator=gen)
    b = torch.empty(fan_out).uniform_(-bound, bound, generator=gen)
    return w.T.contiguous(), b


def dense_names(layers: int) -> list[str]:
    """Parameter names of an MLP with the given number of linear layers: w0, b0, w1, ..."""
    return [f"{kind}{j}" for j in range(layers) for kind in ("w", "b")]


def mlp_forward(params: dict[str, Tensor], x: Tensor, layers: int) -> Tensor:
    """Batched MLP: x (a, B, fan_in) -> (a, B); ReLU between layers, raw logit out.

    ``params`` holds w{j} (a, fan_in, fan_out) and b{j} (a, fan_out).
    """
    h = x
    for j in range(layers):
        h = torch.baddbmm(params[f"b{j}"].unsqueeze(1), h, params[f"w{j}"])
        if j < layers - 1:
            h = torch.relu(h)
    return h.squeeze(-1)


def clip_rows_l2(grad: Tensor, bound: float) -> None:
    """Scale each client's gradient (a, ...) in place to L2 norm at most ``bound``."""
    a = grad.shape[0]
    norms = grad.reshape(a, -1).double().norm(dim=1)
    scale = torch.clamp(bound / norms.clamp(min=1e-300), max=1.0).to(grad.dtype)
    grad.mul_(scale.reshape((a,) + (1,) * (grad.dim() - 1)))


@dataclass
class Plan:
    """Compact lock-step schedule for one chunk (clients sorted by steps, descending).

    Only the item rows a client touches in a round (its positives and sampled
    negatives) can move: with a fresh Adam state a row that never receives a
    gradient keeps zero moments and a zero update. Each client's touched rows
    are gathered into a compact (k, rows, d) table, trained there and
    scattered back: exact, not an approximation.

    The batches are laid out step-major: step s's batches (one per client
    still training, clients 0 .. a_s - 1) are rows ``offsets[s] ..
    offsets[s] + a_s`` of the 2-D tables, so a step reads contiguous slices.
    Client j's batch at step s is batch s mod NB_j of epoch s // NB_j.
    ``loc`` already includes client j's offset j * rows into the flattened
    compact table, and ``wgt`` is 1 / (valid entries of the batch) on valid
    entries and 0 on padding, so the gradient of each client's mean BCE is
    (sigmoid(logit) - label) * wgt.

    ``ids``, ``valid``, ``loc``, ``lab`` and ``wgt`` live on the chunk's device (built
    there, :func:`make_plan`); ``active``, ``offsets`` and ``steps`` are numpy.
    """

    ids: Tensor  # (k, rows) item id of each compact row, sorted per client (0 on padding)
    valid: Tensor  # (k, rows) bool: a real row
    loc: Tensor  # (sum_s a_s, B) flattened compact row index per batch slot, step-major
    lab: Tensor  # (sum_s a_s, B) labels
    wgt: Tensor  # (sum_s a_s, B) per-entry weight of the batch mean
    active: np.ndarray  # (S,) clients still training at each step
    offsets: np.ndarray  # (S + 1,) first slot of each step
    steps: np.ndarray  # (k,) total steps
    epochs: int

    @property
    def rows(self) -> int:
        """The padded compact table height."""
        return int(self.ids.shape[1])

    @functools.cached_property
    def touched(self) -> list[np.ndarray]:
        """Per client: the sorted unique item ids it trains on (numpy, on the CPU)."""
        ids, valid = self.ids.cpu().numpy(), self.valid.cpu().numpy()
        return [ids[j][valid[j]] for j in range(ids.shape[0])]

    @classmethod
    def of_touched(cls, touched: list[np.ndarray], rows: int, **rest: object) -> Plan:
        """A plan from per-client item lists (tests and probes that build one by hand)."""
        ids = np.zeros((len(touched), rows), dtype=np.int64)
        valid = np.zeros((len(touched), rows), dtype=bool)
        for j, t in enumerate(touched):
            ids[j, : t.shape[0]], valid[j, : t.shape[0]] = t, True
        return cls(torch.from_numpy(ids), torch.from_numpy(valid), **rest)  # type: ignore[arg-type]

    def schedule(self) -> Iterator[tuple[int, int, Tensor, Tensor, Tensor]]:
        """(step s, active a, flat rows (a * B,), labels (a, B), weights (a, B)) per step.

        The clients still training at step s are the chunk's first a.
        """
        for s in range(self.active.shape[0]):
            a, lo, hi = int(self.active[s]), int(self.offsets[s]), int(self.offsets[s + 1])
            yield s, a, self.loc[lo:hi].view(-1), self.lab[lo:hi], self.wgt[lo:hi]


def _touched_rows(items: Tensor, owner: Tensor, k: int, n_items: int
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """(ids (k, rows), valid (k, rows), every sample's compact row) on ``items``' device.

    One (k, n_items) marker table instead of a sort per client: row j marks client j's
    items, its running count ranks them, and the marks in row-major order are each
    client's items sorted.
    """
    dev = items.device
    mark = torch.zeros((k, n_items), dtype=torch.bool, device=dev)
    mark[owner, items] = True
    rank = torch.cumsum(mark, dim=1, dtype=torch.int64) - 1
    counts = mark.sum(dim=1)
    rows = max(int(counts.max()) if k else 1, 1)
    j, col = mark.nonzero(as_tuple=True)
    ids = torch.zeros((k, rows), dtype=torch.int64, device=dev)
    ids[j, rank[j, col]] = col
    valid = torch.arange(rows, device=dev)[None, :] < counts[:, None]
    return ids, valid, rank[owner, items]


def make_plan(seed: int, round_: int, clients: np.ndarray, samples: ClientSamples,
              cfg: LocalTrainConfig, dtype: torch.dtype, n_items: int | None = None,
              device: torch.device | None = None) -> Plan:
    """The :class:`Plan` of a chunk; raises if clients are not sorted by steps, descending.

    With ``n_items`` every client's "touched" rows are the whole catalogue, so
    the compact table is the full table (for losses that move every row). The
    plan is built by tensor operations on ``device`` (None: the CPU): the epoch
    orders are drawn there (:func:`fedem_private.rng.epoch_orders_t`), and only the
    per-step counts (k and S numbers) are numpy. Tested against the per-client
    :func:`fedem_private.reference.plan.reference_plan`.
    """
    dev = torch.device("cpu") if device is None else torch.device(device)
    k, bsz, epochs = clients.shape[0], cfg.batch_size, cfg.epochs
    lengths = np.diff(samples.indptr)
    steps = num_steps(lengths, cfg)
    if np.any(np.diff(steps) > 0):
        raise ValueError("clients must be sorted by number of steps, descending")
    nb = np.maximum(-(-lengths // bsz), 1)
    len_t = torch.from_numpy(lengths).to(dev)
    items = torch.from_numpy(samples.items).to(dev)
    owner = torch.repeat_interleave(torch.arange(k, device=dev), len_t)
    if n_items is None:
        width = int(samples.items.max()) + 1 if samples.items.size else 1
        ids, valid_rows, inv = _touched_rows(items, owner, k, width)
    else:
        ids = torch.arange(n_items, device=dev).expand(k, n_items).contiguous()
        valid_rows = torch.ones((k, n_items), dtype=torch.bool, device=dev)
        inv = items
    rows = int(ids.shape[1])
    order = samples.order_grid_t(seed, round_, clients, 0, epochs, dev)  # one call
    # step-major slots: (step s, client j) for every s < steps_j, ordered by s then j
    total = int(steps.max(initial=0))
    active = (steps[None, :] > np.arange(total)[:, None]).sum(axis=1)
    offsets = np.zeros(total + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(active)
    act = torch.from_numpy(active).to(dev)
    step_of = torch.repeat_interleave(torch.arange(total, device=dev), act)
    client_of = torch.arange(int(offsets[-1]), device=dev) - \
        torch.from_numpy(offsets[:-1]).to(dev).repeat_interleave(act)
    nb_of = torch.from_numpy(nb).to(dev)[client_of]
    # slot (client j, epoch s // NB_j, batch s % NB_j)
    src, valid = samples.slots(order, client_of, step_of // nb_of, step_of % nb_of, bsz)
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    loc = torch.where(valid, inv[src] if inv.numel() else zero, zero) + \
        (client_of * rows)[:, None]
    labels = torch.from_numpy(samples.labels).to(device=dev, dtype=dtype)
    lab = torch.where(valid, labels[src] if labels.numel() else 0, 0).to(dtype)
    msk = valid.to(dtype)
    wgt = msk / msk.sum(dim=1, keepdim=True).clamp(min=1.0)
    return Plan(ids, valid_rows, loc, lab, wgt, active, offsets, steps, epochs)


@dataclass
class Compact:
    """A chunk's touched item rows, gathered: table (k, rows, d) and where they came from.

    All three tensors live on the device of the starting tables.
    """

    table: Tensor
    gather: Tensor  # (k, rows) item ids
    valid: Tensor  # (k, rows) bool

    @classmethod
    def of(cls, q_start: Tensor, plan: Plan) -> Compact:
        k, _, d = q_start.shape
        gather, valid = plan.ids.to(q_start.device), plan.valid.to(q_start.device)
        if plan.rows == q_start.shape[1] and bool(valid.all()):
            # every client touches the whole catalogue (make_plan with n_items): the
            # compact table is the table, rows in order; no gather needed
            return cls(q_start.clone(memory_format=torch.contiguous_format), gather, valid)
        table = torch.gather(q_start, 1, gather[:, :, None].expand(k, plan.rows, d)).contiguous()
        return cls(table, gather, valid)

    def scatter(self, q_start: Tensor, inplace: bool = False) -> tuple[Tensor, Tensor]:
        """(q_start with the trained rows written back, touched (k, m) bool).

        ``inplace`` writes into q_start itself (for a caller that owns it) instead of a copy.
        """
        k, m, d = q_start.shape
        dev = q_start.device
        if self.table.shape == q_start.shape and bool(self.valid.all()):
            # the whole table was trained (see :meth:`of`): it is the result
            return self.table, torch.ones((k, m), dtype=torch.bool, device=dev)
        q_local = q_start if inplace else q_start.clone()
        dest = (self.gather + torch.arange(k, device=dev)[:, None] * m)[self.valid]
        q_local.view(-1, d)[dest] = self.table[self.valid]
        touched = torch.zeros((k, m), dtype=torch.bool, device=dev)
        touched.view(-1)[dest] = True
        return q_local, touched


class ItemRows(ABC):
    """A chunk's trainable item rows during local training (docs/design.md sections 9 and 11).

    A backbone reads the item vectors of a step's batch with :meth:`gather`,
    hands back d loss / d (those vectors) with :meth:`add_grad`, and calls
    :meth:`step` once per step; :meth:`close` gives the trained tables. What
    lies behind the rows is not the backbone's business: the default
    :class:`CompactRows` trains the touched rows of the table itself, and an
    upload codec (FedPEFT's LoRA, hash, RQ-VAE) trains its own parameters and
    derives the item vectors from them. ``flat`` always indexes the chunk's
    compact rows (client j's row r is j * plan.rows + r).
    """

    @abstractmethod
    def gather(self, flat: Tensor) -> Tensor:
        """The item vectors of compact rows ``flat`` (n,) -> (n, d)."""

    @abstractmethod
    def add_grad(self, flat: Tensor, grad_rows: Tensor) -> None:
        """Accumulate d loss / d (item vectors of rows ``flat``), (n, d), for this step."""

    @abstractmethod
    def step(self, a: int, flat: Tensor, s: int, cfg: LocalTrainConfig) -> None:
        """Step s (0-based) for the first ``a`` clients: clip each client's gradient at
        ``cfg.grad_clip`` (L2, when set), one Adam step, clear the gradient."""

    @abstractmethod
    def close(self) -> tuple[Tensor, Tensor]:
        """(each client's trained item table (k, m, d), rows it trained on (k, m) bool)."""

    #: whether the rows have parameters of their own that take a step on each batch before
    #: the item step (the FedEM code's merge on every batch, docs/design.md 2a): a backbone that
    #: trains through ItemRows then, at every step, first gathers the batch, hands d loss /
    #: d (those vectors) to :meth:`pre_step`, and only then gathers again for its own step
    pre_steps: ClassVar[bool] = False

    def pre_step(self, a: int, flat: Tensor, grad_rows: Tensor, s: int) -> None:
        """The rows' own step s for the first ``a`` clients, from d loss / d (the item
        vectors :meth:`gather` gave for ``flat``) (n, d). Only where :attr:`pre_steps`."""
        raise NotImplementedError(f"{type(self).__name__} has no step of its own")

    def save(self, j: int) -> object:
        """A copy of client j's trained state (for the early stop, docs/design.md 2a)."""
        raise NotImplementedError(f"{type(self).__name__} cannot save a client's state")

    def load(self, j: int, saved: object) -> None:
        """Client j's trained state back to what :meth:`save` gave."""
        raise NotImplementedError(f"{type(self).__name__} cannot load a client's state")


class CompactRows(ItemRows):
    """The item table's own touched rows, trained with Adam in a compact table (exact; see
    :class:`Plan`). The default :class:`ItemRows`."""

    def __init__(self, q_start: Tensor, plan: Plan) -> None:
        # every tensor here lives on q_start's device, as do the plan's
        self.q_start, self.plan = q_start, plan
        self.compact = Compact.of(q_start, plan)
        self.table = self.compact.table
        d = self.table.shape[-1]
        self.grad, self.m1, self.m2 = adam_buffers([self.table])
        self.grad, self.m1, self.m2 = self.grad[0], self.m1[0], self.m2[0]
        self.flat_table, self.flat_grad = self.table.view(-1, d), self.grad.view(-1, d)

    def gather(self, flat: Tensor) -> Tensor:
        return self.flat_table.index_select(0, flat)

    def add_grad(self, flat: Tensor, grad_rows: Tensor) -> None:
        self.flat_grad.index_add_(0, flat, grad_rows)

    def step(self, a: int, flat: Tensor, s: int, cfg: LocalTrainConfig) -> None:
        if cfg.grad_clip is not None:
            clip_rows_l2(self.grad[:a], cfg.grad_clip)
        fused_adam([self.table[:a]], [self.grad[:a]], [self.m1[:a]], [self.m2[:a]], s + 1, cfg)
        clear_grad(self.grad, a, flat, self.plan)

    def close(self) -> tuple[Tensor, Tensor]:
        return self.compact.scatter(self.q_start)

    def save(self, j: int) -> object:
        return self.table[j].clone()

    def load(self, j: int, saved: object) -> None:
        assert isinstance(saved, Tensor)
        self.table[j] = saved


def untouched_decay(lr: np.ndarray, steps: np.ndarray, weight_decay: float) -> Tensor:
    """Per client j, prod over its steps s < steps[j] of (1 - lr[s] * weight_decay): what
    weight decay alone does to a row whose gradient stays zero (float64, (k,))."""
    factors = np.concatenate(([1.0], np.cumprod(1.0 - np.asarray(lr) * weight_decay)))
    return torch.from_numpy(factors[np.asarray(steps, dtype=np.int64)])


class SGDRows(CompactRows):
    """The item table's own touched rows trained by plain SGD without momentum
    (:func:`sgd_step` at rate ``rates[s]`` for step s, L2 ``weight_decay``): the optimiser
    of ``--optimizer sgd`` for a backbone that trains through :class:`ItemRows`.

    Exact like :class:`CompactRows`: without weight decay a row with a zero gradient
    does not move under SGD. With weight decay every row of the table moves at every
    step (torch.optim.SGD decays the whole parameter): the rows outside the compact
    table are scaled once at :meth:`close` by :func:`untouched_decay`, and every row
    counts as touched.
    """

    def __init__(self, q_start: Tensor, plan: Plan, rates: np.ndarray,
                 weight_decay: float) -> None:
        super().__init__(q_start, plan)
        self.rates, self.weight_decay = np.asarray(rates, dtype=np.float64), weight_decay

    def step(self, a: int, flat: Tensor, s: int, cfg: LocalTrainConfig) -> None:
        if cfg.grad_clip is not None:
            clip_rows_l2(self.grad[:a], cfg.grad_clip)
        sgd_step(self.table[:a], self.grad[:a], float(self.rates[s]), self.weight_decay)
        clear_grad(self.grad, a, flat, self.plan)

    def close(self) -> tuple[Tensor, Tensor]:
        if self.weight_decay <= 0:
            return self.compact.scatter(self.q_start)
        decay = untouched_decay(self.rates, self.plan.steps, self.weight_decay)
        q_decayed = self.q_start * decay.to(self.q_start)[:, None, None]
        q_local, touched = self.compact.scatter(q_decayed, inplace=True)  # q_decayed is ours
        return q_local, torch.ones_like(touched)


#: builds the :class:`ItemRows` of a chunk from its starting tables (k, m, d) and plan
RowsFactory = Callable[[Tensor, "Plan"], ItemRows]


def clear_grad(grad: Tensor, a: int, flat: Tensor, plan: Plan) -> None:
    """Zero the rows of a compact gradient (k, rows, d') that step ``flat`` wrote.

    Only the first ``a`` clients can hold anything. Zeroing their whole block
    (a memset) is several times faster than an indexed fill of the batch rows
    unless the compact table is much taller than a batch; both give zeros.
    """
    if plan.rows <= 8 * max(flat.numel() // max(a, 1), 1):
        grad[:a].zero_()
    else:
        grad.view(-1, grad.shape[-1]).index_fill_(0, flat, 0.0)


def adam_buffers(params: list[Tensor]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Zeroed (gradients, first moments, second moments) shaped like ``params``."""
    return ([torch.zeros_like(t) for t in params], [torch.zeros_like(t) for t in params],
            [torch.zeros_like(t) for t in params])


def fused_adam(params: list[Tensor], grads: list[Tensor], exp_avg: list[Tensor],
               exp_avg_sq: list[Tensor], step: int, cfg: LocalTrainConfig) -> None:
    """One Adam step (torch.optim.Adam's update) on every tensor, all at step count ``step``.

    The step counts are float32 (the CUDA kernel reads them as float32, whatever
    their dtype; the CPU kernel gives the same result for any dtype), made on the
    parameters' device by a fill, not a copy from the host.
    """
    dev = params[0].device
    steps = [torch.full((), float(step), dtype=torch.float32, device=dev) for _ in params]
    beta1, beta2 = cfg.betas
    torch._fused_adam_(params, grads, exp_avg, exp_avg_sq, [], steps, lr=cfg.lr, beta1=beta1,
                       beta2=beta2, weight_decay=0.0, eps=cfg.eps, amsgrad=False,
                       maximize=False)


class Backbone(ABC):
    """A client-side score model, vectorised over clients (docs/design.md sections 9-10)."""

    name: ClassVar[str]
    #: whether its local training honours ``LocalTrainConfig.early_stop_tol`` (docs/design.md 2a)
    early_stop: ClassVar[bool] = False
    #: whether score(u, i) = <user-side vector, q_i> (+ a per-client constant), which the
    #: projection attack assumes; False for an MLP score.
    dot_product: ClassVar[bool]
    #: whether local training goes through :class:`ItemRows` (``rows=``), so an upload
    #: codec can train its own parameters in place of the item table (docs/design.md section 11)
    trains_item_rows: ClassVar[bool] = False
    #: the local optimisers its train_chunk builds (``LocalTrainConfig.optimizer``)
    optimizers: ClassVar[tuple[str, ...]] = ("adam",)
    #: whether its local training can merge with the adapter on every batch (the FedEM
    #: code's FCF; ``--merge-every-batch``)
    batch_merge: ClassVar[bool] = False
    #: whether it has a user embedding with its own sgd rate (``--lr-user``)
    user_embedding: ClassVar[bool] = False
    #: the round its published code reports (docs/design.md 2a): best validation or best
    #: test HR@10 (``select_round = "auto"`` under the ``paper-code`` protocol)
    own_select_round: ClassVar[str] = "best-test"
    #: its own options (docs/design.md section 15), read from the ``[federation]`` keys
    Options: ClassVar[type[PartOptions]] = PartOptions

    def __init__(self, n_items: int, dim: int, seed: int, init_std: float) -> None:
        self.n_items, self.dim, self.seed, self.init_std = n_items, dim, seed, init_std

    @classmethod
    def from_options(cls, n_items: int, dim: int, seed: int, init_std: float,
                     options: PartOptions) -> Backbone:
        """Build it from its own options (an instance of :attr:`Options`)."""
        return cls(n_items, dim, seed, init_std)

    def init_items(self) -> Tensor:
        """The server's initial item table (m, d): N(0, init_std^2), keyed by the server."""
        g = rng.generator(self.seed, rng.Stream.INIT, 0, SERVER)
        return torch.randn((self.n_items, self.dim), generator=g) * self.init_std

    def init_dense(self) -> dict[str, Tensor]:
        """The server's initial shared non-item groups (no client axis); none by default."""
        return {}

    @abstractmethod
    def init_private(self, clients: np.ndarray) -> dict[str, Tensor]:
        """Each client's private groups (k, ...), client c's keyed by (seed, c) alone."""

    @abstractmethod
    def train_chunk(self, start: ClientParams, clients: np.ndarray, samples: ClientSamples,
                    cfg: LocalTrainConfig, round_: int,
                    rows: RowsFactory | None = None) -> tuple[ClientParams, Tensor]:
        """E local epochs for a chunk sorted by steps (descending); (trained, touched (k, m)).

        ``rows`` (only where :attr:`trains_item_rows`) builds what the item vectors
        are trained through; None means :class:`CompactRows`, the table itself.
        """

    @abstractmethod
    def scores(self, params: ClientParams) -> Tensor:
        """Every item's score (k, m) under each client's own model (for evaluation)."""

    @abstractmethod
    def adapter_score(self, params: ClientParams) -> tuple[Tensor, ScoreFn]:
        """(user-side vectors (k, d'), score function) for training the merge adapter.

        The score function gets chunk rows, their user-side vectors, item rows
        (a, B, d) and their item ids (a, B), and returns logits; everything in it
        is frozen.
        """

    def memory_per_client(self) -> int:
        """Bytes of per-client parameters beyond the item table (for chunk sizing)."""
        return 0

    #: whether its client steps the non-item parameters and the item rows one after the
    #: other on each batch (PFedRec), as the IMIA shadow must replay it
    shadow_alternating: ClassVar[bool] = False
    #: whether the ``imia`` attack's built-in shadow (an MF client, hand-written and
    #: vectorised) is to be used instead of the generic shadow built on
    #: :meth:`shadow_logits`, by measurement (docs/attacks.md): MF, which it replays
    #: exactly, faster and, on ML-100K round 50, stronger; GPFedRec, whose private MLP
    #: the shadow can only draw as at the start, where the MF shadow measured stronger
    #: at round 50
    shadow_builtin: ClassVar[bool] = False

    def shadow_logits(self, params: dict[str, Tensor], q_rows: Tensor) -> Tensor:
        """The logits (c, R) of item rows ``q_rows`` (c, R, d) under each client's non-item
        parameters ``params`` (private and dense groups, client axis first), differentiable
        in both: the score an honest-but-curious server replays to retrain a shadow of the
        client's local training (the ``imia`` attack, handed to it by the experiments
        layer). Backbones without one raise NotImplementedError, and the attack falls back
        on an MF shadow, saying so."""
        raise NotImplementedError(f"backbone {self.name!r} has no shadow score")

    #: the private groups with one row per item (m, d') per client (FedRAP's personal
    #: table): the IMIA shadow carries each candidate's row beside the item row, so
    #: :meth:`shadow_logits` gets rows [q_i | its private rows] (c, R, d + d')
    shadow_row_groups: ClassVar[tuple[str, ...]] = ()

    def shadow_row_loss(self, rows: Tensor) -> Tensor | None:
        """A per-entry term (c, R) of the client's batch loss beside the BCE, for rows
        (c, R, d + d') as :meth:`shadow_logits` gets them, weighted like the BCE in the
        batch mean (FedRAP's regularisers); None: the loss is the BCE alone."""
        del rows
        return None

    #: whether :meth:`example_grads` is built (local DP-SGD, privacy ``ldp-dpsgd``)
    per_example_grads: ClassVar[bool] = False

    def example_grads(self, private: dict[str, Tensor], rows: Tensor, items: Tensor,
                      labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-example gradients of the BCE loss, for local DP-SGD.

        ``rows`` (a, B, d) are the item vectors of examples ``items`` (a, B) with
        ``labels`` (a, B) in {0, 1}; ``private`` holds each client's private groups
        (a, ...). Returns (d loss_b / d row_b (a, B, d), {name: d loss_b / d private
        group (a, B, ...)}): example b's gradient on every trained parameter, the
        row's being its only nonzero part of the table's gradient. Only private
        groups may be trained besides the table (no dense shared groups).
        """
        raise NotImplementedError(f"backbone {self.name!r} has no per-example gradients")
