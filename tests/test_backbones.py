"""Backbones as parts (docs/design.md sections 9-10): each vectorised path against its per-client
reference, with and without elastic merging; composition refusals; the codec round trip."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from fedem_private import models
from fedem_private.client.codecs import FullCodec
from fedem_private.data.split import exclusion_csr
from fedem_private.errors import UserError
from fedem_private.models.base import (
    ClientParams,
    LocalTrainConfig,
    draw_samples,
)
from fedem_private.reference import round as reference
from fedem_private.reference.models import reference_train_client
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.simulation.loop import Simulation

BACKBONES = ("mf", "ncf", "pfedrec", "gpfedrec", "fedrap")


def _cfg(**over):
    base = {"train.rounds": 3, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "data.synthetic.n_users": 30}
    base.update(over)
    return with_overrides(RunConfig(), base)


def _max_diff(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).abs().max().item() for k in a), default=0.0)


@pytest.mark.parametrize("backbone", BACKBONES)
def test_local_training_equals_reference(small_split, sorted_chunk, backbone):
    """One chunk, every client trained at once vs one at a time with torch.optim.Adam."""
    sp = small_split
    cfg = LocalTrainConfig(epochs=2, batch_size=32, lr=0.1)
    order, samples = sorted_chunk(cfg)
    bb = models.build(backbone, sp.n_items, 8, seed=0, init_std=0.1)
    k = len(order)
    q0 = bb.init_items().expand(k, -1, -1).clone()
    dense = {n: v.expand(k, *v.shape).clone() for n, v in bb.init_dense().items()}
    start = ClientParams(q0, dense, bb.init_private(order))
    new, touched = bb.train_chunk(start, order, samples, cfg, 1)
    for j, c in enumerate(order.tolist()):
        one = ClientParams(q0[j:j + 1], {n: v[j:j + 1] for n, v in dense.items()},
                           {n: v[j:j + 1] for n, v in start.private.items()})
        items, labels = samples.of(j)
        ref = reference_train_client(bb, one, items, labels, cfg, 1, c)
        assert (new.items[j] - ref.items[0]).abs().max() < 1e-4
        assert _max_diff({n: v[j] for n, v in new.private.items()},
                         {n: v[0] for n, v in ref.private.items()}) < 1e-4
        assert _max_diff({n: v[j] for n, v in new.dense.items()},
                         {n: v[0] for n, v in ref.dense.items()}) < 1e-4
    moved = (new.items - q0).abs().sum(-1) > 0
    assert moved.any() and not (moved & ~touched).any()  # only trained rows move
    if dense:  # the shared MLP moved, and differently per client
        w = new.dense["w0"]
        assert (w - dense["w0"]).abs().max() > 0 and (w[0] - w[1]).abs().max() > 0


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request):
    """Run a test's tensors in float32 and in float64 (torch's default dtype, restored)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(request.param)
    yield request.param
    torch.set_default_dtype(old)


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("method,merge", [("fedmf", "sr"), ("fedem", "em"), ("fedsim", "dm"),
                                          ("gpfedrec", "sr"), ("gpfedrec", "em")])
def test_round_equals_per_client_reference(small_split, backbone, method, merge, dtype):
    """Whole rounds against the one-client-at-a-time loop.

    float32: round 1, < 1e-4 (the bar of the issue). float64: rounds 1 and 2
    (merging active in round 2), < 1e-7 (cvxpy's solver tolerance in the similarity
    weights leaves ~3e-9 in Q_g). Over several rounds float32 is not a
    fair test: where a gradient is ~0 (a dead ReLU unit of a private MLP),
    Adam's m / sqrt(v) turns rounding noise into O(lr) steps, so the two
    float32 paths drift apart by ~1e-4 while agreeing to 1e-13 in float64.
    """
    tol, rounds = (1e-4, 1) if dtype == torch.float32 else (1e-7, 2)
    sim = Simulation(_cfg(**{"federation.method": method, "federation.merge": merge,
                             "federation.backbone": backbone}), small_split)
    for _ in range(rounds):
        ref = reference.simulation_round(sim)
        stats = sim.step()
        assert sim.state.q_local.dtype == dtype
        assert (sim.state.q_local - ref["q_local"]).abs().max() < tol
        assert _max_diff(sim.state.private, ref["private"]) < tol
        assert _max_diff(sim.state.dense_local, ref["dense"]) < tol
        # cvxpy's QP solution in the reference (tolerances 1e-11) leaves up to ~2e-7 in
        # Q_g on some draws (seen in round 2 of fedsim-dm-ncf); Q_l agrees to 1e-13
        qg_tol = tol if dtype == torch.float32 else 1e-6
        assert (sim.state.q_global - ref["q_global"]).abs().max() < qg_tol
        if ref["dense_global"] is not None:
            assert _max_diff(sim.dense.params, ref["dense_global"]) < tol
        if ref["rho_mean"] is None:
            assert stats.merge == {}
        else:
            assert stats.merge["rho_mean"] == pytest.approx(ref["rho_mean"], abs=tol)


@pytest.mark.parametrize("backbone", ("ncf", "pfedrec", "gpfedrec", "fedrap"))
def test_backbone_learns_and_evaluates_its_own_model(small_split, backbone):
    sim = Simulation(_cfg(**{"federation.backbone": backbone, "train.rounds": 4}), small_split)
    first = sim.step()
    assert first.metrics is None
    sim.run()
    metrics = sim.evaluate()
    assert 0.0 <= metrics["sampled"]["hr@10"] <= 1.0
    scores = sim.backbone.scores(sim.state.params(torch.arange(3)))
    assert scores.shape == (3, small_split.n_items) and torch.isfinite(scores).all()
    # each client is scored with its own model: two clients' scores differ
    assert (scores[0] - scores[1]).abs().max() > 0


def test_presets_and_composition_resolve():
    fed = with_overrides(RunConfig(), {"federation.backbone": "pfedrec",
                                       "federation.merge": "em"}).resolved().federation
    assert (fed.method, fed.backbone, fed.aggregation, fed.merge, fed.codec) == (
        "pfedrec", "pfedrec", "fedavg", "em", "full")
    fed = with_overrides(RunConfig(), {"federation.method": "fedncf"}).resolved().federation
    assert (fed.backbone, fed.aggregation, fed.merge) == ("ncf", "fedavg", "sr")
    fed = RunConfig().resolved().federation
    assert (fed.method, fed.backbone) == ("fedmf", "mf")


@pytest.mark.parametrize("over,needle", [
    ({"federation.method": "local", "federation.merge": "em"}, "aggregation 'none'"),
    ({"federation.method": "local", "privacy.mode": "ldp-laplace", "privacy.epsilon": 1.0},
     "uploads nothing"),
    ({"federation.codec": "zip"}, "unknown codec"),
    ({"federation.codec": "lora", "federation.method": "gpfedrec"}, "backbone 'gpfedrec'"),
    ({"federation.backbone": "gru"}, "unknown backbone"),
])
def test_refused_combinations(over, needle):
    with pytest.raises(UserError, match=needle):
        with_overrides(RunConfig(), over).validate()


@pytest.mark.parametrize("args,needle", [
    (["--method", "local", "--merge", "em"], "aggregation 'none'"),
    (["--backbone", "gru"], "unknown backbone"),
    (["--codec", "zip"], "unknown codec"),
    (["--codec", "hash", "--method", "fedem"], "aggregation 'similarity'"),
])
def test_refused_combinations_on_the_command_line(tmp_path, args, needle):
    proc = subprocess.run([sys.executable, "-m", "fedem_private", "run", "--rounds", "1",
                           "--out", str(tmp_path / "r"), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_full_codec_round_trip_and_privacy_covers_dense_groups(small_split):
    g = torch.Generator().manual_seed(0)
    shapes = {"w0": (16, 32), "b0": (32,), "w1": (32, 1), "b1": (1,)}
    codec = FullCodec(50, 8, shapes)
    items = torch.randn(3, 50, 8, generator=g)
    dense = {n: torch.randn(3, *s, generator=g) for n, s in shapes.items()}
    enc = codec.encode(items, dense)
    assert enc.shape == (3, codec.rows, 8) and codec.rows > 50
    back_items, back_dense = codec.decode(enc)
    assert torch.equal(back_items, items)
    assert all(torch.equal(back_dense[n], dense[n]) for n in shapes)
    assert codec.upload_bytes() == 4 * (50 * 8 + 16 * 32 + 32 + 32 + 1)
    assert FullCodec(50, 8, {}).encode(items, {}) is items  # no dense groups: no copy
    # under LDP the MLP is noised with the table: the dense global is not the clean average
    sim = Simulation(_cfg(**{"federation.backbone": "ncf", "privacy.mode": "ldp-laplace",
                             "privacy.epsilon": 1.0, "privacy.clip": 1.0}), small_split)
    clean = Simulation(_cfg(**{"federation.backbone": "ncf"}), small_split)
    sim.step()
    clean.step()
    assert (sim.dense.params["w0"] - clean.dense.params["w0"]).abs().max() > 1e-2


PRIVACY_MODES = [
    {"privacy.mode": "ldp-laplace", "privacy.epsilon": 8.0, "privacy.clip": 50.0},
    {"privacy.mode": "ldp-gaussian", "privacy.epsilon": 8.0, "privacy.delta": 1e-5,
     "privacy.clip": 5.0},
    {"privacy.mode": "paper", "privacy.paper_clip": 0.5, "privacy.paper_lambda": 0.01},
    {"privacy.mode": "ldp-touched-rows", "privacy.epsilon": 8.0, "privacy.clip": 50.0},
]


@pytest.mark.parametrize("backbone", ("ncf", "pfedrec", "gpfedrec", "fedrap"))
@pytest.mark.parametrize("privacy", PRIVACY_MODES, ids=lambda p: p["privacy.mode"])
def test_every_privacy_mode_runs_with_the_new_backbones(small_split, backbone, privacy):
    sim = Simulation(_cfg(**{"federation.backbone": backbone, **privacy}), small_split)
    stats = sim.step()
    assert stats.privacy["eps_spent"] > 0
    assert torch.isfinite(sim.state.q_global).all()
    if privacy["privacy.mode"] == "ldp-laplace":  # every row of the upload moves
        assert (sim.state.q_global - sim.backbone.init_items()).abs().min() > 0


@pytest.mark.parametrize("backbone,dot", [("mf", True), ("ncf", False), ("pfedrec", True),
                                          ("gpfedrec", False), ("fedrap", True)])
def test_attacks_run_on_every_backbone_and_projection_says_when_it_assumes(tmp_path, backbone,
                                                                          dot):
    from recorded_runs import recorded_run

    from attacks.run import format_table, run_attacks
    from fedem_private.experiments.shadow import shadow_model

    run = recorded_run(tmp_path / backbone, rounds="last", clients=40,
                       federation__backbone=backbone)
    report = run_attacks(run, ["projection", "support", "imia"], write=False,
                         shadow=shadow_model)
    by_name = {r["attack"]: r for r in report["records"]}
    assert by_name["projection"]["relations"]["positive_vs_sampled"]["auc"] is not None
    assert "assumption" not in by_name["support"]
    # imia retrains the backbone's own client, but GPFedRec's registration asks for the MF
    # shadow (measured stronger there), and its record says so
    imia_note = by_name["imia"].get("assumption")
    assert (imia_note is None) == (backbone != "gpfedrec")
    if imia_note is not None:
        assert "retrains an MF client" in imia_note
    note = by_name["projection"].get("assumption")
    if dot:
        assert note is None
    else:
        assert "not score by a dot product" in note and backbone in note
        assert f"note: backbone '{backbone}'" in format_table(report)


@pytest.mark.parametrize("threshold,topk,layers", [(1.0, 0, 1), (1.0, 0, 2), (0.5, 0, 1),
                                                  (1e6, 0, 1), (1.0, 3, 1), (1.0, 5, 2)])
def test_graph_aggregator_equals_per_pair_reference(threshold, topk, layers):
    from fedem_private.reference.graph import graph_reference
    from fedem_private.server.graph import graph_tables

    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 20, 6, generator=g)  # four taste clusters of users
    tables = torch.cat([base[i % 4] + 0.3 * torch.randn(20, 6, generator=g)[None]
                        for i in range(12)])
    personal, glob = graph_tables(tables, threshold=threshold, topk=topk, layers=layers)
    ref_personal, ref_glob = graph_reference(tables, threshold=threshold, topk=topk,
                                             layers=layers)
    assert (personal.double() - ref_personal).abs().max() < 1e-5
    assert (glob.double() - ref_glob).abs().max() < 1e-5
    if threshold == 1e6:  # nobody above the threshold: every user keeps its own table
        assert torch.allclose(personal, tables)
    if topk == 3 and layers == 1:  # each table is the mean of 3 tables of its own cluster
        cluster_means = [tables[i::4].mean(0) for i in range(4)]
        assert all(torch.allclose(personal[u], cluster_means[u % 4], atol=1e-5)
                   for u in range(12))


def test_gpfedrec_and_fedrap_presets_and_what_they_share(small_split):
    fed = with_overrides(RunConfig(), {"federation.method": "gpfedrec"}).resolved().federation
    assert (fed.backbone, fed.aggregation, fed.merge) == ("gpfedrec", "graph", "sr")
    fed = with_overrides(RunConfig(), {"federation.backbone": "fedrap",
                                       "federation.merge": "em"}).resolved().federation
    assert (fed.method, fed.aggregation, fed.merge) == ("fedrap", "uniform", "em")
    sim = Simulation(_cfg(**{"federation.method": "fedrap"}), small_split)
    assert sim.dense is None and set(sim.state.private) == {"personal", "w", "b"}
    personal0 = sim.state.private["personal"].clone()
    sim.step()
    assert (sim.state.private["personal"] - personal0).abs().max() > 0  # trained, kept home
    sim = Simulation(_cfg(**{"federation.method": "gpfedrec"}), small_split)
    assert sim.dense is None and {"p", "w0"} <= set(sim.state.private)  # the MLP is private
    sim.step()  # round 1: start = anchor = the initial table, so only trained rows move
    sent = sim.aggregator.sent(torch.arange(small_split.n_users))
    sim.step()
    # from round 2 the start (the global mean) differs from the anchor (the personalised
    # table), and the regulariser between them moves every row of every upload
    moved = (sim.state.q_local - sent).abs().sum(-1) > 0
    assert moved.all()
    assert (sim.aggregator.anchor(torch.arange(2)) - sim.state.q_global).abs().max() > 0


def test_report_says_when_an_attack_does_not_model_the_backbone(tmp_path):
    from recorded_runs import recorded_run

    from attacks.run import run_attacks
    from fedem_private.experiments.report import write_report

    for backbone in ("mf", "ncf"):
        run = recorded_run(tmp_path / "runs" / backbone, rounds="last", clients=20,
                           federation__backbone=backbone, train__seed=0)
        run_attacks(run, ["projection"])
    write_report([str(tmp_path / "runs" / "mf")], str(tmp_path / "mf-only"))
    assert "heuristic on backbone" not in (tmp_path / "mf-only" / "report.md").read_text()
    write_report([str(tmp_path / "runs")], str(tmp_path / "both"))
    text = (tmp_path / "both" / "report.md").read_text()
    assert "**`projection` is a heuristic on backbone ncf**" in text


@pytest.mark.parametrize("backbone", ("ncf", "gpfedrec", "fedrap"))
def test_partial_participation_and_clip_auto_on_the_new_backbones(small_split, backbone):
    """Half the clients per round, Laplace LDP with the clip from the DP warm-up."""
    method = {"gpfedrec": "gpfedrec"}.get(backbone)
    over = {"federation.backbone": backbone, "train.client_fraction": 0.5,
            "privacy.mode": "ldp-laplace", "privacy.epsilon": 8.0, "privacy.clip_auto": True}
    if method:
        over["federation.method"] = method
    sim = Simulation(_cfg(**over), small_split)
    assert sim.privacy.params.clip is not None and sim.privacy.params.clip > 0
    before = sim.state.q_local.clone()
    stats = sim.step()
    assert stats.participants == 15
    moved = (sim.state.q_local - before).abs().sum(dim=(1, 2)) > 0
    assert moved.sum() == 15  # only the round's participants trained
    assert torch.isfinite(sim.state.q_global).all()
    assert stats.privacy["eps_spent"] <= 8.0 + 1e-6


# ---------------------------------------------------------------- fast paths of the plan


def test_chunk_epoch_orders_are_each_clients_epoch_orders(small_split):
    """ClientSamples.order_grid draws a chunk's orders in one call; the adapter's extra
    epochs (first_epoch E) and the training epochs (0 .. E - 1) are epoch_orders' own."""
    from fedem_private.models.base import epoch_orders

    sp = small_split
    ex_ptr, ex_items = exclusion_csr(sp, "paper")
    clients = np.arange(6)
    samples = draw_samples(3, 2, clients, sp.train_indptr, sp.train_items, ex_ptr, ex_items,
                           sp.n_items, 4)
    train = samples.order_grid(3, 2, clients, 0, 3)
    adapter = samples.order_grid(3, 2, clients, 3, 2)
    for j, c in enumerate(clients.tolist()):
        n = int(samples.indptr[j + 1] - samples.indptr[j])
        assert np.array_equal(train[j, :, :n], epoch_orders(3, 2, c, n, 3))
        assert np.array_equal(adapter[j, :, :n], epoch_orders(3, 2, c, n, 5)[3:])
        assert np.array_equal(adapter[j, :, :n], epoch_orders(3, 2, c, n, 2, first_epoch=3))
    # a different round draws different orders
    other = draw_samples(3, 3, clients, sp.train_indptr, sp.train_items, ex_ptr, ex_items,
                         sp.n_items, 4)
    assert not np.array_equal(other.order_grid(3, 3, clients, 0, 2), train[:, :2])


def _samples_one_by_one(seed, round_, clients, sp, ex_ptr, ex_items, negatives):
    """The slow, obvious reference of draw_samples: each client alone, its positives then
    its keyed negatives (sample_excluding with rng.uniform at counters 0 .. n - 1)."""
    from fedem_private import rng
    from fedem_private.data.negatives import sample_excluding

    items, labels = [], []
    for c in clients.tolist():
        pos = sp.train_items[sp.train_indptr[c]: sp.train_indptr[c + 1]]
        n = pos.shape[0] * negatives
        u = rng.uniform(rng.key(seed, rng.Stream.NEGATIVES, round_, c), np.arange(n))
        neg = sample_excluding(ex_ptr, ex_items, sp.n_items, np.full(n, c), u)
        items.append(np.concatenate([pos, neg]))
        labels.append(np.concatenate([np.ones(pos.shape[0]), np.zeros(n)]))
    return np.concatenate(items), np.concatenate(labels)


@pytest.mark.parametrize("negatives", [0, 1, 4])
def test_draw_samples_lays_out_each_clients_positives_then_negatives(small_split, negatives):
    sp = small_split
    ex_ptr, ex_items = exclusion_csr(sp, "strict")
    clients = np.array([5, 0, 17, 3, sp.n_users - 1])
    got = draw_samples(2, 7, clients, sp.train_indptr, sp.train_items, ex_ptr, ex_items,
                       sp.n_items, negatives)
    items, labels = _samples_one_by_one(2, 7, clients, sp, ex_ptr, ex_items, negatives)
    assert np.array_equal(got.items, items) and np.array_equal(got.labels, labels)
    assert got.items.dtype == np.int64 and got.labels.dtype == np.float32
    assert np.array_equal(got.negatives, items[labels == 0])


def test_negatives_as_tensor_operations_are_the_numpy_draw(small_split):
    """negatives_t (the GPU's path) run on the CPU gives draw_samples' numpy negatives bit
    for bit, for a chunk in any order and with a client twice."""
    from fedem_private.models.base import negatives_t

    sp = small_split
    ex_ptr, ex_items = exclusion_csr(sp, "paper")
    clients = np.array([9, 2, 2, sp.n_users - 1, 1, 0])
    want = draw_samples(4, 3, clients, sp.train_indptr, sp.train_items, ex_ptr, ex_items,
                        sp.n_items, 4).negatives
    nneg = 4 * (sp.train_indptr[clients + 1] - sp.train_indptr[clients])
    got = negatives_t(4, 3, clients, nneg, ex_ptr, ex_items, sp.n_items, torch.device("cpu"))
    assert got.dtype == torch.int64 and np.array_equal(got.numpy(), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_negatives_drawn_on_the_gpu_are_the_cpu_draw(small_split):
    sp = small_split
    ex_ptr, ex_items = exclusion_csr(sp, "strict")
    clients = np.arange(sp.n_users)
    args = (sp.train_indptr, sp.train_items, ex_ptr, ex_items, sp.n_items, 4)
    cpu = draw_samples(1, 2, clients, *args)
    gpu = draw_samples(1, 2, clients, *args, device=torch.device("cuda"))
    assert np.array_equal(cpu.items, gpu.items) and np.array_equal(cpu.labels, gpu.labels)


def test_full_table_plan_skips_the_gather_but_gives_the_same_tables(small_split):
    """With every row trained (make_plan's n_items), Compact.of copies the table and
    scatter returns it; the result equals the gather/scatter path's."""
    from fedem_private.models.base import Compact, make_plan

    sp = small_split
    ex_ptr, ex_items = exclusion_csr(sp, "paper")
    cfg = LocalTrainConfig(epochs=2, batch_size=16)
    counts = np.diff(sp.train_indptr)
    clients = np.argsort(-counts, kind="stable")[:5]
    samples = draw_samples(0, 1, clients, sp.train_indptr, sp.train_items, ex_ptr, ex_items,
                           sp.n_items, 4)
    plan = make_plan(0, 1, clients, samples, cfg, torch.float32, n_items=sp.n_items)
    q = torch.randn(5, sp.n_items, 4)
    q_before = q.clone()
    compact = Compact.of(q, plan)
    assert compact.table.data_ptr() != q.data_ptr() and torch.equal(compact.table, q)
    compact.table.add_(1.0)  # "training"
    out, touched = compact.scatter(q)
    assert torch.equal(out, q + 1.0) and bool(touched.all())
    assert torch.equal(q, q_before)  # the start table was not written
    # the general path on the same rows gives the same result
    gathered = torch.gather(q, 1, compact.gather[:, :, None].expand(5, sp.n_items, 4))
    assert torch.equal(gathered, q)


def test_cosine_gram_by_upper_blocks_is_symmetric_and_exact():
    from fedem_private.server import graph

    gen = torch.Generator().manual_seed(0)
    tables = torch.randn(300, 7, 3, generator=gen)  # more than one CHUNK of rows
    sim = graph.cosine_similarity_matrix(tables)
    assert torch.allclose(sim, sim.T, atol=1e-15, rtol=0)
    flat = tables.reshape(300, -1).double()
    ref = (flat @ flat.T) / (flat.norm(dim=1)[:, None] * flat.norm(dim=1)[None, :])
    assert torch.allclose(sim, ref, atol=1e-12, rtol=0)
