"""The vectorised engine against the per-client reference, and its invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.data.split import exclusion_csr
from fedem_private.models.mf import LocalTrainConfig, draw_samples, num_steps, train_chunk
from fedem_private.reference import round as reference
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.simulation.loop import Simulation


@pytest.fixture(scope="module")
def small_split():
    data = generate(SyntheticConfig(n_users=40, n_items=120, mean_activity=25,
                                    activity_sigma=1.0), seed=5)
    return leave_one_out(data, 5)


def _sorted_clients(split, cfg, protocol="strict", seed=0, round_=1):
    excl = exclusion_csr(split, protocol)
    clients = np.arange(split.n_users)
    s = draw_samples(seed, round_, clients, split.train_indptr, split.train_items, *excl,
                     split.n_items, cfg.num_negatives)
    order = np.argsort(-num_steps(np.diff(s.indptr), cfg), kind="stable")
    return order, excl


@pytest.mark.parametrize("grad_clip,epochs,dtype,tol", [
    (None, 1, torch.float32, 1e-4),
    (0.05, 1, torch.float32, 1e-4),
    # Several epochs of Adam at lr 0.1 amplify float32 rounding chaotically where a row's
    # gradients nearly cancel (m / sqrt(v) is scale-free), so the multi-epoch comparison
    # runs in float64, where both paths must agree to rounding.
    (None, 3, torch.float64, 1e-9),
    (0.05, 3, torch.float64, 1e-9),
])
def test_vectorised_local_training_equals_reference(small_split, grad_clip, epochs, dtype, tol):
    cfg = LocalTrainConfig(epochs=epochs, batch_size=32, lr=0.1, grad_clip=grad_clip)
    order, excl = _sorted_clients(small_split, cfg)
    sp = small_split
    samples = draw_samples(0, 1, order, sp.train_indptr, sp.train_items, *excl, sp.n_items,
                           cfg.num_negatives)
    g = torch.Generator().manual_seed(1)
    q0 = (torch.randn(len(order), sp.n_items, 8, generator=g) * 0.1).to(dtype)
    p0 = (torch.randn(len(order), 8, generator=g) * 0.1).to(dtype)
    q_vec, p_vec, touched = train_chunk(q0, p0, order, samples, cfg, 0, 1)
    q_ref, p_ref = reference.train_clients(q0, p0, order, samples, cfg, 0, 1)
    assert (q_vec - q_ref).abs().max() < tol
    assert (p_vec - p_ref).abs().max() < tol
    moved = (q_vec - q0).abs().sum(-1) > 0
    assert moved.any()
    assert not (moved & ~touched).any()  # only rows a client trained on can move
    for j in range(len(order)):  # touched = exactly the client's positives and negatives
        items, _ = samples.of(j)
        assert set(torch.nonzero(touched[j]).flatten().tolist()) == set(items.tolist())


def test_train_chunk_requires_sorted_clients(small_split):
    cfg = LocalTrainConfig(epochs=1, batch_size=16)
    order, excl = _sorted_clients(small_split, cfg)
    rev = order[::-1].copy()
    sp = small_split
    s = draw_samples(0, 1, rev, sp.train_indptr, sp.train_items, *excl, sp.n_items, 4)
    with pytest.raises(ValueError, match="sorted"):
        train_chunk(torch.zeros(len(rev), sp.n_items, 4), torch.zeros(len(rev), 4), rev, s,
                    cfg, 0, 1)


def _cfg(**over) -> RunConfig:
    base = {"data.dataset": "synthetic", "train.rounds": 2, "train.local_epochs": 1,
            "train.batch_size": 32, "train.dim": 8}
    base.update(over)
    return with_overrides(RunConfig(), base)


def test_one_fedmf_round_equals_reference_loop(small_split):
    sim = Simulation(_cfg(), small_split)
    q0 = sim.state.q_global.clone()
    p0 = sim.state.p.clone()
    sim.step()
    tr = sim.cfg.train
    cfg = LocalTrainConfig(epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.lr)
    q_ref, p_ref, uploads = reference.fedavg_round(
        q0, p0, 1, tr.seed, small_split.train_indptr, small_split.train_items, sim.excl,
        small_split.n_items, cfg)
    assert (sim.state.q_global - q_ref).abs().max() < 1e-4
    assert (sim.state.p - p_ref).abs().max() < 1e-4
    assert (sim.state.q_local - uploads).abs().max() < 1e-4


@pytest.mark.parametrize("method", ["fedmf", "fedem"])
def test_chunking_does_not_change_results(small_split, method):
    a = Simulation(_cfg(**{"federation.method": method}), small_split)
    b = Simulation(_cfg(**{"federation.method": method}), small_split)
    b._chunk_size = lambda: 3  # many tiny chunks
    a.run()
    b.run()
    assert (a.state.q_local - b.state.q_local).abs().max() < 1e-5
    assert (a.state.p - b.state.p).abs().max() < 1e-5


def test_chunk_cap_is_wider_on_a_gpu(small_split):
    """The CPU trains at most MAX_CHUNK clients side by side, a GPU up to MAX_CHUNK_CUDA
    (the memory budget still bounds both; results do not depend on it, test above)."""
    from fedem_private.simulation import loop

    sim = Simulation(_cfg(**{"train.memory_budget_mb": 1 << 16}), small_split)
    assert sim._chunk_size() == loop.MAX_CHUNK
    sim.device = torch.device("cuda")  # only the cap is read here: no GPU needed
    assert sim._chunk_size() == loop.MAX_CHUNK_CUDA > loop.MAX_CHUNK
    tight = Simulation(_cfg(**{"train.memory_budget_mb": 1}), small_split)
    tight.device = torch.device("cuda")
    assert 1 <= tight._chunk_size() < loop.MAX_CHUNK


def test_client_fraction_only_moves_participants(small_split):
    sim = Simulation(_cfg(**{"train.client_fraction": 0.25}), small_split)
    before = sim.state.q_local.clone()
    clients = sim.participants(1)
    assert len(clients) == int(np.ceil(0.25 * small_split.n_users))
    sim.step()
    changed = (sim.state.q_local - before).abs().flatten(1).amax(1) > 0
    assert set(torch.nonzero(changed).flatten().tolist()) <= set(clients.tolist())
    assert not np.array_equal(sim.participants(1), sim.participants(2))


def test_local_method_never_mixes_clients(small_split):
    sim = Simulation(_cfg(**{"federation.method": "local"}), small_split)
    solo = Simulation(_cfg(**{"federation.method": "local"}), small_split)
    sim.run()
    solo.run()
    assert sim.state.q_global is None
    assert torch.equal(sim.state.q_local, solo.state.q_local)  # deterministic


def test_seed_changes_results(small_split):
    a = Simulation(_cfg(), small_split)
    b = Simulation(_cfg(**{"train.seed": 1}), small_split)
    a.step()
    b.step()
    assert not torch.allclose(a.state.q_global, b.state.q_global)


@pytest.mark.parametrize("method,merge", [("fedmf", "sr"), ("fedsim", "sr"), ("fedsim", "sm"),
                                          ("fedsim", "dm"), ("fedem", "em"), ("local", "sr")])
def test_second_round_equals_per_client_reference(small_split, method, merge):
    """Round 2 (merging active) of every method against the one-client-at-a-time loop."""
    sim = Simulation(_cfg(**{"federation.method": method, "federation.merge": merge}),
                     small_split)
    sim.step()
    ref = reference.simulation_round(sim)
    stats = sim.step()
    assert (sim.state.q_local - ref["q_local"]).abs().max() < 1e-4
    if ref["rho_mean"] is None:  # static replacement: nothing merged
        assert stats.merge == {}
    else:  # the mean weight on Q_g, reported in metrics.csv as rho_mean
        assert stats.merge["rho_mean"] == pytest.approx(ref["rho_mean"], abs=1e-5)
        assert 0.0 <= stats.merge["rho_mean"] <= 1.0
    assert (sim.state.p - ref["p"]).abs().max() < 1e-4
    if ref["q_global"] is not None:
        assert (sim.state.q_global - ref["q_global"]).abs().max() < 1e-4


@pytest.mark.parametrize("over", [
    {"federation.method": "fedmf"},
    {"federation.method": "pfedrec"},
    {"federation.method": "fedncf"},  # a shared MLP beside the items (extra upload rows)
    {"federation.method": "fedrap"},  # uniform sums; weight decay moves every row
    {"federation.method": "fedem", "federation.aggregation": "fedavg"},  # merges from round 2
    {"federation.method": "pfedrec", "train.client_fraction": 0.5, "train.optimizer": "sgd",
     "train.lr": 0.5, "train.weight_decay": 0.01},  # decay moves every row
    {"federation.method": "fedmf", "federation.agg_clients_ratio": 0.4},
])
def test_rounds_that_add_trained_rows_give_the_dense_sums_bits(small_split, over, monkeypatch):
    """The loop hands a sum aggregator only each upload's trained rows where that is the
    whole difference (Aggregator.add_rows); three rounds that way and three with every
    upload added whole end in the same tables, bit for bit."""
    from fedem_private.simulation import loop

    cfg = with_overrides(RunConfig(), {"train.rounds": 3, "train.local_epochs": 2,
                                       "train.dim": 8, "train.eval_every": 100, **over})
    calls = {"rows": 0}
    real = loop.ReleasedUploads._trained_rows

    def counted(self, rnd, work, released):
        rows = real(self, rnd, work, released)
        calls["rows"] += rows is not None
        return rows

    monkeypatch.setattr(loop.ReleasedUploads, "_trained_rows", counted)
    sparse = Simulation(cfg, small_split)
    sparse.run()
    monkeypatch.setattr(loop.ReleasedUploads, "_trained_rows", lambda *a: None)
    dense = Simulation(cfg, small_split)
    dense.run()
    assert calls["rows"] > 0  # the sparse add was taken (round 1 at least)
    assert torch.equal(sparse.state.q_local, dense.state.q_local)
    assert sparse.state.q_global is not None
    assert torch.equal(sparse.state.q_global, dense.state.q_global)
    for name, value in sparse.state.private.items():
        assert torch.equal(value, dense.state.private[name])


def test_a_perturbed_or_merged_upload_is_added_whole(small_split, monkeypatch):
    """Under a local mechanism (noise on every entry) no chunk's upload is added by its
    trained rows."""
    from fedem_private.simulation import loop

    cfg = with_overrides(RunConfig(), {"train.rounds": 2, "train.local_epochs": 1,
                                       "train.dim": 8, "train.eval_every": 100,
                                       "privacy.mode": "ldp-laplace", "privacy.epsilon": 10.0,
                                       "privacy.clip": 1.0})
    taken = []
    real = loop.ReleasedUploads._trained_rows
    monkeypatch.setattr(loop.ReleasedUploads, "_trained_rows",
                        lambda self, *a: taken.append(real(self, *a)))
    Simulation(cfg, small_split).run()
    assert taken and all(rows is None for rows in taken)
