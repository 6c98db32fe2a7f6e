"""Server-side aggregation (aggregation.py): weights, distances, equation 13."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedem_private.errors import UserError
from fedem_private.reference.aggregation import similarity_weights_cvxpy
from fedem_private.server.aggregation import (
    cross_sq_distances,
    fedavg_aggregate,
    fedavg_weights,
    pairwise_sq_distances,
    project_to_simplex,
    similarity_aggregate,
    similarity_weights,
    uniform_weights,
)

F64 = torch.float64


def rand_tables(n: int, m: int = 9, d: int = 3, seed: int = 0, scale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn((n, m, d), generator=g)


def brute_sq_distances(tables: torch.Tensor) -> torch.Tensor:
    flat = tables.to(F64).reshape(tables.shape[0], -1)
    n = flat.shape[0]
    return torch.tensor([[float(((flat[u] - flat[v]) ** 2).sum()) for v in range(n)]
                         for u in range(n)], dtype=F64)


def rand_p(n: int, seed: int = 0, participating: torch.Tensor | None = None):
    g = torch.Generator().manual_seed(seed + 100)
    return fedavg_weights(torch.randint(1, 60, (n,), generator=g), participating)


def assert_on_simplex(w: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(dim=1), torch.ones(w.shape[0], dtype=F64),
                               rtol=0, atol=1e-12)
    if mask is not None:
        assert bool((w[:, ~mask] == 0).all())


# ---------------------------------------------------------------- fixed weights


def test_fedavg_and_uniform_weights():
    sizes = torch.tensor([10, 30, 0, 60])
    torch.testing.assert_close(fedavg_weights(sizes), torch.tensor([0.1, 0.3, 0.0, 0.6],
                                                                  dtype=F64))
    mask = torch.tensor([True, False, True, True])
    torch.testing.assert_close(fedavg_weights(sizes, mask),
                               torch.tensor([1 / 7, 0.0, 0.0, 6 / 7], dtype=F64))
    torch.testing.assert_close(uniform_weights(sizes, mask),
                               torch.tensor([1 / 3, 0.0, 1 / 3, 1 / 3], dtype=F64))
    torch.testing.assert_close(uniform_weights(sizes), torch.full((4,), 0.25, dtype=F64))


def test_fedavg_aggregate_skips_zero_weight_rows_and_rejects_nan():
    tables = rand_tables(4)
    w = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=F64)
    want = sum(w[v].item() * tables[v] for v in range(4))
    tables[1] = float("nan")  # a non-participant's slot may hold anything
    torch.testing.assert_close(fedavg_aggregate(tables, w), want)
    tables[2, 0, 0] = float("inf")
    with pytest.raises(UserError, match="client 2"):
        fedavg_aggregate(tables, w)


# ---------------------------------------------------------------- distances


@pytest.mark.parametrize("chunk_rows", [1, 4, 1000])
def test_pairwise_distances_equal_brute_force(chunk_rows):
    tables = rand_tables(7, seed=1)
    tables[5] = tables[2]  # two identical tables
    got = pairwise_sq_distances(tables, chunk_rows, precision="float64")
    assert got.dtype == F64
    assert torch.equal(got.diagonal(), torch.zeros(7, dtype=F64))
    assert torch.equal(got, got.T)
    assert bool((got >= 0).all())
    torch.testing.assert_close(got, brute_sq_distances(tables), rtol=1e-12, atol=1e-12)


def test_pairwise_distances_do_not_depend_on_chunk_size():
    tables = rand_tables(12, m=50, d=4, seed=2) + 5.0  # offset: cancellation-prone
    ref = pairwise_sq_distances(tables, 50, "float64")
    for chunk in (1, 3, 16):
        torch.testing.assert_close(pairwise_sq_distances(tables, chunk, "float64"), ref,
                                   rtol=1e-12, atol=1e-12)


def test_cross_distances_on_subsets():
    tables = rand_tables(8, seed=3)
    a, b = torch.tensor([6, 1, 3]), torch.tensor([3, 0, 6, 7])
    got = cross_sq_distances(tables, a, b, chunk_rows=2, precision="float64")
    want = brute_sq_distances(tables)[a][:, b]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got[0, 2] == 0.0 and got[2, 0] == 0.0


@pytest.mark.parametrize("subsets", [False, True])
def test_float32_products_match_float64_within_float32_rounding(subsets):
    """The default float32 products (float64 accumulation) against brute-force float64."""
    tables = rand_tables(300, m=40, d=8, seed=11) + 2.0  # offset: centring must absorb it
    a = torch.arange(0, 300, 3) if subsets else None
    b = torch.arange(1, 300, 2) if subsets else None
    got = cross_sq_distances(tables, a, b, chunk_rows=16)
    want = brute_sq_distances(tables)
    want = want if a is None else want[a][:, b]
    assert got.dtype == F64
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0.0)
    if not subsets:  # symmetric from the upper Gram blocks (GRAM_BLOCK = 256 < 300)
        assert torch.equal(got, got.T)
        assert torch.equal(got.diagonal(), torch.zeros(300, dtype=F64))


def test_an_accelerator_multiplies_whole_tables_in_one_gram_product(monkeypatch):
    """On a GPU the Gram is one product per row chunk (GRAM_BLOCK_DEVICE clients a block):
    the same distances as the CPU's 256-client blocks within float32 rounding, exactly
    symmetric, zero on the diagonal (the GPU's block size run here on the CPU)."""
    from fedem_private.server import aggregation

    assert aggregation.gram_block(torch.device("cpu")) == aggregation.GRAM_BLOCK
    assert aggregation.gram_block(torch.device("cuda")) == aggregation.GRAM_BLOCK_DEVICE
    tables = rand_tables(300, m=40, d=8, seed=11) + 2.0
    cpu = cross_sq_distances(tables, None, None, chunk_rows=16)
    monkeypatch.setattr(aggregation, "gram_block", lambda dev: aggregation.GRAM_BLOCK_DEVICE)
    calls = []
    real = aggregation._add_symmetric_gram
    monkeypatch.setattr(aggregation, "_add_symmetric_gram",
                        lambda g, x, block: calls.append(block) or real(g, x, block))
    one = cross_sq_distances(tables, None, None, chunk_rows=16)
    assert calls and set(calls) == {aggregation.GRAM_BLOCK_DEVICE}
    torch.testing.assert_close(one, cpu, rtol=1e-5, atol=0.0)
    torch.testing.assert_close(one, brute_sq_distances(tables), rtol=1e-5, atol=0.0)
    assert torch.equal(one, one.T) and torch.equal(one.diagonal(), torch.zeros(300, dtype=F64))


def test_float32_cancelled_pairs_are_recomputed_in_float64():
    """Two near-copies: float32 products would cancel almost every bit of their distance."""
    tables = rand_tables(6, m=30, d=4, seed=12)
    tables[4] = tables[1] + 1e-4 * rand_tables(1, m=30, d=4, seed=13)[0]
    want = brute_sq_distances(tables)
    got = pairwise_sq_distances(tables)
    assert float(want[1, 4]) < 1e-6  # the pair is cancellation-prone
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0.0)
    for i, j in ((1, 4), (4, 1)):  # recomputed from the difference: float64-accurate
        assert abs(float(got[i, j] - want[i, j])) <= 1e-12 * float(want[i, j])
    # two clusters of near-copies: more risky pairs than clients, the whole matrix in float64
    many = rand_tables(2, m=30, d=4, seed=14).repeat_interleave(5, dim=0)
    many += 1e-5 * rand_tables(10, m=30, d=4, seed=15)
    # (float32 products would be off by orders of magnitude on the within-cluster pairs;
    # float64 products lose digits there too, but keep these)
    torch.testing.assert_close(pairwise_sq_distances(many), brute_sq_distances(many),
                               rtol=1e-4, atol=0.0)


def test_float64_tables_are_never_multiplied_in_float32():
    tables = rand_tables(5, seed=16).to(F64)
    torch.testing.assert_close(pairwise_sq_distances(tables), brute_sq_distances(tables),
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- projection and eq. 13


def kkt_holds(c: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> None:
    """Projection optimality: c - w equals one theta on the support and c <= theta off it."""
    for u in range(c.shape[0]):
        keep = mask if mask.dim() == 1 else mask[u]
        cu, wu = c[u][keep], w[u][keep]
        support = wu > 0
        theta = (cu - wu)[support]
        assert float(theta.max() - theta.min()) <= 1e-9 * (1 + float(theta.abs().max()))
        assert bool((cu[~support] <= theta.mean() + 1e-9 * (1 + abs(float(theta.mean())))).all())


@settings(max_examples=150, deadline=None)
@given(
    c=hnp.arrays("float64", st.tuples(st.integers(1, 5), st.integers(1, 9)),
                 elements=st.floats(-1e3, 1e3, allow_nan=False)),
    data=st.data(),
)
def test_projection_is_on_simplex_and_optimal(c, data):
    c = torch.from_numpy(c)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=c.shape[1],
                                           max_size=c.shape[1])))
    mask[data.draw(st.integers(0, c.shape[1] - 1))] = True
    w = project_to_simplex(c, mask)
    assert_on_simplex(w, mask)
    kkt_holds(c, w, mask)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 12),
    k=st.integers(1, 4),
    alpha=st.floats(0.0, 1e4),
    log_scale=st.floats(-6, 12),
    seed=st.integers(0, 2**16),
)
def test_similarity_weights_on_simplex(n, k, alpha, log_scale, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, generator=g) < 0.7
    mask[0] = True
    p = fedavg_weights(torch.randint(0, 5, (n,), generator=g) + 1, mask)
    sq = torch.rand((k, n), generator=g, dtype=F64) * 10.0**log_scale
    w = similarity_weights(p, sq, alpha, mask)
    assert_on_simplex(w, mask)


def closed_vs_cvxpy(p, sq, alpha, mask=None) -> torch.Tensor:
    w = similarity_weights(p, sq, alpha, mask)
    ref = similarity_weights_cvxpy(p, sq, alpha, mask)
    assert float((w - ref).abs().max()) <= 1e-6
    assert_on_simplex(w, mask)
    return w


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.3, 1.0, 5.0])
def test_closed_form_equals_cvxpy_random(seed, alpha):
    tables = rand_tables(15, seed=seed, scale=0.2 + 0.1 * seed)
    closed_vs_cvxpy(rand_p(15, seed), pairwise_sq_distances(tables), alpha)


def test_closed_form_equals_cvxpy_edge_cases():
    assert torch.equal(closed_vs_cvxpy(torch.ones(1, dtype=F64), torch.zeros((1, 1), dtype=F64),
                                       1.0), torch.ones((1, 1), dtype=F64))
    n = 6
    uniform_p = torch.full((n,), 1.0 / n, dtype=F64)
    ties = torch.full((n, n), 0.5, dtype=F64).fill_diagonal_(0.0)
    closed_vs_cvxpy(uniform_p, ties, 1.0)  # ties in p and in distances
    p = rand_p(n, 1)
    sq = pairwise_sq_distances(rand_tables(n, seed=4))
    torch.testing.assert_close(closed_vs_cvxpy(p, sq, 0.0), p.expand(n, n))  # alpha = 0: FedAvg
    huge = torch.full((n, n), 1e30, dtype=F64).fill_diagonal_(0.0)
    closed_vs_cvxpy(p, huge, 1.0)  # only self-similarity survives
    equal_tables = rand_tables(1).expand(n, -1, -1)
    same = pairwise_sq_distances(equal_tables)
    assert torch.equal(same, torch.zeros((n, n), dtype=F64))
    # all s_uv = 1: the projection shifts c uniformly, giving a p / uniform mixture
    torch.testing.assert_close(closed_vs_cvxpy(p, same, 2.0), ((p + 2.0 / n) / 3.0).expand(n, n))
    mask = torch.tensor([True, False, True, True, False, True])
    closed_vs_cvxpy(rand_p(n, 2, mask), sq, 1.0, mask)  # participants only
    closed_vs_cvxpy(rand_p(n, 2), sq, 1e6)  # similarity dominates


def test_bad_alpha_is_a_user_error():
    with pytest.raises(UserError, match="alpha"):
        similarity_weights(torch.ones(1, dtype=F64), torch.zeros((1, 1), dtype=F64), -1.0)


# ---------------------------------------------------------------- similarity aggregation


def loop_aggregate(uploads, p, alpha, participating, anchored):
    """Explicit per-client loop: brute-force distances, cvxpy weights, weighted sum."""
    n = uploads.shape[0]
    part = [v for v in range(n) if participating[v]]
    p_part = p[part]
    out = torch.empty_like(uploads)
    for u in range(n):
        if participating[u] or anchored[u]:
            sq = torch.tensor([[float(((uploads[u].to(F64) - uploads[v].to(F64)) ** 2).sum())
                                for v in part]], dtype=F64)
            w = similarity_weights_cvxpy(p_part, sq, alpha)[0]
        else:
            w = p_part / p_part.sum()
        out[u] = sum(float(w[j]) * uploads[v] for j, v in enumerate(part))
    return out


@pytest.mark.parametrize("chunk_clients", [1, 3, 100])
def test_similarity_aggregate_equals_loop(chunk_clients):
    uploads = rand_tables(7, seed=5)
    everyone = torch.ones(7, dtype=torch.bool)
    p = rand_p(7, 5)
    got = similarity_aggregate(uploads, p, 1.0, None, chunk_clients, chunk_rows=4)
    want = loop_aggregate(uploads, p, 1.0, everyone, everyone)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk_clients", [2, 100])
def test_similarity_aggregate_with_participants(chunk_clients):
    uploads = rand_tables(8, seed=6)
    part = torch.tensor([True, False, True, True, False, True, False, True])
    anchored = torch.tensor([False, True, False, False, False, False, True, False])
    p = rand_p(8, 6, part)
    uploads[4] = float("nan")  # never uploaded, no anchor: its slot is never read
    got = similarity_aggregate(uploads, p, 2.0, part, chunk_clients, anchored=anchored)
    want = loop_aggregate(uploads, p, 2.0, part, anchored)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_similarity_aggregate_does_not_depend_on_chunking():
    uploads = rand_tables(40, m=30, d=4, seed=7)
    p = rand_p(40, 7)
    ref = similarity_aggregate(uploads, p, 1.0, None, 40, chunk_rows=30)
    for chunk_clients, chunk_rows in ((1, 1), (7, 4), (16, 13)):
        got = similarity_aggregate(uploads, p, 1.0, None, chunk_clients, chunk_rows=chunk_rows)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


def test_similarity_aggregate_rejects_nan_upload():
    uploads = rand_tables(4)
    uploads[3, 2, 1] = float("nan")
    with pytest.raises(UserError, match="client 3"):
        similarity_aggregate(uploads, rand_p(4), 1.0)


def test_projection_of_large_equal_entries_sums_to_one() -> None:
    # found by hypothesis: without the per-row shift, c - theta cancels ~1e-12 away
    c = torch.full((1, 7), -512.38795743, dtype=F64)
    w = project_to_simplex(c, torch.tensor([False] + [True] * 6))
    assert_on_simplex(w)
    assert w[0, 0] == 0.0
    torch.testing.assert_close(w[0, 1:], torch.full((6,), 1 / 6, dtype=F64), rtol=0, atol=1e-15)


# ------------------------------------------------------------------ the sums' sparse add
def _sparse_uploads(q: torch.Tensor, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k uploads equal to q outside random rows (k, m) bool, where they are changed."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.rand((k, q.shape[0]), generator=gen) < 0.3
    up = q.expand(k, -1, -1).clone()
    up[rows] += torch.randn((int(rows.sum()), q.shape[1]), generator=gen) * 0.1
    return up, rows


@pytest.mark.parametrize("name, ratio", [("fedavg", 1.0), ("uniform", 1.0), ("fedavg", 0.5)])
def test_the_sparse_add_gives_the_dense_adds_bits(name, ratio):
    """add_rows over the trained rows and add over whole uploads give the same table,
    bit for bit on the CPU, over two chunks; both are the weighted sum of the uploads to
    float64 rounding (sum_v w_v U_v = W Q + sum_v w_v (U_v - Q))."""
    from fedem_private.server import aggregators as agg_mod

    cls = {"fedavg": agg_mod.FedAvgAggregator, "uniform": agg_mod.UniformAggregator}[name]
    gen = torch.Generator().manual_seed(0)
    n, m, d = 7, 40, 4
    sizes = torch.randint(1, 30, (n,), generator=gen).double()
    q0 = torch.randn((m, d), generator=gen)
    part = torch.tensor([True, True, False, True, True, True, False])
    idx = torch.nonzero(part).flatten()
    up, rows = _sparse_uploads(q0, int(idx.shape[0]), seed=1)
    tables = []
    for sparse in (False, True):
        agg = cls(sizes, n, q0, agg_ratio=ratio, seed=3)
        for rnd in range(2):  # round 2 sends round 1's table
            agg.begin_round(part)
            q = agg.table
            up_r = q.expand_as(up).clone()
            up_r[rows] = up[rows] + rnd
            for lo, hi in ((0, 2), (2, int(idx.shape[0]))):  # two chunks, as the loop adds
                if sparse:
                    agg.add_rows(idx[lo:hi], up_r[lo:hi], rows[lo:hi])
                else:
                    agg.add(idx[lo:hi], up_r[lo:hi])
            weights = agg._weights[idx]  # the round's weights (0 off the aggregated share)
            want = torch.einsum("k,kmd->md", weights, up_r.double())
            agg.end_round()
            assert torch.allclose(agg.table.double(), want, rtol=0, atol=1e-6)
        tables.append(agg.table)
    assert torch.equal(tables[0], tables[1])


def test_a_subclass_add_rows_defaults_to_its_own_add():
    """An aggregator that does not use the sparsity takes add_rows as add (the base's)."""
    from fedem_private.server.aggregators import Aggregator

    seen = []

    class Dense(Aggregator):
        name = "dense-test"

        def sent(self, idx):
            return None

        def add(self, idx, uploads):
            seen.append(uploads.shape)

        def end_round(self):
            pass

    Dense(torch.ones(2, dtype=torch.float64), 2).add_rows(
        torch.tensor([0]), torch.zeros(1, 3, 2), torch.ones(1, 3, dtype=torch.bool))
    assert seen == [(1, 3, 2)]


def test_the_accelerator_sum_is_the_cpu_sum_to_rounding():
    """Off the CPU add is one product over the chunk and add_rows calls it (emulated here
    by naming another device type on CPU tensors): the same table to float64 rounding."""
    from fedem_private.server.aggregators import FedAvgAggregator

    gen = torch.Generator().manual_seed(4)
    n, m, d = 5, 30, 3
    sizes = torch.randint(1, 20, (n,), generator=gen).double()
    q0 = torch.randn((m, d), generator=gen)
    part = torch.ones(n, dtype=torch.bool)
    idx = torch.arange(n)
    up, rows = _sparse_uploads(q0, n, seed=5)
    given = up.clone()
    tables = []
    for device in ("cpu", "accelerator"):
        agg = FedAvgAggregator(sizes, n, q0)
        if device != "cpu":
            agg.device = torch.device("meta")  # only its type is read
        agg.begin_round(part)
        agg.add_rows(idx[:2], up[:2], rows[:2])
        agg.add(idx[2:], up[2:])
        agg.end_round()
        tables.append(agg.table)
    assert torch.allclose(tables[0], tables[1], rtol=0, atol=1e-6)
    assert torch.equal(up, given)  # the uploads themselves are never written
