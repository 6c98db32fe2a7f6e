"""FedMerge (issue 16, docs/design.md section 12): K global tables merged per client on the server.

The server fit (12.2) against its plain per-client reference, K = 1 as uniform
averaging, weights on the simplex, a decreasing objective; whole rounds against
the one-client-at-a-time loop; partial participation, seeding, refusals, the
command line, recording and attacks.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedem_private.errors import UserError
from fedem_private.reference import round as reference
from fedem_private.reference.fedmerge import fit_reference
from fedem_private.server.aggregators import FedMergeAggregator, UniformAggregator
from fedem_private.server.fedmerge import (
    FitConfig,
    fit,
    initial_tables,
    logit_step,
    merged_tables,
    weight_entropy,
)
from fedem_private.simulation.config import (
    RunConfig,
    identity_dict,
    refuse_central,
    with_overrides,
)
from fedem_private.simulation.loop import Simulation


def _clustered(n: int = 12, m: int = 30, d: int = 4, clusters: int = 3, noise: float = 0.2,
               seed: int = 0) -> torch.Tensor:
    """Uploads (n, m, d) float64: client u is cluster u % clusters plus noise."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(clusters, m, d, generator=g, dtype=torch.float64)
    return torch.stack([base[u % clusters]
                        + noise * torch.randn(m, d, generator=g, dtype=torch.float64)
                        for u in range(n)])


def _start(uploads: torch.Tensor, k: int, seed: int = 0,
           logit_scale: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 100)
    q0 = 0.1 * torch.randn(uploads.shape[1:], generator=g, dtype=torch.float64)
    logits = logit_scale * torch.randn(uploads.shape[0], k, generator=g, dtype=torch.float64)
    return initial_tables(q0, k, seed), logits


# ------------------------------------------------------------------------ the server fit
@pytest.mark.parametrize("lr", [1.0])
def test_k1_fit_is_exactly_uniform_averaging(lr):
    uploads = _clustered(n=9, seed=1)
    tables, logits = _start(uploads, 1)
    for steps in (1, 5):
        res = fit(uploads, tables, logits, FitConfig(steps=steps, lr=lr))
        assert res.tables.shape == (1, 30, 4)
        assert (res.tables[0] - uploads.mean(dim=0)).abs().max() < 1e-12
        assert torch.equal(res.logits, logits)  # one table: the weight is 1, nothing to learn


def test_k1_aggregator_equals_the_uniform_aggregator_with_partial_participation():
    g = torch.Generator().manual_seed(4)
    n, m, d = 10, 25, 3
    q0 = 0.1 * torch.randn(m, d, generator=g)
    sizes = torch.arange(1, n + 1, dtype=torch.float64)
    fm = FedMergeAggregator(sizes, n, q0, k=1, fit_cfg=FitConfig(), seed=3)
    uni = UniformAggregator(sizes, n, q0)
    assert torch.equal(fm.sent(torch.arange(n)), uni.sent(torch.arange(n)))  # K=1: q0 itself
    for t in range(3):
        part = torch.zeros(n, dtype=torch.bool)
        part[torch.randperm(n, generator=g)[: 4 + 2 * t]] = True
        idx = part.nonzero().squeeze(1)
        uploads = torch.randn(idx.numel(), m, d, generator=g)
        for agg in (fm, uni):
            agg.begin_round(part)
            agg.add(idx[:2], uploads[:2])  # two chunks, as the loop adds them
            agg.add(idx[2:], uploads[2:])
            agg.end_round()
        everyone = torch.arange(n)
        assert (fm.sent(everyone) - uni.sent(everyone)).abs().max() < 1e-6
        assert fm.round_stats()["fedmerge_entropy"] == 0.0


def test_k1_run_equals_uniform_aggregation_end_to_end(small_split):
    a = Simulation(_cfg(**{"federation.aggregation": "fedmerge", "federation.merge_k": 1}),
                   small_split)
    b = Simulation(_cfg(**{"federation.aggregation": "uniform"}), small_split)
    for _ in range(3):
        a.step()
        b.step()
        assert (a.state.q_local - b.state.q_local).abs().max() < 1e-5
        assert (a.state.q_global - b.state.q_global[None]).abs().max() < 1e-5


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("lr", [1.0, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_fit_decreases_its_objective_and_keeps_weights_on_the_simplex(k, lr, seed):
    uploads = _clustered(seed=seed)
    tables, logits = _start(uploads, k, seed, logit_scale=0.5)
    res = fit(uploads, tables, logits, FitConfig(steps=8, lr=lr))
    obj = res.objective
    assert len(obj) == 2 * 8 + 1
    assert all(b <= a * (1 + 1e-12) for a, b in zip(obj, obj[1:], strict=False))
    assert obj[-1] < 0.5 * obj[0]
    w = torch.softmax(res.logits, dim=1)
    assert (w >= 0).all() and torch.allclose(w.sum(dim=1), torch.ones(12, dtype=w.dtype))
    # the reported objective is (12.2) computed afresh
    direct = float(((uploads - merged_tables(res.logits, res.tables)) ** 2).sum())
    assert obj[-1] == pytest.approx(direct, rel=1e-10)


def test_fit_personalises_on_clustered_uploads_over_rounds():
    """Three taste clusters, K = 3: warm-started fits give each cluster its own table."""
    uploads = _clustered(n=15, clusters=3, noise=0.1)
    tables, logits = _start(uploads, 3)
    k1 = float(((uploads - uploads.mean(0)) ** 2).sum())  # the K = 1 (averaging) objective
    for _ in range(30):
        res = fit(uploads, tables, logits, FitConfig())
        tables, logits = res.tables, res.logits
    assert res.objective[-1] < 0.25 * k1
    top = torch.softmax(logits, dim=1).argmax(dim=1)
    assert all(len(set(top[c::3].tolist())) == 1 for c in range(3))  # a cluster agrees
    assert len(set(top.tolist())) == 3  # and the clusters differ
    assert float(weight_entropy(logits).mean()) < math.log(3)


@pytest.mark.parametrize("k,chunk,lr,logit_scale", [(1, 128, 1.0, 0.0), (2, 5, 1.0, 0.0),
                                                    (4, 128, 1.0, 0.5), (4, 3, 0.5, 1.0),
                                                    (8, 7, 1.0, 0.3)])
def test_batched_fit_equals_the_per_client_reference(k, chunk, lr, logit_scale):
    uploads = _clustered(n=11, seed=k)
    tables, logits = _start(uploads, k, seed=k, logit_scale=logit_scale)
    cfg = FitConfig(steps=4, lr=lr)
    res = fit(uploads.float(), tables, logits, cfg, chunk=chunk)
    ref = fit_reference(uploads.float(), tables, logits, cfg)
    assert (res.tables - ref.tables).abs().max() < 1e-9
    assert (res.logits - ref.logits).abs().max() < 1e-8
    assert np.allclose(res.objective, ref.objective, rtol=1e-10, atol=0)
    if k > 1:  # the logits did move: the comparison is not between two no-ops
        assert (res.logits - logits).abs().max() > 1e-3


def test_initial_tables_are_seeded_centred_perturbations():
    q0 = 0.1 * torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    a, b, c = initial_tables(q0, 4, 7), initial_tables(q0, 4, 7), initial_tables(q0, 4, 8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a.mean(dim=0) - q0.double()).abs().max() < 1e-12  # uniform weights send q0
    spread = (a - q0.double()).std()
    assert 0.05 * float(q0.std()) < float(spread) < 0.2 * float(q0.std())
    assert torch.equal(initial_tables(q0, 1, 7)[0], q0.double())


# ---------------------------------------------------------------------- in the round loop


def _cfg(**over):
    base = {"train.rounds": 3, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "data.synthetic.n_users": 30,
            "federation.fedmerge_steps": 3}
    base.update(over)
    return with_overrides(RunConfig(), base)


@pytest.mark.parametrize("backbone,merge", [("mf", "sr"), ("mf", "em"), ("ncf", "sr"),
                                            ("pfedrec", "em"), ("gpfedrec", "sr")])
def test_round_equals_per_client_reference(small_split, float64, backbone, merge):
    """Two float64 rounds (merging active in round 2) vs the one-client-at-a-time loop."""
    sim = Simulation(_cfg(**{"federation.aggregation": "fedmerge", "federation.merge": merge,
                             "federation.backbone": backbone}), small_split)
    for _ in range(2):
        ref = reference.simulation_round(sim)
        stats = sim.step()
        assert (sim.state.q_local - ref["q_local"]).abs().max() < 1e-7
        assert (sim.state.q_global - ref["q_global"]).abs().max() < 1e-7
        assert (sim.aggregator.logits - ref["server"]["logits"]).abs().max() < 1e-7
        assert (sim.aggregator.tables - ref["server"]["tables"]).abs().max() < 1e-7
        ent = stats.server["fedmerge_entropy"]
        assert 0.0 <= ent <= math.log(4) + 1e-12
        assert stats.server["fedmerge_fit_mse"] > 0
    # personalised: every client is sent its own merged table
    sent = sim.aggregator.sent(torch.arange(3))
    assert (sent[0] - sent[1]).abs().max() > 0
    assert torch.equal(sim.aggregator.anchor(torch.arange(3)), sent)


def test_only_participants_logits_move(small_split):
    sim = Simulation(_cfg(**{"federation.method": "fedmerge", "train.client_fraction": 0.5}),
                     small_split)
    for t in range(1, 3):
        before = sim.aggregator.logits.clone()
        part = torch.from_numpy(sim.participants(t))
        sim.step()
        moved = (sim.aggregator.logits - before).abs().sum(dim=1) > 0
        assert moved[part].all()
        others = torch.ones(small_split.n_users, dtype=torch.bool)
        others[part] = False
        assert others.any() and not moved[others].any()
    w = sim.aggregator.weights
    assert torch.allclose(w.sum(dim=1), torch.ones(small_split.n_users, dtype=w.dtype))


def test_runs_are_reproducible_and_keyed_by_the_seed(small_split):
    def run(seed):
        sim = Simulation(_cfg(**{"federation.method": "fedmerge", "train.seed": seed}),
                         small_split)
        sim.step()
        sim.step()
        return sim.state.q_local.clone(), sim.aggregator.logits.clone()

    (qa, la), (qb, lb), (qc, _) = run(0), run(0), run(1)
    assert torch.equal(qa, qb) and torch.equal(la, lb)
    assert not torch.equal(qa, qc)


def test_ldp_laplace_and_the_other_backbones_run(small_split):
    sim = Simulation(_cfg(**{"federation.method": "fedmerge", "privacy.mode": "ldp-laplace",
                             "privacy.epsilon": 8.0, "privacy.clip": 50.0}), small_split)
    stats = sim.step()
    assert stats.privacy["eps_spent"] > 0 and torch.isfinite(sim.state.q_global).all()
    assert not sim.aggregator.aliased  # noisy uploads are copied, not the clients' tables
    for backbone in ("fedrap", "gpfedrec"):
        sim = Simulation(_cfg(**{"federation.backbone": backbone,
                                 "federation.aggregation": "fedmerge"}), small_split)
        sim.step()
        assert torch.isfinite(sim.state.q_global).all()


# ------------------------------------------------------------------- config and refusals
def test_preset_flags_and_identity_of_older_runs():
    fed = with_overrides(RunConfig(), {"federation.method": "fedmerge",
                                       "federation.merge": "em"}).resolved().federation
    assert (fed.backbone, fed.aggregation, fed.merge, fed.merge_k) == ("mf", "fedmerge", "em", 4)
    # defaults stay out of a run's identity (old digests hold); a set K enters it
    assert "merge_k" not in identity_dict(RunConfig().resolved())["federation"]
    cfg = with_overrides(RunConfig(), {"federation.merge_k": 8}).resolved()
    assert identity_dict(cfg)["federation"]["merge_k"] == 8
    from fedem_private.cli import build_parser, config_from_args

    args = build_parser().parse_args(["run", "--aggregation", "fedmerge", "--merge-k", "2",
                                      "--fedmerge-steps", "3", "--fedmerge-lr", "0.5"])
    fed = config_from_args(args).federation
    assert (fed.aggregation, fed.merge_k, fed.fedmerge_steps, fed.fedmerge_lr) == (
        "fedmerge", 2, 3, 0.5)


@pytest.mark.parametrize("over,needle", [
    ({"federation.merge_k": 0}, "--merge-k"),
    ({"federation.fedmerge_steps": 0}, "--fedmerge-steps"),
    ({"federation.fedmerge_lr": 1.5}, "--fedmerge-lr"),
])
def test_bad_values_are_refused(over, needle):
    with pytest.raises(UserError, match=needle):
        with_overrides(RunConfig(), {"federation.method": "fedmerge", **over}).validate()


def test_central_mechanisms_are_refused_in_one_line():
    """Each-upload aggregations refuse a central mode (cdp-gaussian) in one line."""
    refuse_central("fedmerge", "ldp-gaussian")  # a local mode: nothing to refuse
    with pytest.raises(UserError) as exc:
        refuse_central("fedmerge", "cdp-gaussian")
    text = str(exc.value)
    assert "\n" not in text and "needs each client's upload" in text and "fedmerge" in text
    refuse_central("fedavg", "cdp-gaussian")  # sums are fine


def test_refused_combination_on_the_command_line_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedem_private", "run", "--method", "fedmerge",
                           "--merge-k", "0", "--rounds", "1", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--merge-k" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("merge", ["sr", "em"])
def test_command_line_run_writes_the_weight_entropy(tmp_path, merge):
    from fedem_private.cli import main

    toml = tmp_path / "c.toml"
    toml.write_text("[data.synthetic]\nn_users = 40\nn_items = 60\nmean_activity = 8\n")
    out = tmp_path / "run"
    assert main(["run", "--config", str(toml), "--out", str(out), "--method", "fedmerge",
                 "--merge", merge, "--merge-k", "3", "--rounds", "3", "--local-epochs", "1",
                 "--dim", "4", "--no-progress"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    ent = [float(r["fedmerge_entropy"]) for r in rows]
    assert all(0.0 <= e <= math.log(3) + 1e-9 for e in ent)
    assert ent[-1] < math.log(3) - 1e-6  # the weights left uniform
    summary = json.loads((out / "summary.json").read_text())
    assert summary["aggregation"] == "fedmerge" and summary["merge"] == merge
    assert summary["server_stats"]["fedmerge_entropy"] == pytest.approx(ent[-1])
    assert 0.0 <= summary["metrics"]["sampled"]["hr@10"] <= 1.0
    if merge == "em":
        assert 0.0 <= float(rows[2]["rho_mean"]) <= 1.0


def test_recording_and_attacks_run_on_its_uploads(tmp_path):
    from recorded_runs import recorded_run

    from attacks.run import run_attacks

    run = recorded_run(tmp_path / "fm", rounds="1,last", clients=40,
                       federation__method="fedmerge", federation__merge="em")
    report = run_attacks(run, ["projection", "support", "imia"], write=False)
    by_name = {r["attack"]: r for r in report["records"]}
    for name in ("projection", "support"):
        auc = by_name[name]["relations"]["positive_vs_sampled"]["auc"]
        assert auc is not None and 0.0 <= auc <= 1.0
    assert by_name["imia"]["relations"]


def test_logit_step_backtracks_when_a_full_step_would_overshoot():
    """Client terms with an interior optimum (U between the tables) and a step far beyond
    1/L: the full step lands past the optimum and raises the term; the halved one must not."""
    g = torch.Generator().manual_seed(0)
    tables = torch.randn(2, 20, 3, generator=g, dtype=torch.float64)
    uploads = torch.stack([0.5 * tables[0] + 0.5 * tables[1], 0.7 * tables[0] + 0.3 * tables[1]])
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=torch.float64)

    def terms(a):
        return ((uploads - merged_tables(a, tables)) ** 2).sum(dim=(1, 2))

    res = uploads - merged_tables(logits, tables)
    gr = torch.einsum("kmd,umd->uk", tables, res)
    flat = tables.reshape(2, -1)
    gram = flat @ flat.T
    rate = 500.0 / float(torch.linalg.eigvalsh(2 * gram)[-1])
    w = torch.softmax(logits, dim=1)
    grad_a = w * (-2 * gr - (w * -2 * gr).sum(dim=1, keepdim=True))
    assert (terms(logits - rate * grad_a) > terms(logits)).all()  # the full step overshoots
    out = logit_step(logits, gr, gram, rate)
    assert (terms(out) < terms(logits)).all()  # halved until it helps
    # and the step direction is the autograd gradient of each client's term
    a = logits.clone().requires_grad_(True)
    terms(a).sum().backward()
    assert torch.allclose(a.grad, grad_a, atol=1e-10)
