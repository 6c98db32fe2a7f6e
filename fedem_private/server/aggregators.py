"""The server's aggregators as objects with one job: from the round's uploads, the next tables.

Every aggregator (docs/design.md sections 3 and 9) answers three questions for the
round loop, which never branches on their names:

- :meth:`Aggregator.sent`: what item table the server sends each client of a
  chunk (``None``: nothing; the client continues from its own table);
- :meth:`Aggregator.add`: take a chunk's (decoded, privatised) item-table
  uploads (:meth:`Aggregator.add_rows` when the loop knows each upload equals
  the table it was sent outside the rows its client trained);
- :meth:`Aggregator.end_round`: form the next round's table(s).

``fedavg`` (weights |D_v| / sum |D| over the round's participants),
``uniform`` (1/n), ``similarity`` (equation 13, personalised per client),
``graph`` (GPFedRec) and ``fedmerge`` (K global tables merged per client,
docs/design.md section 12) live here; ``none`` is the ``local`` baseline. Under a central
mechanism (cdp-gaussian) no upload reaches the aggregator: a sum-based one
(:attr:`Aggregator.takes_aggregate`) is handed the round's noisy aggregate
by :meth:`Aggregator.take_aggregate` instead. An
aggregator may report per-round figures (:meth:`Aggregator.round_stats`),
which the loop writes into metrics.csv without knowing what they are.
Non-item shared groups (an MLP) are always averaged with FedAvg weights by
:class:`DenseFedAvg`.

Devices: an aggregator keeps its tables, weights and masks on the device of
the ``sizes`` and initial table it is built with (the run's device); the index
tensors and uploads it is given must be there too.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from fedem_private import rng
from fedem_private.server.aggregation import (
    fedavg_weights,
    similarity_aggregate,
    uniform_weights,
)
from fedem_private.server.fedmerge import (
    FitConfig,
    fit,
    initial_tables,
    merged_tables,
    weight_entropy,
)
from fedem_private.server.graph import graph_tables
from fedem_private.server.options import FedMergeOptions, GraphOptions, SimilarityOptions


def aggregated_uploads(part_mask: Tensor, agg_ratio: float, seed: int, round_: int,
                       keys: np.ndarray | None = None) -> Tensor:
    """The uploads a round aggregates, (n,) bool: all participants (``agg_ratio`` 1), or the
    ceil(q n_t) participants with the smallest draws keyed by (seed, AGG_SAMPLE, round,
    client identity): ``keys[client]``, the stable key of its source id (None: the index),
    so that no other user's presence moves a client's draw; the FedEM code's
    ``agg_clients_ratio`` q (docs/design.md 2a), which only the owners of the sampled
    uploads hear back from next round."""
    if agg_ratio >= 1.0:
        return part_mask
    part = part_mask.nonzero().squeeze(1).cpu().numpy()
    mask = torch.zeros_like(part_mask)
    if part.shape[0] == 0:
        return mask
    k = max(1, math.ceil(agg_ratio * part.shape[0]))
    ident = part if keys is None else np.asarray(keys, dtype=np.int64)[part]
    u = rng.uniform(rng.key(seed, rng.Stream.AGG_SAMPLE, round_, ident), 0)
    chosen = part[rng.smallest(u, k)]
    mask[torch.from_numpy(chosen).to(part_mask.device)] = True
    return mask


class _Sampled:
    """An aggregator that may aggregate a random share of the round's uploads (the FedEM
    code's ``agg_clients_ratio``, docs/design.md 2a): only the owners of the sampled uploads receive
    a table next round; every other client continues from its own model, with no merge.
    The share 1 (the default) is plain aggregation over all participants."""

    sampled: ClassVar[bool] = True

    agg_ratio: float
    seed: int
    round: int
    receiving: Tensor | None
    _chosen: Tensor | None

    def _init_sampling(self, agg_ratio: float, seed: int) -> None:
        self.agg_ratio = float(agg_ratio)
        self.seed = seed
        self.round = 0
        # the clients whose uploads the last round aggregated (agg_ratio < 1); None: all
        self.receiving = None
        self._chosen = None
        # each client's identity key (Split.source_users), set by the simulation; None: index
        self.client_keys: np.ndarray | None = None

    def begin_round(self, part_mask: Tensor) -> None:
        """Counts the round and samples its share (``_chosen``), then the aggregator's own
        :meth:`Aggregator.begin_round` (the mixin comes first in the bases)."""
        self.round += 1
        self._chosen = aggregated_uploads(part_mask, self.agg_ratio, self.seed, self.round,
                                          self.client_keys)
        super().begin_round(part_mask)  # type: ignore[misc]

    def receives(self, idx: Tensor) -> Tensor | None:
        return None if self.receiving is None else self.receiving.index_select(0, idx)

    def aggregated(self) -> Tensor:
        assert self._chosen is not None, "begin_round first"
        return self._chosen

    def _received(self) -> None:
        """Called from end_round: the sampled owners hear back next round."""
        if self.agg_ratio < 1.0:
            self.receiving = self._chosen


@dataclass(frozen=True)
class ServerOptConfig:
    """The server's step on each round's aggregate (``--server-lr``, ``--server-momentum``)."""

    lr: float = 1.0
    momentum: float = 0.0

    @property
    def plain(self) -> bool:
        """lr 1 and no momentum: the aggregate is adopted as is (plain FedAvg)."""
        return self.lr == 1.0 and self.momentum == 0.0


class ServerMomentum:
    """Server learning rate and momentum on the aggregate (FedAvgM; Hsu et al. 2019).

    With G the table sent last round and A this round's aggregate (the FedAvg
    mean, or the noisy release of cdp-gaussian), the pseudo-gradient is
    D_t = A_t - G_{t-1}; then m_t = beta m_{t-1} + D_t (m_0 = 0) and
    G_t = G_{t-1} + lr m_t. lr = 1, beta = 0 gives G_t = A_t exactly (the
    aggregate itself is returned). It only post-processes what the server
    already holds, so it changes no privacy guarantee (under cdp-gaussian it
    acts on the released noisy aggregate; momentum averages that noise over
    about 1 / (1 - beta) rounds).
    """

    def __init__(self, cfg: ServerOptConfig) -> None:
        self.cfg = cfg
        self.m: Tensor | None = None

    def step(self, prev: Tensor, aggregate: Tensor) -> Tensor:
        """G_t from G_{t-1} = ``prev`` and A_t = ``aggregate`` (same shape)."""
        if self.cfg.plain:
            return aggregate
        delta = aggregate.double() - prev.double()
        self.m = delta if self.m is None else self.m.mul_(self.cfg.momentum).add_(delta)
        return (prev.double() + self.cfg.lr * self.m).to(prev.dtype)


class Aggregator(ABC):
    """Server-side state and update of the shared item table(s)."""

    name: ClassVar[str]
    #: whether it needs each client's upload (not only their sum): similarity does
    needs_each_upload: ClassVar[bool] = False
    #: whether it can adopt an aggregate formed elsewhere (central DP): the sums can
    takes_aggregate: ClassVar[bool] = False
    #: whether it sends clients a table at all (the local baseline sends none)
    sends_table: ClassVar[bool] = True
    #: whether it can aggregate a random share of the uploads (``--agg-clients-ratio``)
    sampled: ClassVar[bool] = False
    #: whether it keeps one global table formed as a weighted sum, which a server step
    #: (``--server-lr``) and a FedPEFT codec's averaged theta act on
    one_table: ClassVar[bool] = False
    #: whether it takes the clients' uploads at all (the local baseline takes none, so no
    #: upload exists for a privacy mechanism to protect)
    takes_uploads: ClassVar[bool] = True
    #: whether it weighs every participant alike (1 / n_t) rather than by |D_v|: a FedPEFT
    #: codec's theta is averaged the same way
    equal_weights: ClassVar[bool] = False
    #: whether it weighs the uploads by their similarity (equation 13), the rule
    #: ``--similarity`` chooses (and the FedEM code's facts of docs/design.md 2a apply to)
    similarity_weights: ClassVar[bool] = False

    @classmethod
    def from_options(cls, sizes: Tensor, q0: Tensor, opts: AggregatorOptions) -> Aggregator:
        """Build it from the run's options (each class takes its own)."""
        raise NotImplementedError(f"aggregation {cls.name!r} has no from_options")

    @staticmethod
    def _no_server_step(name: str, opts: AggregatorOptions) -> None:
        if opts.server is not None and not opts.server.plain:
            raise ValueError(f"a server learning rate / momentum needs a sum aggregator, "
                             f"not {name!r}")

    def __init__(self, sizes: Tensor, n_clients: int) -> None:
        self.sizes = sizes  # (n,) float64 training-set sizes |D_u|, on the run's device
        self.n = n_clients
        self.device = sizes.device
        self.part_mask = torch.zeros(n_clients, dtype=torch.bool, device=self.device)

    @abstractmethod
    def sent(self, idx: Tensor) -> Tensor | None:
        """The item tables (k, m, d) the server sends clients ``idx``; None: nothing."""

    def begin_round(self, part_mask: Tensor) -> None:
        """The round's participants (n,) bool."""
        self.part_mask = part_mask

    @abstractmethod
    def add(self, idx: Tensor, uploads: Tensor) -> None:
        """Take the item-table uploads (k, m, d) of clients ``idx``."""

    def add_rows(self, idx: Tensor, uploads: Tensor, rows: Tensor) -> None:
        """:meth:`add` for uploads (k, m, d) that equal the table each client was sent,
        :meth:`sent`, outside ``rows`` (k, m) bool, the rows it trained: the loop calls it
        only when that holds (no merge, no perturbation, the whole table received). An
        aggregator that can use the sparsity overrides it; by default, :meth:`add`."""
        self.add(idx, uploads)

    @abstractmethod
    def end_round(self) -> None:
        """Form the tables sent next round."""

    def take_aggregate(self, table: Tensor) -> None:
        """Adopt ``table`` (m, d), the round's aggregate formed under central DP, as the
        next global table (instead of :meth:`add`); only sum-based aggregators can."""
        raise TypeError(f"aggregation {self.name!r} needs each client's upload and cannot "
                        "take a central aggregate")

    @property
    def table(self) -> Tensor | None:
        """The current global table: (m, d), (n, m, d) when personalised, None for none."""
        return None

    def anchor(self, idx: Tensor) -> Tensor | None:
        """A table (k, m, d) sent as the target of a backbone's regulariser; None: none."""
        return None

    def receives(self, idx: Tensor) -> Tensor | None:
        """(k,) bool: which of clients ``idx`` get a table this round (the others continue
        from their own model, with no merge); None: all of them."""
        return None

    def aggregated(self) -> Tensor:
        """(n,) bool: the uploads this round aggregates (after :meth:`begin_round`): every
        participant, or the sampled share of :class:`_Sampled`. A backbone's shared dense
        groups are averaged over the same uploads."""
        return self.part_mask

    def round_stats(self) -> dict[str, float]:
        """Figures of the last :meth:`end_round` for metrics.csv (column name -> value)."""
        return {}


class _SumAggregator(_Sampled, Aggregator):
    """A weighted sum of the uploads, accumulated chunk by chunk in float64.

    With weights w_v over the uploads U_v and the table Q the round sent, the sum is
    formed as sum_v w_v U_v = W Q + sum_v w_v (U_v - Q), W = sum_v w_v, in float64: the
    second sum has no term where an upload equals Q, so :meth:`add_rows` adds only the
    rows each client trained. On the CPU both :meth:`add` and :meth:`add_rows` add the
    terms client by client in chunk order (``index_add_`` adds its rows in index
    order), so the two give the same bits (tests/test_aggregation.py); on an
    accelerator :meth:`add` is one product and :meth:`add_rows` calls it. A subclass
    that redefines :meth:`add` gets every upload through it.

    With ``agg_ratio`` q < 1 (:class:`_Sampled`) the sum is over a random share of the
    round's uploads, weighted as if only they had taken part, and only their owners
    receive the new table next round.

    Under cdp-gaussian it takes the round's noisy aggregate instead
    (:meth:`take_aggregate`): the UNWEIGHTED mean of clipped deltas over the
    expected count (docs/design.md section 5), so fedavg's data-size weights are not
    used there (they would raise the sensitivity).
    """

    takes_aggregate = True
    one_table = True

    @classmethod
    def from_options(cls, sizes: Tensor, q0: Tensor, opts: AggregatorOptions) -> Aggregator:
        return cls(sizes, sizes.shape[0], q0, opts.server, agg_ratio=float(opts.agg_ratio),
                   seed=opts.seed)

    def __init__(self, sizes: Tensor, n_clients: int, q0: Tensor,
                 server: ServerOptConfig | None = None, agg_ratio: float = 1.0,
                 seed: int = 0) -> None:
        super().__init__(sizes, n_clients)
        self._init_sampling(agg_ratio, seed)
        self.global_table = q0.clone()
        self.server_opt = ServerMomentum(server or ServerOptConfig())
        self._acc: Tensor | None = None  # sum_v w_v (U_v - Q), float64
        self._base: Tensor | None = None  # Q, the table this round sent, float64
        self._weights: Tensor | None = None
        self._aggregate: Tensor | None = None

    def _round_weights(self, part_mask: Tensor) -> Tensor:
        raise NotImplementedError

    def sent(self, idx: Tensor) -> Tensor:
        return self.global_table.expand(idx.shape[0], -1, -1).contiguous()

    def begin_round(self, part_mask: Tensor) -> None:
        super().begin_round(part_mask)
        chosen = self._chosen
        assert chosen is not None
        # a Poisson-sampled round (cdp-gaussian) may have no participant: no weights then
        self._weights = (self._round_weights(chosen) if bool(chosen.any())
                         else torch.zeros(self.n, dtype=torch.float64, device=self.device))
        self._acc = torch.zeros_like(self.global_table, dtype=torch.float64)
        self._base = self.global_table.double()

    def add(self, idx: Tensor, uploads: Tensor) -> None:
        """sum_v w_v (U_v - Q) over the chunk, into the round's float64 accumulator."""
        assert self._acc is not None and self._weights is not None
        w = self._weights[idx]
        if self.device.type != "cpu":
            delta = uploads.to(torch.float64, copy=True).sub_(self._base)  # one temporary
            self._acc += torch.einsum("k,kmd->md", w, delta)
            return
        for j in range(uploads.shape[0]):  # client by client, as add_rows adds them
            self._acc.add_((uploads[j].double() - self._base).mul_(w[j]))

    def add_rows(self, idx: Tensor, uploads: Tensor, rows: Tensor) -> None:
        """:meth:`add` over the trained rows only (``rows`` (k, m) bool); elsewhere
        U_v - Q is zero. The (client, row) pairs come client-major, so ``index_add_``
        adds each row's terms in the order :meth:`add` does."""
        assert self._acc is not None and self._weights is not None
        if self.device.type != "cpu" or type(self).add is not _SumAggregator.add:
            self.add(idx, uploads)  # off the CPU, or a subclass's own add: its rule
            return
        who, row = rows.nonzero(as_tuple=True)
        terms = uploads[who, row].double().sub_(self._base[row])
        terms.mul_(self._weights[idx][who][:, None])
        self._acc.index_add_(0, row, terms)

    def take_aggregate(self, table: Tensor) -> None:
        if tuple(table.shape) != tuple(self.global_table.shape):
            raise ValueError(f"aggregate {tuple(table.shape)} does not match the global table "
                             f"{tuple(self.global_table.shape)}")
        self._aggregate = table

    def adopt(self, table: Tensor) -> None:
        """Replace the global table between rounds (m, d): the table a FedPEFT codec's
        starting parameters decode to (docs/design.md section 11)."""
        if tuple(table.shape) != tuple(self.global_table.shape):
            raise ValueError(f"table {tuple(table.shape)} does not match the global table "
                             f"{tuple(self.global_table.shape)}")
        self.global_table = table.to(self.global_table.dtype).clone()

    def end_round(self) -> None:
        if self._aggregate is not None:
            aggregate = self._aggregate.to(self.global_table.dtype)
        else:
            assert self._acc is not None and self._weights is not None
            total = self._weights.sum()  # W: zero weights off the aggregated uploads
            aggregate = self._acc.add_(self._base.mul_(total)).to(self.global_table.dtype)
        self.global_table = self.server_opt.step(self.global_table, aggregate)
        self._aggregate, self._acc, self._base = None, None, None
        self._received()

    @property
    def table(self) -> Tensor:
        return self.global_table


class FedAvgAggregator(_SumAggregator):
    """Q_g = sum_v (|D_v| / sum |D|) U_v over the round's participants (FedAvg)."""

    name = "fedavg"

    def _round_weights(self, part_mask: Tensor) -> Tensor:
        return fedavg_weights(self.sizes, part_mask)


class UniformAggregator(_SumAggregator):
    """Q_g = (1 / n_t) sum_v U_v over the round's n_t participants."""

    name = "uniform"
    equal_weights = True

    def _round_weights(self, part_mask: Tensor) -> Tensor:
        return uniform_weights(self.sizes, part_mask)


class _PerUploadAggregator(Aggregator):
    """An aggregator that keeps the server's copy of each client's last upload (n, m, d).

    ``alias``: when uploads always equal the clients' trained tables (no
    privacy noise), the caller may pass that (n, m, d) tensor and the copy
    shares its storage (nothing is copied on upload). ``store``: the dtype its
    per-client (n, m, d) copies are kept in (``train.state_dtype``; None: q0's);
    what it sends, and its arithmetic, stay in q0's dtype (:meth:`_stored`,
    :meth:`_loaded`).
    """

    needs_each_upload = True

    def _keep_uploads(self, q0: Tensor, alias: Tensor | None,
                      store: torch.dtype | None = None) -> None:
        m, d = q0.shape
        self.dtype = q0.dtype
        self.store = alias.dtype if alias is not None else (store or q0.dtype)
        self.last_upload = (alias if alias is not None
                            else q0.to(self.store).expand(self.n, m, d).clone())
        self.aliased = alias is not None

    def _stored(self, tables: Tensor) -> Tensor:
        """Tables as kept (a no-op unless the state dtype is narrower)."""
        return tables.to(self.store)

    def _loaded(self, tables: Tensor) -> Tensor:
        """Kept tables as sent and computed with (q0's dtype)."""
        return tables.to(self.dtype)

    def add(self, idx: Tensor, uploads: Tensor) -> None:
        if not self.aliased:
            self.last_upload[idx] = self._stored(uploads)

    def _round_uploads(self, mask: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
        """(participant ids, their last uploads) of the round (or of the clients in
        ``mask``); None if nobody took part.

        With full participation the stored uploads are returned without a copy.
        """
        part = (self.part_mask if mask is None else mask).nonzero().squeeze(1)
        if part.numel() == 0:
            return None
        uploads = (self.last_upload if part.numel() == self.n
                   else self.last_upload.index_select(0, part))
        return part, uploads


class SimilarityAggregator(_Sampled, _PerUploadAggregator):
    """FedEM's personalised tables, equation 13: Q_g[u] = sum_v w_uv U_v.

    Keeps the server's copy of each client's last upload (``alias`` as in
    :class:`_PerUploadAggregator`).
    """

    name = "similarity"
    similarity_weights = True

    @classmethod
    def from_options(cls, sizes: Tensor, q0: Tensor, opts: AggregatorOptions) -> Aggregator:
        cls._no_server_step(cls.name, opts)
        rule = (opts.similarity or SimilarityOptions()).similarity
        return cls(sizes, sizes.shape[0], q0, opts.alpha, opts.alias, seed=opts.seed,
                   agg_ratio=float(opts.agg_ratio), similarity=rule, store=opts.store)

    def __init__(self, sizes: Tensor, n_clients: int, q0: Tensor, alpha: float,
                 alias: Tensor | None = None, similarity: str = "eq13",
                 agg_ratio: float = 1.0, seed: int = 0,
                 store: torch.dtype | None = None) -> None:
        super().__init__(sizes, n_clients)
        self.alpha = alpha
        # "eq13" (the paper) or "pca" (the FedEM code, docs/design.md 2a; server.aggregation)
        self.similarity = similarity
        # the share of each round's uploads aggregated (the FedEM code: 0.1, docs/design.md 2a)
        self._init_sampling(agg_ratio, seed)
        m, d = q0.shape
        self._keep_uploads(q0, alias, store)
        self.global_tables = self._stored(q0).expand(n_clients, m, d).clone()
        self.uploaded = torch.zeros(n_clients, dtype=torch.bool, device=self.device)

    def sent(self, idx: Tensor) -> Tensor:
        return self._loaded(self.global_tables.index_select(0, idx))

    def end_round(self) -> None:
        if self.agg_ratio < 1.0:
            # the FedEM code: only the sampled uploads are compared and aggregated, and
            # only their owners receive a (personalised) table next round
            chosen = self._chosen
            assert chosen is not None
            p = fedavg_weights(self.sizes, chosen)
            tables = similarity_aggregate(self.last_upload, p, self.alpha, participating=chosen,
                                          similarity=self.similarity)
            self.global_tables[chosen] = self._stored(tables[chosen])
            self._received()
            return
        self.uploaded |= self.part_mask
        p = fedavg_weights(self.sizes, self.part_mask)
        self.global_tables = self._stored(similarity_aggregate(
            self.last_upload, p, self.alpha, participating=self.part_mask,
            anchored=self.uploaded, similarity=self.similarity))

    @property
    def table(self) -> Tensor:
        return self.global_tables


class GraphAggregator(_Sampled, _PerUploadAggregator):
    """GPFedRec's graph (:mod:`fedem_private.server.graph`) over the round's uploads.

    Sends every client the global table (the mean of the propagated tables) and,
    as the anchor of GPFedRec's regulariser, its personalised table; a client
    that did not take part keeps its last personalised table. Needs each
    upload, like similarity aggregation. ``alias`` as for
    :class:`_PerUploadAggregator`. With ``agg_ratio`` q < 1 (:class:`_Sampled`) the
    graph is built over a random share of the uploads; only their owners receive the
    global table next round and get a new personalised table (the others keep their
    last one as their regulariser's anchor, as a client that did not take part does).
    """

    name = "graph"

    @classmethod
    def from_options(cls, sizes: Tensor, q0: Tensor, opts: AggregatorOptions) -> Aggregator:
        cls._no_server_step(cls.name, opts)
        graph = opts.graph or GraphOptions()
        return cls(sizes, sizes.shape[0], q0, alias=opts.alias, agg_ratio=float(opts.agg_ratio),
                   seed=opts.seed, threshold=graph.threshold, topk=graph.topk,
                   layers=graph.layers, store=opts.store)

    def __init__(self, sizes: Tensor, n_clients: int, q0: Tensor, *, threshold: float,
                 topk: int, layers: int, alias: Tensor | None = None,
                 agg_ratio: float = 1.0, seed: int = 0,
                 store: torch.dtype | None = None) -> None:
        super().__init__(sizes, n_clients)
        self._init_sampling(agg_ratio, seed)
        self.threshold, self.topk, self.layers = threshold, topk, layers
        m, d = q0.shape
        self._keep_uploads(q0, alias, store)
        self.global_table = q0.clone()
        self.personal = self._stored(q0).expand(n_clients, m, d).clone()

    def sent(self, idx: Tensor) -> Tensor:
        return self.global_table.expand(idx.shape[0], -1, -1).contiguous()

    def anchor(self, idx: Tensor) -> Tensor:
        return self._loaded(self.personal.index_select(0, idx))

    def end_round(self) -> None:
        # the graph over the sampled uploads only when agg_ratio < 1
        round_uploads = self._round_uploads(self._chosen)
        if round_uploads is None:
            return
        part, uploads = round_uploads
        personal, self.global_table = graph_tables(self._loaded(uploads),
                                                   threshold=self.threshold,
                                                   topk=self.topk, layers=self.layers)
        self.personal[part] = self._stored(personal)
        self._received()

    @property
    def table(self) -> Tensor:
        return self.global_table


class FedMergeAggregator(_PerUploadAggregator):
    """FedMerge (docs/design.md section 12): K global tables, one merged table per client.

    Sends client u Q_sent[u] = sum_k softmax(a_u)_k G_k (12.1), also as the
    anchor of a backbone's regulariser; after the round fits the tables and
    the participants' logits to their uploads by :func:`~fedem_private.server.
    fedmerge.fit` on (12.2), warm-started from the last round. A client that
    did not take part keeps its logits (its merged table still follows the
    refitted tables). Needs each upload; ``alias`` as for
    :class:`_PerUploadAggregator`.
    """

    name = "fedmerge"

    @classmethod
    def from_options(cls, sizes: Tensor, q0: Tensor, opts: AggregatorOptions) -> Aggregator:
        cls._no_server_step(cls.name, opts)
        fit = opts.fedmerge or FedMergeOptions()
        return cls(sizes, sizes.shape[0], q0, k=int(fit.k),
                   fit_cfg=FitConfig(steps=fit.steps, lr=fit.lr), seed=opts.seed,
                   alias=opts.alias, store=opts.store)

    def __init__(self, sizes: Tensor, n_clients: int, q0: Tensor, *, k: int, fit_cfg: FitConfig,
                 seed: int, alias: Tensor | None = None,
                 store: torch.dtype | None = None) -> None:
        super().__init__(sizes, n_clients)
        self.fit_cfg = fit_cfg
        self._keep_uploads(q0, alias, store)
        self.tables = initial_tables(q0, k, seed)  # (K, m, d) float64
        self.logits = torch.zeros((n_clients, k), dtype=torch.float64, device=self.device)
        self.personal = self._stored(merged_tables(self.logits, self.tables))
        self.objective: list[float] = []
        self._stats: dict[str, float] = {}

    @property
    def weights(self) -> Tensor:
        """Every client's merge weights softmax(a_u): (n, K), on the simplex."""
        return torch.softmax(self.logits, dim=1)

    def sent(self, idx: Tensor) -> Tensor:
        return self._loaded(self.personal.index_select(0, idx))

    def anchor(self, idx: Tensor) -> Tensor:
        return self._loaded(self.personal.index_select(0, idx))

    def end_round(self) -> None:
        round_uploads = self._round_uploads()
        if round_uploads is None:
            return
        part, uploads = round_uploads
        res = fit(uploads, self.tables, self.logits.index_select(0, part), self.fit_cfg)
        self.tables = res.tables
        self.logits[part] = res.logits
        self.objective = res.objective
        self.personal = self._stored(merged_tables(self.logits, self.tables))
        entries = part.numel() * self.tables[0].numel()
        self._stats = {"fedmerge_entropy": float(weight_entropy(self.logits).mean()),
                       "fedmerge_fit_mse": res.objective[-1] / entries}

    def round_stats(self) -> dict[str, float]:
        return dict(self._stats)

    @property
    def table(self) -> Tensor:
        return self.personal


class NoAggregator(Aggregator):
    """``local``: the server sends nothing; each client continues from its own table."""

    name = "none"
    sends_table = False
    takes_uploads = False

    @classmethod
    def from_options(cls, sizes: Tensor, q0: Tensor, opts: AggregatorOptions) -> Aggregator:
        cls._no_server_step(cls.name, opts)
        return cls(sizes, sizes.shape[0])

    def sent(self, idx: Tensor) -> None:
        return None

    def add(self, idx: Tensor, uploads: Tensor) -> None:
        return None

    def end_round(self) -> None:
        return None


@dataclass(frozen=True)
class AggregatorOptions:
    """Every aggregator's options; each class's ``from_options`` takes its own.

    ``alpha``: similarity's self weight; ``alias``: the clients' tables a per-upload copy
    may share (no noise); ``graph``: GPFedRec's (:class:`~fedem_private.server.options.
    GraphOptions`); ``fedmerge``: FedMerge's (:class:`~fedem_private.server.options.
    FedMergeOptions`; its initial tables keyed by ``seed``); None: their defaults;
    ``server``: the sum aggregators' step on the aggregate (:class:`ServerMomentum`);
    ``similarity``: the similarity aggregator's rule (:class:`~fedem_private.server.options.
    SimilarityOptions`, docs/design.md 2a; its alpha is ``alpha``); ``agg_ratio``: the
    share of each round's uploads aggregated (:class:`_Sampled`); ``store``: the dtype of
    a per-upload aggregator's per-client copies (``train.state_dtype``; None: q0's).
    """

    alpha: float = 0.9
    alias: Tensor | None = None
    graph: GraphOptions | None = None
    fedmerge: FedMergeOptions | None = None
    seed: int = 0
    server: ServerOptConfig | None = None
    similarity: SimilarityOptions | None = None
    agg_ratio: float = 1.0
    store: torch.dtype | None = None


class DenseFedAvg:
    """Non-item shared groups (an MLP, a FedPEFT codec's parameters), averaged over the
    participants with FedAvg weights (``uniform``: 1 / n_t each). Under the FedEM code's
    ``agg_clients_ratio`` (docs/design.md 2a) :meth:`begin_round` is given the sampled share
    instead (:meth:`Aggregator.aggregated`): the mean is over those uploads alone, and the
    round loop sends it only to their owners, as it does the item table."""

    def __init__(self, sizes: Tensor, init: dict[str, Tensor], uniform: bool = False,
                 server: ServerOptConfig | None = None) -> None:
        self.sizes = sizes
        self.uniform = uniform
        self.server_opts = {k: ServerMomentum(server or ServerOptConfig()) for k in init}
        self.params = {k: v.clone() for k, v in init.items()}
        self._acc: dict[str, Tensor] = {}
        self._weights: Tensor | None = None

    def sent(self, k: int) -> dict[str, Tensor]:
        """The global groups, repeated for k clients."""
        return {n: v.expand(k, *v.shape).contiguous() for n, v in self.params.items()}

    def begin_round(self, part_mask: Tensor) -> None:
        weights = uniform_weights if self.uniform else fedavg_weights
        self._weights = (weights(self.sizes, part_mask) if bool(part_mask.any())
                         else torch.zeros_like(self.sizes, dtype=torch.float64))
        self._acc = {n: torch.zeros_like(v, dtype=torch.float64) for n, v in self.params.items()}

    def add(self, idx: Tensor, uploads: dict[str, Tensor]) -> None:
        assert self._weights is not None
        w = self._weights[idx]
        for n, v in uploads.items():
            self._acc[n] += torch.tensordot(w, v.double(), dims=1)

    def take_aggregate(self, groups: dict[str, Tensor]) -> None:
        """Adopt the round's central aggregate of the groups (cdp-gaussian: unweighted)."""
        self._acc = {n: groups[n] for n in self.params}

    def end_round(self) -> None:
        self.params = {n: self.server_opts[n].step(self.params[n], v.to(self.params[n].dtype))
                       for n, v in self._acc.items()}
        self._acc = {}
