"""One round's cohort in shards: the clients' work computed elsewhere, the server step here
(issue 66, item 4; docs/guide.md, "One run across a Ray cluster").

Under a central mechanism (``cdp-gaussian``, ``dp-ftrl``; docs/design.md section 5) a
round's uploads only enter the secure sum, so what a client does in a round is a pure
function of the round number, what the server sends (the global item table and dense
groups), its own private state (p_u, a head) and the run's keyed draws (section 16).
A shard is a list of whole chunks of the round (the driver's ``Simulation._chunks``);
for each chunk a worker computes what the one-process loop computes (``_send``,
``_merge``, ``_train``, ``_encode``) and hands back a :class:`ChunkResult`: the chunk's
:class:`~fedem_private.privacy.central.SumPart` (its clipped deltas summed in float64
and the clipping figures), its clients' new private and dense groups, and the bytes
moved. The driver adds the parts to its secure sum **in the round's chunk order**
(:func:`apply_results`), exactly as the one-process loop adds each chunk's sum as soon
as it is formed, so the sum, the figures and every later number are the same bits;
the server's end of the round (the noisy release, the aggregator, the accounting) is
the driver's own, unchanged.

This module holds only the simulation side: the :class:`ShardExecutor` protocol, the
tasks, the worker's computation (:func:`run_shard`) and :class:`InProcessShards`, an
executor that runs the shards one after another in this process (the reference the
tests use without Ray). The Ray executor lives in the experiments room
(:mod:`fedem_private.experiments.ray_shards`), which this room may not import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from fedem_private.errors import UserError
from fedem_private.privacy.central import SumPart, sparse_sum_part, sum_part

if TYPE_CHECKING:
    from fedem_private.simulation.loop import RoundWork, Simulation


@dataclass(frozen=True)
class ShardTask:
    """What one shard needs for one round besides the run's config and split (which a
    worker holds from the start).

    ``chunks`` are whole chunks of the round, in the round's chunk order; ``items`` the
    global item table (m, d) and ``dense`` the global dense groups the round sends;
    ``private`` and ``dense_local`` the shard's clients' own groups, rows in the order of
    the concatenated chunks; ``clip`` the round's clip C of the secure sum.
    """

    round: int
    chunks: tuple[np.ndarray, ...]
    items: torch.Tensor
    dense: dict[str, torch.Tensor]
    private: dict[str, torch.Tensor]
    dense_local: dict[str, torch.Tensor]
    clip: float

    @property
    def clients(self) -> np.ndarray:
        """The shard's clients, in chunk order."""
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int64)


@dataclass
class ChunkResult:
    """One chunk's round as computed by a shard: its share of the secure sum, its clients'
    new private groups and own dense groups (as the loop's ``_train`` keeps them), and the
    bytes it sent up and received."""

    clients: np.ndarray
    part: SumPart
    private: dict[str, torch.Tensor] = field(default_factory=dict)
    dense_local: dict[str, torch.Tensor] = field(default_factory=dict)
    up_bytes: int = 0
    down_bytes: int = 0


class ShardExecutor(Protocol):
    """Runs one round's shards somewhere (Ray actors, this process) and returns each
    task's chunk results, tasks and chunks in the order given."""

    @property
    def shards(self) -> int:
        """How many shards a round is cut into."""
        ...

    def run_round(self, tasks: Sequence[ShardTask]) -> list[list[ChunkResult]]:
        """:func:`run_shard` of every task on a worker holding the run's config and split."""
        ...


def check_shardable(sim: Simulation) -> None:
    """Refuse, in one line, a run whose round cannot be sharded exactly: only a central
    mechanism's secure sum (the parts add in chunk order) with no per-client item table
    to ship (``--client-tables global``), on the CPU, without merging, FedPEFT codecs,
    local DP-SGD or the share rule."""
    cfg = sim.cfg
    why = None
    if not sim.privacy.central:
        why = (f"--privacy {cfg.privacy.mode} releases each upload; only a central mechanism "
               f"(cdp-gaussian, dp-ftrl), whose uploads only enter the secure sum, is sharded")
    elif cfg.train.client_tables != "global":
        why = (f"--client-tables {cfg.train.client_tables} keeps an item table (or its rows) "
               f"per client, which a shard would have to ship each round; use "
               f"--client-tables global")
    elif sim.device.type != "cpu":
        why = f"shards run on the CPU; this run's device is {sim.device.type}"
    elif sim.merger.merges or sim.merger.every_batch:
        why = f"merge {cfg.federation.resolved_merge} is not sharded; use merge sr"
    elif bool(sim.codec.peft):
        why = f"codec {cfg.federation.codec} is not sharded"
    elif sim.privacy.dpsgd:
        why = "local DP-SGD is not sharded"
    elif cfg.federation.agg_clients_ratio < 1.0:
        why = "--agg-clients-ratio < 1 is not sharded"
    elif sim.privacy.selects_rows:
        why = "--select-rows (private row selection) is not sharded"
    if why is not None:
        raise UserError(f"sharded rounds: {why}")


def shard_tasks(sim: Simulation, t: int, chunks: Sequence[np.ndarray], shards: int
                ) -> list[ShardTask]:
    """Cut the round's chunks (in order) into at most ``shards`` contiguous runs of whole
    chunks of about equal client counts, and pack each with what its worker needs."""
    sizes = np.array([c.shape[0] for c in chunks], dtype=np.int64)
    total = int(sizes.sum())
    # chunk i goes to shard floor(start_i * shards / total): contiguous, balanced by clients
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(chunks) else sizes
    owner = (starts * max(shards, 1)) // max(total, 1)
    items = sim.aggregator.table.detach().clone()
    dense = ({n: v.detach().clone() for n, v in sim.dense.params.items()}
             if sim.dense is not None else {})
    tasks = []
    for s in range(max(shards, 1)):
        mine = tuple(chunks[i] for i in np.flatnonzero(owner == s))
        if not mine:
            continue
        idx = sim._index(np.concatenate(mine))
        tasks.append(ShardTask(
            t, mine, items, dense,
            {n: v.index_select(0, idx) for n, v in sim.state.private.items()},
            {n: v.index_select(0, idx) for n, v in sim.state.dense_local.items()},
            sim.privacy.sum_clip))
    return tasks


def run_shard(sim: Simulation, task: ShardTask) -> list[ChunkResult]:
    """A worker's round (``sim`` is the worker's own simulation of the same config and
    split): adopt the round's global tables and the shard's clients' groups, then for
    each chunk the loop's send, merge, train and encode and the chunk's share of the
    secure sum. Nothing of the worker's server side (aggregator sums, privacy layer,
    ledger) is used or changed beyond the sent tables."""
    from fedem_private.simulation.loop import RoundWork, SecureSumUploads, wire_bytes

    check_shardable(sim)
    sim.aggregator.adopt(task.items)
    if sim.dense is not None:
        sim.dense.params = {n: v.clone() for n, v in task.dense.items()}
    idx = sim._index(np.array(task.clients, dtype=np.int64))
    for n, v in task.private.items():
        sim.state.private[n][idx] = v
    for n, v in task.dense_local.items():
        sim.state.dense_local[n][idx] = v
    out = []
    for chunk in task.chunks:
        chunk = np.array(chunk, dtype=np.int64)  # writable: Ray hands read-only arrays over
        rnd = RoundWork(task.round, 0.0, task.clients, peft=False, before=None)
        work = sim._send(rnd, chunk)
        sim._merge(rnd, work)
        sim._train(rnd, work)
        sim._encode(rnd, work)
        assert work.new is not None and work.enc_sent is not None and work.enc_new is not None
        up = work.k * wire_bytes(sim.wire(rnd).decode(work.enc_new[:1]))
        assert isinstance(sim.uploads, SecureSumUploads)
        rows = sim.uploads.sum_rows(rnd, work)  # the one-process round's rule, so same bits
        part = (sum_part(work.enc_sent, work.enc_new, task.clip) if rows is None
                else sparse_sum_part(work.enc_sent, work.enc_new, rows, task.clip))
        out.append(ChunkResult(chunk, part,
                               dict(work.new.private), dict(work.new.dense), up,
                               rnd.down_bytes))
    return out


def apply_results(sim: Simulation, rnd: RoundWork, results: Sequence[ChunkResult]) -> None:
    """The driver's side of a sharded round, chunk by chunk in the round's order: each
    part into the secure sum, each client's new groups kept as ``_train`` keeps them, the
    bytes counted (as the one-process ``SecureSumUploads.upload`` and ``_send`` do)."""
    st = sim.state
    for res in results:
        clients = np.array(res.clients, dtype=np.int64)  # writable (Ray's are read-only)
        sim.privacy.contribute_part(res.part, clients)
        idx = sim._index(clients)
        for name, value in res.private.items():
            st.keep_private(idx, name, value)
        for name, value in res.dense_local.items():
            st.dense_local[name][idx] = value
        rnd.up_bytes += res.up_bytes
        rnd.down_bytes += res.down_bytes


def run_sharded(sim: Simulation, rnd: RoundWork, executor: ShardExecutor) -> None:
    """The clients' part of round ``rnd`` through ``executor``: the round's chunks (the
    one-process loop's, in its order) cut into shards, run, and their results applied in
    chunk order (:func:`apply_results`)."""
    chunks = list(sim._chunks(rnd.clients, rnd.t))
    tasks = shard_tasks(sim, rnd.t, chunks, executor.shards)
    results = executor.run_round(tasks)
    if len(results) != len(tasks):
        raise RuntimeError(f"{len(tasks)} shards sent, {len(results)} answered")
    apply_results(sim, rnd, [r for shard in results for r in shard])


class ShardRunner:
    """What every executor adds to its :class:`ShardExecutor` side, and all a
    :class:`~fedem_private.simulation.loop.Simulation` calls (its ``RoundSharding``): the
    run checked once (:func:`check_shardable`) and each round's clients run in shards
    (:func:`run_sharded`). The loop imports nothing of this module: doors open one way."""

    def check(self, sim: Simulation) -> None:
        check_shardable(sim)

    def run(self, sim: Simulation, rnd: RoundWork) -> None:
        run_sharded(sim, rnd, self)  # type: ignore[arg-type]  # an executor with this mixin


class InProcessShards(ShardRunner):
    """A :class:`ShardExecutor` running the shards one after another in this process, each
    on its own worker simulation of the run's config and split (the reference for the
    Ray executor, and for tests without Ray)."""

    def __init__(self, sim: Simulation, shards: int) -> None:
        from fedem_private.simulation.loop import Simulation

        if shards < 1:
            raise UserError(f"shards must be >= 1, got {shards}")
        self._shards = int(shards)
        self.workers = [Simulation(sim.cfg, sim.split, dataset_name=sim.dataset_name,
                                   item_features=sim.item_features) for _ in range(shards)]

    @property
    def shards(self) -> int:
        return self._shards

    def run_round(self, tasks: Sequence[ShardTask]) -> list[list[ChunkResult]]:
        return [run_shard(self.workers[i % self._shards], task)
                for i, task in enumerate(tasks)]
