"""The federated round loop, vectorised over clients (docs/design.md sections 3, 7 and 9).

A method is a composition of parts, each with one job and each chosen by
name from its own room; this loop only composes them and names none:

- backbone (:mod:`fedem_private.models`): trains a chunk, scores items;
- merge (:class:`~fedem_private.client.merging.Merger`): the start table;
- codec (:mod:`fedem_private.client.codecs`): shared groups <-> upload;
- privacy (:class:`~fedem_private.privacy.layer.PrivacyLayer`): releases uploads;
- aggregator (:mod:`fedem_private.server.aggregators`): the next tables.

Round t, for the clients taking part (all unless a client fraction is set):

1. the server sends Q_sent[u] (the global table, u's personalised table, or
   nothing: the client keeps its own) and the dense shared groups;
2. the client builds its starting table: static replacement uses Q_sent[u];
   elastic merging first trains its adapter (equation 11), then merges
   (equation 10);
3. local training (equation 12) gives Q_l[u] and the client's other groups;
4. the upload, the encoded shared groups through the privacy layer, is all
   that leaves it;
5. the server decodes and aggregates the uploads.

Under a central mechanism (cdp-gaussian, docs/design.md section 5) the privacy
layer picks the participants (Poisson sampling) and steps 4 and 5 change:
each client's encoded (sent, trained) pair goes into the layer's secure sum
(:meth:`~fedem_private.privacy.layer.PrivacyLayer.contribute`), no upload is
decoded or observed, and after the last chunk the layer releases ONE noisy
aggregate, which the (sum-based) aggregator adopts as the next global table.

Under a FedPEFT codec (``lora``, ``hash``, ``rqvae`` and their ``c-``
variants; docs/design.md section 11) the first W rounds are ordinary full-table
rounds; then the server freezes its global table as E0 and from round W + 1
sends, trains and averages only the codec's parameters theta: the backbone
trains theta through the codec's item rows (it never knows), the privacy
layer releases the encoded theta, the server averages theta (the
aggregator's weights) and hands the aggregator the table E0 + f_theta it
decodes to, which is what clients are sent and the attacks see. A merge
(EM) merges decoded tables, the client's own and the sent one; the merge's
offset from the sent table stays on the client as part of its frozen base.

Communication (bytes per client per round, up and down) is counted from the
tensors each client sends and receives.

Clients are processed in chunks sorted by workload; every random draw is keyed
by (seed, round, client), so chunking never changes results.

Device (``train.device``, docs/design.md section 13): the client state (:class:`SimState`),
the aggregators' tables, each chunk's training tensors, the merge adapters, the
privacy layer's clipping and noise addition and the evaluation's scores live on
``Simulation.device``. Random draws are made on the CPU exactly as on a CPU run
(:mod:`fedem_private.rng`) and moved there, and the per-chunk plans are built
in numpy and moved once per chunk. Client ids (numpy) stay on the CPU; their
index tensors (``idx``) are made on the device.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from fedem_private import hostmem, models, rng
from fedem_private.client import codecs
from fedem_private.client.merging import (
    MergeConfig,
    Merger,
    MergeState,
    merge_tables,
    merge_with_rho,
)
from fedem_private.client.variant_options import (
    MergeEveryOptions,
    MergeRowsOptions,
    ProxOptions,
)
from fedem_private.client.variants import merge_seen_rows, prox_rows, seen_mask
from fedem_private.data.split import Split, exclusion_csr
from fedem_private.device import torch_device
from fedem_private.errors import UserError
from fedem_private.evaluation.metrics import (
    EvalSets,
    RankAccumulator,
    build_eval_sets,
    eval_sample,
)
from fedem_private.hostmem import keep_freed_memory
from fedem_private.models.base import (
    ClientParams,
    ClientSamples,
    LocalTrainConfig,
    draw_samples,
    num_steps,
)
from fedem_private.privacy.layer import PrivacyLayer, server_sizes
from fedem_private.server import aggregators
from fedem_private.server import registry as aggregator_registry
from fedem_private.server.options import (
    FedMergeOptions,
    GraphOptions,
    ServerStepOptions,
    SimilarityOptions,
)
from fedem_private.server.pretrain import pretrain_items
from fedem_private.simulation.config import SGD_FIELDS, RunConfig, with_cohort
from fedem_private.simulation.sparse_tables import (
    MERGED,
    OWN,
    SENT,
    SparseTables,
    estimate_bytes,
)
from fedem_private.simulation.view import RunView, read_only

SERVER = 1 << 40  # client id used to key the server's own random draws
# the most clients trained side by side (the memory budget may allow fewer): on the CPU
# larger chunks only pad more; a GPU needs wide chunks to hide its per-kernel overhead
MAX_CHUNK = 64
MAX_CHUNK_CUDA = 2048


@dataclass
class ChunkView:
    """What one chunk of clients did in a round (for recording and attacks).

    ``sent`` and ``upload`` are item tables (k, m, d): the decoded upload,
    i.e. what the server's aggregation and attacks see of the item table.
    ``dense_sent`` holds the shared dense groups the server sent (e.g. FedNCF's
    MLP), client axis first; empty for a backbone without any. After a FedPEFT
    codec's warm-up, ``theta_sent`` and ``theta_upload`` are the codec's parameters
    the server sent and decoded from the released upload (name -> (k, ...)): the
    server holds both, and ``sent`` / ``upload`` are the tables they decode to;
    empty otherwise.
    """

    round: int
    clients: np.ndarray
    sent: torch.Tensor
    upload: torch.Tensor
    samples: ClientSamples
    dense_sent: dict[str, torch.Tensor] = field(default_factory=dict)
    theta_sent: dict[str, torch.Tensor] = field(default_factory=dict)
    theta_upload: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class AggregateView:
    """One round of a central mechanism as the server sees it (docs/design.md section 6).

    Under ``cdp-gaussian`` no upload is observed: the secure sum hides each one and
    only the noisy aggregate is released. ``sent`` is the global item table of the
    round's start, ``released`` the one after the noisy aggregate was applied (both
    (m, d)); ``participants`` are the round's Poisson-sampled clients, known to the
    aggregator but not to observers of the released models.
    """

    round: int
    participants: np.ndarray
    sent: torch.Tensor
    released: torch.Tensor


@dataclass
class RoundStats:
    """One row of metrics.csv."""

    round: int
    seconds: float
    participants: int
    metrics: dict[str, dict[str, float]] | None = None
    privacy: dict[str, float] = field(default_factory=dict)
    # rho_mean: mean over merging clients (and items) of the weight on Q_g (eq. 10)
    merge: dict[str, float] = field(default_factory=dict)
    # the aggregator's own figures (Aggregator.round_stats), e.g. FedMerge's weight entropy
    server: dict[str, float] = field(default_factory=dict)
    # bytes_up / bytes_down: mean bytes per participant this round; bytes_setup: one-time
    # downloads of the round (a FedPEFT codec's E0 and codes, to every client)
    comm: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {"round": self.round, "seconds": self.seconds,
                                             "participants": self.participants}
        for kind, values in (self.metrics or {}).items():
            for name, value in values.items():
                out[f"{kind}_{name}"] = value
        out.update(self.privacy)
        out.update(self.merge)
        out.update(self.server)
        out.update(self.comm)
        return out


#: the round number keying evaluation's fine-tuning draws (plus the rounds done): far from
#: every training round, so its negatives and orders are never a round's
FINETUNE_ROUND = 1 << 40


def _check_state_fits(cfg: RunConfig, n: int, q0: torch.Tensor, store: torch.dtype,
                      device: torch.device, sparse: int | None = None) -> None:
    """Refuse, in one line, a run whose per-client item tables cannot fit: under
    ``--client-tables kept`` every client keeps its own (m, d) table between rounds
    (``SimState.q_local``), n m d entries of ``store`` before anything else, so a
    population of 10^6 users on ML-100K's catalogue (d 16, float32) would need 100 GiB;
    under ``sparse`` the clients' stored rows, ``sparse`` bytes by the end of the run
    (:func:`~fedem_private.simulation.sparse_tables.estimate_bytes`). Where the memory
    free for it is known (the host's ``MemAvailable``; a GPU's free memory) and smaller,
    the run stops before allocating, with the size it would need, instead of being killed
    by the kernel part way."""
    need = (n * q0.numel() * torch.empty((), dtype=store).element_size() if sparse is None
            else sparse)
    if device.type == "cuda":
        free = int(torch.cuda.mem_get_info(device)[0])
    else:
        free = hostmem.available_bytes()
    if free is None or need <= free:
        return
    m, d = q0.shape[0], q0.shape[-1]
    if sparse is not None:
        raise UserError(
            f"{cfg.federation.resolved_method} with --client-tables sparse keeps the rows each "
            f"client trained: about {hostmem.gib(need)} of state for {n:,} clients over "
            f"{cfg.train.rounds} rounds (an estimate), and {hostmem.gib(free)} is free on "
            f"{device.type}; use fewer users, a smaller cohort, fewer rounds, "
            f"--state-dtype bfloat16, or a smaller --dim")
    raise UserError(
        f"{cfg.federation.resolved_method} keeps an item table per client: {n:,} clients x "
        f"{m:,} items x {d} x {torch.empty((), dtype=store).element_size()} B = "
        f"{hostmem.gib(need)} of state, and {hostmem.gib(free)} is free on {device.type}; "
        f"use fewer users, --state-dtype bfloat16, or a smaller --dim")


class RoundSharding(Protocol):
    """How a run computes its rounds' clients elsewhere (:meth:`Simulation.shard`):
    ``simulation/shards.py``'s executors, which use this module, never the reverse."""

    def check(self, sim: Simulation) -> None:
        """Refuse, in one line, a run whose rounds cannot be sharded exactly."""

    def run(self, sim: Simulation, rnd: RoundWork) -> None:
        """Round ``rnd``'s clients: their secure-sum parts added here in chunk order."""


@dataclass
class SimState:
    """All client state, as batched tensors on the run's device (the server's lives in its
    aggregators)."""

    q_local: torch.Tensor | None  # (n, m, d) each client's table after its last training,
    # kept in train.state_dtype (read through params / items, which return the compute
    # dtype); None under train.client_tables "global": no client keeps one (``shared``),
    # and under "sparse": each keeps the rows it trained (``sparse``)
    private: dict[str, torch.Tensor]  # (n, ...) groups that never leave a client (p_u, heads);
    # per-client tables among them (n, m, d: FedRAP's personal table) in train.state_dtype
    dense_local: dict[str, torch.Tensor]  # (n, ...) each client's own shared dense groups
    q_global: torch.Tensor | None  # (m, d) shared, or (n, m, d) personalised, or None
    round: int = 0
    dtype: torch.dtype = torch.float32  # the compute dtype tables are read in
    # without q_local: the server's current table for clients idx (the aggregator's sent)
    shared: Callable[[torch.Tensor], torch.Tensor] | None = None
    # train.client_tables "sparse": each client's table as the rows it trained since the
    # tables the server sent it (rebuilt when read; Simulation._train keeps it)
    sparse: SparseTables | None = None

    def items(self, idx: torch.Tensor) -> torch.Tensor:
        """Clients idx's own item tables Q_l (k, m, d), in the compute dtype (under sparse
        tables, rebuilt from their rows: :meth:`SparseTables.tables`); without kept
        tables, the server's current one."""
        if self.sparse is not None:
            return self.sparse.tables(idx)
        if self.q_local is None:
            assert self.shared is not None
            return self.shared(idx).to(self.dtype)
        return self.q_local.index_select(0, idx).to(self.dtype)

    def keep_items(self, idx: torch.Tensor, tables: torch.Tensor) -> None:
        """Store clients idx's newly trained tables (rounded to the state dtype); without
        kept tables, nothing (the trained table leaves only as its upload)."""
        if self.q_local is not None:
            self.q_local[idx] = tables.to(self.q_local.dtype)

    @property
    def p(self) -> torch.Tensor:
        """The user vectors p_u (n, d) of a backbone that has them."""
        return self.private["p"]

    def params(self, idx: torch.Tensor, items: bool = True) -> ClientParams:
        """Clients idx's own current model; ``items`` False leaves out their item tables
        (an empty (k, 0, d) stands in: reading them is a pass over (k, m, d))."""
        table = (self.items(idx) if items else
                 torch.empty((idx.shape[0], 0, self._dim()), dtype=self.dtype,
                             device=idx.device))
        return ClientParams(table,
                            {n: t.index_select(0, idx) for n, t in self.dense_local.items()},
                            {n: t.index_select(0, idx).to(self.dtype)
                             for n, t in self.private.items()})

    def _dim(self) -> int:
        if self.q_local is not None:
            return int(self.q_local.shape[2])
        if self.sparse is not None:
            return self.sparse.dim
        assert self.shared is not None
        return int(self.shared(torch.zeros(0, dtype=torch.long)).shape[2])

    def keep_private(self, idx: torch.Tensor, name: str, value: torch.Tensor) -> None:
        """Store clients idx's newly trained private group ``name`` (in its stored dtype)."""
        self.private[name][idx] = value.to(self.private[name].dtype)


@dataclass
class RoundWork:
    """One round's explicit state between its stages (:meth:`Simulation._step`)."""

    t: int
    t0: float  # perf_counter at the round's start
    clients: np.ndarray  # the round's participants
    peft: bool  # whether the wire is a FedPEFT codec's theta this round
    before: torch.Tensor | None  # the global table at the start (central, observed)
    setup_bytes: int = 0
    rho_sum: float = 0.0
    rho_n: int = 0
    up_bytes: int = 0
    down_bytes: int = 0
    privacy_stats: dict[str, float] = field(default_factory=dict)


@dataclass
class ChunkWork:
    """One chunk of clients through a round's stages: what it was sent, what it trained
    and what it encodes for upload (filled stage by stage)."""

    chunk: np.ndarray  # client ids
    idx: torch.Tensor  # the same on the run's device
    samples: ClientSamples
    start: ClientParams  # the start of local training (the merge replaces its items)
    sent: torch.Tensor  # (k, m, d) what the server sent (observers' view of it)
    dense_sent: dict[str, torch.Tensor]
    recv: torch.Tensor | None  # (k,) who got a table under the share rule; None: all
    merged: bool = False
    rows: object | None = None  # what local training trains the item vectors through
    batch_rows: object | None = None  # the FedEM code's per-batch merge rows
    theta_sent: dict[str, torch.Tensor] | None = None  # a FedPEFT codec's sent theta
    new: ClientParams | None = None  # after local training
    touched: torch.Tensor | None = None  # (k, m) rows local training touched
    enc_sent: torch.Tensor | None = None  # the encoded release centre
    enc_new: torch.Tensor | None = None  # the encoded trained groups
    touched_rows: torch.Tensor | None = None
    # what equation 10 used beyond the two tables (sparse tables only): the adapters, or a
    # pooled merge's rho (k,); None: a fixed rho
    merge_used: MergeState | torch.Tensor | None = None

    @property
    def k(self) -> int:
        return int(self.chunk.shape[0])

    @functools.cached_property
    def n_recv(self) -> int:
        """How many of the chunk got a table (read once: a device sync off the CPU)."""
        return self.k if self.recv is None else int(self.recv.sum())


class ReleasedUploads:
    """How uploads travel under no mechanism or a local one: each client's encoded pair
    is released by the privacy layer, decoded by the server, added to the aggregator (or
    a FedPEFT codec's theta) and shown to the observers (recording, attacks)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def upload(self, rnd: RoundWork, work: ChunkWork) -> None:
        """Steps 4-5 for one chunk: privatise, decode, aggregate, observe."""
        sim = self.sim
        released = sim.privacy.release(work.enc_sent, work.enc_new, work.chunk,
                                       work.touched_rows)
        decoded = sim.wire(rnd).decode(released)
        rnd.up_bytes += work.k * wire_bytes(decoded)
        theta_up: dict[str, torch.Tensor] = {}
        if rnd.peft:
            assert sim.codec_server is not None
            theta_up, dense_upload = decoded
            sim.codec_server.add(work.idx, theta_up)
            upload = sim.codec.table(theta_up)  # what the server decodes (E0 + f_theta)
        else:
            upload, dense_upload = decoded
            rows = self._trained_rows(rnd, work, released)
            if rows is None:
                sim.aggregator.add(work.idx, upload)
            else:
                sim.aggregator.add_rows(work.idx, upload, rows)
        if sim.dense is not None:
            sim.dense.add(work.idx, dense_upload)
        for observe in sim.observers:
            observe(ChunkView(rnd.t, work.chunk, work.sent, upload, work.samples, work.dense_sent,
                              work.theta_sent or {}, theta_up))

    def _trained_rows(self, rnd: RoundWork, work: ChunkWork,
                      released: torch.Tensor) -> torch.Tensor | None:
        """The rows (k, m) outside which each upload of the chunk is the table the server
        sent it (:meth:`Aggregator.add_rows`), or None where that is not known: the
        release is the trained table itself (no perturbation), every client trained from
        the table it was sent (received, not merged) through the table's own rows (no
        codec or per-batch rows), and those rows are what local training reports as
        moved."""
        if (rnd.peft or released is not work.enc_new or self.sim.privacy.perturbs
                or work.recv is not None or work.merged or work.rows is not None):
            return None
        return work.touched

    def finish(self, rnd: RoundWork) -> None:
        """Nothing to release at the end of the round."""


class SecureSumUploads(ReleasedUploads):
    """How uploads travel under a central mechanism (cdp-gaussian): each client's encoded
    pair goes into the privacy layer's secure sum, nothing per client is released,
    decoded or observed, and the round's one noisy aggregate is taken at its end."""

    def upload(self, rnd: RoundWork, work: ChunkWork) -> None:
        """Into the secure sum: no upload is released or observed."""
        sim = self.sim
        items = self.items_of(work.chunk)
        sim.privacy.contribute(work.enc_sent, work.enc_new, work.chunk,
                               self.sum_rows(rnd, work), items)
        if items is None:
            rnd.up_bytes += work.k * wire_bytes(sim.wire(rnd).decode(work.enc_new[:1]))
        else:  # under secure aggregation: the released rows, dense, and the m item counts
            released = int(sim.privacy.released_rows(work.enc_new.shape[1]))
            rnd.up_bytes += work.k * (released * work.enc_new.shape[2]
                                      * work.enc_new.element_size() + items[2] * 4)

    def sum_rows(self, rnd: RoundWork, work: ChunkWork) -> torch.Tensor | None:
        """The encoded rows (k, n) outside which each client's upload is exactly the table
        it was sent, so the secure sum may be formed from them alone (the cost of a round
        then grows with the rows trained, not the catalogue; docs/design.md section 18),
        or None where that is not known: the same conditions as
        :meth:`ReleasedUploads._trained_rows` (no codec, no merge, every client sent the
        table, training through the table's own rows), and :attr:`sparse_sums` on."""
        if not self.sparse_sums or (rnd.peft or work.recv is not None or work.merged
                                    or work.rows is not None):
            return None
        return work.touched_rows

    def items_of(self, chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The chunk's training items (indptr, items, m) in CSR, for private row selection
        (each client's indicator of its own items joins the secure sum); None without it."""
        sim = self.sim
        if not sim.privacy.selects_rows:
            return None
        ptr, m = sim.split.train_indptr, int(sim.split.n_items)
        chunk = np.asarray(chunk, dtype=np.int64)
        lo, hi = ptr[chunk].astype(np.int64), ptr[chunk + 1].astype(np.int64)
        owner = np.repeat(np.arange(chunk.shape[0], dtype=np.int64), hi - lo)
        pos = np.arange(owner.shape[0]) - np.repeat(np.cumsum(hi - lo) - (hi - lo), hi - lo) \
            + np.repeat(lo, hi - lo)
        key = np.unique(owner * m + sim.split.train_items[pos].astype(np.int64))
        indptr = np.searchsorted(key // m, np.arange(chunk.shape[0] + 1)).astype(np.int64)
        return indptr, key % m, m

    #: whether the secure sum is formed from the trained rows where that is exact (off:
    #: the dense reference over every row, for tests)
    sparse_sums: bool = True

    def finish(self, rnd: RoundWork) -> None:
        """The round's one noisy aggregate to the aggregator and the dense groups."""
        self.sim._take_central_aggregate(rnd.peft)


def wire_bytes(groups: dict[str, torch.Tensor] | tuple[object, ...]) -> int:
    """Bytes one client sends or receives: the sizes of its tensors (client axis first).

    ``groups`` is a dict of (k, ...) tensors, or a codec's decoded upload (a
    table and / or dicts of them).
    """
    if isinstance(groups, tuple):
        return sum(wire_bytes(g if isinstance(g, dict) else {"t": g})  # type: ignore[arg-type]
                   for g in groups)
    return sum(int(t[0].numel()) * t.element_size() for t in groups.values())


def validation_kind(cfg: RunConfig) -> str | None:
    """Whether (and against which negatives) the validation item is ranked (docs/design.md 2a):
    ``"shared"`` with ``--shared-eval-negatives``, ``"separate"`` when the reported round is
    chosen by validation HR@10 (sampled or full) without it, else None (no validation
    metric)."""
    if cfg.data.shared_eval_negatives:
        return "shared"
    return "separate" if cfg.train.select_round in ("best-val", "best-val-full") else None


class Simulation:
    """A configured run over one split; call :meth:`run` or :meth:`step` round by round."""

    def __init__(self, cfg: RunConfig, split: Split, *, dataset_name: str | None = None,
                 demographics: dict[str, np.ndarray] | None = None,
                 item_features: np.ndarray | None = None) -> None:
        #: the configuration as given (what a run directory's config.toml records, so the
        #: run can be repeated); ``cfg`` adds what it derives, the cohort's rate
        self.config = cfg.validate().resolved()
        self.cfg = with_cohort(self.config, split.n_users)
        self.split = split
        #: the ranks of the last evaluation (:meth:`ranks`), None before one
        self.last_ranks: RankAccumulator | None = None
        self.dataset_name = dataset_name or self.cfg.data.dataset
        self.demographics = demographics or {}
        # (m, k_p) item attributes, row i = item i (FedPEFT's pre-training); None: none
        self.item_features = item_features
        tr, fed = self.cfg.train, self.cfg.federation
        # the training and mechanism streams' key (train.nonce); the data and the
        # evaluation sets are keyed by the seed alone, so runs that differ only in their
        # nonce are evaluated on the same candidates
        self.seed = tr.run_seed
        self.device = torch_device(tr.device)  # of every heavy tensor (module docstring)
        self.aggregation = fed.resolved_aggregation
        self.merge_cfg = MergeConfig.from_config(fed)
        # issue 69: equation 10 on the client's own items only; the proximal weight mu
        self.merge_seen = MergeRowsOptions.from_config(fed).rows == "seen"
        self.prox_mu = ProxOptions.from_config(fed).mu
        self.merge_schedule = MergeEveryOptions.from_config(fed)  # issue 69: --merge-every
        self.privacy = PrivacyLayer(self.cfg.privacy, rounds=tr.rounds,
                                    n_clients=split.n_users, lr=tr.lr,
                                    sizes=split.train_counts, seed=self.seed,
                                    client_keys=split.source_users)
        self.local_cfg = LocalTrainConfig(epochs=tr.local_epochs, batch_size=tr.batch_size,
                                          lr=tr.lr, num_negatives=tr.num_negatives,
                                          grad_clip=self.privacy.local_grad_clip,
                                          early_stop_tol=tr.early_stop_tol,
                                          optimizer=tr.optimizer,
                                          **{n: getattr(tr, n) for n in SGD_FIELDS})
        self.excl = exclusion_csr(split, self.cfg.data.protocol)
        # with train.eval_users, the sets of the evaluated sample only (issue 66)
        self.eval_sets: EvalSets = build_eval_sets(
            split, self.cfg.data.protocol, tr.seed, validation=validation_kind(self.cfg),
            users=self.eval_sample() if tr.eval_users else None)
        # the data sizes as the server may use them (docs/design.md section 5): |D_u| with no
        # mechanism or when declared public, else all ones (uniform weights)
        self.sizes = torch.from_numpy(server_sizes(split.train_counts, self.cfg.privacy)
                                      ).to(self.device)
        self.backbone = models.build(fed.resolved_backbone, split.n_items, tr.dim, self.seed,
                                     tr.init_std, config=fed)
        if self.local_cfg.optimizer not in self.backbone.optimizers:
            raise UserError(f"--optimizer {self.local_cfg.optimizer} is not built for backbone "
                            f"{self.backbone.name!r}")
        self._build_parts()
        n_samples = split.train_counts * (1 + tr.num_negatives)
        self._workload = num_steps(n_samples, self.local_cfg)
        # whether the last round ran with the host allocator tuned (fedem_private.hostmem)
        self.host_allocator_tuned = False
        self.observers: list[Callable[[ChunkView], None]] = []
        # under a central mechanism, called once per round with the released aggregate
        self.aggregate_observers: list[Callable[[AggregateView], None]] = []
        # issue 66 item 4: where the round's clients are computed in shards (shard()); None:
        # here, chunk by chunk
        self.shards: RoundSharding | None = None
        if self.cfg.privacy.clip_auto:
            self._auto_clip()
        #: what the harness (recording, summaries, benchmarks) reads of the run
        self.view = self._make_view()

    # the harness's attachments, left out of a pickled simulation (checkpoints) and made
    # afresh when it is read back: the view's accessors are closures over the live run
    _UNPICKLED = ("view", "observers", "aggregate_observers", "shards")
    # the data, a function of the config: left out too (at 10^6 users the split and its
    # exclusion CSR were 2 GB of each checkpoint) and read again by the resumed run
    # (attach_split), which checks it against the digest kept in their place
    _FROM_DATA = ("split", "excl")

    def __getstate__(self) -> dict[str, object]:
        """The run's state for a checkpoint (:mod:`fedem_private.experiments.checkpoint`):
        every attribute but the harness's attachments and the data, with the split's
        digest (:meth:`Split.digest`, computed once per run)."""
        if getattr(self, "_split_digest", None) is None:
            self._split_digest = self.split.digest()
        return {k: v for k, v in self.__dict__.items()
                if k not in self._UNPICKLED + self._FROM_DATA}

    def __setstate__(self, state: dict[str, object]) -> None:
        """A simulation read back without its data: :meth:`attach_split` gives it back (a
        checkpoint written before the data was left out holds its split: its digest)."""
        if state.get("split") is not None and state.get("_split_digest") is None:
            state = dict(state, _split_digest=state["split"].digest())
        self.__dict__.update(state)
        self.split = None  # type: ignore[assignment]
        self.excl = None  # type: ignore[assignment]
        self.observers = []
        self.aggregate_observers = []
        self.shards = None  # an executor is the harness's, attached afresh (shard())
        self.view = self._make_view()

    def attach_split(self, split: Split) -> None:
        """Give a simulation read back from a checkpoint its data: ``split``, read again from
        the config, must be the one it was saved with (its digest); the exclusion CSR is
        rebuilt from it. A split that differs (the data files changed since) is a user
        error: the run would go on with other users' data."""
        if split.digest() != self._split_digest:
            raise UserError("the checkpoint's run was made on other data than its config reads "
                            "now (the split's digest differs); remove the checkpoint to start "
                            "the run afresh")
        self.split = split
        self.excl = exclusion_csr(split, self.cfg.data.protocol)
        self.view = self._make_view()

    def _make_view(self) -> RunView:
        """The run's read-only :class:`~fedem_private.simulation.view.RunView`: its
        accessors read the live round, host allocator flag and privacy reports (after
        ``--clip auto`` the mechanism's parameters are the re-derived ones)."""
        layer = self.privacy
        return RunView(
            cfg=self.cfg, split=self.split, dataset_name=self.dataset_name,
            demographics=read_only(self.demographics), seed=self.seed, device=self.device,
            central=layer.central, dpsgd=layer.dpsgd,
            _round=lambda: self.state.round, _tuned=lambda: self.host_allocator_tuned,
            _participants=self.participants, _excl=self.excl,
            _privacy_params=lambda: layer.params.as_log(), _privacy_summary=layer.summary,
            _privacy_ledger=layer.ledger_dict)

    def observe(self, on_chunk: Callable[[ChunkView], None] | None = None,
                on_aggregate: Callable[[AggregateView], None] | None = None) -> None:
        """Register observers: ``on_chunk`` sees each chunk's released uploads (no mechanism
        or a local one), ``on_aggregate`` each round's released aggregate (a central one)."""
        if on_chunk is not None:
            self.observers.append(on_chunk)
        if on_aggregate is not None:
            self.aggregate_observers.append(on_aggregate)

    def shard(self, executor: RoundSharding | None) -> None:
        """Compute each round's clients in shards through ``executor`` (None: here again);
        the results are the same bits (:mod:`fedem_private.simulation.shards`). Refused, in
        one line, where a round cannot be sharded exactly (``shards.check_shardable``)."""
        if executor is not None:
            executor.check(self)
        self.shards = executor

    def _auto_clip(self) -> None:
        """``--clip auto``: the DP warm-up of :mod:`fedem_private.privacy.clip_auto`.

        Every client trains once from the table it would be sent in round 1,
        measures its delta's norm (L1, or L2 under ldp-gaussian) and releases
        it noised; the state is left untouched (the trained tables are dropped).
        """
        from fedem_private.privacy.clip_auto import WARMUP_ROUND, estimate_clip, noisy_log_norms

        pc = self.cfg.privacy
        clients = np.arange(self.split.n_users)
        norms = np.zeros(clients.shape[0], dtype=np.float64)
        for chunk in self._chunks(clients):
            idx = self._index(chunk)
            samples = draw_samples(self.seed, WARMUP_ROUND, chunk, self.split.train_indptr,
                                   self.split.train_items, *self.excl, self.split.n_items,
                                   self.local_cfg.num_negatives, device=self.device)
            start = self._sent_params(idx)
            new, _ = self.backbone.train_chunk(start, chunk, samples, self.local_cfg,
                                               WARMUP_ROUND)
            # the norm of the whole encoded upload's delta: what the mechanism clips
            delta = (self.full_codec.encode(new.items, new.dense).double()
                     - self.full_codec.encode(start.items, start.dense).double())
            delta = delta.reshape(chunk.shape[0], -1)
            norm = (delta.norm(dim=1) if pc.mechanism.norm == "l2"  # the mechanism's clip norm
                    else delta.abs().sum(dim=1))
            norms[chunk] = norm.cpu().numpy()
        released = noisy_log_norms(norms, clients, pc.clip_auto_min, pc.clip_auto_max,
                                   pc.warmup_epsilon, self.seed)
        self.privacy.set_auto_clip(estimate_clip(released, pc.clip_auto_min, pc.clip_auto_max),
                                   clients)

    # ------------------------------------------------------------------ state
    def _build_parts(self) -> None:
        """The initial state and the parts, on the run's device: every initial tensor is
        drawn on the CPU (keyed as on a CPU run) and moved there."""
        n, m = self.split.n_users, self.split.n_items
        dev = self.device
        q0 = self._initial_items().to(dev)
        dense0 = {k: v.to(dev) for k, v in self.backbone.init_dense().items()}
        # train.state_dtype names a torch dtype (sections.STATE_DTYPES); a float64 test
        # run keeps float64
        store = getattr(torch, self.cfg.train.state_dtype) if q0.dtype == torch.float32 \
            else q0.dtype
        kept = self.cfg.train.client_tables == "kept"
        sparse = self.cfg.train.client_tables == "sparse"
        if kept:
            _check_state_fits(self.cfg, n, q0, store, self.device)
        if sparse:
            _check_state_fits(self.cfg, n, q0, store, self.device,
                              sparse=self._sparse_estimate(q0, store))
        q_local = q0.to(store).expand(n, *q0.shape).clone() if kept else None
        # Without noise an upload equals the client's new table, so the server's copy of
        # each last upload can share storage with q_local (it changes only on upload).
        alias = q_local if not self.privacy.perturbs else None
        fed = self.cfg.federation
        step, similarity = ServerStepOptions.from_config(fed), SimilarityOptions.from_config(fed)
        server = aggregators.ServerOptConfig(lr=step.lr, momentum=step.momentum)
        self.aggregator = aggregator_registry.build(
            self.aggregation, self.sizes, q0, alpha=similarity.alpha, alias=alias,
            graph=GraphOptions.from_config(fed), fedmerge=FedMergeOptions.from_config(fed),
            seed=self.seed, server=server,
            similarity=similarity, agg_ratio=fed.agg_clients_ratio, store=store)
        if hasattr(self.aggregator, "client_keys"):  # sampled shares keyed by identity
            self.aggregator.client_keys = self.split.source_users
        self.dense = (aggregators.DenseFedAvg(self.sizes, dense0, server=server) if dense0
                      else None)
        peft = codecs.PeftConfig.from_config(fed)
        self.codec = codecs.build(fed.codec, m, self.cfg.train.dim,
                                  {k: tuple(v.shape) for k, v in dense0.items()}, peft)
        # a FedPEFT codec's global parameters theta, once it has started (after the warm-up)
        self.codec_server: aggregators.DenseFedAvg | None = None
        # the wire format of full-table rounds (every round, or a FedPEFT codec's warm-up)
        self.full_codec = (self.codec if isinstance(self.codec, codecs.FullCodec) else
                           codecs.FullCodec(m, self.cfg.train.dim,
                                            {k: tuple(v.shape) for k, v in dense0.items()}))
        self.merger = Merger(self.merge_cfg, n, self.cfg.train.dim, self.seed, q0.dtype,
                             device=dev)
        dense_local = {k: v.expand(n, *v.shape).clone() for k, v in dense0.items()}
        # per-client private tables (n, m, d) narrow like q_local; vectors stay as drawn
        private = {k: v.to(dev, store if v.dim() >= 3 and v.dtype == torch.float32
                            else v.dtype)
                   for k, v in self.backbone.init_private(np.arange(n)).items()}
        if not kept and any(v.dim() >= 3 for v in private.values()):
            raise UserError(f"--client-tables {self.cfg.train.client_tables}: backbone "
                            f"{self.backbone.name!r} keeps a private item table per client; "
                            f"use --client-tables kept")
        self.state = SimState(q_local, private, dense_local, self.aggregator.table,
                              dtype=q0.dtype,
                              shared=None if kept or sparse else self.aggregator.sent)
        if sparse:
            self.state.sparse = SparseTables(n, q0, store, self._remerge, self._merged_rows)
        # under a perturbing mechanism with the share rule, the last encoded table the
        # server sent each client: the public centre of its release (_release_base)
        self._public_sent: torch.Tensor | None = None
        if self.privacy.centres_release and fed.agg_clients_ratio < 1.0:
            enc0 = self.full_codec.encode(q0[None], {k: v[None] for k, v in dense0.items()})
            self._public_sent = enc0.expand(n, *enc0.shape[1:]).clone()
        # how uploads travel, chosen once: a secure sum under a central mechanism
        self.uploads = (SecureSumUploads(self) if self.privacy.central
                        else ReleasedUploads(self))
        if self.privacy.selects_rows:  # the catalogue's rows, before any client adds its items
            self.privacy.secure.n_items = int(self.split.n_items)  # type: ignore[union-attr]

    def _sparse_estimate(self, q0: torch.Tensor, store: torch.dtype) -> int:
        """The bytes sparse tables will hold by the end of the run
        (:func:`~fedem_private.simulation.sparse_tables.estimate_bytes`), at the round's
        sampling rate (the mechanism's own, or the client fraction)."""
        cfg = self.cfg
        rate = (cfg.privacy.sample_rate if "sample_rate" in cfg.privacy.mechanism.options
                else cfg.train.client_fraction)
        adapter = 0
        if self.merge_cfg.rule.learned:
            fans = (2 * cfg.train.dim, *self.merge_cfg.adapter_layers)
            adapter = 4 * sum(a * b + b for a, b in zip(fans[:-1], fans[1:], strict=True))
        every_row = self.merge_cfg.rule.merges and not self.merge_seen
        return estimate_bytes(self.split.train_counts, int(q0.shape[0]), int(q0.shape[-1]),
                              torch.empty((), dtype=store).element_size(),
                              cfg.train.num_negatives, cfg.train.rounds, min(1.0, rate),
                              adapter, every_row)

    # ---------------------------------------------------------------- helpers
    def _index(self, clients: np.ndarray) -> torch.Tensor:
        """Client ids (numpy) as an int64 index tensor on the run's device."""
        return torch.from_numpy(clients).to(self.device)

    def _initial_items(self) -> torch.Tensor:
        """The server's initial item table: the backbone's random one, or (``--peft-pretrain
        attributes``) FedPEFT's autoencoder latent of the item attributes (docs/design.md §11)."""
        q0 = self.backbone.init_items()
        if self.cfg.federation.peft_pretrain == "none":
            return q0
        if self.item_features is None:
            raise UserError(f"--peft-pretrain attributes: dataset {self.dataset_name} has no "
                            f"item attributes")
        if self.item_features.shape[0] != self.split.n_items:
            raise ValueError(f"item_features has {self.item_features.shape[0]} rows for "
                             f"{self.split.n_items} items")
        tr = self.cfg.train
        return pretrain_items(self.item_features, tr.dim, self.seed, tr.init_std,
                              dtype=q0.dtype).table

    def _peft_round(self, t: int) -> bool:
        """Whether round t trains and uploads a FedPEFT codec's parameters (after warm-up)."""
        return bool(self.codec.peft) and t > self.codec.cfg.warmup

    def _start_codec(self) -> int:
        """Freeze the server's global table as E0, fix codes / hashes, start theta.

        Returns the one-time bytes every client downloads (E0, codes, hash (a, b)).
        """
        codec = self.codec
        assert isinstance(codec, codecs.PeftCodec)
        theta0 = codec.prepare(self.aggregator.table, self.seed, self.cfg.train.init_std)
        self.codec_server = aggregators.DenseFedAvg(self.sizes, theta0,
                                                    uniform=self.aggregator.equal_weights)
        self.aggregator.adopt(codec.table({n: v[None] for n, v in theta0.items()})[0])
        return self.split.n_users * codec.one_time_bytes()

    def _sent_params(self, idx: torch.Tensor) -> ClientParams:
        """What clients idx start the round from before merging: the server's tables (or,
        when it sends none, their own) and their own private groups.

        A client the aggregator sends nothing this round (:meth:`Aggregator.receives`
        False: FedEM code's ``agg_clients_ratio``, docs/design.md 2a) starts from its own model."""
        sent = self.aggregator.sent(idx)
        if sent is None:  # nothing from the server: the client continues from its own
            return self.state.params(idx)
        own = self.state.params(idx, items=False)  # its own tables only where read below
        dense_sent = self.dense.sent(idx.shape[0]) if self.dense is not None else {}
        recv = self.aggregator.receives(idx)
        if recv is not None:
            sent = torch.where(recv.view(-1, 1, 1), sent, self.state.items(idx))
            dense_sent = {name: torch.where(recv.view(-1, *[1] * (v.dim() - 1)), v,
                                            own.dense[name])
                          for name, v in dense_sent.items()}
        return ClientParams(sent, dense_sent, own.private, self.aggregator.anchor(idx))

    def participants(self, round_: int) -> np.ndarray:
        """Clients taking part in a round: the privacy layer's Poisson sample (cdp-gaussian),
        else all, or the ceil(q n) with the smallest draws (``client_fraction`` q), each
        draw keyed by the client's identity (``Split.source_users``), not its index; less
        the clients out of uploads under ``--max-uploads`` (:meth:`PrivacyLayer.admit`)."""
        sampled = self.privacy.participants(round_)
        if sampled is not None:
            return sampled
        return self.privacy.admit(self._cohort(round_))  # less those out of uploads

    def _cohort(self, round_: int) -> np.ndarray:
        """All clients, or the ceil(q n) (``--cohort-size``) with the smallest keyed draws."""
        n, q = self.split.n_users, self.cfg.train.client_fraction
        if q >= 1.0:
            return np.arange(n)
        k = self.cfg.train.cohort_size or max(1, int(np.ceil(q * n)))
        u = rng.uniform(rng.key(self.seed, rng.Stream.PARTICIPATION, round_,
                                self.split.source_users), 0)
        return rng.smallest(u, k)

    def _chunk_size(self) -> int:
        m, d = self.split.n_items, self.cfg.train.dim
        tr = self.cfg.train
        per_client = m * d * 4 * 10 + tr.local_epochs * int(self._workload.max() // max(
            tr.local_epochs, 1) + 1) * tr.batch_size * 13
        if self.merger.learned:
            per_client += m * 64 * 4 * 3
        per_client += self.backbone.memory_per_client()
        budget = tr.memory_budget_mb * (1 << 20)
        cap = MAX_CHUNK_CUDA if self.device.type == "cuda" else MAX_CHUNK
        return int(max(1, min(cap, budget // max(per_client, 1))))

    def _chunks(self, clients: np.ndarray, round_: int = 0) -> Iterator[np.ndarray]:
        work = self._workload
        if self.merger.withholds(round_):  # holdout: the adapter's fold leaves local training
            kept = self.merger.kept_positives(round_, self.split.train_counts)
            work = num_steps(kept * (1 + self.local_cfg.num_negatives), self.local_cfg)
        order = clients[np.argsort(-work[clients], kind="stable")]
        size = self._chunk_size()
        for start in range(0, order.shape[0], size):
            yield order[start: start + size]

    # ------------------------------------------------------------------ round
    def step(self) -> RoundStats:
        """Run one round; evaluate when due. Returns the round's stats.

        On the CPU the round runs with freed host blocks kept for reuse, restored after
        (:mod:`fedem_private.hostmem`): large per-chunk tables are not faulted in afresh.
        """
        with self.host_memory() as tuned:
            self.host_allocator_tuned = tuned
            return self._step()

    def host_memory(self) -> contextlib.AbstractContextManager[bool]:
        """The host allocator context a round runs in, yielding whether it is tuned:
        :func:`~fedem_private.hostmem.keep_freed_memory` on the CPU; nothing to tune
        when the heavy tensors live on another device."""
        if self.device.type != "cpu":
            return contextlib.nullcontext(False)
        return keep_freed_memory()

    def _step(self) -> RoundStats:
        """One round as stages over explicit state (module docstring): for each chunk of
        the round's clients send -> merge -> train -> encode -> upload (privatise,
        aggregate, observe; :attr:`uploads`), then the server's end of the round."""
        rnd = self._begin_round()
        if self.shards is not None:
            # sharded (central mechanisms only): the same chunks computed by the shards,
            # their secure-sum parts added here in this loop's chunk order (shards.py)
            self.shards.run(self, rnd)
        else:
            for chunk in self._chunks(rnd.clients, rnd.t):
                work = self._send(rnd, chunk)
                self._merge(rnd, work)
                self._train(rnd, work)
                self._encode(rnd, work)
                self.uploads.upload(rnd, work)
        self.uploads.finish(rnd)
        self._end_round(rnd)
        return self._round_stats(rnd)

    def _begin_round(self) -> RoundWork:
        """Sample the participants and open the round in every part that keeps per-round
        state (aggregator, dense groups, privacy layer, a FedPEFT codec's server)."""
        t = self.state.round + 1
        t0 = time.perf_counter()
        clients = self.participants(t)
        part_mask = torch.zeros(self.split.n_users, dtype=torch.bool, device=self.device)
        part_mask[self._index(clients)] = True
        self.aggregator.begin_round(part_mask)
        if self.dense is not None:
            self.dense.begin_round(self.aggregator.aggregated())
        self.privacy.begin_round(t)
        before = (self.aggregator.table.detach().clone()
                  if self.privacy.central and self.aggregate_observers else None)
        peft = self._peft_round(t)
        setup_bytes = self._start_codec() if peft and self.codec_server is None else 0
        if self.codec_server is not None:
            self.codec_server.begin_round(part_mask)
        return RoundWork(t, t0, clients, peft, before, setup_bytes)

    def _send(self, rnd: RoundWork, chunk: np.ndarray) -> ChunkWork:
        """Step 1: the chunk's samples and what the server sends it (its start before
        merging), with the download's bytes."""
        idx = self._index(chunk)
        samples = draw_samples(self.seed, rnd.t, chunk, self.split.train_indptr,
                               self.split.train_items, *self.excl, self.split.n_items,
                               self.local_cfg.num_negatives, device=self.device)
        start = self._sent_params(idx)
        recv = self.aggregator.receives(idx)  # None: every client of the chunk gets a table
        if self.merge_schedule.every > 1 and not self.merge_schedule.merges_in(rnd.t):
            # --merge-every K: no table between merges; each client starts from its own
            recv = torch.zeros(len(chunk), dtype=torch.bool, device=idx.device)
        work = ChunkWork(chunk, idx, samples, start,
                         sent=start.items, dense_sent=start.dense, recv=recv)
        if not rnd.peft and self.aggregator.sends_table:
            rnd.down_bytes += work.n_recv * wire_bytes({"items": work.sent, **work.dense_sent})
        return work

    def _merge(self, rnd: RoundWork, work: ChunkWork) -> None:
        """Step 2: the start table (equations 10-11): the merger's, from round 2 on."""
        if not (self.merger.merges and rnd.t > 1):
            return
        user_vecs, score = self.backbone.adapter_score(work.start)
        lc = self.local_cfg  # holdout: samples loses the fold the adapter trains on
        work.samples, steps = self.merger.round_samples(rnd.t, work.chunk, work.samples,
                                                        lc.epochs, lc.batch_size,
                                                        lc.num_negatives)
        work.start.items, rho = self.merger.start(
            # each client's own table before the round (the state is first written by _train)
            work.idx, self.state.items(work.idx), work.sent, user_vecs, score, steps,
            merging=work.recv,
            trainer=self._adapter_trainer(work))
        if self.merge_seen:  # rho' = 1 outside the client's training items (issue 69)
            keep = seen_mask(work.chunk, self.split.train_indptr, self.split.train_items,
                             self.split.n_items, work.sent.device)
            if work.recv is not None:  # a client sent nothing keeps its own table whole
                keep |= ~work.recv.to(keep.device).view(-1, 1)
            work.start.items = merge_seen_rows(work.start.items, work.sent, keep)
        rnd.rho_sum += float(rho.sum() if work.recv is None else rho[work.recv].sum())
        rnd.rho_n += work.n_recv
        work.merged = True
        if self.state.sparse is not None:  # as equation 10 used them
            work.merge_used = (rho if self.merge_cfg.rule.pooled else
                               self.merger.take(work.idx))
        if self.merger.every_batch:  # the FedEM code: merge on every batch
            work.rows = work.batch_rows = self.merger.batch_rows(work.idx, work.sent,
                                                                 work.recv)

    def _origins(self, work: ChunkWork) -> np.ndarray:
        """(k,) how each of the chunk's clients' start table was formed (sparse tables,
        :mod:`~fedem_private.simulation.sparse_tables`): merged with the table sent
        (:data:`MERGED`), the table sent itself (:data:`SENT`), or its own (:data:`OWN`:
        sent nothing, or not merging in a round of ``--merge-every``)."""
        if not self.aggregator.sends_table:
            return np.full(work.k, OWN, dtype=np.int64)
        recv = (np.ones(work.k, dtype=bool) if work.recv is None
                else work.recv.cpu().numpy().astype(bool))
        return np.where(recv, MERGED if work.merged else SENT, OWN).astype(np.int64)

    def _remerge(self, clients: np.ndarray, q_prev: torch.Tensor, sent: torch.Tensor,
                 used: MergeState | torch.Tensor | None) -> torch.Tensor:
        """Equation 10 as :meth:`_merge` applied it to clients (numpy ids) whose own tables
        were ``q_prev`` and who were sent ``sent`` (both (k, m, d)), with what it used then
        (``used``: the adapters, a pooled merge's rho (k,), or None), ``--merge-rows seen``
        included: the replay of a merge under sparse tables (:meth:`SparseTables.tables`)."""
        if isinstance(used, torch.Tensor):  # a pooled rho: the weight itself
            start = merge_tables(q_prev, sent, used.to(q_prev.dtype).view(-1, 1))
        else:
            start, _ = merge_with_rho(self.merge_cfg, used, q_prev, sent)
        if self.merge_seen:
            start = merge_seen_rows(start, sent, self._merged_rows(clients))
        return start

    def _merged_rows(self, clients: np.ndarray) -> torch.Tensor | None:
        """(k, m) bool: the rows in which equation 10 keeps anything of clients' own tables
        (their training items under ``--merge-rows seen``); None: every row."""
        if not self.merge_seen:
            return None
        return seen_mask(clients, self.split.train_indptr, self.split.train_items,
                         self.split.n_items, self.device)

    def _adapter_trainer(self, work: ChunkWork) -> Callable[..., object] | None:
        """The merge adapter's trainer: by the mechanism's DP-SGD when local training is
        (ldp-dpsgd); None: the merger's own."""
        if not (self.privacy.dpsgd and self.merger.learned):
            return None

        def trainer(w, b, ql, qg, _chunk=work.chunk, _private=work.start.private):
            return self.privacy.train_adapter(
                self.backbone, _private, w, b, ql, qg, _chunk, self.split.train_indptr,
                self.split.train_items, self.local_cfg.num_negatives)
        return trainer

    def _train(self, rnd: RoundWork, work: ChunkWork) -> None:
        """Step 3: local training (equation 12; by local DP-SGD when that is the
        mechanism, docs/design.md section 5), and the clients' new state kept."""
        if rnd.peft:
            assert self.codec_server is not None and isinstance(self.codec, codecs.PeftCodec)
            work.theta_sent = self.codec_server.sent(work.k)
            work.rows = self.codec.trainer(work.theta_sent,
                                           base=None if work.merged else self.codec.e0)
            rnd.down_bytes += work.k * wire_bytes({**work.theta_sent, **work.dense_sent})
        if self.prox_mu > 0 and not rnd.peft:  # (mu / 2) ||Q_l - Q_g||^2 (issue 69)
            work.rows = prox_rows(work.sent, self.prox_mu)
        if self.privacy.dpsgd:
            new, touched = self.privacy.train_local(
                self.backbone, work.start, work.chunk, self.split.train_indptr,
                self.split.train_items, self.local_cfg.num_negatives)
        else:
            new, touched = self.backbone.train_chunk(work.start, work.chunk, work.samples,
                                                     self.local_cfg, rnd.t, rows=work.rows)
        if work.batch_rows is not None:
            self.merger.keep_trained(work.idx, work.batch_rows)
        st = self.state
        if st.sparse is not None:
            st.sparse.keep(rnd.t, work.idx, self._origins(work), work.start.items, new.items,
                           work.sent if self.aggregator.sends_table else None, work.merge_used)
        else:
            st.keep_items(work.idx, new.items)
        for name, value in new.private.items():
            st.keep_private(work.idx, name, value)
        for name, value in new.dense.items():
            st.dense_local[name][work.idx] = value
        work.new, work.touched = new, touched

    def _encode(self, rnd: RoundWork, work: ChunkWork) -> None:
        """Step 4: the (sent, trained) pair in the round's wire format (a FedPEFT codec's
        theta, or the full table centred on what the server last sent, _release_base)."""
        new = work.new
        if rnd.peft:
            assert work.theta_sent is not None and work.rows is not None
            work.enc_sent = self.codec.encode(work.theta_sent, work.dense_sent)
            work.enc_new = self.codec.encode(work.rows.theta, new.dense)
            work.touched_rows = self.codec.touched(work.k)
            return
        work.enc_sent = self._release_base(work.idx, work.recv,
                                           self.full_codec.encode(work.sent, work.dense_sent))
        work.enc_new = self.full_codec.encode(new.items, new.dense)
        work.touched_rows = self.full_codec.touched(work.touched)
        if work.recv is not None and self._public_sent is not None:
            work.sent = self.full_codec.decode(work.enc_sent)[0]  # what the server knows it sent

    def wire(self, rnd: RoundWork) -> codecs.FullCodec | codecs.PeftCodec:
        """The round's wire format: the codec after a FedPEFT warm-up, else full tables."""
        return self.codec if rnd.peft else self.full_codec

    def _end_round(self, rnd: RoundWork) -> None:
        """The server's end of the round: the codec's theta, the aggregator's next tables,
        the dense groups, the aggregate observers and the privacy layer's accounting."""
        if rnd.peft:
            assert self.codec_server is not None
            self.codec_server.end_round()
            theta = {n: v[None] for n, v in self.codec_server.params.items()}
            self.aggregator.take_aggregate(self.codec.table(theta)[0])
        self.aggregator.end_round()
        if self.dense is not None:
            self.dense.end_round()
        self.state.q_global = self.aggregator.table
        if rnd.before is not None:
            view = AggregateView(rnd.t, rnd.clients, rnd.before, self.aggregator.table)
            for observe_aggregate in self.aggregate_observers:
                observe_aggregate(view)
        rnd.privacy_stats = self.privacy.end_round(rnd.clients)
        self.state.round = rnd.t

    def _round_stats(self, rnd: RoundWork) -> RoundStats:
        """The round's row of metrics.csv (evaluated when due)."""
        if self.device.type == "cuda":  # the round's kernels run asynchronously: time them all
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - rnd.t0
        stats = RoundStats(rnd.t, seconds, int(rnd.clients.shape[0]),
                           privacy=rnd.privacy_stats, server=self.aggregator.round_stats())
        n_part = max(int(rnd.clients.shape[0]), 1)
        stats.comm = {"bytes_up": rnd.up_bytes / n_part, "bytes_down": rnd.down_bytes / n_part,
                      "bytes_setup": float(rnd.setup_bytes)}
        if rnd.rho_n and self.merger.merges:
            stats.merge = {"rho_mean": rnd.rho_sum / rnd.rho_n}
        if rnd.t % self.cfg.train.eval_every == 0 or rnd.t == self.cfg.train.rounds:
            stats.metrics = self.evaluate()
        return stats

    def _release_base(self, idx: torch.Tensor, recv: torch.Tensor | None,
                      enc_sent: torch.Tensor) -> torch.Tensor:
        """The encoded table a chunk's release is centred on: what the server last sent
        each client (docs/design.md section 5, "What the server may use").

        ``enc_sent`` is the encoded start table before merging. Where every client of
        the chunk received the server's table this round (``recv`` None) it is that
        table, public. Under the FedEM code's share rule (``--agg-clients-ratio`` < 1) a
        client the server sent nothing starts from its own private table; a perturbing
        mechanism then releases around the last table the server sent it (the initial
        table if none), so the change it accumulated on its own is inside the clipped
        delta and no release is centred on private state. Without perturbation the
        upload is the table itself and the base only labels what was sent.
        """
        if recv is None or self._public_sent is None:
            return enc_sent
        rows = idx[recv]
        self._public_sent[rows] = enc_sent[recv].to(self._public_sent.dtype)
        return self._public_sent.index_select(0, idx).to(enc_sent.dtype)

    def _take_central_aggregate(self, peft: bool) -> None:
        """The round's one noisy aggregate (cdp-gaussian) to the aggregator and dense groups.

        ``base`` is the encoded table (or, in a FedPEFT round, the encoded theta)
        every client was sent this round (a sum aggregator sends all the same).
        """
        one = torch.zeros(1, dtype=torch.long, device=self.device)
        sent = self._sent_params(one)
        if peft:
            assert self.codec_server is not None
            base = self.codec.encode(self.codec_server.sent(1), sent.dense)
            theta, dense = self.codec.decode(self.privacy.release_aggregate(base))
            self.codec_server.take_aggregate({name: value[0] for name, value in theta.items()})
        else:
            base = self.full_codec.encode(sent.items, sent.dense)
            items, dense = self.full_codec.decode(self.privacy.release_aggregate(base))
            self.aggregator.take_aggregate(items[0])
        if self.dense is not None:
            self.dense.take_aggregate({name: value[0] for name, value in dense.items()})

    def evaluate(self) -> dict[str, dict[str, float]]:
        """HR/NDCG of every client's own current model (its Q_l and private groups).

        Merging on every batch (the FedEM code, docs/design.md 2a), a client that will receive a
        table next round is evaluated with Q_l merged with it, as that code does."""
        return self.ranks().result()

    def ranks(self) -> RankAccumulator:
        """Every user's ranks under its own current model (:meth:`evaluate`, per user);
        with ``train.eval_users`` M, those of :meth:`eval_sample`'s M users only (the
        others stay unranked, and the metrics carry their standard error)."""
        n = self.split.n_users
        acc = RankAccumulator(n, standard_errors=bool(self.cfg.train.eval_users))
        chosen = self.eval_sample()
        if self.cfg.train.eval_finetune:  # training chunks run longest first (make_plan)
            chosen = chosen[np.argsort(-self._workload[chosen], kind="stable")]
        size = max(1, self._chunk_size() * (1 if self.cfg.train.eval_finetune else 4))
        with torch.no_grad():
            for start in range(0, chosen.shape[0], size):
                users = chosen[start:start + size]
                idx = self._index(users)
                params = (self._finetuned(users, idx) if self.cfg.train.eval_finetune
                          else self.state.params(idx))
                if self.merger.every_batch:
                    params.items = self.merger.evaluated(idx, params.items,
                                                         self.aggregator.sent(idx),
                                                         self.aggregator.receives(idx))
                scores = self.backbone.scores(params)
                if self.privacy.selects_rows and self.cfg.privacy.select_prior:
                    scores = self.privacy.selection_prior(scores)
                acc.add_scores(users, scores, self.eval_sets)
        self.last_ranks = acc
        return acc

    def _finetuned(self, users: np.ndarray, idx: torch.Tensor) -> ClientParams:
        """Users' models for evaluation under ``train.eval_finetune`` E: each starts from
        what the server would send it now (its table, its own private groups) and trains
        E local epochs on its own training data, as in a round but keyed by round
        :data:`FINETUNE_ROUND` + t and uploading nothing; the state is left as it was.
        A merging method (FedEM) starts from equation 10's merge of the user's own table
        with the one sent, as its next round would, with its adapter as it stands (not
        trained again): the personal table is what it evaluates.
        Under any mechanism this is client-local computation: nothing leaves the client."""
        local = replace(self.local_cfg, epochs=self.cfg.train.eval_finetune)
        start = self._sent_params(idx)
        if self.merger.merges and self.state.round > 1:
            start.items = self._remerge(users, self.state.items(idx), start.items,
                                        self.merger.take(idx))
        key = FINETUNE_ROUND + self.state.round
        samples = draw_samples(self.seed, key, users, self.split.train_indptr,
                               self.split.train_items, *self.excl, self.split.n_items,
                               local.num_negatives, device=self.device)
        with torch.enable_grad():
            new, _ = self.backbone.train_chunk(start, users, samples, local, key)
        return new

    def eval_sample(self) -> np.ndarray:
        """The users evaluated (:func:`~fedem_private.evaluation.metrics.eval_sample`)."""
        return eval_sample(self.split.n_users, self.cfg.train.eval_users,
                           self.cfg.train.seed)

    def run(self, on_round: Callable[[RoundStats], None] | None = None) -> list[RoundStats]:
        """All configured rounds."""
        out = []
        while self.state.round < self.cfg.train.rounds:
            stats = self.step()
            out.append(stats)
            if on_round is not None:
                on_round(stats)
        return out
