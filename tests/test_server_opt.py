"""The server's learning rate and momentum on the aggregate (FedAvgM; issue 20's knobs)."""

from __future__ import annotations

import pytest
import torch

from fedem_private.errors import UserError
from fedem_private.server.aggregation import fedavg_weights
from fedem_private.server.aggregators import ServerMomentum, ServerOptConfig
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.simulation.loop import Simulation


def _cfg(**over):
    base = {"train.rounds": 4, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "data.synthetic.n_users": 30}
    base.update(over)
    return with_overrides(RunConfig(), base)


def test_momentum_against_the_written_out_recursion():
    g = torch.Generator().manual_seed(0)
    opt = ServerMomentum(ServerOptConfig(lr=0.7, momentum=0.8))
    prev = torch.randn(5, 3, generator=g)
    m = torch.zeros(5, 3, dtype=torch.float64)
    want = prev.double()
    for _ in range(4):
        agg = torch.randn(5, 3, generator=g)
        m = 0.8 * m + (agg.double() - want)
        want = want + 0.7 * m
        prev = opt.step(prev, agg)
        assert torch.allclose(prev.double(), want, atol=1e-6)
    plain = ServerMomentum(ServerOptConfig())
    agg = torch.randn(5, 3, generator=g)
    assert plain.step(prev, agg) is agg  # lr 1, no momentum: the aggregate itself


@pytest.mark.parametrize("backbone", ["mf", "ncf"])
def test_rounds_step_the_fedavg_mean(small_split, backbone):
    """Each round's global table (and MLP) is G + lr m over the plain FedAvg mean of the
    uploads the server received."""
    lr, beta = 0.5, 0.9
    sim = Simulation(_cfg(**{"federation.server_lr": lr, "federation.server_momentum": beta,
                             "federation.backbone": backbone}), small_split)
    seen = []
    sim.observers.append(seen.append)
    w = fedavg_weights(sim.sizes, torch.ones(small_split.n_users, dtype=torch.bool))
    m = None
    dense_m: dict[str, torch.Tensor] = {}
    real_add = sim.dense.add if sim.dense else None
    for t in range(1, 5):
        prev = sim.aggregator.table.double().clone()
        prev_dense = {n: v.double().clone() for n, v in (sim.dense.params.items()
                                                          if sim.dense else [])}
        dense_up: dict[str, torch.Tensor] = {}
        if sim.dense:
            def grab(idx, ups, real_add=real_add, dense_up=dense_up):
                for n, v in ups.items():
                    dense_up[n] = dense_up.get(n, 0) + torch.tensordot(w[idx], v.double(), 1)
                real_add(idx, ups)
            sim.dense.add = grab
        sim.step()
        mean = sum(torch.einsum("k,kmd->md", w[torch.from_numpy(v.clients)], v.upload.double())
                   for v in seen if v.round == t)
        m = mean - prev if m is None else beta * m + (mean - prev)
        assert torch.allclose(sim.aggregator.table.double(), prev + lr * m, atol=1e-5)
        for n, v in dense_up.items():
            dense_m[n] = v - prev_dense[n] if n not in dense_m else \
                beta * dense_m[n] + (v - prev_dense[n])
            assert torch.allclose(sim.dense.params[n].double(), prev_dense[n] + lr * dense_m[n],
                                  atol=1e-5)
    plain = Simulation(_cfg(**{"federation.backbone": backbone}), small_split)
    plain.run()
    assert (plain.aggregator.table - sim.aggregator.table).abs().max() > 1e-3  # it acts


def test_post_processing_leaves_the_central_guarantee_alone(small_split):
    over = {"privacy.mode": "cdp-gaussian", "privacy.epsilon": 2.0, "privacy.clip": 1.0,
            "privacy.sample_rate": 0.5}
    a = Simulation(_cfg(**over), small_split)
    b = Simulation(_cfg(**over, **{"federation.server_momentum": 0.9,
                                   "federation.server_lr": 0.3}), small_split)
    a.run()
    b.run()
    sa, sb = a.privacy.summary(), b.privacy.summary()
    assert sa["epsilon"] == sb["epsilon"] and sa["noise_multiplier"] == sb["noise_multiplier"]
    assert not torch.equal(a.aggregator.table, b.aggregator.table)


@pytest.mark.parametrize("over,match", [
    ({"federation.server_momentum": 1.0}, "--server-momentum"),
    ({"federation.server_lr": 0.0}, "--server-lr"),
    ({"federation.server_momentum": 0.5, "federation.method": "fedem"},
     "aggregation 'similarity'"),
    ({"federation.server_momentum": 0.5, "federation.codec": "lora"}, "codec 'lora'"),
])
def test_refusals(over, match):
    with pytest.raises(UserError, match=match):
        _cfg(**over).validate()
