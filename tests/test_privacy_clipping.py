"""Per-client L1/L2 clipping in float64: the bound holds exactly, idempotent, stats right."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedem_private.errors import UserError
from fedem_private.privacy.clipping import clip_l1, clip_l2, clip_rows

CLIPS = {"l1": clip_l1, "l2": clip_l2}


def _exact_norm_at_most(row: np.ndarray, bound: float, norm: str) -> bool:
    """||row||_p <= bound in exact rational arithmetic (p = 1 or 2)."""
    values = [Fraction(float(v)) for v in row]
    c = Fraction(bound)
    if norm == "l1":
        return sum(abs(v) for v in values) <= c
    return sum(v * v for v in values) <= c * c


def _check_bound(clipped: torch.Tensor, bound: float, norm: str) -> None:
    assert clipped.dtype == torch.float64
    flat = clipped.reshape(clipped.shape[0], -1)
    p = 1 if norm == "l1" else 2
    assert bool((torch.linalg.vector_norm(flat, p, dim=1) <= bound).all())
    for row in flat.numpy():
        assert np.linalg.norm(row, p) <= bound
        assert _exact_norm_at_most(row, bound, norm)


magnitudes = st.sampled_from([1e-30, 1e-3, 1.0, 7.3, 1e5, 1e30])
tables = st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5)).flatmap(
    lambda shape: arrays(np.float64, shape, elements=st.floats(-1e3, 1e3, allow_nan=False))
)


@settings(max_examples=60, deadline=None)
@given(tables, magnitudes, st.floats(1e-30, 1e30), st.sampled_from(["l1", "l2"]))
def test_bound_holds_exactly_and_idempotent(x: np.ndarray, scale: float, bound: float,
                                            norm: str) -> None:
    delta = torch.from_numpy(x * scale)
    clipped, stats = CLIPS[norm](delta, bound)
    _check_bound(clipped, bound, norm)
    again, stats2 = CLIPS[norm](clipped, bound)
    assert torch.equal(again, clipped)
    assert stats2.fraction_clipped == 0.0
    assert torch.equal(delta, torch.from_numpy(x * scale))  # input untouched


@pytest.mark.parametrize("norm", ["l1", "l2"])
@pytest.mark.parametrize("value", [1e30, 1e-30, 0.0, 1e300, 1e-310, 3.0])
@pytest.mark.parametrize("bound", [1e-30, 0.37, 1.0, 1e30])
def test_extreme_magnitudes(norm: str, value: float, bound: float) -> None:
    gen = torch.Generator().manual_seed(0)
    delta = torch.randn((3, 40, 7), generator=gen, dtype=torch.float64) * value
    clipped, stats = CLIPS[norm](delta, bound)
    assert torch.isfinite(clipped).all()
    _check_bound(clipped, bound, norm)
    assert torch.equal(CLIPS[norm](clipped, bound)[0], clipped)
    if value == 0.0:
        assert torch.equal(clipped, delta) and stats.fraction_clipped == 0.0


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_float32_input_many_entries(norm: str) -> None:
    # float32 norms of ~27k entries overshoot; clipping must still hold in float64
    gen = torch.Generator().manual_seed(1)
    delta = torch.rand((5, 1682, 16), generator=gen, dtype=torch.float32) * 3.0
    clipped, _ = CLIPS[norm](delta, 1.0)
    p = 1 if norm == "l1" else 2
    norms = torch.linalg.vector_norm(clipped.reshape(5, -1), p, dim=1)
    assert bool((norms <= 1.0).all())
    assert bool((norms > 1.0 - 1e-8).all())  # scaled to the bound, not far below
    ratio = clipped / delta.double()
    assert torch.allclose(ratio, ratio[:, :1, :1].expand_as(ratio), rtol=1e-12)  # same direction


def test_fraction_clipped_and_norms() -> None:
    delta = torch.zeros((4, 3, 2), dtype=torch.float64)
    delta[0, 0, 0] = 0.5          # L1 0.5, L2 0.5
    delta[1] = 1.0                # L1 6, L2 sqrt(6)
    delta[2, :, 0] = -2.0         # L1 6, L2 sqrt(12)
    # delta[3] stays zero
    c1, s1 = clip_l1(delta, 1.0)
    assert s1.fraction_clipped == 0.5
    assert torch.allclose(s1.norms, torch.tensor([0.5, 6.0, 6.0, 0.0], dtype=torch.float64))
    assert math.isclose(s1.mean_norm, 12.5 / 4)
    assert torch.equal(c1[0], delta[0]) and torch.equal(c1[3], delta[3])
    assert torch.allclose(c1[1], torch.full((3, 2), 1 / 6, dtype=torch.float64), rtol=1e-8)
    c2, s2 = clip_l2(delta, 3.0)
    assert s2.fraction_clipped == 0.25
    expected = torch.tensor([0.5, math.sqrt(6), math.sqrt(12), 0.0], dtype=torch.float64)
    assert torch.allclose(s2.norms, expected)
    assert torch.equal(c2[1], delta[1])
    assert math.isclose(float(torch.linalg.vector_norm(c2[2])), 3.0, rel_tol=1e-8)


def test_two_dimensional_input_and_empty() -> None:
    clipped, stats = clip_l1(torch.ones((2, 10)), 5.0)
    assert clipped.shape == (2, 10) and stats.fraction_clipped == 1.0
    empty, stats = clip_l2(torch.zeros((0, 4, 3)), 1.0)
    assert empty.shape == (0, 4, 3) and stats.fraction_clipped == 0.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_bad_bound(bad: float) -> None:
    with pytest.raises(UserError):
        clip_l1(torch.ones((1, 3)), bad)


def test_non_finite_update_is_a_user_error() -> None:
    delta = torch.ones((3, 4))
    delta[1, 2] = math.nan
    with pytest.raises(UserError, match=r"row\(s\) \[1\]"):
        clip_rows(delta, 1.0, "l2")


def test_finite_rows_matches_entrywise_check() -> None:
    from fedem_private.finite import finite_rows

    x = torch.randn(6, 5, 3)
    x[1, 2, 0] = float("nan")
    x[2, 0, 1] = float("inf")
    x[3, 4, 2] = -float("inf")
    x[4] = 3e38  # finite entries whose float32 sum overflows
    expected = torch.isfinite(x).flatten(1).all(dim=1)
    assert finite_rows(x).tolist() == expected.tolist() == [True, False, False, False, True, True]
    assert finite_rows(torch.zeros(0, 4)).shape == (0,)


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_row_whose_rounded_norm_is_the_bound_is_still_clipped(norm: str) -> None:
    """Hypothesis's counterexample: the float64 norm of [1, 1.46e-224] rounds to exactly 1,
    the exact one is above 1; the returned row must be within the bound exactly."""
    delta = torch.tensor([[[1.0, 1.45516383e-224]]], dtype=torch.float64)
    clipped, stats = CLIPS[norm](delta, 1.0)
    _check_bound(clipped, 1.0, norm)
    assert stats.fraction_clipped == 1.0
    assert torch.equal(CLIPS[norm](clipped, 1.0)[0], clipped)
