"""--optimizer sgd (the published PFedRec, FedRAP and GPFedRec codes' local optimiser): vectorised
rounds against torch.optim.SGD + ExponentialLR per client, the closed-form decay of
untouched rows, the rates' schedule and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private import models
from fedem_private.errors import UserError
from fedem_private.models.base import (
    ClientParams,
    LocalTrainConfig,
    make_plan,
    sgd_rates,
    untouched_decay,
)
from fedem_private.reference import round as reference
from fedem_private.simulation.config import (
    RunConfig,
    identity_dict,
    with_overrides,
)
from fedem_private.simulation.loop import Simulation

SGD = {"train.optimizer": "sgd", "train.lr": 3.0, "train.lr_head": 0.05,
       "train.weight_decay": 0.01, "train.lr_batch_decay": 0.95, "train.lr_round_decay": 0.97}


def _cfg(**over):
    base = {"train.rounds": 3, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "data.synthetic.n_users": 30,
            "federation.method": "fedrap"}
    base.update(over)
    return with_overrides(RunConfig(), base)


def _rounds_match_the_reference(sim: Simulation, rounds: int = 2) -> None:
    for _ in range(rounds):
        ref = reference.simulation_round(sim)
        sim.step()
        assert (sim.state.q_local - ref["q_local"]).abs().max() < 1e-9
        for name, value in sim.state.private.items():
            assert (value - ref["private"][name]).abs().max() < 1e-9
        assert (sim.state.q_global - ref["q_global"]).abs().max() < 1e-9


@pytest.mark.parametrize("merge,over", [
    ("sr", SGD), ("em", SGD), ("sr", {**SGD, "train.weight_decay": 0.0}),
    ("em", {**SGD, "train.lr_head": None, "train.lr": 0.5})],
    ids=["published-shape", "published-shape-em", "no-decay", "one-rate-em"])
def test_sgd_rounds_equal_the_per_client_reference(small_split, float64, merge, over):
    """Rounds 1 and 2 (round decay, and EM's merge, active in round 2) against one
    torch.optim.SGD with its ExponentialLR per client."""
    _rounds_match_the_reference(Simulation(_cfg(**over, **{"federation.merge": merge}),
                                           small_split))


@pytest.mark.parametrize("over", [
    {"train.optimizer": "sgd", "train.lr": 2.0, "train.lr_user": 0.7, "train.lr_head": 0.1},
    {**SGD, "train.lr_user": 0.7}], ids=["published-shape", "with-decays"])
def test_gpfedrec_sgd_rounds_equal_the_per_client_reference(small_split, float64, over):
    """GPFedRec's three rates (item table, user embedding, MLP) over two rounds, the
    graph's regulariser active from round 2, against one torch.optim.SGD per client."""
    _rounds_match_the_reference(Simulation(_cfg(**over, **{"federation.method": "gpfedrec"}),
                                           small_split))


@pytest.mark.parametrize("merge,over", [
    ("sr", {"train.optimizer": "sgd", "train.lr": 4.0, "train.lr_head": 0.1}),
    ("em", {"train.optimizer": "sgd", "train.lr": 4.0, "train.lr_head": 0.1}),
    ("sr", SGD)], ids=["published-shape", "published-shape-em", "with-decays"])
def test_pfedrec_sgd_rounds_equal_the_per_client_reference(small_split, float64, merge, over):
    """PFedRec's two steps per batch (head, then table with the updated head), each by SGD
    at its own rate, over two rounds, against two torch.optim.SGD (with their
    ExponentialLR) per client; with weight decay every row of the table moves."""
    _rounds_match_the_reference(Simulation(_cfg(**over, **{"federation.method": "pfedrec",
                                                            "federation.merge": merge}),
                                           small_split))


def test_pfedrec_sgd_without_decay_moves_only_batch_rows(small_split, float64, sorted_chunk):
    """SGD has no moments: a row no batch touched keeps its start value exactly, and the
    touched mask is the rows of the client's samples."""
    cfg = LocalTrainConfig(epochs=2, batch_size=32, optimizer="sgd", lr=4.0, lr_head=0.1)
    order, samples = sorted_chunk(cfg)
    bb = models.build("pfedrec", small_split.n_items, 8, seed=0, init_std=0.1)
    k = len(order)
    start = ClientParams(bb.init_items().expand(k, -1, -1).clone(), {}, bb.init_private(order))
    new, touched = bb.train_chunk(start, order, samples, cfg, 1)
    for j in range(k):
        items, _ = samples.of(j)
        mask = np.zeros(small_split.n_items, dtype=bool)
        mask[items] = True
        assert np.array_equal(touched[j].numpy(), mask)
        assert torch.equal(new.items[j, ~mask], start.items[j, ~mask])
        assert not torch.equal(new.items[j, mask], start.items[j, mask])


def test_rows_no_batch_touched_decay_by_the_product_of_step_factors(small_split, float64,
                                                                    sorted_chunk):
    """Weight decay moves every row of P_u and C (the published code's dense embedding
    gradients): a row outside a client's samples ends at start * prod_s (1 - lr_s wd)."""
    sp = small_split
    cfg = LocalTrainConfig(epochs=2, batch_size=32, optimizer="sgd", lr=3.0, lr_head=0.05,
                           weight_decay=0.01, lr_batch_decay=0.95)
    order, samples = sorted_chunk(cfg)
    bb = models.build("fedrap", sp.n_items, 8, seed=0, init_std=0.1)
    k = len(order)
    start = ClientParams(bb.init_items().expand(k, -1, -1).clone(), {},
                         bb.init_private(order))
    new, touched = bb.train_chunk(start, order, samples, cfg, 1)
    assert touched.all()  # every row moved
    plan = make_plan(0, 1, order, samples, cfg, torch.float64)
    lr = sgd_rates(cfg, 1, int(plan.steps.max()))["items"]
    factor = untouched_decay(lr, plan.steps, cfg.weight_decay)
    checked = 0
    for j in range(k):
        outside = np.setdiff1d(np.arange(sp.n_items), plan.touched[j])
        for name, table in (("items", new.items), ("personal", new.private["personal"])):
            begin = start.items if name == "items" else start.private["personal"]
            assert torch.allclose(table[j, outside], begin[j, outside] * factor[j],
                                  rtol=1e-12, atol=0)
            checked += outside.size
        assert factor[j] < 1
    assert checked > 0


def test_untouched_decay_is_the_product_of_step_factors():
    lr = np.array([1.0, 0.5, 0.25])
    got = untouched_decay(lr, np.array([0, 1, 3]), 0.1).numpy()
    assert got == pytest.approx([1.0, 0.9, 0.9 * 0.95 * 0.975])


def test_sgd_rates_follow_the_published_schedule():
    cfg = LocalTrainConfig(optimizer="sgd", lr=100.0, lr_head=0.1, lr_batch_decay=0.95,
                           lr_round_decay=0.97)
    rates = sgd_rates(cfg, 3, 4)
    assert rates["items"] == pytest.approx(100.0 * 0.97 ** 2 * 0.95 ** np.arange(4))
    assert rates["head"] == pytest.approx(0.1 * 0.97 ** 2 * 0.95 ** np.arange(4))
    assert rates["user"] == pytest.approx(rates["items"])  # lr_user defaults to lr
    rates = sgd_rates(LocalTrainConfig(optimizer="sgd", lr=2.0, lr_user=0.5), 1, 2)
    assert list(rates["items"]) == list(rates["head"]) == [2.0, 2.0]
    assert list(rates["user"]) == [0.5, 0.5]


def test_sgd_is_refused_where_it_is_not_built():
    with pytest.raises(UserError, match="built for backbone pfedrec, gpfedrec, fedrap, not 'mf'"):
        _cfg(**{"federation.method": "fedmf", "train.optimizer": "sgd"}).validate()
    with pytest.raises(UserError, match="codec 'lora' trains its own parameters"):
        _cfg(**{"federation.method": "pfedrec", "train.optimizer": "sgd",
                "federation.codec": "lora"}).validate()
    with pytest.raises(UserError, match="own DP-SGD steps; --optimizer sgd"):
        _cfg(**{"federation.method": "pfedrec", "train.optimizer": "sgd",
                "privacy.mode": "ldp-dpsgd", "privacy.epsilon": 8.0}).validate()
    with pytest.raises(UserError, match="--weight-decay .* setting of --optimizer sgd"):
        _cfg(**{"train.weight_decay": 0.1}).validate()
    with pytest.raises(UserError, match="--lr-user .* backbone 'fedrap' has none"):
        _cfg(**{**SGD, "train.lr_user": 0.5}).validate()
    with pytest.raises(UserError, match="unknown --optimizer"):
        _cfg(**{"train.optimizer": "adagrad"}).validate()
    with pytest.raises(UserError, match="lr-batch-decay"):
        _cfg(**{**SGD, "train.lr_batch_decay": 1.5}).validate()


def test_the_backbones_that_build_sgd_are_the_published_codes():
    built = tuple(name for name in models.BACKBONES
                  if "sgd" in models.build(name, 5, 2, seed=0, init_std=0.1).optimizers)
    assert built == models.backbones_where("optimizers", "sgd") == ("pfedrec", "gpfedrec",
                                                                     "fedrap")


def test_defaults_leave_run_identities_unchanged():
    """The new settings at their defaults are not part of a run's identity (old sweeps
    resume), and a non-default one is."""
    plain = identity_dict(_cfg())
    assert "optimizer" not in plain["train"] and "weight_decay" not in plain["train"]
    assert identity_dict(_cfg(**SGD))["train"]["optimizer"] == "sgd"
