"""Client-side elastic merging (FedEM, section 4 of docs/design.md; paper equations 9-11).

A client starts each round from Q_m = Q_l + rho (.) (Q_g - Q_l) (equation 10)
instead of the downloaded Q_g. Strategies (the paper's Table 2 ablation):

- ``sr``: rho = 1, static replacement (FedMF / FedSim);
- ``sm``: one fixed scalar rho for all clients, from the configuration;
- ``dm``: one learned scalar per client, the adapter's outputs averaged over items;
- ``em``: one learned rho per item per client.

The adapter (equation 9) is a private per-client MLP applied to each item row
of Q_cat = [Q_g - Q_l, Q_l]: ReLU between layers, sigmoid output. All clients'
adapters live in batched tensors, weights (k, fan_in, fan_out) and biases
(k, fan_out), evaluated with batched matmul. It is trained with p_u, Q_l and
Q_g frozen (equation 11) by Adam with per-client step counts, on the
round's training samples (``adapter_objective`` ``train``, as published) or
on a fold of them withheld from local training (``holdout``,
:mod:`fedem_private.client.holdout`).

Merging is a plug-in: it only needs each client's local and global item
tables, so any backbone that uploads an item table can use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedem_private import rng
from fedem_private.client import adapter as _adapter
from fedem_private.client.adapter import (  # noqa: F401  (re-exported: the merge's tensors)
    MergeState,
    adapter_forward,
    adapter_input,
    adapter_shapes,
    mean_rho,
    merge_tables,
    put_clients,
    require_state,
    take_clients,
    took_all,
)
from fedem_private.client.holdout import OBJECTIVES, split_samples, withheld_counts
from fedem_private.client.merges import AdapterOptions, StaticOptions
from fedem_private.client.strategies import REGISTRY, merge_class, strategies_where
from fedem_private.errors import UserError
from fedem_private.models.base import (
    ClientSamples,
    Compact,
    CompactRows,
    LocalTrainConfig,
    Plan,
    adam_buffers,
    fused_adam,
)
from fedem_private.optim import AdamConfig, MaskedAdam

if TYPE_CHECKING:
    from fedem_private.client.merges import AdapterMerge, Merge

# logits (a, B) from the active rows (a,), their user vectors (a, d), item rows (a, B, d)
# and item ids (a, B)
ScoreFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
# (weights, biases, q_local, q_global) of a chunk -> trained (weights, biases)
AdapterTrainer = Callable[[tuple[Tensor, ...], tuple[Tensor, ...], Tensor, Tensor],
                          tuple[tuple[Tensor, ...], tuple[Tensor, ...]]]


@dataclass(frozen=True)
class MergeConfig:
    """How a client merges its local table with the global one (docs/design.md section 4)."""

    strategy: str = "em"
    rho: float = 0.5
    adapter_layers: tuple[int, ...] = (32, 16, 8, 1)
    adapter_lr: float = 0.1
    adapter_epochs: int = 1
    # what equation 11 trains on: "train" (the round's training samples, as published) or
    # "holdout" (a rotating fold withheld from local training; fedem_private.client.holdout)
    adapter_objective: str = "train"
    adapter_folds: int = 5  # holdout: F folds of each client's positives
    # docs/design.md 2a, the FedEM code: merge on every local batch (adapter step, then item step,
    # both through the merge) instead of once before local training, and evaluate the merged
    # table (:class:`BatchMergeRows`); em only
    every_batch: bool = False
    # the merge itself (docs/design.md section 15), built from these options
    rule: Merge = field(init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: Any) -> MergeConfig:
        """The merge a run's ``[federation]`` section (``config``) chose, built from the
        merges' own options (:class:`~fedem_private.client.merges.StaticOptions`,
        :class:`~fedem_private.client.merges.AdapterOptions`) and ``merge_every_batch``."""
        static, adapter = StaticOptions.from_config(config), AdapterOptions.from_config(config)
        return cls(strategy=config.resolved_merge, rho=static.rho, adapter_lr=adapter.lr,
                   adapter_epochs=adapter.epochs, adapter_objective=adapter.objective,
                   adapter_folds=adapter.folds, every_batch=config.merge_every_batch)

    def __post_init__(self) -> None:
        if self.strategy not in REGISTRY:
            raise UserError(f"merge strategy must be one of {', '.join(REGISTRY)}; "
                            f"got {self.strategy!r}")
        object.__setattr__(self, "rule", merge_class(self.strategy)(self))
        if not (isinstance(self.rho, int | float) and 0.0 <= self.rho <= 1.0):
            raise UserError(f"merge rho must lie in [0, 1], got {self.rho}")
        layers = tuple(self.adapter_layers)
        object.__setattr__(self, "adapter_layers", layers)  # lists from TOML become tuples
        if not layers or any(int(w) != w or w < 1 for w in layers) or layers[-1] != 1:
            raise UserError("adapter_layers must be positive integers ending in 1, "
                            f"got {list(self.adapter_layers)}")
        if not (math.isfinite(self.adapter_lr) and self.adapter_lr > 0.0):
            raise UserError(f"adapter_lr must be a positive number, got {self.adapter_lr}")
        if int(self.adapter_epochs) != self.adapter_epochs or self.adapter_epochs < 0:
            raise UserError(f"adapter_epochs must be a non-negative integer, "
                            f"got {self.adapter_epochs}")
        if self.adapter_objective not in OBJECTIVES:
            raise UserError(f"adapter_objective must be one of {', '.join(OBJECTIVES)}; "
                            f"got {self.adapter_objective!r}")
        if int(self.adapter_folds) != self.adapter_folds or self.adapter_folds < 2:
            raise UserError(f"adapter_folds must be an integer >= 2, got {self.adapter_folds}")
        if self.adapter_objective == "holdout" and not self.rule.learned:
            raise UserError(f"adapter_objective 'holdout' trains the merge adapter, but merge "
                            f"{self.strategy!r} has none; use "
                            f"{' or '.join(reversed(strategies_where('learned')))}")
        if self.every_batch and not self.rule.batch_merge:
            raise UserError(f"merging on every batch (the FedEM code) is built for merge "
                            f"{', '.join(strategies_where('batch_merge'))}; "
                            f"got {self.strategy!r}")
        if self.every_batch and self.adapter_objective != "train":
            raise UserError("merging on every batch trains the adapter on the training "
                            "batches themselves; it cannot use adapter_objective 'holdout'")


@dataclass(frozen=True)
class StepBatch:
    """One lock-step training step over the clients that have a batch in it.

    rows: (a,) int64 indices into the chunk's client axis (no repeats);
    items: (a, B) int64 item ids, padded; labels: (a, B) float, 1 positive,
    0 negative; mask: (a, B) bool, True on valid entries.
    """

    rows: Tensor
    items: Tensor
    labels: Tensor
    mask: Tensor


# ---------------------------------------------------------------- adapter (eq. 9)


def _init_one_client(shapes: list[tuple[int, int]], gen: torch.Generator,
                     dtype: torch.dtype) -> tuple[list[Tensor], list[Tensor]]:
    """torch.nn.Linear's default init: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

    Draw order per layer is weight (fan_out, fan_in) then bias, as nn.Linear does.
    """
    weights, biases = [], []
    for fan_in, fan_out in shapes:
        bound = 1.0 / math.sqrt(fan_in)
        w = torch.empty((fan_out, fan_in), dtype=dtype).uniform_(-bound, bound, generator=gen)
        b = torch.empty(fan_out, dtype=dtype).uniform_(-bound, bound, generator=gen)
        weights.append(w.T)
        biases.append(b)
    return weights, biases


def init_merge_state(cfg: MergeConfig, clients: np.ndarray, dim: int, seed: int,
                     dtype: torch.dtype = torch.float32) -> MergeState | None:
    """Fresh adapters for the given client ids (None for sr and sm, which learn nothing).

    Client c's adapter comes from rng.generator(seed, ADAPTER_INIT, 0, c) alone,
    so it does not depend on which other clients are initialised with it.
    """
    if not cfg.rule.learned:
        return None
    shapes = adapter_shapes(dim, cfg.adapter_layers)
    per_client = [
        _init_one_client(shapes, rng.generator(seed, rng.Stream.ADAPTER_INIT, 0, int(c)), dtype)
        for c in np.asarray(clients).tolist()
    ]
    weights = tuple(torch.stack([pc[0][j] for pc in per_client]) for j in range(len(shapes)))
    biases = tuple(torch.stack([pc[1][j] for pc in per_client]) for j in range(len(shapes)))
    return MergeState(weights, biases)


# ---------------------------------------------------------------- merging (eq. 10)


def compute_rho(cfg: MergeConfig, state: MergeState | None, q_local: Tensor,
                q_global: Tensor) -> Tensor:
    """The merge weights, detached (the merge's :meth:`~fedem_private.client.merges.Merge.
    weights`): (k, m) for em, (k, 1) for dm, a 0-d tensor for sr/sm."""
    return cfg.rule.weights(state, q_local, q_global)


def adapter_rho(cfg: MergeConfig, state: MergeState | None, q_local: Tensor,
                q_global: Tensor) -> Tensor:
    """Equation 9 on every item of the k clients' tables, detached: rho (k, m)."""
    return _adapter.adapter_rho(cfg.strategy, state, q_local, q_global)


def _require_state(cfg: MergeConfig, state: MergeState | None, k: int) -> MergeState:
    return require_state(cfg.strategy, state, k)


def merge(cfg: MergeConfig, state: MergeState | None, q_local: Tensor,
          q_global: Tensor) -> Tensor:
    """The merged starting tables Q_m (k, m, d) for the next round of local training."""
    return merge_with_rho(cfg, state, q_local, q_global)[0]


def merge_with_rho(cfg: MergeConfig, state: MergeState | None, q_local: Tensor,
                   q_global: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`merge`, and each client's mean rho (k,): how much of Q_g it took (1 = all).

    The mean is over items for ``em``; it tells whether an adapter learned to
    keep the client's own table (rho near 0) or to take the global one.
    """
    if q_local.shape != q_global.shape:
        raise ValueError(f"local {tuple(q_local.shape)} and global {tuple(q_global.shape)} "
                         "tables differ in shape")
    return cfg.rule.start(state, q_local, q_global)


# ---------------------------------------------------------------- adapter training (eq. 11)


def dot_scores(rows: Tensor, p_rows: Tensor, q_items: Tensor,
               items: Tensor | None = None) -> Tensor:
    """MF logits p_u . q_i: p_rows (a, d), q_items (a, B, d) -> (a, B)."""
    del rows, items  # MF needs no per-client score head
    return torch.einsum("ad,abd->ab", p_rows, q_items)


def _active(batch: StepBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The batch restricted to rows with at least one valid entry; padding ids set to 0."""
    rows, items, labels, mask = batch.rows, batch.items, batch.labels, batch.mask.bool()
    shapes_ok = (items.dim() == 2 and rows.dim() == 1 and items.shape[0] == rows.shape[0]
                 and labels.shape == items.shape and mask.shape == items.shape)
    if not shapes_ok:
        raise ValueError("StepBatch needs rows (a,) and items, labels, mask of shape (a, B)")
    if torch.unique(rows).numel() != rows.numel():
        raise ValueError("StepBatch.rows must not repeat a client")
    keep = mask.any(dim=1)  # on the mask's device; rows may be on the CPU beside it
    if not bool(keep.all()):
        rows, items, labels, mask = rows[keep.to(rows.device)], items[keep], labels[keep], \
            mask[keep]
    items = torch.where(mask, items, torch.zeros_like(items))
    return rows.to(torch.int64), items.to(torch.int64), labels, mask


def _client_losses(rule: AdapterMerge, weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                   tables: tuple[Tensor, Tensor, Tensor], batch: tuple[Tensor, ...],
                   score: ScoreFn) -> Tensor:
    """Mean BCE-with-logits of each active client over its valid entries: (a,)."""
    q_local, q_global, p_users = tables
    rows, items, labels, mask = batch
    k, m, d = q_local.shape
    flat = (rows[:, None] * m + items).reshape(-1)  # row-major (client, item) positions
    ql_items = q_local.reshape(k * m, d).index_select(0, flat).view(*items.shape, d)
    qg_items = q_global.reshape(k * m, d).index_select(0, flat).view(*items.shape, d)
    rho = rule.batch_weights(weights, biases, (q_local, q_global), rows, (ql_items, qg_items))
    q_merged = torch.lerp(ql_items, qg_items, rho)
    logits = score(rows, p_users.index_select(0, rows), q_merged, items)
    bce = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    bce = torch.where(mask, bce, torch.zeros_like(bce))
    return bce.sum(dim=1) / mask.sum(dim=1).to(bce.dtype)


def train_adapter(cfg: MergeConfig, state: MergeState | None, client_rows: Tensor | None,
                  q_local: Tensor, q_global: Tensor, p_users: Tensor,
                  steps: Iterable[StepBatch], score: ScoreFn = dot_scores) -> MergeState | None:
    """Equation 11: train the adapters of a chunk of k clients; returns a new state.

    state holds adapters for N clients; client_rows (k,) picks the chunk's
    clients from it (None: state is exactly the chunk). q_local, q_global:
    (k, m, d); p_users: (k, d); all three are frozen and never written. Each
    StepBatch indexes the chunk's client axis. Adam (lr = adapter_lr, betas
    (0.9, 0.999), eps 1e-8) starts fresh on every call and keeps one step count
    per client: a client with no valid entry in a step neither moves nor
    advances its count. sr and sm learn nothing and return state unchanged.

    The adapters and tables may live on any device (the same one); each
    StepBatch is checked where it was built (the CPU, :func:`adapter_batches`:
    no wait for the device) and then moved to the tables' device.
    """
    if not cfg.rule.learned:
        return state
    rule: AdapterMerge = cfg.rule  # type: ignore[assignment]  # learned: an adapter merge
    k = q_local.shape[0]
    if state is None:
        raise ValueError(f"strategy {cfg.strategy!r} needs adapters; call init_merge_state")
    chunk = state if client_rows is None else take_clients(state, client_rows)
    _require_state(cfg, chunk, k)
    n_layers = len(chunk.weights)
    params = [t.detach().clone() for t in (*chunk.weights, *chunk.biases)]
    adam = MaskedAdam(params, AdamConfig(lr=cfg.adapter_lr, betas=(0.9, 0.999), eps=1e-8))
    tables = (q_local.detach(), q_global.detach(), p_users.detach())
    dev = q_local.device
    with torch.enable_grad():
        for step in steps:
            checked = _active(step)
            if checked[0].numel() == 0:
                continue
            batch = tuple(t.to(dev) for t in checked)
            rows = batch[0]
            leaves = [t.index_select(0, rows).requires_grad_(True) for t in params]
            losses = _client_losses(rule, tuple(leaves[:n_layers]),
                                    tuple(leaves[n_layers:]), tables, batch, score)
            grads = torch.autograd.grad(losses.sum(), leaves)
            adam.step(grads, checked[0])  # rows where they were checked: no wait there
    trained = MergeState(tuple(params[:n_layers]), tuple(params[n_layers:]))
    return trained if client_rows is None else put_clients(state, client_rows, trained)


# ---------------------------------------------------------------- merging on every batch


class BatchMergeRows(CompactRows):
    """Item rows trained through the merge on every batch: the FedEM code (docs/design.md 2a).

    The published code does not train the adapter once before local training
    (equation 11) and then train the merged table (equation 12). Each local
    batch of a client that received a table this round runs two steps:

    1. the adapter's: the batch's rows are merged, Q_l[i] + rho_i (Q_g[i] - Q_l[i])
       (equation 10, with rho_i from equation 9 on [Q_g[i] - Q_l[i], Q_l[i]]), the
       backbone's loss on them is back-propagated to the adapter, and the adapter
       takes one Adam step (lr ``adapter_lr``; p_u and Q_l do not move);
    2. the item table's: the rows are merged again with the updated adapter, and
       the loss's gradient flows through the merge (rho's dependence on Q_l
       included) into Q_l, which takes the backbone's own Adam step.

    The local table Q_l (never the merged one) is what the client keeps and
    uploads. A client that received no table this round (``merging`` False)
    trains its own rows as :class:`~fedem_private.models.base.CompactRows` does and
    its adapter does not move. Both Adam states start fresh each round, one step
    count per client (a client's s-th step is step s + 1 of both), as the code's
    per-round optimisers do.

    ``q_start`` (k, m, d) is each client's starting local table (the code merges
    once with the stored adapter at the start of the round; the caller does
    that), ``q_global`` (k, m, d) the table it received, ``adapters`` the
    chunk's adapters; :meth:`adapters` gives them trained.
    """

    pre_steps = True

    def __init__(self, q_start: Tensor, plan: Plan, q_global: Tensor, adapters: MergeState,
                 adapter_lr: float, merging: Tensor | None = None) -> None:
        super().__init__(q_start, plan)
        k, d = q_start.shape[0], q_start.shape[-1]
        if adapters.n_clients != k or q_global.shape != q_start.shape:
            raise ValueError(f"{adapters.n_clients} adapters and a global table "
                             f"{tuple(q_global.shape)} for local tables {tuple(q_start.shape)}")
        self.flat_global = Compact.of(q_global, plan).table.view(-1, d)
        self.n_layers = len(adapters.weights)
        self.params = [t.detach().clone() for t in (*adapters.weights, *adapters.biases)]
        self.agrad, self.am1, self.am2 = adam_buffers(self.params)
        self.adam = LocalTrainConfig(lr=adapter_lr, betas=(0.9, 0.999), eps=1e-8)
        self.merging = (torch.ones(k, dtype=torch.bool, device=q_start.device)
                        if merging is None else merging.to(q_start.device).bool())
        self.batch = plan.loc.shape[1]
        # the last gather's graph: (flat, local rows leaf, adapter leaves, merged rows)
        self._graph: tuple[Tensor, Tensor, list[Tensor], Tensor] | None = None

    def gather(self, flat: Tensor) -> Tensor:
        a = flat.numel() // self.batch
        d = self.flat_table.shape[1]
        with torch.enable_grad():
            ql = self.flat_table.index_select(0, flat).view(a, self.batch, d)
            ql.requires_grad_(True)
            leaves = [t[:a].detach().requires_grad_(True) for t in self.params]
            qg = self.flat_global.index_select(0, flat).view(a, self.batch, d)
            rho = adapter_forward(tuple(leaves[:self.n_layers]), tuple(leaves[self.n_layers:]),
                                  adapter_input(ql, qg))
            merged = ql + rho.unsqueeze(-1) * (qg - ql)
            merged = torch.where(self.merging[:a, None, None], merged, ql)
        self._graph = (flat, ql, leaves, merged)
        return merged.detach().view(-1, d)

    def _grads(self, flat: Tensor, grad_rows: Tensor, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        if self._graph is None or self._graph[0] is not flat:
            raise ValueError("gradients must be for the rows of the last gather")
        merged = self._graph[3]
        return torch.autograd.grad(merged, inputs, grad_rows.view_as(merged),
                                   retain_graph=True)

    def pre_step(self, a: int, flat: Tensor, grad_rows: Tensor, s: int) -> None:
        """Step 1 (the adapter's): one Adam step of the first ``a`` clients' adapters."""
        assert self._graph is not None
        grads = self._grads(flat, grad_rows, self._graph[2])
        for grad, buf in zip(grads, self.agrad, strict=True):
            buf[:a].copy_(grad)
        fused_adam([t[:a] for t in self.params], [t[:a] for t in self.agrad],
                   [t[:a] for t in self.am1], [t[:a] for t in self.am2], s + 1, self.adam)

    def add_grad(self, flat: Tensor, grad_rows: Tensor) -> None:
        """Step 2's gradient: through the merge into the local rows."""
        assert self._graph is not None
        (grad_local,) = self._grads(flat, grad_rows, [self._graph[1]])
        self._graph = None
        self.flat_grad.index_add_(0, flat, grad_local.reshape(-1, grad_local.shape[-1]))

    def adapters(self) -> MergeState:
        """The chunk's adapters as trained so far."""
        return MergeState(tuple(self.params[:self.n_layers]), tuple(self.params[self.n_layers:]))

    def save(self, j: int) -> object:
        return (self.table[j].clone(), [t[j].clone() for t in self.params])

    def load(self, j: int, saved: object) -> None:
        table, params = saved  # type: ignore[misc]
        self.table[j] = table
        for t, v in zip(self.params, params, strict=True):
            t[j] = v


class BatchMergeFactory:
    """Builds a chunk's :class:`BatchMergeRows` for the backbone (a ``RowsFactory``) and
    keeps it, so the caller can take the trained adapters back."""

    def __init__(self, q_global: Tensor, adapters: MergeState, adapter_lr: float,
                 merging: Tensor | None) -> None:
        self.q_global, self.adapters, self.merging = q_global, adapters, merging
        self.lr = adapter_lr
        self.made: BatchMergeRows | None = None

    def __call__(self, q_start: Tensor, plan: Plan) -> BatchMergeRows:
        self.made = BatchMergeRows(q_start, plan, self.q_global, self.adapters, self.lr,
                                   self.merging)
        return self.made


# ---------------------------------------------------------------- the client's merge step


def adapter_batches(seed: int, round_: int, clients: np.ndarray, samples: object,
                    local_epochs: int, extra_epochs: int, batch_size: int,
                    device: torch.device | None = None) -> Iterable[StepBatch]:
    """Lock-step batches for the adapter (equation 11), from this round's samples.

    Client c's adapter epoch e uses its sample order number ``local_epochs + e``
    of the round (:func:`~fedem_private.models.base.epoch_orders`), so the
    adapter never reuses the order of a training epoch. ``samples`` is the
    round's :class:`~fedem_private.models.base.ClientSamples` for ``clients``
    (``train`` objective), or the withheld fold's, whose orders come from a
    stream of their own (``holdout``, called with ``local_epochs`` 0). On the CPU
    (``device`` None or a CPU) the batches are CPU tensors (:func:`train_adapter` checks
    them there); on a GPU the orders are drawn and the slots gathered there, and only
    each step's ``rows`` stay on the CPU. Both give the same batches.
    """
    e0, extra, bsz = local_epochs, extra_epochs, batch_size
    lengths = np.diff(samples.indptr)
    per_epoch = -(-lengths // bsz)
    nb = extra * per_epoch
    on = device if device is not None and torch.device(device).type != "cpu" else None
    order = samples.order_grid_t(seed, round_, clients, e0, extra, device=on)  # one call
    if on is not None:
        yield from _device_batches(samples, order, nb, per_epoch, bsz, on)
        return
    zero = samples.labels.dtype.type(0)
    # client j's step s is (epoch, batch) = divmod(s, per_epoch[j]), gathered for the step
    # alone; past the client's samples, padding (item 0, label 0, mask False)
    for s in range(int(nb.max(initial=0))):
        rows = np.nonzero(nb > s)[0]
        epoch, b = np.divmod(s, per_epoch[rows])
        src_t, valid_t = samples.slots(order, *(torch.from_numpy(a) for a in (rows, epoch, b)),
                                       bsz)
        src, valid = src_t.numpy(), valid_t.numpy()
        its = np.where(valid, samples.items[src], 0) if samples.items.size else \
            np.zeros(valid.shape, dtype=np.int64)
        labs = np.where(valid, samples.labels[src], zero) if samples.labels.size else \
            np.zeros(valid.shape, dtype=samples.labels.dtype)
        yield StepBatch(torch.from_numpy(rows).to(torch.long),
                        torch.from_numpy(its.astype(np.int64, copy=False)),
                        torch.from_numpy(labs), torch.from_numpy(valid))


def _device_batches(samples: object, order: Tensor, nb: np.ndarray, per_epoch: np.ndarray,
                    bsz: int, device: torch.device) -> Iterable[StepBatch]:
    """:func:`adapter_batches`' steps gathered on ``device`` (rows on the CPU)."""
    items = torch.as_tensor(samples.items, dtype=torch.int64).to(device)
    labels = torch.as_tensor(samples.labels).to(device)
    for s in range(int(nb.max(initial=0))):
        rows = np.nonzero(nb > s)[0]
        epoch, b = np.divmod(s, per_epoch[rows])
        src, valid = samples.slots(order, *(torch.from_numpy(a).to(device)
                                            for a in (rows, epoch, b)), bsz)
        its = torch.where(valid, items[src], 0) if items.numel() else torch.zeros_like(src)
        labs = (torch.where(valid, labels[src], 0).to(labels.dtype) if labels.numel()
                else torch.zeros(valid.shape, dtype=labels.dtype, device=device))
        yield StepBatch(torch.from_numpy(rows).to(torch.long), its, labs, valid)


class AdapterStore:
    """The adapters of n clients, each drawn when it is first used, so memory grows with
    the clients that took part, not with n (a population of 10^6 users; issue 79).

    Client c's adapter is drawn from rng.generator(seed, ADAPTER_INIT, 0, c) alone
    (:func:`init_merge_state`), so drawing it late gives the values an eager draw of all n
    gives. Rows live in one table per layer tensor, in the order clients were first used
    (``slot[c]``); the tables grow by a quarter (or what a chunk needs) when full.
    """

    def __init__(self, cfg: MergeConfig, n_clients: int, dim: int, seed: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.cfg, self.dim, self.seed, self.dtype, self.device = cfg, dim, seed, dtype, device
        self.slot = np.full(n_clients, -1, dtype=np.int64)
        self.used = 0
        self.table: MergeState | None = None

    @classmethod
    def holding(cls, full: MergeState, device: torch.device) -> AdapterStore:
        """A store that already holds ``full`` (every client's adapter, in client order)."""
        store = cls.__new__(cls)
        n = full.n_clients
        store.cfg = store.dim = store.seed = None  # every client is drawn: never drawn again
        store.dtype, store.device = full.weights[0].dtype, device
        store.slot, store.used, store.table = np.arange(n, dtype=np.int64), n, full
        return store

    @property
    def n_clients(self) -> int:
        return int(self.slot.shape[0])

    def _capacity(self) -> int:
        return 0 if self.table is None else self.table.n_clients

    def _draw(self, ids: np.ndarray) -> None:
        """Give every client of ``ids`` not yet drawn a slot and its keyed adapter."""
        new = np.unique(ids[self.slot[ids] < 0])
        if new.size == 0:
            return
        fresh = init_merge_state(self.cfg, new, self.dim, self.seed, self.dtype)
        assert fresh is not None
        need = self.used + new.size
        if need > self._capacity():
            cap = min(self.n_clients, max(need, self._capacity() + self._capacity() // 4))
            base = fresh if self.table is None else self.table
            self.table = MergeState(tuple(self._grown(t, cap) for t in base.weights),
                                    tuple(self._grown(t, cap) for t in base.biases))
        assert self.table is not None
        at = torch.arange(self.used, need, device=self.device)
        for dst, src in zip((*self.table.weights, *self.table.biases),
                            (*fresh.weights, *fresh.biases), strict=True):
            dst.index_copy_(0, at, src.to(self.device))
        self.slot[new] = np.arange(self.used, need)
        self.used = need

    def _grown(self, old: Tensor, cap: int) -> Tensor:
        """A (cap, ...) table holding the first :attr:`used` rows of ``old`` (the rest
        unset)."""
        out = torch.empty((cap, *old.shape[1:]), dtype=self.dtype, device=self.device)
        if self.used:  # the first table is shaped on the fresh draw, on the CPU: no copy
            out[:self.used] = old[:self.used]
        return out

    def _rows(self, idx: Tensor) -> Tensor:
        ids = idx.detach().cpu().numpy().astype(np.int64, copy=False)
        self._draw(ids)
        return torch.from_numpy(self.slot[ids]).to(self.device)

    def take(self, idx: Tensor) -> MergeState:
        """A copy of the adapters of clients ``idx`` (drawn first where new)."""
        rows = self._rows(idx)
        assert self.table is not None
        return take_clients(self.table, rows)

    def put(self, idx: Tensor, part: MergeState) -> None:
        """Write ``part``'s adapters as those of clients ``idx`` (in place)."""
        rows = self._rows(idx)
        assert self.table is not None
        for dst, src in zip((*self.table.weights, *self.table.biases),
                            (*part.weights, *part.biases), strict=True):
            dst.index_copy_(0, rows, src.to(device=dst.device, dtype=dst.dtype))

    def full(self) -> MergeState:
        """Every client's adapter in client order (all n drawn)."""
        return self.take(torch.arange(self.n_clients))


class Merger:
    """A run's merge step on the client side (SR / SM / DM / EM) and the adapters it keeps.

    Only item tables are merged (the group every backbone marks mergeable);
    the backbone supplies the frozen score function the adapter is trained
    through (equation 11), so merging never knows which backbone runs.

    The adapters (all n clients') live on ``device``; they are drawn on the CPU,
    keyed as on a CPU run, and moved there.
    """

    def __init__(self, cfg: MergeConfig, n_clients: int, dim: int, seed: int,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.store = (AdapterStore(cfg, n_clients, dim, seed, dtype, self.device)
                      if cfg.rule.learned else None)

    @property
    def state(self) -> MergeState | None:
        """Every client's adapter, in client order (None for SR / SM): each one not yet
        used is drawn now, so this holds all n; the round loop reads only its chunk's
        (:meth:`take`)."""
        return None if self.store is None else self.store.full()

    def take(self, idx: Tensor) -> MergeState | None:
        """A copy of the adapters of clients ``idx`` (None for SR / SM)."""
        return None if self.store is None else self.store.take(idx)

    def __setstate__(self, d: dict[str, Any]) -> None:
        """A checkpoint from before the store (its ``state`` held all n adapters) resumes."""
        if "store" not in d:
            full = d.pop("state", None)
            d["store"] = None if full is None else AdapterStore.holding(full, d["device"])
        self.__dict__.update(d)

    @property
    def merges(self) -> bool:
        """Whether the start table differs from the server's (anything but SR)."""
        return self.cfg.rule.merges

    @property
    def learned(self) -> bool:
        """Whether adapters are trained (DM, EM)."""
        return self.cfg.rule.learned

    @property
    def every_batch(self) -> bool:
        """Whether the adapter trains on every local batch, through the merge, and the merged
        table is evaluated (the FedEM code, docs/design.md 2a; :class:`BatchMergeRows`)."""
        return self.cfg.every_batch

    def batch_rows(self, idx: Tensor, sent: Tensor,
                   merging: Tensor | None = None) -> BatchMergeFactory:
        """The item rows clients ``idx`` train through when merging on every batch: their
        received tables ``sent`` (k, m, d) and their adapters (``merging`` (k,) bool: who
        received one; None: all). Hand the factory back to :meth:`keep_trained` after."""
        assert self.store is not None
        return BatchMergeFactory(sent, self.store.take(idx), self.cfg.adapter_lr, merging)

    def keep_trained(self, idx: Tensor, rows: BatchMergeFactory) -> None:
        """Keep the adapters clients ``idx`` trained in local training (:meth:`batch_rows`)."""
        if rows.made is None:  # no local training ran (an empty chunk)
            return
        assert self.store is not None
        self.store.put(idx, rows.made.adapters())

    def evaluated(self, idx: Tensor, q_local: Tensor, sent: Tensor | None,
                  receives: Tensor | None) -> Tensor:
        """The item tables clients ``idx`` are evaluated with: their own ``q_local``, or,
        merging on every batch, Q_l merged with the table the server has for them next
        (``sent``; only where ``receives``, None: all), as the FedEM code evaluates."""
        if not self.every_batch or sent is None:
            return q_local
        assert self.store is not None
        merged = merge(self.cfg, self.store.take(idx), q_local, sent)
        if receives is not None:
            merged = torch.where(receives.view(-1, 1, 1), merged, q_local)
        return merged

    def withholds(self, round_: int) -> bool:
        """Whether round t takes a fold out of local training: ``holdout``, DM/EM, t > 1."""
        return self.learned and self.cfg.adapter_objective == "holdout" and round_ > 1

    def kept_positives(self, round_: int, n_pos: np.ndarray) -> np.ndarray:
        """Positives each client (n_pos (n,) per client id) trains on locally in round t.

        n_pos itself, but for the withheld fold under ``holdout``
        (:func:`~fedem_private.client.holdout.withheld_counts`).
        """
        n_pos = np.asarray(n_pos, dtype=np.int64)
        if not self.withholds(round_):
            return n_pos
        return n_pos - withheld_counts(round_, n_pos, self.cfg.adapter_folds)

    def round_samples(self, round_: int, clients: np.ndarray, samples: ClientSamples,
                      local_epochs: int, batch_size: int, num_negatives: int
                      ) -> tuple[ClientSamples, Iterable[StepBatch] | None]:
        """(local-training samples, adapter steps) of a chunk in a merging round t > 1.

        The data D_u of equation 11: under ``train`` the round's samples
        themselves, in orders local_epochs .. of their shuffle stream
        (:func:`adapter_batches`), and local training gets them all; under
        ``holdout`` the withheld fold t mod F_u and its negatives
        (:func:`~fedem_private.client.holdout.split_samples`), and local
        training gets the rest. SR / SM train no adapter: (samples, None).
        """
        if not self.learned or self.every_batch:
            return samples, None
        epochs, bsz = self.cfg.adapter_epochs, batch_size
        if not self.withholds(round_):
            return samples, adapter_batches(self.seed, round_, clients, samples, local_epochs,
                                            epochs, bsz, device=self.device)
        train, fold = split_samples(samples, clients, self.seed, round_,
                                    self.cfg.adapter_folds, num_negatives)
        return train, adapter_batches(self.seed, round_, clients, fold, 0, epochs, bsz,
                                      device=self.device)

    def start(self, idx: Tensor, q_prev: Tensor, sent: Tensor, user_vecs: Tensor,
              score: ScoreFn, steps: Iterable[StepBatch] | None,
              merging: Tensor | None = None,
              trainer: AdapterTrainer | None = None) -> tuple[Tensor, Tensor]:
        """Train the adapters of clients ``idx`` (DM, EM), then merge (equation 10).

        ``merging`` (k,) bool: the clients that received a table this round; the others
        (the FedEM code's ``agg_clients_ratio``, docs/design.md 2a) neither train their adapter
        nor merge: their start table is ``q_prev``. None: all merge.
        ``trainer`` replaces equation 11's Adam training (ldp-dpsgd's DP-SGD adapter): it
        gets the chunk's (weights, biases), q_prev and sent, and returns the trained pair.
        Merging on every batch (:attr:`every_batch`), nothing is trained here: the start
        table is the merge with the adapter as the last round left it (the FedEM code), and
        the adapter trains in local training (:meth:`batch_rows`).
        Returns the start tables (k, m, d) and each client's mean rho (k,).
        """
        if merging is not None and steps is not None:
            steps = _only_rows(steps, merging)
        if self.every_batch:
            pass  # the adapter trains in local training, on every batch (batch_rows)
        elif self.learned and trainer is not None:
            if merging is not None:
                raise ValueError("a replacement adapter trainer takes every client")
            assert self.store is not None
            chunk = self.store.take(idx)
            w, b = trainer(chunk.weights, chunk.biases, q_prev, sent)
            self.store.put(idx, MergeState(tuple(w), tuple(b)))
        elif self.learned:
            assert self.store is not None
            trained = train_adapter(self.cfg, self.store.take(idx), None, q_prev, sent,
                                    user_vecs, steps if steps is not None else (), score)
            assert trained is not None
            self.store.put(idx, trained)
        chunk_state = self.take(idx)
        start, rho = merge_with_rho(self.cfg, chunk_state, q_prev, sent)
        if merging is not None:
            start = torch.where(merging.view(-1, 1, 1), start, q_prev)
        return start, rho


def _only_rows(steps: Iterable[StepBatch], keep: Tensor) -> Iterable[StepBatch]:
    """The adapter's steps with the entries of clients not in ``keep`` (k,) masked out."""
    keep_cpu = keep.cpu()
    for step in steps:
        rows_keep = keep_cpu.to(step.rows.device)[step.rows].to(step.mask.device)
        yield StepBatch(step.rows, step.items, step.labels,
                        step.mask.bool() & rows_keep[:, None])
