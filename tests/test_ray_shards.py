"""One run's rounds in shards (issue 66, item 4; docs/guide.md, "One run across a Ray
cluster"): the shards' secure-sum parts are added in the one-process loop's chunk order, so
a sharded run is the one-process run bit for bit."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.errors import UserError
from fedem_private.experiments import ray_tasks
from fedem_private.privacy.central import SecureSum, sum_part
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.simulation import loop
from fedem_private.simulation.config import (
    DataConfig,
    FederationConfig,
    RunConfig,
    TrainConfig,
)
from fedem_private.simulation.loop import RoundStats, Simulation
from fedem_private.simulation.shards import InProcessShards

SYN = SyntheticConfig(n_users=60, n_items=40, mean_activity=8)
needs_ray = pytest.mark.skipif(not ray_tasks.ray_installed(),
                               reason="Ray is not installed (pip install 'fedem-private[ray]')")


@pytest.fixture(scope="module")
def split():
    return leave_one_out(generate(SYN, 0), 0)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Chunks of at most 4 clients: a cohort of about 20 is 5-6 chunks, so each shard
    holds several and the order the driver adds them in matters."""
    monkeypatch.setattr(loop, "MAX_CHUNK", 4)
    yield


def _cfg(method: str = "fedmf", mode: str = "cdp-gaussian", *, tables: str = "global",
         **privacy: object) -> RunConfig:
    return RunConfig(data=DataConfig(synthetic=SYN),
                     train=TrainConfig(rounds=3, local_epochs=1, dim=4, cohort_size=20,
                                       client_tables=tables),
                     federation=FederationConfig(method=method),
                     privacy=PrivacyConfig(mode=mode, noise_multiplier=1.0, clip=0.5,
                                           **privacy))  # type: ignore[arg-type]


def _rows(history: list[RoundStats]) -> list[dict[str, object]]:
    """Every recorded number of the rounds but their wall-clock seconds."""
    return [{k: v for k, v in h.row().items() if k != "seconds"} for h in history]


def _assert_same_run(a: Simulation, ha: list[RoundStats], b: Simulation,
                     hb: list[RoundStats]) -> None:
    assert _rows(ha) == _rows(hb)
    assert torch.equal(a.aggregator.table, b.aggregator.table)
    assert a.state.private.keys() == b.state.private.keys()
    for name in a.state.private:
        assert torch.equal(a.state.private[name], b.state.private[name]), name
    for name in a.state.dense_local:
        assert torch.equal(a.state.dense_local[name], b.state.dense_local[name]), name
    if a.dense is not None:
        assert b.dense is not None
        for name in a.dense.params:
            assert torch.equal(a.dense.params[name], b.dense.params[name]), name
    assert a.view.privacy_summary() == b.view.privacy_summary()
    assert a.view.privacy_ledger() == b.view.privacy_ledger()


def test_a_secure_sum_of_parts_is_the_sum_of_chunks() -> None:
    """SecureSum.add is sum_part then add_part, so parts formed elsewhere and added in
    order give the same float64 sum and figures."""
    gen = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(k, 6, 3, generator=gen), torch.randn(k, 6, 3, generator=gen))
              for k in (4, 4, 2)]
    one, other = SecureSum(1.0, 0.0, 10.0, 0), SecureSum(1.0, 0.0, 10.0, 0)
    one.begin_round(1)
    other.begin_round(1)
    for sent, local in chunks:
        one.add(sent, local)
    for part in [sum_part(sent, local, other.clip) for sent, local in chunks]:
        other.add_part(part)
    assert one._sum is not None and other._sum is not None
    assert torch.equal(one._sum, other._sum)
    assert one.stats == other.stats
    with pytest.raises(ValueError, match="clipped at"):
        other.add_part(sum_part(*chunks[0], 2.0))


# fedncf: dense groups (an MLP); clip_quantile: adaptive clipping moves C between rounds
@pytest.mark.parametrize(("method", "privacy"), [("fedmf", {}), ("fedncf", {}),
                                                 ("fedmf", {"clip_quantile": 0.5})])
def test_in_process_shards_give_the_one_process_run(split, method: str,
                                                    privacy: dict[str, float]) -> None:
    a = Simulation(_cfg(method, **privacy), split)
    assert len(list(a._chunks(a.participants(1), 1))) >= 4  # several chunks per shard
    ha = a.run()
    b = Simulation(_cfg(method, **privacy), split)
    b.shard(InProcessShards(b, 3))
    hb = b.run()
    _assert_same_run(a, ha, b, hb)


def test_dp_ftrl_shards_give_the_one_process_run(split) -> None:
    cfg = _cfg("fedmf", "dp-ftrl")
    cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, noise_multiplier=None,
                                                               epsilon=8.0))
    a, b = Simulation(cfg, split), Simulation(cfg, split)
    b.shard(InProcessShards(b, 2))
    _assert_same_run(a, a.run(), b, b.run())


def test_what_cannot_be_sharded_exactly_is_refused(split) -> None:
    with pytest.raises(UserError, match="only a central mechanism"):
        sim = Simulation(dataclasses.replace(_cfg(), privacy=PrivacyConfig()), split)
        sim.shard(InProcessShards(sim, 2))
    with pytest.raises(UserError, match="client-tables global"):
        sim = Simulation(_cfg(tables="kept"), split)
        sim.shard(InProcessShards(sim, 2))
    from fedem_private.experiments.ray_shards import shard_options

    assert shard_options(None, None) is None
    assert shard_options("auto", 3) == {"shards": 3, "address": "auto"}
    with pytest.raises(UserError, match="give --ray-shards"):
        shard_options("auto", None)


@needs_ray
def test_a_run_on_two_ray_shards_is_the_one_process_run(split) -> None:
    from fedem_private.experiments.ray_shards import ray_shards

    a = Simulation(_cfg(), split)
    ha = a.run()
    b = Simulation(_cfg(), split)
    with ray_shards(b, 2) as how:
        assert how.startswith("2 shards, local Ray")
        hb = b.run()
    assert b.shards is None  # detached on exit
    _assert_same_run(a, ha, b, hb)
    assert np.isfinite(ha[-1].privacy["eps_spent"])
