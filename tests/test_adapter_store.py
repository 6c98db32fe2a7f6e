"""The lazily drawn adapters (client/merging.py:AdapterStore; issue 79, a FedEM run at 10^6
users): memory grows with the clients used, and each adapter equals the eager draw."""

from __future__ import annotations

import numpy as np
import torch

from fedem_private.client.adapter import MergeState
from fedem_private.client.merging import AdapterStore, MergeConfig, Merger, init_merge_state


def _eager(n: int, seed: int = 3) -> MergeState:
    state = init_merge_state(MergeConfig(), np.arange(n), 8, seed)
    assert state is not None
    return state


def test_a_late_draw_equals_the_eager_one_in_any_order():
    n = 50
    merger = Merger(MergeConfig(), n, 8, 3)
    assert merger.store is not None and merger.store.used == 0  # nothing drawn yet
    idx = torch.tensor([41, 7, 7, 19])
    chunk = merger.take(idx)
    want = _eager(n)
    for got, full in zip((*chunk.weights, *chunk.biases), (*want.weights, *want.biases),
                         strict=True):
        assert torch.equal(got, full[idx])
    assert merger.store.used == 3  # 7 twice in the chunk: drawn once
    for got, full in zip((*merger.state.weights, *merger.state.biases),
                         (*want.weights, *want.biases), strict=True):
        assert torch.equal(got, full)


def test_memory_grows_with_the_clients_used_not_n():
    n = 100_000
    store = AdapterStore(MergeConfig(), n, 8, 0, torch.float32, torch.device("cpu"))
    for start in range(0, 1000, 100):
        store.take(torch.arange(start, start + 100))
    assert store.used == 1000
    assert 1000 <= store.table.n_clients <= 1250 + 100  # a quarter's slack at most


def test_put_writes_only_the_named_clients():
    merger = Merger(MergeConfig(), 20, 8, 1)
    idx = torch.tensor([3, 11])
    part = merger.take(idx)
    zeros = MergeState(tuple(torch.zeros_like(w) for w in part.weights),
                       tuple(torch.zeros_like(b) for b in part.biases))
    merger.store.put(idx, zeros)
    after, want = merger.state, _eager(20, 1)
    keep = torch.tensor([i for i in range(20) if i not in (3, 11)])
    for got, full in zip(after.weights, want.weights, strict=True):
        assert torch.equal(got[idx], torch.zeros_like(got[idx]))
        assert torch.equal(got[keep], full[keep])


def test_a_merge_that_learns_nothing_keeps_no_store():
    assert Merger(MergeConfig(strategy="sr"), 10, 8, 0).take(torch.tensor([1])) is None


def test_a_checkpoint_from_before_the_store_resumes_with_its_adapters():
    merger = Merger(MergeConfig(), 6, 8, 2)
    full = _eager(6, 2)
    old = {k: v for k, v in merger.__dict__.items() if k != "store"}
    old["state"] = full  # what a checkpoint of the eager code held
    resumed = Merger.__new__(Merger)
    resumed.__setstate__(old)
    got = resumed.take(torch.tensor([5, 0]))
    assert torch.equal(got.weights[0], full.weights[0][torch.tensor([5, 0])])
    assert "state" not in resumed.__dict__  # the property reads the store now
