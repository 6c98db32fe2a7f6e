"""Secure aggregation simulated as a protocol (fedem_private/privacy/secagg.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("Crypto", reason="the [secagg] extra (pycryptodome) is not installed")

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from fedem_private.privacy import secagg  # noqa: E402


def _inputs(m: int, length: int, bits: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << bits, size=(m, length)).astype(np.uint32)


def _plain(x: np.ndarray, bits: int) -> np.ndarray:
    return (x.astype(np.int64).sum(axis=0) % (1 << bits)).astype(np.uint32)


@pytest.mark.parametrize("m", [5, 40])  # the complete graph, and SecAgg+'s Harary graph
def test_sum_equals_the_plain_modular_sum(m: int) -> None:
    x = _inputs(m, 300, 16)
    ids = np.arange(m) * 7 + 3
    view = secagg.run_round(x, ids, 16, seed=5, round_=1)
    assert view.total is not None
    assert np.array_equal(view.total, _plain(x, 16))
    assert view.degree == (m - 1 if m == 5 else secagg.default_degree(m))
    # every masked input differs from its input (the masks are there)
    assert all(not np.array_equal(view.masked[int(u)], x[i]) for i, u in enumerate(ids))


@pytest.mark.parametrize("m", [6, 40])
def test_dropouts_before_and_after_masking_are_recovered(m: int) -> None:
    x = _inputs(m, 200, 12, seed=1)
    ids = np.arange(m)
    before, after = ids[[1]], ids[[3]]
    view = secagg.run_round(x, ids, 12, seed=2, round_=4, drop_before=before, drop_after=after)
    keep = ~np.isin(ids, before)  # the after-dropper's input counts: it was sent
    assert view.total is not None
    assert np.array_equal(view.total, _plain(x[keep], 12))
    assert 3 in view.senders.tolist() and 3 not in view.survivors.tolist()
    assert 1 not in view.senders.tolist()


def test_too_many_dropouts_abort_with_one_message() -> None:
    x = _inputs(12, 50, 8)
    ids = np.arange(12)
    with pytest.raises(secagg.SecAggAbort, match="nothing released") as err:
        secagg.run_round(x, ids, 8, seed=0, round_=1, drop_after=ids[:8])
    assert "\n" not in str(err.value)


def test_a_masked_upload_is_uniform_and_an_unmasked_one_is_not() -> None:
    bits, length = 8, 40_000
    x = np.zeros((5, length), dtype=np.uint32)
    x[:, : length // 2] = 3  # a very non-uniform input
    view = secagg.run_round(x, np.arange(5), bits, seed=9, round_=1)
    bins = np.arange((1 << bits) + 1)

    def p_value(values: np.ndarray) -> float:
        counts = np.histogram(values, bins=bins)[0]
        return float(stats.chisquare(counts).pvalue)

    assert p_value(view.masked[2]) > 1e-3
    assert p_value(x[2]) < 1e-12  # the test does fail on an unmasked upload


def test_graph_is_symmetric_with_the_stated_degree() -> None:
    ids = np.arange(50) * 2
    g = secagg.graph(ids, 8, seed=1, round_=3)
    for u, nb in g.items():
        assert len(nb) == 8 and u not in nb.tolist()
        for v in nb.tolist():
            assert u in g[v].tolist()


def test_costs_count_what_a_client_sends() -> None:
    x = _inputs(10, 1000, 16)
    view = secagg.run_round(x, np.arange(10), 16, seed=0, round_=1)
    per = view.costs.per_client()
    assert per["upload_masked_input_bytes"] == 1000 * 16 / 8
    assert per["upload_keys_bytes"] == 64
    assert per["upload_shares_bytes"] == view.degree * secagg.SHARE_MESSAGE


@pytest.mark.parametrize(("m", "before", "after"), [(6, [1], [3]), (40, [0, 5], [7, 9]),
                                                     (12, [], list(range(8)))])
def test_the_benchmarks_plain_round_matches_the_protocol(m: int, before: list[int],
                                                         after: list[int]) -> None:
    """plain_round (benchmarks' shortcut) gives the protocol's senders, survivors and sum,
    and aborts exactly when it does."""
    x = _inputs(m, 64, 10, seed=m)
    ids = np.arange(m) * 3
    kw = {"seed": 4, "round_": 2, "drop_before": ids[before], "drop_after": ids[after]}
    try:
        real = secagg.run_round(x, ids, 10, **kw)
    except secagg.SecAggAbort as err:
        with pytest.raises(secagg.SecAggAbort) as again:
            secagg.plain_round(x, ids, 10, **kw)
        assert str(again.value) == str(err)
        return
    plain = secagg.plain_round(x, ids, 10, **kw)
    assert np.array_equal(plain.total, real.total)
    assert np.array_equal(plain.senders, real.senders)
    assert np.array_equal(plain.survivors, real.survivors)
    assert plain.masked == {}  # nothing to record: the shortcut is no protocol
