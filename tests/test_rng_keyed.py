"""The keyed generator as tensor operations (docs/design.md section 16).

Slow and obvious against fast: the torch draws equal the numpy reference bit for bit,
the chunk's orders equal a per-client argsort, noise has its target distribution, and
numbers depend on (seed, stream, round, client, counter) alone (full-width keys, no
dependence on chunking). The CUDA test checks that a GPU draws the CPU's numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedem_private import rng
from fedem_private.models.base import epoch_orders

# clients beyond 2**32 and near 2**63: every bit of the key reaches the draws
CLIENTS = np.array([0, 1, 5, 77, (1 << 40) + 11, (1 << 62) + 3, 123_456])


def test_uniform_t_equals_the_numpy_reference_bit_for_bit() -> None:
    for seed, stream, round_ in ((0, rng.Stream.NOISE, 1), (7, rng.Stream.SHUFFLE, 99),
                                 ((1 << 40) + 1, rng.Stream.DPSGD_NOISE, 0)):
        ref = rng.uniform_grid(seed, stream, round_, CLIENTS, 3000)
        got = rng.uniform_t(seed, stream, round_, CLIENTS, 3000)
        assert got.dtype == torch.float64 and np.array_equal(got.numpy(), ref)
        assert float(got.min()) > 0.0 and float(got.max()) < 1.0
    # counters given as a tensor: any positions, also far out
    ctr = torch.tensor([0, 5, 1 << 33, (1 << 62) + 9])
    ref = rng.uniform(rng.key(3, 7, 2, CLIENTS)[:, None], ctr.numpy()[None, :])
    assert np.array_equal(rng.uniform_t(3, 7, 2, CLIENTS, ctr).numpy(), ref)


def test_keys_t_equal_the_numpy_keys() -> None:
    got = rng.key_t(11, rng.Stream.NOISE, 42, torch.from_numpy(CLIENTS)).numpy()
    assert np.array_equal(got.view(np.uint64), rng.key(11, rng.Stream.NOISE, 42, CLIENTS))


def test_uniform_is_open_at_one() -> None:
    """(b + 0.5) 2**-53 rounds to 1.0 at b = 2**53 - 1; the cap keeps u < 1 (Laplace's
    inverse CDF would give an infinite draw at u = 1)."""
    assert rng._MAX_U < 1.0
    b = np.array([(1 << 53) - 1], dtype=np.uint64)
    assert np.minimum((b.astype(np.float64) + 0.5) * rng._INV53, rng._MAX_U)[0] < 1.0


@pytest.mark.parametrize("n, k, levels", [(1, 1, 0), (50, 0, 0), (50, 7, 0), (50, 50, 0),
                                          (50, 80, 0), (200, 30, 4), (200, 30, 40),
                                          (1000, 999, 3)])
def test_smallest_equals_the_stable_argsort_ties_included(n, k, levels) -> None:
    """rng.smallest (one partition) picks what the obvious stable sort picks; ``levels``
    > 0 draws from that few values, so the cut falls inside a run of ties."""
    g = np.random.default_rng(n * 31 + k)
    u = g.integers(0, levels, n).astype(float) if levels else g.random(n)
    got = rng.smallest(u, k)
    assert np.array_equal(got, np.sort(np.argsort(u, kind="stable")[:k]))
    assert got.shape == (min(max(k, 0), n),)


def test_chunk_orders_equal_a_per_client_argsort_and_are_permutations() -> None:
    lengths = np.array([0, 1, 7, 300, 41, 300])
    clients = np.array([3, 9, 4, 1 << 40, 12, 8])
    grid = rng.epoch_orders_t(5, rng.Stream.SHUFFLE, 6, clients, lengths, 0, 4).numpy()
    assert grid.shape == (6, 4, 300)
    for j, (c, n) in enumerate(zip(clients.tolist(), lengths.tolist(), strict=True)):
        assert np.array_equal(grid[j, :, :n], epoch_orders(5, 6, c, n, 4))
        for e in range(4):
            assert np.array_equal(np.sort(grid[j, e, :n]), np.arange(n))
            assert np.array_equal(grid[j, e, n:], np.arange(n, 300))  # padding, in order
    assert not np.array_equal(grid[3, 0], grid[3, 1])  # epochs differ
    assert not np.array_equal(grid[3, 0], grid[5, 0])  # clients differ


def test_orders_do_not_depend_on_chunking_padding_or_epochs_drawn() -> None:
    lengths = np.arange(10) * 13 + 2
    whole = rng.epoch_orders_t(1, rng.Stream.SHUFFLE, 2, np.arange(10), lengths, 0, 3).numpy()
    for lo, hi in ((0, 4), (4, 10), (9, 10)):
        part = rng.epoch_orders_t(1, rng.Stream.SHUFFLE, 2, np.arange(lo, hi), lengths[lo:hi],
                                  0, 3).numpy()
        for j in range(hi - lo):
            n = lengths[lo + j]
            assert np.array_equal(part[j, :, :n], whole[lo + j, :, :n])
    later = rng.epoch_orders_t(1, rng.Stream.SHUFFLE, 2, np.arange(10), lengths, 2, 1).numpy()
    for j, n in enumerate(lengths.tolist()):
        assert np.array_equal(later[j, 0, :n], whole[j, 2, :n])


def test_orders_are_uniform_over_permutations() -> None:
    """All 3! = 6 orders of 3 samples appear about equally often over 6,000 clients
    (chi-square, fixed seed: deterministic)."""
    grid = rng.epoch_orders_t(0, rng.Stream.SHUFFLE, 1, np.arange(6000), np.full(6000, 3),
                              0, 1).numpy()[:, 0]
    codes = grid[:, 0] * 9 + grid[:, 1] * 3 + grid[:, 2]
    _, counts = np.unique(codes, return_counts=True)
    assert counts.size == 6
    assert stats.chisquare(counts).pvalue > 1e-3


def test_chunking_does_not_change_noise() -> None:
    for kind in ("laplace", "gaussian"):
        whole = rng.client_noise(4, 3, np.arange(10), 501, kind, 2.0)
        halves = torch.cat([rng.client_noise(4, 3, np.arange(0, 6), 501, kind, 2.0),
                            rng.client_noise(4, 3, np.arange(6, 10), 501, kind, 2.0)])
        assert torch.equal(whole, halves)
        shorter = rng.client_noise(4, 3, np.arange(10), 200, kind, 2.0)
        assert torch.equal(shorter, whole[:, :200])  # a row's prefix does not depend on n


def test_noise_is_the_obvious_transform_of_the_reference_uniforms() -> None:
    u = rng.uniform_grid(2, rng.Stream.NOISE, 5, CLIENTS, 400)
    lap = rng.client_noise(2, 5, CLIENTS, 400, "laplace", 1.5).numpy()
    assert np.allclose(lap, rng.laplace_from_uniform(u, 1.5), rtol=1e-14, atol=0)
    gau = rng.client_noise(2, 5, CLIENTS, 400, "gaussian", 1.0).numpy()
    r = np.sqrt(-2.0 * np.log(u[:, 0::2]))
    ref = np.stack((r * np.cos(2 * np.pi * u[:, 1::2]), r * np.sin(2 * np.pi * u[:, 1::2])),
                   axis=2).reshape(len(CLIENTS), -1)
    assert np.allclose(gau, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind,scale,cdf,var", [
    ("laplace", 0.7, stats.laplace(scale=0.7).cdf, 2 * 0.7**2),
    ("gaussian", 1.3, stats.norm(scale=1.3).cdf, 1.3**2),
])
def test_noise_has_its_target_distribution(kind, scale, cdf, var) -> None:
    """1e5 draws (10 clients x 10,000): mean, variance and a KS test against the target
    (fixed seed: the assertions are deterministic)."""
    x = rng.client_noise(0, 1, np.arange(10), 10_000, kind, scale).numpy().ravel()
    assert np.isfinite(x).all()
    se = np.sqrt(var / x.size)
    assert abs(x.mean()) < 5 * se
    assert abs(x.var() / var - 1) < 0.03
    assert stats.kstest(x, cdf).pvalue > 1e-3


def test_poisson_masks_have_rate_q() -> None:
    m = rng.bernoulli_t(0, rng.Stream.DPSGD_SAMPLE, 1, np.arange(20), 5000, 0.1)
    assert m.dtype == torch.bool and abs(float(m.double().mean()) - 0.1) < 0.005
    ref = rng.uniform_grid(0, rng.Stream.DPSGD_SAMPLE, 1, np.arange(20), 5000) < 0.1
    assert np.array_equal(m.numpy(), ref)


def test_distinct_rounds_and_clients_draw_distinct_noise_even_when_keys_share_low_bits() -> None:
    """Full-width keys: two clients whose ids (and keys) agree in their low 32 bits, or two
    rounds, never share noise; no entry cancels in the difference."""
    a = rng.client_noise(1, 4, np.array([5, 5 + (1 << 32), 5 + (1 << 40)]), 256, "gaussian", 1.0)
    b = rng.client_noise(1, 5, np.array([5]), 256, "gaussian", 1.0)
    for x, y in ((a[0], a[1]), (a[0], a[2]), (a[1], a[2]), (a[0], b[0])):
        assert float((x - y).abs().min()) > 0
    # keys equal in their low 32 bits (found at ML-100K size) still draw different numbers
    ka = rng.key_t(1, rng.Stream.NOISE, 43, torch.tensor([586]))
    kb = rng.key_t(1, rng.Stream.NOISE, 47, torch.tensor([50]))
    assert int(ka) != int(kb) and int(ka) & 0xFFFFFFFF == int(kb) & 0xFFFFFFFF
    na = rng.client_noise(1, 43, np.array([586]), 256, "laplace", 1.0)
    nb = rng.client_noise(1, 47, np.array([50]), 256, "laplace", 1.0)
    assert float((na - nb).abs().min()) > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: checks that the "
                    "GPU draws the CPU's numbers")
def test_cpu_and_gpu_draw_identical_numbers() -> None:
    """Uniforms, Poisson masks and orders are bit-identical on a GPU; noise goes through
    log / cos / sin, whose last bit may differ between the CPU's and CUDA's libm, so it is
    compared to 4 ulp."""
    dev = torch.device("cuda")
    cpu = rng.uniform_t(3, rng.Stream.NOISE, 2, CLIENTS, 4096)
    gpu = rng.uniform_t(3, rng.Stream.NOISE, 2, CLIENTS, 4096, device=dev)
    assert gpu.device.type == "cuda" and torch.equal(cpu, gpu.cpu())
    lengths = np.array([0, 3, 500, 77, 1000, 2, 999])
    o_cpu = rng.epoch_orders_t(1, rng.Stream.SHUFFLE, 4, CLIENTS, lengths, 0, 3)
    o_gpu = rng.epoch_orders_t(1, rng.Stream.SHUFFLE, 4, CLIENTS, lengths, 0, 3, device=dev)
    assert torch.equal(o_cpu, o_gpu.cpu())
    m_cpu = rng.bernoulli_t(0, rng.Stream.POISSON, 3, CLIENTS, 999, 0.2)
    assert torch.equal(m_cpu, rng.bernoulli_t(0, rng.Stream.POISSON, 3, CLIENTS, 999, 0.2,
                                              device=dev).cpu())
    for kind in ("laplace", "gaussian"):
        a = rng.client_noise(0, 1, CLIENTS, 4096, kind, 1.0)
        b = rng.client_noise(0, 1, CLIENTS, 4096, kind, 1.0, device=dev).cpu()
        assert torch.allclose(a, b, rtol=4 * 2.0**-52, atol=4 * 2.0**-1074)


def test_dpsgd_chunk_draws_equal_each_clients_draws() -> None:
    from fedem_private.privacy import dpsgd

    clients, n_pos = np.array([4, 0, 1 << 35, 9]), np.array([7, 0, 30, 12])
    masks = dpsgd.chunk_positive_masks(2, 3, clients, n_pos, 5, 0.3)
    negs = dpsgd.chunk_step_negatives(2, 3, clients, 5, 8, 1682).numpy()
    for j, (c, n) in enumerate(zip(clients.tolist(), n_pos.tolist(), strict=True)):
        assert np.array_equal(masks[j, :, :n], dpsgd.positive_masks(2, 3, c, n, 5, 0.3))
        assert np.array_equal(negs[j], dpsgd.step_negatives(2, 3, c, 5, 8, 1682))
    assert negs.min() >= 0 and negs.max() < 1682
