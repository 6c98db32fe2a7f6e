"""Merging on every batch (the FedEM code, docs/design.md 2a): the vectorised rows against a plain
per-client reference, the round loop's use of them, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private import models
from fedem_private.client.merging import (
    BatchMergeFactory,
    MergeConfig,
    init_merge_state,
    merge,
    take_clients,
)
from fedem_private.data.split import exclusion_csr
from fedem_private.errors import UserError
from fedem_private.models.base import ClientParams, LocalTrainConfig, draw_samples, num_steps
from fedem_private.reference.merging import reference_batch_merge_client
from fedem_private.reference.models import reference_train_client


def _chunk(split, cfg: LocalTrainConfig, dim: int = 8):
    """The split's clients sorted by steps, their round-2 samples, MF start tables: each
    client's own local table (perturbed from the initial one) and a different global one."""
    excl = exclusion_csr(split, "strict")
    clients = np.arange(split.n_users)
    s = draw_samples(0, 2, clients, split.train_indptr, split.train_items, *excl,
                     split.n_items, cfg.num_negatives)
    order = clients[np.argsort(-num_steps(np.diff(s.indptr), cfg), kind="stable")]
    samples = draw_samples(0, 2, order, split.train_indptr, split.train_items, *excl,
                           split.n_items, cfg.num_negatives)
    bb = models.build("mf", split.n_items, dim, seed=0, init_std=0.1)
    k = len(order)
    g = torch.Generator().manual_seed(3)
    q0 = bb.init_items()
    q_local = q0 + 0.1 * torch.randn((k, *q0.shape), generator=g)
    q_global = q0 + 0.1 * torch.randn((k, *q0.shape), generator=g)
    adapters = init_merge_state(MergeConfig(strategy="em"), order, dim, seed=0,
                                dtype=q0.dtype)
    return bb, order, samples, q_local, q_global, bb.init_private(order), adapters


@pytest.mark.parametrize("tol, mask", [(0.0, False), (1e-2, False), (0.0, True)])
def test_batch_merge_rows_equal_the_per_client_reference(small_split, float64, tol, mask):
    """Lock-step training through BatchMergeRows vs one client at a time with two
    torch.optim.Adam (adapter step, then table step, per batch); with the early stop and
    with some clients that received no table (those train plainly, adapter unmoved)."""
    cfg = LocalTrainConfig(epochs=4, batch_size=32, lr=0.1, early_stop_tol=tol)
    bb, order, samples, q_local, q_global, private, adapters = _chunk(small_split, cfg)
    k = len(order)
    merging = (torch.arange(k) % 3 != 0) if mask else None
    factory = BatchMergeFactory(q_global, adapters, 0.05, merging)
    new, _ = bb.train_chunk(ClientParams(q_local, {}, private), order, samples, cfg, 2,
                            rows=factory)
    assert factory.made is not None
    trained = factory.made.adapters()
    moved = 0
    for j, c in enumerate(order.tolist()):
        items, labels = samples.of(j)
        one_w = tuple(w[j] for w in adapters.weights)
        one_b = tuple(b[j] for b in adapters.biases)
        if merging is not None and not bool(merging[j]):
            ref = reference_train_client(
                bb, ClientParams(q_local[j:j + 1], {}, {"p": private["p"][j:j + 1]}), items, labels,
                cfg, 2, c)
            q_ref, p_ref, w_ref, b_ref = ref.items[0], ref.private["p"][0], one_w, one_b
        else:
            q_ref, p_ref, w_ref, b_ref = reference_batch_merge_client(
                q_local[j], q_global[j], private["p"][j], one_w, one_b, items, labels, cfg,
                0.05, 0, 2, c)
        assert (new.items[j] - q_ref).abs().max() < 1e-8
        assert (new.private["p"][j] - p_ref).abs().max() < 1e-8
        for got, want in zip((*trained.weights, *trained.biases), (*w_ref, *b_ref),
                             strict=True):
            assert (got[j] - want).abs().max() < 1e-8
        moved += bool((trained.weights[0][j] - one_w[0]).abs().max() > 1e-6)
    # the adapters did train (where a table was received), and only there
    expected = k if merging is None else int(merging.sum())
    assert moved == expected


def test_batch_merge_is_not_the_train_once_merge(small_split, float64):
    """The per-batch merge trains Q_l through the merge: its tables differ from plain MF
    training of the same start (the option changes something)."""
    cfg = LocalTrainConfig(epochs=2, batch_size=32, lr=0.1)
    bb, order, samples, q_local, q_global, private, adapters = _chunk(small_split, cfg)
    start = ClientParams(q_local, {}, private)
    plain, _ = bb.train_chunk(start, order, samples, cfg, 2)
    batch, _ = bb.train_chunk(start, order, samples, cfg, 2,
                              rows=BatchMergeFactory(q_global, adapters, 0.05, None))
    assert (plain.items - batch.items).abs().max() > 1e-3


def _run_cfg(**over):
    from fedem_private.simulation.config import RunConfig, with_overrides

    base = {"data.dataset": "synthetic",
            "train.rounds": 3, "train.local_epochs": 2, "train.dim": 8,
            "federation.method": "fedem", "federation.merge_every_batch": True}
    base.update(over)
    return with_overrides(RunConfig(), base).validate()


def test_round_loop_merges_on_every_batch_and_evaluates_the_merged_table():
    """In the loop: round 1 trains no adapter; later rounds train it in local training;
    evaluation scores Q_l merged with the table each client gets next."""
    from fedem_private.data import SyntheticConfig, generate, leave_one_out
    from fedem_private.simulation.loop import Simulation

    cfg = _run_cfg()
    data = generate(SyntheticConfig(n_users=40, n_items=60, mean_activity=15), seed=1)
    sim = Simulation(cfg, leave_one_out(data, 1))
    w0 = sim.merger.state.weights[0].clone()
    sim.step()
    assert torch.equal(sim.merger.state.weights[0], w0)  # no merge in round 1
    sim.step()
    assert (sim.merger.state.weights[0] - w0).abs().amax(dim=(1, 2)).min() > 0  # all moved
    idx = torch.arange(sim.split.n_users)
    want = merge(sim.merge_cfg, take_clients(sim.merger.state, idx), sim.state.q_local,
                 sim.aggregator.sent(idx))
    got = sim.merger.evaluated(idx, sim.state.q_local, sim.aggregator.sent(idx),
                               sim.aggregator.receives(idx))
    assert torch.equal(got, want) and not torch.equal(got, sim.state.q_local)
    seen = []
    scores = sim.backbone.scores
    sim.backbone.scores = lambda params: seen.append(params.items) or scores(params)
    sim.evaluate()
    assert torch.equal(torch.cat(seen), want)  # the merged tables are what is scored


def test_paper_code_preset_merges_on_every_batch_for_fedem_only():
    from fedem_private.simulation.config import protocol_label, protocol_options

    fedem = _run_cfg(**{"data.protocol": "paper-code",
                        "federation.merge_every_batch": False}).resolved()
    assert protocol_options(fedem)["merge_every_batch"] is True
    assert protocol_label(fedem) == "paper-code"
    fedmf = _run_cfg(**{"data.protocol": "paper-code", "federation.method": "fedmf",
                        "federation.merge_every_batch": False}).resolved()
    assert "merge_every_batch" not in protocol_options(fedmf)


@pytest.mark.parametrize("over, needle", [
    ({"federation.merge": "dm"}, "use --merge em"),
    ({"federation.method": "fedmf"}, "use --merge em"),
    ({"federation.backbone": "pfedrec", "federation.method": None, "federation.merge": "em"},
     "built for backbone mf"),
    ({"federation.codec": "lora"}, "use --codec full"),
    ({"federation.adapter_objective": "holdout"}, "holdout"),
    ({"privacy.mode": "ldp-dpsgd", "privacy.epsilon": 8.0, "privacy.dpsgd_adapter_steps": 1},
     "not built for it"),
])
def test_batch_merge_refusals(over, needle):
    with pytest.raises(UserError, match=needle):
        _run_cfg(**over)
