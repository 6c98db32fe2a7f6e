"""Small integration runs on the real ML-100K (skipped when ../shared/datasets is absent)."""

from __future__ import annotations

from fedem_private.experiments.runner import prepare
from fedem_private.simulation.config import RunConfig, with_overrides


def _run(data_dir, **over):
    cfg = with_overrides(RunConfig(), {"data.dataset": "ml-100k", "data.data_dir": str(data_dir),
                                       "train.local_epochs": 2, "train.rounds": 3,
                                       "train.eval_every": 3, **over})
    sim = prepare(cfg)
    return sim.run()[-1].metrics


def test_fedmf_learns_on_ml100k(ml100k_dir):
    m = _run(ml100k_dir, **{"federation.method": "fedmf", "data.protocol": "strict"})
    assert m["sampled"]["hr@10"] > 0.2  # random ranking of 100 candidates gives 0.1
    assert m["full"]["hr@10"] > 0.02


def test_paper_protocol_leaks_to_a_model_without_federation(ml100k_dir):
    paper = _run(ml100k_dir, **{"federation.method": "local", "data.protocol": "paper"})
    strict = _run(ml100k_dir, **{"federation.method": "local", "data.protocol": "strict"})
    # no client ever sees another's data, yet the paper protocol rates it highly
    assert strict["sampled"]["hr@10"] < 0.15  # about random (0.1)
    assert paper["sampled"]["hr@10"] > 2 * strict["sampled"]["hr@10"]
