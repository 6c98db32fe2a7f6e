"""``train.state_dtype = "bfloat16"``: per-client item tables kept in half the memory,
arithmetic in float32 (issue 43, item 4)."""

from __future__ import annotations

import pytest
import torch

from fedem_private.cli import main
from fedem_private.server.aggregation import _split_bf16_mm, _widened_mm, similarity_aggregate
from fedem_private.simulation.config import from_dict
from fedem_private.simulation.loop import Simulation


def _sim(split, state_dtype: str, **fed) -> Simulation:
    cfg = {"train": {"rounds": 3, "local_epochs": 2, "state_dtype": state_dtype, "seed": 1},
           "federation": fed}
    return Simulation(from_dict(cfg), split)


def test_round_one_keeps_the_float32_tables_rounded_once(small_split):
    """FedMF's round 1 starts every client from the same float32 global table either
    way, so the bfloat16 state is exactly the float32 run's trained tables rounded to
    nearest, and the server's float32 aggregate of the (unrounded) uploads is identical."""
    a, b = _sim(small_split, "float32", method="fedmf"), _sim(small_split, "bfloat16",
                                                              method="fedmf")
    a.step()
    b.step()
    assert a.state.q_local.dtype == torch.float32 and b.state.q_local.dtype == torch.bfloat16
    assert torch.equal(b.state.q_local, a.state.q_local.to(torch.bfloat16))
    assert torch.equal(a.aggregator.table, b.aggregator.table)
    # read back in the compute dtype
    idx = torch.arange(3)
    assert b.state.params(idx).items.dtype == torch.float32


def test_fedem_keeps_every_per_client_table_narrow_and_trains(small_split):
    sim = _sim(small_split, "bfloat16", method="fedem")
    ref = _sim(small_split, "float32", method="fedem")
    sim.run()
    ref.run()
    agg = sim.aggregator
    assert sim.state.q_local.dtype == torch.bfloat16
    assert agg.global_tables.dtype == torch.bfloat16 and agg.last_upload.dtype == torch.bfloat16
    assert agg.sent(torch.arange(2)).dtype == torch.float32
    assert sim.state.q_local.element_size() * 2 == ref.state.q_local.element_size()
    # the tables follow the float32 run's to within bfloat16's rounding, not elsewhere
    gap = (sim.state.q_local.float() - ref.state.q_local).abs().max().item()
    assert 0 < gap < 0.05 * ref.state.q_local.abs().max().item()
    hr = sim.evaluate()["sampled"]["hr@10"]
    assert 0 <= hr <= 1


def test_similarity_aggregate_of_narrow_tables_sums_in_float32():
    """The personalised tables of bfloat16 uploads are the float64 aggregate of the same
    (bfloat16-valued) uploads rounded once, not a sum accumulated in bfloat16."""
    gen = torch.Generator().manual_seed(0)
    uploads = torch.randn(7, 50, 4, generator=gen).to(torch.bfloat16)
    p = torch.full((7,), 1 / 7, dtype=torch.float64)
    got = similarity_aggregate(uploads, p, 0.5)
    want = similarity_aggregate(uploads.double(), p, 0.5)
    assert got.dtype == torch.bfloat16
    # one rounding: within half a bfloat16 ulp (at most 2^-8 relative), float32 slack
    err = (got.double() - want).abs()
    assert bool((err <= want.abs() * (2 ** -8 + 1e-6) + 1e-30).all())


@pytest.mark.parametrize("method", ["gpfedrec", "fedmerge"])
def test_other_per_upload_aggregators_keep_narrow_copies(small_split, method):
    sim = _sim(small_split, "bfloat16", method=method)
    sim.run()
    assert sim.aggregator.last_upload.dtype == torch.bfloat16
    assert sim.aggregator.personal.dtype == torch.bfloat16
    assert sim.aggregator.anchor(torch.arange(2)).dtype == torch.float32


def test_fedrap_keeps_its_personal_tables_narrow_and_its_vectors_wide(small_split):
    """FedRAP's per-client personal table (n, m, d) is a private group as large as q_local:
    kept in the state dtype, read back in float32; its head stays float32."""
    sim = _sim(small_split, "bfloat16", method="fedrap")
    ref = _sim(small_split, "float32", method="fedrap")
    sim.run()
    ref.run()
    personal = sim.state.private["personal"]
    assert personal.dtype == torch.bfloat16 and sim.state.private["w"].dtype == torch.float32
    assert sim.state.params(torch.arange(2)).private["personal"].dtype == torch.float32
    # on average within bfloat16's rounding of the float32 run; single entries can part
    # further (the L1 term's sign flips for entries near zero)
    gap = (personal.float() - ref.state.private["personal"]).abs().mean().item()
    assert 0 < gap < 0.01 * ref.state.private["personal"].abs().mean().item()
    assert 0 <= sim.evaluate()["sampled"]["hr@10"] <= 1


def test_unknown_state_dtype_is_one_line(tmp_path, capsys):
    code = main(["run", "--rounds", "1", "--state-dtype", "float8", "--out",
                 str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "float32, bfloat16" in err


def _bf16_step(x: torch.Tensor) -> torch.Tensor:
    """The gap between consecutive bfloat16 numbers at |x| (8 significant bits)."""
    exp = torch.floor(torch.log2(x.abs().clamp_min(1e-30)))
    return torch.pow(2.0, exp - 7)


def test_split_bfloat16_product_is_the_widened_float32_one():
    """The bfloat16 matrix-unit mix (weights split in two bfloat16 parts) is the float32
    product rounded once: nearly every entry identical, none more than one bfloat16 step
    away, and each within half a step of the float64 product (float32 slack)."""
    gen = torch.Generator().manual_seed(3)
    n, cols = 64, 5000
    raw = torch.rand(n, n, generator=gen, dtype=torch.float64)
    w = (raw / raw.sum(dim=1, keepdim=True)).to(torch.float32)
    src = (torch.randn(1, cols, generator=gen) * 0.1
           + torch.randn(n, cols, generator=gen) * 0.05).to(torch.bfloat16)
    fast = torch.empty(n, cols, dtype=torch.bfloat16)
    wide = torch.empty_like(fast)
    _split_bf16_mm(w, src, fast, block_bytes=1 << 16)  # several column blocks
    _widened_mm(w, src, wide)
    a, b = fast.double(), wide.double()
    # float32 sums of terms of size |w| |src| can cancel to near zero, where a bfloat16
    # step is tiny: allow the float32 sum's error (and w's 2^-17 residual) absolutely
    slack = 2.0 ** -16 * (w.double().abs() @ src.double().abs())
    assert (a != b).double().mean().item() < 1e-3
    assert bool(((a - b).abs() <= _bf16_step(torch.maximum(a.abs(), b.abs())) + slack).all())
    exact = w.double() @ src.double()
    assert bool(((a - exact).abs() <= 0.5 * _bf16_step(exact) + slack).all())


def test_narrow_mix_uses_the_matrix_units_only_where_the_cpu_has_them(monkeypatch):
    """The dispatch: bfloat16 on a CPU with bfloat16 matrix instructions takes the split
    product, anything else the widened float32 one."""
    from fedem_private.server import aggregation as agg
    calls: list[str] = []
    monkeypatch.setattr(agg, "_split_bf16_mm", lambda *a, **k: calls.append("split"))
    monkeypatch.setattr(agg, "_widened_mm", lambda *a, **k: calls.append("wide"))
    w = torch.ones(2, 2)
    for has, dtype, want in ((True, torch.bfloat16, "split"), (False, torch.bfloat16, "wide"),
                             (True, torch.float16, "wide")):
        monkeypatch.setattr(agg, "cpu_bf16_matmul", lambda has=has: has)
        agg._narrow_mm(w, torch.ones(2, 3, dtype=dtype), torch.empty(2, 3, dtype=dtype))
        assert calls.pop() == want
