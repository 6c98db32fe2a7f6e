"""Elastic merging (merging.py) and the masked batched Adam (optim.py).

The vectorised adapter training is checked against a plain per-client loop:
one torch.nn.Sequential MLP per client, initialised the way nn.Linear is, and
one torch.optim.Adam per client stepped only when that client has a batch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedem_private import rng
from fedem_private.client.merging import (
    MergeConfig,
    MergeState,
    StepBatch,
    compute_rho,
    init_merge_state,
    merge,
    merge_tables,
    take_clients,
    train_adapter,
)
from fedem_private.errors import UserError
from fedem_private.optim import AdamConfig, MaskedAdam

SEED = 1234
DIM = 4
M = 7


# ---------------------------------------------------------------- reference implementation


def reference_adapter(layers: tuple[int, ...], dim: int, seed: int, client: int,
                      dtype: torch.dtype) -> nn.Sequential:
    """nn.Sequential adapter, initialised with nn.init from the client's own generator."""
    gen = rng.generator(seed, rng.Stream.ADAPTER_INIT, 0, client)
    modules: list[nn.Module] = []
    fan_in = 2 * dim
    for j, width in enumerate(layers):
        lin = nn.Linear(fan_in, width, dtype=dtype)
        with torch.no_grad():
            nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5), generator=gen)
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(lin.bias, -bound, bound, generator=gen)
        modules += [lin, nn.Sigmoid() if j == len(layers) - 1 else nn.ReLU()]
        fan_in = width
    return nn.Sequential(*modules)


def reference_train(cfg: MergeConfig, net: nn.Sequential, q_local: torch.Tensor,
                    q_global: torch.Tensor, p_user: torch.Tensor,
                    batches: list[tuple[torch.Tensor, torch.Tensor]]) -> nn.Sequential:
    """Equation 11 for one client, the obvious way: (items, labels) batches in order."""
    opt = torch.optim.Adam(net.parameters(), lr=cfg.adapter_lr, betas=(0.9, 0.999), eps=1e-8)
    for items, labels in batches:
        ql, qg = q_local[items], q_global[items]
        if cfg.strategy == "em":
            rho = net(torch.cat([qg - ql, ql], dim=1)).squeeze(1)[:, None]
        else:
            rho = net(torch.cat([q_global - q_local, q_local], dim=1)).mean()
        q = ql + rho * (qg - ql)
        loss = F.binary_cross_entropy_with_logits(q @ p_user, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net


def reference_rho(cfg: MergeConfig, net: nn.Sequential, q_local: torch.Tensor,
                  q_global: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        rho = net(torch.cat([q_global - q_local, q_local], dim=1)).squeeze(1)
    return rho.mean(dim=0, keepdim=True) if cfg.strategy == "dm" else rho


def adapter_of(state: MergeState, row: int) -> list[torch.Tensor]:
    """One client's parameters in nn.Linear layout (weight (out, in), bias)."""
    out: list[torch.Tensor] = []
    for w, b in zip(state.weights, state.biases, strict=True):
        out += [w[row].T, b[row]]
    return out


def net_params(net: nn.Sequential) -> list[torch.Tensor]:
    return [p.detach() for p in net.parameters()]


# ---------------------------------------------------------------- fixtures


def make_tables(k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q_local = torch.randn((k, M, DIM), generator=g, dtype=dtype)
    q_global = torch.randn((k, M, DIM), generator=g, dtype=dtype)
    p_users = torch.randn((k, DIM), generator=g, dtype=dtype)
    return q_local, q_global, p_users


def ragged_schedule(dtype: torch.dtype) -> tuple[list[StepBatch], dict[int, list]]:
    """Lock-step batches over 4 chunk rows; row 2 never trains; row 1 has an empty batch.

    Returns the steps and, per row, the (items, labels) batches a per-client
    loop would see. Padding carries id -1 to check it is never read.
    """
    g = torch.Generator().manual_seed(7)
    lengths = {0: [5, 5, 3], 1: [4, 0, 2], 3: [2, 5]}  # row 2: no data at all
    steps, per_row = [], {r: [] for r in range(4)}
    for s in range(3):
        rows = [r for r, ls in lengths.items() if s < len(ls)]
        width = 5
        items = torch.full((len(rows), width), -1, dtype=torch.int64)
        labels = torch.zeros((len(rows), width), dtype=dtype)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            n = lengths[r][s]
            it = torch.randint(0, M, (n,), generator=g)
            lab = (torch.rand(n, generator=g) < 0.5).to(dtype)
            items[i, :n], labels[i, :n], mask[i, :n] = it, lab, True
            if n:
                per_row[r].append((it, lab))
        steps.append(StepBatch(torch.tensor(rows), items, labels, mask))
    return steps, per_row


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("rho", [-0.1, 1.5, float("nan")])
def test_sm_rejects_rho_outside_unit_interval(rho):
    with pytest.raises(UserError) as err:
        MergeConfig(strategy="sm", rho=rho)
    assert "rho" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs", [dict(strategy="xx"), dict(adapter_layers=(8, 2)),
                                    dict(adapter_lr=0.0), dict(adapter_epochs=-1)])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(UserError):
        MergeConfig(**kwargs)


# ---------------------------------------------------------------- merging


def test_endpoints_are_exact():
    q_local, q_global, _ = make_tables(3, torch.float32)
    assert torch.equal(merge(MergeConfig(strategy="sr"), None, q_local, q_global), q_global)
    assert torch.equal(merge(MergeConfig(strategy="sm", rho=1.0), None, q_local, q_global),
                       q_global)
    assert torch.equal(merge(MergeConfig(strategy="sm", rho=0.0), None, q_local, q_global),
                       q_local)
    ones, zeros = torch.ones(3, M), torch.zeros(3, M)
    assert torch.equal(merge_tables(q_local, q_global, ones), q_global)
    assert torch.equal(merge_tables(q_local, q_global, zeros), q_local)


def test_sm_merge_is_equation_10():
    q_local, q_global, _ = make_tables(2, torch.float64)
    got = merge(MergeConfig(strategy="sm", rho=0.3), None, q_local, q_global)
    torch.testing.assert_close(got, q_local + 0.3 * (q_global - q_local))


@pytest.mark.parametrize("strategy", ["dm", "em"])
def test_rho_shape_and_range(strategy):
    cfg = MergeConfig(strategy=strategy)
    state = init_merge_state(cfg, np.arange(3), DIM, SEED)
    q_local, q_global, _ = make_tables(3, torch.float32)
    for scale in (1.0, 1e4):  # large inputs saturate the sigmoid
        rho = compute_rho(cfg, state, scale * q_local, -scale * q_global)
        assert rho.shape == ((3, M) if strategy == "em" else (3, 1))
        assert not rho.requires_grad
        assert bool(((rho >= 0) & (rho <= 1)).all())
    merged = merge(cfg, state, q_local, q_global)
    want = q_local + compute_rho(cfg, state, q_local, q_global)[..., None] * (q_global - q_local)
    torch.testing.assert_close(merged, want)


def test_sr_and_sm_have_no_state_and_scalar_rho():
    for cfg in (MergeConfig(strategy="sr"), MergeConfig(strategy="sm", rho=0.25)):
        assert init_merge_state(cfg, np.arange(2), DIM, SEED) is None
        q_local, q_global, _ = make_tables(2, torch.float32)
        assert compute_rho(cfg, None, q_local, q_global).dim() == 0
        assert train_adapter(cfg, None, None, q_local, q_global, q_local[:, 0], []) is None


def test_adapter_init_is_per_client_and_matches_nn_linear():
    cfg = MergeConfig(strategy="em")
    alone = init_merge_state(cfg, np.array([7]), DIM, SEED)
    shared = init_merge_state(cfg, np.array([3, 7, 11]), DIM, SEED)
    for a, b in zip(adapter_of(alone, 0), adapter_of(shared, 1), strict=True):
        assert torch.equal(a, b)
    net = reference_adapter(cfg.adapter_layers, DIM, SEED, 7, torch.float32)
    for a, b in zip(adapter_of(alone, 0), net_params(net), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert [w.shape for w in shared.weights] == [(3, 8, 32), (3, 32, 16), (3, 16, 8), (3, 8, 1)]


# ---------------------------------------------------------------- adapter training


@pytest.mark.parametrize("strategy", ["em", "dm"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 3e-5)])
def test_vectorised_training_equals_per_client_loop(strategy, dtype, tol):
    """float32: Adam's steps amplify rounding (up to ~1.7e-5 on some adapter draws);
    float64 agrees to 1e-10, which is the test of the algorithm."""
    cfg = MergeConfig(strategy=strategy)  # the paper's [32, 16, 8, 1] adapter
    clients = np.array([10, 11, 12, 13])
    state = init_merge_state(cfg, clients, DIM, SEED, dtype=dtype)
    q_local, q_global, p_users = make_tables(4, dtype)
    steps, per_row = ragged_schedule(dtype)
    trained = train_adapter(cfg, state, None, q_local, q_global, p_users, steps)
    rho = compute_rho(cfg, trained, q_local, q_global)
    for row, client in enumerate(clients.tolist()):
        net = reference_adapter(cfg.adapter_layers, DIM, SEED, client, dtype)
        net = reference_train(cfg, net, q_local[row], q_global[row], p_users[row], per_row[row])
        for got, want in zip(adapter_of(trained, row), net_params(net), strict=True):
            assert (got - want).abs().max() < tol
        want_rho = reference_rho(cfg, net, q_local[row], q_global[row])
        assert (rho[row] - want_rho).abs().max() < tol


def test_training_touches_only_adapters_of_active_clients():
    cfg = MergeConfig(strategy="em")
    state = init_merge_state(cfg, np.arange(4), DIM, SEED)
    before = [t.clone() for t in (*state.weights, *state.biases)]
    q_local, q_global, p_users = make_tables(4, torch.float32)
    frozen = [q_local.clone(), q_global.clone(), p_users.clone()]
    steps, _ = ragged_schedule(torch.float32)
    trained = train_adapter(cfg, state, None, q_local, q_global, p_users, steps)
    for a, b in zip(frozen, (q_local, q_global, p_users), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(before, (*state.weights, *state.biases), strict=True):
        assert torch.equal(a, b)  # the input state is not modified
    for a, b in zip(adapter_of(state, 2), adapter_of(trained, 2), strict=True):
        assert torch.equal(a, b)  # row 2 has no batch
    for row in (0, 1, 3):
        assert not torch.equal(adapter_of(state, row)[0], adapter_of(trained, row)[0])


def test_training_a_chunk_of_a_larger_state():
    cfg = MergeConfig(strategy="dm", adapter_layers=(4, 1))
    state = init_merge_state(cfg, np.arange(6), DIM, SEED)
    rows = torch.tensor([4, 1, 5, 2])
    q_local, q_global, p_users = make_tables(4, torch.float32)
    steps, _ = ragged_schedule(torch.float32)
    full = train_adapter(cfg, state, rows, q_local, q_global, p_users, steps)
    part = train_adapter(cfg, take_clients(state, rows), None, q_local, q_global, p_users, steps)
    for i, r in enumerate(rows.tolist()):
        for a, b in zip(adapter_of(full, r), adapter_of(part, i), strict=True):
            assert torch.equal(a, b)
    for r in (0, 3):
        for a, b in zip(adapter_of(full, r), adapter_of(state, r), strict=True):
            assert torch.equal(a, b)


# ---------------------------------------------------------------- masked Adam


def test_masked_adam_equals_torch_adam_per_client():
    g = torch.Generator().manual_seed(3)
    k = 3
    start = torch.randn((k, 2, 3), generator=g, dtype=torch.float64)
    schedule = [[0, 1, 2], [2], [0, 2], [], [1]]
    grads = [torch.randn((len(r), 2, 3), generator=g, dtype=torch.float64) for r in schedule]
    param = start.clone()
    opt = MaskedAdam([param], AdamConfig(lr=0.1))
    for rows, grad in zip(schedule, grads, strict=True):
        opt.step([grad], torch.tensor(rows, dtype=torch.int64))
    for c in range(k):
        ref = start[c].clone().requires_grad_(True)
        ref_opt = torch.optim.Adam([ref], lr=0.1)
        for rows, grad in zip(schedule, grads, strict=True):
            if c in rows:
                ref.grad = grad[rows.index(c)].clone()
                ref_opt.step()
        torch.testing.assert_close(param[c], ref.detach(), rtol=0, atol=1e-12)
    assert opt.steps.tolist() == [2, 2, 3]
