"""One run's rounds sharded over Ray actors: the back end of ``fedem-private run --ray-shards``
(issue 66, item 4; docs/guide.md, "One run across a Ray cluster").

Each of K actors holds its own :class:`~fedem_private.simulation.loop.Simulation` of the
run's config and split (the split travels once, through Ray's object store, so a
cluster's nodes need not hold the data). Every round the driver cuts the round's chunks
into K shards of whole chunks (:mod:`fedem_private.simulation.shards`), each actor
computes its chunks' shares of the secure sum and its clients' new private state, and
the driver adds the shares in chunk order and takes the server step itself: the results
are the one-process run's, bit for bit. Ray is imported only when this is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedem_private.data.split import Split
from fedem_private.experiments.ray_tasks import LOCAL, import_ray, ray_session
from fedem_private.simulation.config import RunConfig
from fedem_private.simulation.loop import Simulation
from fedem_private.simulation.shards import (
    ChunkResult,
    ShardRunner,
    ShardTask,
    check_shardable,
    run_shard,
)


class ShardWorker:
    """A shard's worker (made a Ray actor by :class:`RayShards`): a simulation of the run's
    config and split whose clients' side of a round :func:`run_shard` computes."""

    def __init__(self, cfg: RunConfig, split: Split, dataset_name: str,
                 item_features: np.ndarray | None) -> None:
        self.sim = Simulation(cfg, split, dataset_name=dataset_name,
                              item_features=item_features)

    def run(self, task: ShardTask) -> list[ChunkResult]:
        """One round's shard (:func:`~fedem_private.simulation.shards.run_shard`)."""
        return run_shard(self.sim, task)


class RayShards(ShardRunner):
    """A :class:`~fedem_private.simulation.shards.ShardExecutor` over ``shards`` Ray actors
    (1 CPU each, never restarted: a lost actor fails the run). Needs an open
    :func:`~fedem_private.experiments.ray_tasks.ray_session`."""

    def __init__(self, sim: Simulation, shards: int) -> None:
        ray = import_ray()
        self._ray = ray
        self._shards = int(shards)
        split = ray.put(sim.split)  # once per run; each actor reads it from the store
        actor = ray.remote(num_cpus=1, max_restarts=0)(ShardWorker)
        self.actors = [actor.remote(sim.cfg, split, sim.dataset_name, sim.item_features)
                       for _ in range(self._shards)]

    @property
    def shards(self) -> int:
        return self._shards

    def run_round(self, tasks: Sequence[ShardTask]) -> list[list[ChunkResult]]:
        """Every task on its own actor, at once; the answers in the tasks' order."""
        refs = [self.actors[i % self._shards].run.remote(task) for i, task in enumerate(tasks)]
        return list(self._ray.get(refs))

    def close(self) -> None:
        """End the actors (their processes and simulations)."""
        for a in self.actors:
            with contextlib.suppress(Exception):
                self._ray.kill(a)
        self.actors = []


def _package_dir() -> list[str]:
    """This package's directory, shipped to a cluster's workers so that they run the
    driver's code whatever version the nodes have installed."""
    return [str(Path(__file__).resolve().parents[1])]


@contextlib.contextmanager
def ray_shards(sim: Simulation, shards: int, address: str | None = None) -> Iterator[str]:
    """Compute ``sim``'s rounds in ``shards`` shards on Ray while the ``with`` lasts: a local
    Ray with ``shards`` CPUs (``address`` None or ``local``), or the cluster at ``address``
    (``auto``, ``HOST:6379``, ``ray://HOST:10001``). Refuses, before starting Ray, a run
    whose rounds cannot be sharded exactly. Yields a short description of where."""
    if shards < 1:
        from fedem_private.errors import UserError

        raise UserError(f"--ray-shards must be >= 1, got {shards}")
    check_shardable(sim)
    address = address or LOCAL
    local = address == LOCAL
    with ray_session(address, num_cpus=shards if local else None,
                     ship=() if local else _package_dir()) as how:
        executor = RayShards(sim, shards)
        sim.shard(executor)
        try:
            yield f"{shards} shards, {how}"
        finally:
            sim.shard(None)
            executor.close()


def shard_options(ray: str | None, ray_shards: int | None) -> dict[str, Any] | None:
    """``run``'s ``--ray ADDRESS`` / ``--ray-shards K`` as :func:`ray_shards`'s keyword
    arguments, or None when the run is not sharded. ``--ray`` without ``--ray-shards`` is
    refused in one line (how many shards is the user's choice, not the cluster's)."""
    if ray_shards is None and ray is None:
        return None
    if ray_shards is None:
        from fedem_private.errors import UserError

        raise UserError("--ray ADDRESS shards a run's rounds: give --ray-shards K too")
    return {"shards": int(ray_shards), "address": ray}
