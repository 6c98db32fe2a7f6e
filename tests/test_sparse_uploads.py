"""The secure sum formed from the rows each client trained (issue 78, item 1; docs/design.md
section 19): equal to the dense reference over every row, and taken only where exact."""

from __future__ import annotations

import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.errors import Diverged
from fedem_private.privacy.central import packed_rows, sparse_sum_part, sum_part
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.simulation.config import DataConfig, FederationConfig, RunConfig, TrainConfig
from fedem_private.simulation.loop import SecureSumUploads, Simulation

SYN = SyntheticConfig(n_users=50, n_items=60, mean_activity=8)


def _uploads(k: int = 6, n: int = 30, d: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sent = torch.randn(n, d, generator=g).expand(k, n, d)  # every client was sent the same
    rows = torch.rand(k, n, generator=g) < 0.2
    rows[0] = False  # a client that trained nothing
    rows[1] = True  # and one that trained every row
    scale = torch.tensor([1.0, 5.0, 0.01, 3.0, 0.2, 9.0])[:k, None, None]
    local = sent + rows[:, :, None] * torch.randn(k, n, d, generator=g) * scale
    return sent, local.float(), rows


@pytest.mark.parametrize("clip", [0.05, 1.0, 100.0])
def test_the_sparse_sum_equals_the_dense_sum_over_every_row(clip):
    sent, local, rows = _uploads()
    dense, sparse = sum_part(sent, local, clip), sparse_sum_part(sent, local, rows, clip)
    torch.testing.assert_close(sparse.total, dense.total, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(sparse.stats.norms, dense.stats.norms, rtol=1e-12, atol=0)
    assert sparse.stats.fraction_clipped == dense.stats.fraction_clipped
    assert sparse.k == dense.k == 6
    assert 0 < dense.stats.fraction_clipped < 1 or clip == 100.0


def test_packed_rows_lists_each_clients_rows_in_order():
    rows = torch.tensor([[False, True, False, True], [False, False, False, False],
                         [True, True, True, False]])
    ids, valid = packed_rows(rows)
    assert ids.shape == (3, 3)
    assert ids[valid].tolist() == [1, 3, 0, 1, 2]
    assert valid.sum(dim=1).tolist() == [2, 0, 3]


def test_a_non_finite_trained_row_is_refused():
    sent, local, rows = _uploads()
    local[3, int(rows[3].nonzero()[0, 0])] = float("nan")
    with pytest.raises(Diverged, match="non-finite"):
        sparse_sum_part(sent, local, rows, 1.0)


def _sim(split, method: str = "fedmf", tables: str = "global", sparse: bool = True,
         **fed: str) -> Simulation:
    cfg = RunConfig(data=DataConfig(synthetic=SYN),
                    train=TrainConfig(rounds=2, local_epochs=2, dim=4, cohort_size=20,
                                      client_tables=tables),
                    federation=FederationConfig(method=method, **fed),
                    privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=0.7, clip=0.5))
    sim = Simulation(cfg, split)
    assert isinstance(sim.uploads, SecureSumUploads)
    sim.uploads.sparse_sums = sparse
    return sim


@pytest.fixture(scope="module")
def split():
    return leave_one_out(generate(SYN, 0), 0)


@pytest.mark.parametrize("tables", ["global", "kept"])
def test_a_private_run_reads_the_same_with_sparse_and_dense_sums(split, tables):
    sims = [_sim(split, tables=tables, sparse=s) for s in (True, False)]
    for sim in sims:
        sim.step()
        sim.step()
    a, b = (s.aggregator.table for s in sims)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(a, sims[0].state.q_global * 0)  # the table moved


def test_the_sparse_sum_is_taken_without_a_merge_and_not_with_one(split, monkeypatch):
    seen: list[bool] = []
    original = SecureSumUploads.sum_rows

    def spy(self, rnd, work):
        rows = original(self, rnd, work)
        seen.append(rows is not None)
        return rows

    monkeypatch.setattr(SecureSumUploads, "sum_rows", spy)
    _sim(split).step()
    assert seen and all(seen)  # FedMF: every client trains from the table it was sent
    seen.clear()
    sim = _sim(split, method="fedem", tables="kept", aggregation="fedavg")
    sim.step()
    sim.step()  # from round 2 FedEM merges: the start is not what was sent
    assert seen and not all(seen)
