"""benchmarks/probes/row_mean.py: each row's change averaged over the uploads that changed it."""

from __future__ import annotations

import torch

from benchmarks.probes.row_mean import RowMeanAggregator


def test_each_row_moves_by_the_mean_change_of_the_uploads_that_changed_it():
    q0 = torch.zeros(3, 2)
    sizes = torch.tensor([1.0, 3.0, 4.0])
    agg = RowMeanAggregator(sizes, 3, q0)
    agg.begin_round(torch.tensor([True, True, False]))  # weights 1/4, 3/4; client 2 sits out
    up = q0.expand(2, -1, -1).clone()
    up[0, 0] = torch.tensor([4.0, 0.0])   # client 0 alone changes row 0
    up[0, 1] = torch.tensor([2.0, 2.0])   # both change row 1
    up[1, 1] = torch.tensor([-2.0, 6.0])
    agg.add(torch.tensor([0, 1]), up)
    agg.end_round()
    want = torch.tensor([[4.0, 0.0],                     # not diluted by client 1's weight
                         [0.25 * 2 + 0.75 * -2, 0.25 * 2 + 0.75 * 6],
                         [0.0, 0.0]])                      # nobody changed row 2
    assert torch.allclose(agg.table, want)


def test_fedavg_dilutes_the_same_row():
    """The contrast the probe measures: under fedavg row 0 moves by client 0's weight only."""
    from fedem_private.server.aggregators import FedAvgAggregator

    q0 = torch.zeros(3, 2)
    agg = FedAvgAggregator(torch.tensor([1.0, 3.0, 4.0]), 3, q0)
    agg.begin_round(torch.tensor([True, True, False]))
    up = q0.expand(2, -1, -1).clone()
    up[0, 0] = torch.tensor([4.0, 0.0])
    agg.add(torch.tensor([0, 1]), up)
    agg.end_round()
    assert torch.allclose(agg.table[0], torch.tensor([1.0, 0.0]))


def test_the_probe_refuses_a_private_config(tmp_path, capsys, monkeypatch):
    from benchmarks.probes import row_mean
    from fedem_private.server import registry

    # main() registers the probe's rule in this process; the registry is left as found, so a
    # later test's `fedem-private list` sees the built-ins only
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))

    cfg = tmp_path / "private.toml"
    cfg.write_text('[data]\ndataset = "synthetic"\n[privacy]\nmode = "cdp-gaussian"\n')
    assert row_mean.main(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    assert "no privacy architecture" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
