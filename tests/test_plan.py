"""make_plan (the lock-step schedule of a chunk) against its per-client reference, and
the same plan on any device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private.data.split import exclusion_csr
from fedem_private.models.base import LocalTrainConfig, draw_samples, make_plan, num_steps
from fedem_private.reference.plan import reference_plan


def _chunk(split, cfg: LocalTrainConfig, round_: int = 3, seed: int = 7):
    clients = np.arange(split.n_users)
    excl = exclusion_csr(split, "strict")
    samples = draw_samples(seed, round_, clients, split.train_indptr, split.train_items,
                           *excl, split.n_items, cfg.num_negatives)
    steps = num_steps(np.diff(samples.indptr), cfg)
    order = np.argsort(-steps, kind="stable")
    samples = draw_samples(seed, round_, clients[order], split.train_indptr,
                           split.train_items, *excl, split.n_items, cfg.num_negatives)
    return clients[order], samples


@pytest.mark.parametrize("batch_size, epochs, full", [(16, 2, False), (7, 3, False),
                                                      (256, 1, False), (16, 2, True)])
def test_make_plan_matches_the_per_client_reference(small_split, batch_size, epochs, full):
    cfg = LocalTrainConfig(epochs=epochs, batch_size=batch_size, lr=0.1, num_negatives=3)
    clients, samples = _chunk(small_split, cfg)
    n_items = small_split.n_items if full else None
    plan = make_plan(7, 3, clients, samples, cfg, torch.float64, n_items=n_items)
    ref = reference_plan(7, 3, clients, samples, cfg, n_items=n_items)
    assert plan.rows == ref["rows"]
    assert [t.tolist() for t in plan.touched] == [t.tolist() for t in ref["ids"]]
    np.testing.assert_array_equal(plan.active, ref["active"])
    np.testing.assert_array_equal(plan.offsets, ref["offsets"])
    np.testing.assert_array_equal(plan.steps, ref["steps"])
    np.testing.assert_array_equal(plan.loc.numpy(), ref["loc"])
    np.testing.assert_array_equal(plan.lab.numpy(), ref["lab"])
    np.testing.assert_allclose(plan.wgt.numpy(), ref["wgt"], rtol=0, atol=1e-15)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_plan_built_on_a_gpu_is_the_cpu_plan(small_split):
    cfg = LocalTrainConfig(epochs=2, batch_size=16, lr=0.1, num_negatives=3)
    clients, samples = _chunk(small_split, cfg)
    cpu = make_plan(7, 3, clients, samples, cfg, torch.float32)
    gpu = make_plan(7, 3, clients, samples, cfg, torch.float32, device=torch.device("cuda"))
    assert gpu.loc.device.type == "cuda" and gpu.ids.device.type == "cuda"
    for name in ("ids", "valid", "loc", "lab", "wgt"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
