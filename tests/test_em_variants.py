"""Issue 69's variants of elastic merging against their slow references: equation 10 on the
client's own items only (``federation.merge_rows = "seen"``) and the proximal local table
(``federation.prox_mu``); and every run without them unchanged."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private.client.merging import merge_tables
from fedem_private.client.variants import merge_seen_rows, prox_rows, seen_mask
from fedem_private.errors import UserError
from fedem_private.models.mf import LocalTrainConfig, train_chunk
from fedem_private.reference import round as reference
from fedem_private.reference.variants import prox_mf_train_client, seen_merge_client
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.simulation.config_io import identity_dict
from fedem_private.simulation.loop import Simulation


def _cfg(**over) -> RunConfig:
    base = {"data.dataset": "synthetic", "train.rounds": 2, "train.local_epochs": 1,
            "train.batch_size": 32, "train.dim": 8}
    base.update(over)
    return with_overrides(RunConfig(), base)


def test_seen_rows_merge_equals_item_by_item_reference():
    g = torch.Generator().manual_seed(3)
    k, m, d = 3, 12, 4
    q_l, q_g = torch.randn(k, m, d, generator=g), torch.randn(k, m, d, generator=g)
    rho = torch.rand(k, m, generator=g)
    indptr = np.array([0, 2, 2, 5, 9])  # client 1 has no training item
    items = np.array([1, 7, 3, 4, 11, 0, 2, 5, 6])
    clients = np.array([3, 1, 0])
    seen = seen_mask(clients, indptr, items, m)
    fast = merge_seen_rows(merge_tables(q_l, q_g, rho), q_g, seen)
    for j, u in enumerate(clients.tolist()):
        own = items[indptr[u]: indptr[u + 1]]
        assert seen[j].nonzero().flatten().tolist() == sorted(own.tolist())
        ref = seen_merge_client(q_l[j], q_g[j], rho[j], own)
        assert torch.allclose(fast[j], ref, atol=1e-6)
    assert torch.equal(fast[1], q_g[1])  # no item of its own: the received table itself
    assert not torch.equal(fast[0], q_g[0])  # its own rows are merged
    # a scalar rho (sm) too
    fast_sm = merge_seen_rows(merge_tables(q_l, q_g, torch.tensor(0.25)), q_g, seen)
    ref_sm = seen_merge_client(q_l[0], q_g[0], 0.25, items[indptr[3]: indptr[4]])
    assert torch.allclose(fast_sm[0], ref_sm, atol=1e-6)


@pytest.mark.parametrize("mu", [0.0, 0.7])
def test_proximal_local_training_equals_per_client_adam(small_split, sorted_chunk, mu):
    cfg = LocalTrainConfig(epochs=3, batch_size=32, lr=0.1)
    order, samples = sorted_chunk(cfg)
    g = torch.Generator().manual_seed(1)
    k, m = len(order), small_split.n_items
    q0 = torch.randn(k, m, 8, generator=g, dtype=torch.float64) * 0.1
    anchor = q0 + torch.randn(k, m, 8, generator=g, dtype=torch.float64) * 0.3
    p0 = torch.randn(k, 8, generator=g, dtype=torch.float64) * 0.1
    q_fast, p_fast, _ = train_chunk(q0, p0, order, samples, cfg, 0, 1,
                                    rows=prox_rows(anchor, mu))
    for j, u in enumerate(order.tolist()):
        items, labels = samples.of(j)
        q_ref, p_ref = prox_mf_train_client(q0[j], p0[j], anchor[j], mu, items, labels, cfg,
                                            0, 1, u)
        assert (q_fast[j] - q_ref).abs().max() < 1e-9
        assert (p_fast[j] - p_ref).abs().max() < 1e-9
    plain, _, _ = train_chunk(q0, p0, order, samples, cfg, 0, 1)
    if mu == 0:
        assert torch.equal(q_fast, plain)
    else:  # the pull moved the trained rows toward the anchor
        assert (q_fast - anchor).norm() < (plain - anchor).norm()


@pytest.mark.parametrize("over", [
    {"federation.method": "fedsim", "federation.merge": "sm", "federation.merge_rows": "seen"},
    {"federation.method": "fedem", "federation.aggregation": "fedavg",
     "federation.merge_rows": "seen"},
    {"federation.method": "fedsim", "federation.merge": "sm", "federation.prox_mu": 0.5},
    {"federation.method": "fedmf", "federation.prox_mu": 2.0},
    {"federation.method": "fedsim", "federation.merge": "sm", "federation.merge_rows": "seen",
     "federation.prox_mu": 0.5},
])
def test_second_round_with_a_variant_equals_per_client_reference(small_split, over):
    """Round 2 of the batched loop against the one-client-at-a-time round. The proximal
    cases merge with sm, not em: where an adapter's rho is near 1 a row starts a float32
    rounding away from the received one, and Adam's first step (lr times the gradient's
    sign) turns the pull's rounding-sized gradient into a step of +-lr either way; the
    chunk-level test above checks the pull in float64 on tables far from the anchor."""
    sim = Simulation(_cfg(**over), small_split)
    sim.step()
    ref = reference.simulation_round(sim)
    sim.step()
    assert (sim.state.q_local - ref["q_local"]).abs().max() < 1e-4
    assert (sim.state.p - ref["p"]).abs().max() < 1e-4
    assert (sim.state.q_global - ref["q_global"]).abs().max() < 1e-4


def _spy_starts(sim: Simulation, monkeypatch) -> list[tuple[np.ndarray, torch.Tensor]]:
    """(clients, start item tables) of every chunk the backbone trains from now on."""
    starts: list[tuple[np.ndarray, torch.Tensor]] = []
    train = sim.backbone.train_chunk

    def spy(start, clients, *args, **kwargs):
        starts.append((np.asarray(clients).copy(), start.items.clone()))
        return train(start, clients, *args, **kwargs)

    monkeypatch.setattr(sim.backbone, "train_chunk", spy)
    return starts


def test_seen_rows_leave_unseen_rows_at_the_received_table(small_split, monkeypatch):
    sim = Simulation(_cfg(**{"federation.method": "fedsim", "federation.merge": "sm",
                             "federation.merge_rows": "seen"}), small_split)
    sim.step()
    sent = sim.state.q_global.clone()
    starts = _spy_starts(sim, monkeypatch)
    sim.step()
    sp = small_split
    for clients, start in starts:
        seen = seen_mask(clients, sp.train_indptr, sp.train_items, sp.n_items)
        assert torch.equal(start[~seen], sent[clients][~seen])  # rho' = 1 off I_u
        assert not torch.allclose(start[seen], sent[clients][seen])  # rho = 0.5 on I_u
    assert starts


def test_defaults_leave_runs_and_their_identity_unchanged(small_split):
    plain = _cfg(**{"federation.method": "fedem", "federation.aggregation": "fedavg"})
    explicit = _cfg(**{"federation.method": "fedem", "federation.aggregation": "fedavg",
                       "federation.merge_rows": "all", "federation.prox_mu": 0.0,
                       "federation.merge_every": 1})
    ids = identity_dict(plain.resolved())["federation"]
    assert not {"merge_rows", "prox_mu", "merge_every"} & set(ids)  # old digests resume
    assert identity_dict(explicit.resolved()) == identity_dict(plain.resolved())
    a, b = Simulation(plain, small_split), Simulation(explicit, small_split)
    for _ in range(2):
        a.step()
        b.step()
    assert torch.equal(a.state.q_local, b.state.q_local)
    assert torch.equal(a.state.q_global, b.state.q_global)
    seen = _cfg(**{"federation.method": "fedem", "federation.aggregation": "fedavg",
                   "federation.merge_rows": "seen"})
    assert identity_dict(seen.resolved())["federation"]["merge_rows"] == "seen"


@pytest.mark.parametrize("over,words", [
    ({"federation.method": "fedmf", "federation.merge_rows": "seen"}, "--merge-rows"),
    ({"federation.merge_rows": "some"}, "merge_rows must be one of"),
    ({"federation.prox_mu": -1.0}, "prox_mu must be a number >= 0"),
    ({"federation.method": "gpfedrec", "federation.prox_mu": 1.0}, "trains whole tables"),
    ({"federation.method": "fedem", "federation.merge_every_batch": True,
      "federation.prox_mu": 1.0}, "--prox-mu"),
])
def test_variants_refuse_what_they_cannot_do(over, words):
    with pytest.raises(UserError, match=words):
        _cfg(**over).validate()


def test_merge_every_starts_from_the_own_table_between_merges(small_split, monkeypatch):
    """--merge-every 2: round 2 (no merge) starts each client from its own table as round 1
    left it; round 3 (a merge) starts it from equation 10 with the server's table."""
    sim = Simulation(_cfg(**{"federation.method": "fedsim", "federation.merge": "sm",
                             "federation.merge_every": 2, "train.rounds": 3}), small_split)
    sim.step()
    starts = _spy_starts(sim, monkeypatch)
    own = sim.state.q_local.clone()
    sim.step()  # round 2: no merge
    assert starts
    for clients, start in starts:
        assert torch.equal(start, own[clients])
    starts.clear()
    own, sent = sim.state.q_local.clone(), sim.state.q_global.clone()
    sim.step()  # round 3: equation 10, rho 0.5
    for clients, start in starts:
        want = own[clients] + 0.5 * (sent[clients] - own[clients])
        assert torch.allclose(start, want, atol=1e-6)
        assert not torch.allclose(start, own[clients])


@pytest.mark.parametrize("over,words", [
    ({"federation.method": "fedmf", "federation.merge_every": 3}, "--merge-every"),
    ({"federation.method": "fedem", "federation.merge_every": 0}, "merge_every must be"),
    ({"federation.method": "fedem", "federation.merge_every": 2, "privacy.mode": "cdp-gaussian",
      "privacy.epsilon": 4.0}, "built without privacy"),
])
def test_merge_every_refuses_what_it_cannot_do(over, words):
    with pytest.raises(UserError, match=words):
        _cfg(**over).validate()
