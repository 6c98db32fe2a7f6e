"""PrivacyLayer: the simulation's view (chunked release, per-round log, summary)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedem_private.privacy.accounting import compose
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.layer import PrivacyLayer
from fedem_private.privacy.mechanisms import release

N, M, D = 8, 30, 4


def _layer(**kw: object) -> PrivacyLayer:
    return PrivacyLayer(PrivacyConfig(**kw), rounds=5, n_clients=N, lr=0.01,
                        sizes=np.arange(1, N + 1), seed=3)


def test_chunked_release_equals_one_call_and_logs_round() -> None:
    layer = _layer(mode="ldp-laplace", epsilon=2.0, clip=0.5)
    gen = torch.Generator().manual_seed(0)
    sent = torch.randn((5, M, D), generator=gen)
    local = sent + torch.randn((5, M, D), generator=gen)
    clients = np.array([6, 1, 3, 0, 7])
    layer.begin_round(1)
    parts = [layer.release(sent[s], local[s], clients[s], None) for s in (slice(0, 2),
                                                                          slice(2, 5))]
    whole, _ = release(layer.params, sent, local, seed=3, round_=1, clients=clients)
    assert torch.equal(torch.cat(parts), whole)
    row = layer.end_round(clients)
    assert row["clip"] == 0.5 and row["frac_clipped"] == 1.0 and row["mean_pre_clip_norm"] > 0.5
    mech = layer.params.round_mechanism()
    assert mech is not None
    assert row["eps_spent"] == pytest.approx(compose(mech, 1, 1e-5).reported)
    assert 0 < row["eps_spent"] < 2.0
    summary = layer.summary()
    json.dumps(summary, allow_nan=False)
    json.dumps(layer.ledger_dict(), allow_nan=False)
    assert summary["epsilon"]["reported"] == pytest.approx(row["eps_spent"])
    assert layer.ledger.rounds_of(6) == [1] and layer.ledger.rounds_of(2) == []


def test_none_and_paper() -> None:
    layer = _layer()
    assert not layer.perturbs and layer.local_grad_clip is None
    layer.begin_round(1)
    x = torch.zeros((2, M, D))
    assert layer.release(x, x, np.array([0, 1]), None) is x
    assert "eps_spent" not in layer.end_round(np.array([0, 1]))
    paper = _layer(mode="paper", paper_clip=0.5, paper_lambda=0.1)
    assert paper.local_grad_clip == 0.5
    paper.begin_round(1)
    row = paper.end_round(np.array([0, 1]))  # sizes 1 and 2: p = 1/3, 2/3
    assert math.isinf(row["eps_spent"])
    assert row["paper_heuristic_eps_max"] == pytest.approx(2 * (2 / 3) * 0.01 * 0.5 / 0.1)


def test_clip_only_claims_no_guarantee() -> None:
    layer = _layer(mode="ldp-laplace", epsilon=math.inf, clip=0.5)
    layer.begin_round(1)
    gen = torch.Generator().manual_seed(0)
    sent = torch.randn((N, M, D), generator=gen)
    layer.release(sent, sent + 1.0, np.arange(N), None)
    log = layer.end_round(np.arange(N))
    summary = layer.summary()
    assert summary["guarantee"] is False
    assert summary["epsilon"]["reported"] is None and math.isinf(log["eps_spent"])


@pytest.mark.parametrize("mode, relation, trust", [
    ("none", "no guarantee", "sees every upload"),
    ("ldp-laplace", "replace-one", "local"),
    ("ldp-gaussian", "replace-one", "local"),
    ("paper", "not a DP guarantee", "local"),
    ("ldp-touched-rows", "INSECURE", "local"),
])
def test_every_run_states_its_neighbouring_relation_trust_model_and_amplification(
        tmp_path, mode, relation, trust):
    """summary.json and results.csv carry the mode's threat model (docs/design.md section 5)."""
    from fedem_private.experiments.results import collect
    from fedem_private.experiments.runner import execute
    from fedem_private.simulation.config import RunConfig, with_overrides

    over = {"data.dataset": "synthetic", "data.synthetic.n_users": 30,
            "data.synthetic.n_items": 40, "train.rounds": 1, "train.local_epochs": 1,
            "train.dim": 4, "privacy.mode": mode}
    if mode != "none":
        over.update({"privacy.epsilon": 8.0, "privacy.clip": 1.0})
    if mode == "paper":
        over = {k: v for k, v in over.items() if k not in ("privacy.epsilon", "privacy.clip")}
    if mode in ("ldp-gaussian",):
        over["privacy.delta"] = 1e-5
    summary = execute(with_overrides(RunConfig(), over), tmp_path / "run")
    p = summary["privacy"]
    assert relation in p["neighbouring"] and trust in p["trust_model"]
    assert p["amplification"].startswith("none")
    frame = collect(tmp_path)
    assert frame.loc[0, "neighbouring"] == p["neighbouring"]
    assert frame.loc[0, "trust_model"] == p["trust_model"]
