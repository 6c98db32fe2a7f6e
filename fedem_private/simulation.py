"""The federated round loop, vectorised over clients (DESIGN sections 3 and 7).

Round t, for the clients taking part (all unless a client fraction is set):

1. the server sends Q_sent[u]: the global table (FedAvg, uniform), u's
   personalised table Q_g[u] (similarity aggregation), or nothing (``local``:
   the client keeps its own table);
2. the client builds its starting table: static replacement uses Q_sent[u];
   elastic merging first trains its adapter (equation 11), then merges
   (equation 10);
3. local training (equation 12) gives Q_l[u] and p_u;
4. the upload, Q_l[u] through the privacy layer, is all that leaves it;
5. the server aggregates the uploads (FedAvg weights |D_v| / sum |D|, uniform
   1/n, or similarity weights, equation 13).

Clients are processed in chunks sorted by workload; every random draw is keyed
by (seed, round, client), so chunking never changes results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from . import rng
from .aggregation import fedavg_weights, similarity_aggregate, uniform_weights
from .config import RunConfig
from .data.split import Split, exclusion_csr
from .merging import (
    MergeConfig,
    StepBatch,
    init_merge_state,
    merge_with_rho,
    take_clients,
    train_adapter,
)
from .metrics import EvalSets, RankAccumulator, build_eval_sets
from .models.mf import ClientSamples, LocalTrainConfig, draw_samples, epoch_orders, num_steps
from .models.mf import train_chunk as train_mf_chunk
from .privacy.layer import PrivacyLayer

SERVER = 1 << 40  # client id used to key the server's own random draws
MAX_CHUNK = 64


@dataclass
class ChunkView:
    """What one chunk of clients did in a round (for recording and attacks)."""

    round: int
    clients: np.ndarray
    sent: torch.Tensor
    upload: torch.Tensor
    samples: ClientSamples


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

    def row(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {"round": self.round, "seconds": self.seconds,
                                             "participants": self.participants}
        for kind, values in (self.metrics or {}).items():
            for name, value in values.items():
                out[f"{kind}_{name}"] = value
        out.update(self.privacy)
        out.update(self.merge)
        return out


@dataclass
class SimState:
    """All client and server state, as batched tensors."""

    p: torch.Tensor  # (n, d) private user vectors
    q_local: torch.Tensor  # (n, m, d) each client's table after its last training
    q_global: torch.Tensor | None  # (m, d) shared, or (n, m, d) personalised, or None
    last_upload: torch.Tensor | None  # (n, m, d) the server's copy of each last upload
    uploaded: torch.Tensor  # (n,) bool: has the server ever received an upload from u
    merge_state: object | None
    round: int = 0


class Simulation:
    """A configured run over one split; call :meth:`run` or :meth:`step` round by round."""

    def __init__(self, cfg: RunConfig, split: Split, *, dataset_name: str | None = None,
                 demographics: dict[str, np.ndarray] | None = None) -> None:
        self.cfg = cfg.validate().resolved()
        self.split = split
        self.dataset_name = dataset_name or self.cfg.data.dataset
        self.demographics = demographics or {}
        tr, fed = self.cfg.train, self.cfg.federation
        self.seed = tr.seed
        self.aggregation = fed.resolved_aggregation
        self.merge_cfg = MergeConfig(strategy=fed.resolved_merge, rho=fed.rho,
                                     adapter_lr=fed.adapter_lr,
                                     adapter_epochs=fed.adapter_epochs)
        self.privacy = PrivacyLayer(self.cfg.privacy, rounds=tr.rounds,
                                    n_clients=split.n_users, lr=tr.lr,
                                    sizes=split.train_counts, seed=self.seed)
        self.local_cfg = LocalTrainConfig(epochs=tr.local_epochs, batch_size=tr.batch_size,
                                          lr=tr.lr, num_negatives=tr.num_negatives,
                                          grad_clip=self.privacy.local_grad_clip)
        self.excl = exclusion_csr(split, self.cfg.data.protocol)
        self.eval_sets: EvalSets = build_eval_sets(split, self.cfg.data.protocol, self.seed)
        self.sizes = torch.from_numpy(split.train_counts.astype(np.float64))
        self.state = self._init_state()
        n_samples = split.train_counts * (1 + tr.num_negatives)
        self._workload = num_steps(n_samples, self.local_cfg)
        self.observers: list[Callable[[ChunkView], None]] = []
        if self.cfg.privacy.clip_auto:
            self._auto_clip()

    def _auto_clip(self) -> None:
        """``--clip auto``: the DP warm-up of :mod:`fedem_private.privacy.clip_auto`.

        Every client trains once from the table it would be sent in round 1,
        measures its delta's norm (L1, or L2 under ldp-gaussian) and releases
        it noised; the state is left untouched (the trained tables are dropped).
        """
        from .privacy.clip_auto import WARMUP_ROUND, estimate_clip, noisy_log_norms

        pc = self.cfg.privacy
        clients = np.arange(self.split.n_users)
        norms = np.zeros(clients.shape[0], dtype=np.float64)
        for chunk in self._chunks(clients):
            idx = torch.from_numpy(chunk)
            samples = draw_samples(self.seed, WARMUP_ROUND, chunk, self.split.train_indptr,
                                   self.split.train_items, *self.excl, self.split.n_items,
                                   self.local_cfg.num_negatives)
            sent = self._sent(chunk)
            q_new, _, _ = train_mf_chunk(sent, self.state.p.index_select(0, idx), chunk,
                                         samples, self.local_cfg, self.seed, WARMUP_ROUND)
            delta = (q_new.double() - sent.double()).reshape(chunk.shape[0], -1)
            norm = delta.norm(dim=1) if pc.mode == "ldp-gaussian" else delta.abs().sum(dim=1)
            norms[chunk] = norm.numpy()
        released = noisy_log_norms(norms, clients, pc.clip_auto_min, pc.clip_auto_max,
                                   pc.warmup_epsilon, self.seed)
        self.privacy.set_auto_clip(estimate_clip(released, pc.clip_auto_min, pc.clip_auto_max),
                                   clients)

    # ------------------------------------------------------------------ state
    def _init_state(self) -> SimState:
        n, m, d = self.split.n_users, self.split.n_items, self.cfg.train.dim
        std = self.cfg.train.init_std
        g = rng.generator(self.seed, rng.Stream.INIT, 0, SERVER)
        q0 = torch.randn((m, d), generator=g) * std
        p = torch.empty((n, d))
        for u in range(n):
            p[u] = torch.randn(d, generator=rng.generator(self.seed, rng.Stream.INIT, 0, u)) * std
        q_local = q0.expand(n, m, d).clone()
        if self.aggregation == "similarity":
            q_global: torch.Tensor | None = q0.expand(n, m, d).clone()
        elif self.aggregation in ("fedavg", "uniform"):
            q_global = q0.clone()
        else:
            q_global = None
        # Without noise an upload equals the client's new table, so the server's copy of
        # each last upload can share storage with q_local (it changes only on upload).
        last_upload = None
        if self.aggregation == "similarity":
            last_upload = q_local if not self.privacy.perturbs else q_local.clone()
        merge_state = None
        if self.merge_cfg.strategy in ("dm", "em"):
            merge_state = init_merge_state(self.merge_cfg, np.arange(n), d, self.seed)
        return SimState(p, q_local, q_global, last_upload, torch.zeros(n, dtype=torch.bool),
                        merge_state)

    # ---------------------------------------------------------------- helpers
    def participants(self, round_: int) -> np.ndarray:
        """Clients taking part in a round: all, or the ceil(q n) with the smallest draws."""
        n, q = self.split.n_users, self.cfg.train.client_fraction
        if q >= 1.0:
            return np.arange(n)
        k = max(1, int(np.ceil(q * n)))
        u = rng.uniform(rng.key(self.seed, rng.Stream.PARTICIPATION, round_, np.arange(n)), 0)
        return np.sort(np.argsort(u, kind="stable")[:k])

    def _chunk_size(self) -> int:
        m, d = self.split.n_items, self.cfg.train.dim
        tr = self.cfg.train
        per_client = m * d * 4 * 10 + tr.local_epochs * int(self._workload.max() // max(
            tr.local_epochs, 1) + 1) * tr.batch_size * 13
        if self.merge_cfg.strategy in ("dm", "em"):
            per_client += m * 64 * 4 * 3
        budget = tr.memory_budget_mb * (1 << 20)
        return int(max(1, min(MAX_CHUNK, budget // max(per_client, 1))))

    def _chunks(self, clients: np.ndarray) -> Iterator[np.ndarray]:
        order = clients[np.argsort(-self._workload[clients], kind="stable")]
        size = self._chunk_size()
        for start in range(0, order.shape[0], size):
            yield order[start: start + size]

    def _sent(self, chunk: np.ndarray) -> torch.Tensor:
        st = self.state
        idx = torch.from_numpy(chunk)
        if self.aggregation == "none":
            return st.q_local.index_select(0, idx)
        assert st.q_global is not None
        if st.q_global.dim() == 2:
            return st.q_global.expand(len(chunk), -1, -1).contiguous()
        return st.q_global.index_select(0, idx)

    def _adapter_steps(self, round_: int, chunk: np.ndarray,
                       samples: ClientSamples) -> Iterator[StepBatch]:
        """Lock-step batches for the adapter (equation 11), from this round's samples."""
        e0, extra = self.local_cfg.epochs, self.merge_cfg.adapter_epochs
        bsz = self.local_cfg.batch_size
        k = chunk.shape[0]
        lengths = np.diff(samples.indptr)
        per_epoch = -(-lengths // bsz)
        nb = extra * per_epoch
        width = int(per_epoch.max(initial=0)) * bsz
        # slot (j, e, b) holds client j's batch b of adapter epoch e, zero-padded
        its = np.zeros((k, extra, width), dtype=np.int64)
        labs = np.zeros((k, extra, width), dtype=samples.labels.dtype)
        msks = np.zeros((k, extra, width), dtype=bool)
        for j, c in enumerate(chunk.tolist()):
            items, labels = samples.of(j)
            n = items.shape[0]
            orders = epoch_orders(self.seed, round_, c, n, e0 + extra)[e0:]
            its[j, :, :n] = items[orders]
            labs[j, :, :n] = labels[orders]
            msks[j, :, :n] = True
        # client j's step s is (epoch, batch) = divmod(s, per_epoch[j])
        for s in range(int(nb.max(initial=0))):
            rows = np.nonzero(nb > s)[0]
            epoch, b = np.divmod(s, per_epoch[rows])
            cols = (b * bsz)[:, None] + np.arange(bsz)
            yield StepBatch(torch.from_numpy(rows).to(torch.long),
                            torch.from_numpy(its[rows[:, None], epoch[:, None], cols]),
                            torch.from_numpy(labs[rows[:, None], epoch[:, None], cols]),
                            torch.from_numpy(msks[rows[:, None], epoch[:, None], cols]))

    # ------------------------------------------------------------------ round
    def step(self) -> RoundStats:
        """Run one round; evaluate when due. Returns the round's stats."""
        st = self.state
        t = st.round + 1
        t0 = time.perf_counter()
        clients = self.participants(t)
        part_mask = torch.zeros(self.split.n_users, dtype=torch.bool)
        part_mask[torch.from_numpy(clients)] = True
        if self.aggregation in ("fedavg", "uniform"):
            weights = (fedavg_weights if self.aggregation == "fedavg" else uniform_weights)(
                self.sizes, part_mask)
            acc = torch.zeros_like(st.q_global, dtype=torch.float64)
        self.privacy.begin_round(t)
        rho_sum, rho_n = 0.0, 0
        for chunk in self._chunks(clients):
            idx = torch.from_numpy(chunk)
            samples = draw_samples(self.seed, t, chunk, self.split.train_indptr,
                                   self.split.train_items, *self.excl, self.split.n_items,
                                   self.local_cfg.num_negatives)
            sent = self._sent(chunk)
            q_prev = st.q_local.index_select(0, idx)
            if self.merge_cfg.strategy == "sr" or (t == 1 and self.aggregation != "none"):
                start = sent
            else:
                p_chunk = st.p.index_select(0, idx)
                if self.merge_cfg.strategy in ("dm", "em"):
                    st.merge_state = train_adapter(
                        self.merge_cfg, st.merge_state, idx, q_prev, sent, p_chunk,
                        self._adapter_steps(t, chunk, samples))
                chunk_state = (take_clients(st.merge_state, idx)
                               if st.merge_state is not None else None)
                start, rho = merge_with_rho(self.merge_cfg, chunk_state, q_prev, sent)
                rho_sum += float(rho.sum())
                rho_n += rho.shape[0]
            q_new, p_new, touched = train_mf_chunk(start, st.p.index_select(0, idx), chunk,
                                                   samples, self.local_cfg, self.seed, t)
            upload = self.privacy.release(sent, q_new, chunk, touched)
            st.q_local[idx] = q_new
            st.p[idx] = p_new
            if self.aggregation in ("fedavg", "uniform"):
                acc += torch.einsum("k,kmd->md", weights[idx], upload.double())
            elif self.aggregation == "similarity":
                assert st.last_upload is not None
                if st.last_upload is not st.q_local:
                    st.last_upload[idx] = upload
            for observe in self.observers:
                observe(ChunkView(t, chunk, sent, upload, samples))
        st.uploaded[torch.from_numpy(clients)] = True
        if self.aggregation in ("fedavg", "uniform"):
            st.q_global = acc.float()
        elif self.aggregation == "similarity":
            assert st.last_upload is not None
            p = fedavg_weights(self.sizes, part_mask)
            st.q_global = similarity_aggregate(st.last_upload, p, self.cfg.federation.alpha,
                                               participating=part_mask, anchored=st.uploaded)
        privacy_stats = self.privacy.end_round(clients)
        st.round = t
        seconds = time.perf_counter() - t0
        stats = RoundStats(t, seconds, int(clients.shape[0]), privacy=privacy_stats)
        if rho_n and self.merge_cfg.strategy != "sr":
            stats.merge = {"rho_mean": rho_sum / rho_n}
        if t % self.cfg.train.eval_every == 0 or t == self.cfg.train.rounds:
            stats.metrics = self.evaluate()
        return stats

    def evaluate(self) -> dict[str, dict[str, float]]:
        """HR/NDCG of every client's own current model (its Q_l and p_u)."""
        acc = RankAccumulator(self.split.n_users)
        n = self.split.n_users
        size = max(1, self._chunk_size() * 4)
        for start in range(0, n, size):
            users = np.arange(start, min(n, start + size))
            idx = torch.from_numpy(users)
            acc.add(users, self.state.q_local.index_select(0, idx),
                    self.state.p.index_select(0, idx), self.eval_sets)
        return acc.result()

    def run(self, on_round: Callable[[RoundStats], None] | None = None) -> list[RoundStats]:
        """All configured rounds."""
        out = []
        while self.state.round < self.cfg.train.rounds:
            stats = self.step()
            out.append(stats)
            if on_round is not None:
                on_round(stats)
        return out
