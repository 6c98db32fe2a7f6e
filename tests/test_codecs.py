"""FedPEFT's codecs (docs/design.md section 11): training theta through the item rows against the
decode-then-full-table reference, E0 frozen, round trips, bytes, privacy over theta."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private import models
from fedem_private.client import codecs
from fedem_private.client.codecs import PeftCodec, PeftConfig, hash_codes, residual_kmeans
from fedem_private.data.split import exclusion_csr
from fedem_private.errors import UserError
from fedem_private.models.base import (
    ClientParams,
    LocalTrainConfig,
    draw_samples,
    mlp_forward,
    num_steps,
)
from fedem_private.reference import codecs as reference_codecs
from fedem_private.reference.models import reference_logits
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.simulation.loop import Simulation

SMALL = PeftConfig(warmup=1, lora_rank=3, hash_size=16, hash_functions=2, rq_levels=2,
                   rq_codebook=8)
SMALL_FLAGS = {"federation.lora_rank": 3, "federation.hash_size": 16,
               "federation.hash_functions": 2, "federation.rq_levels": 2,
               "federation.rq_codebook": 8, "federation.peft_warmup": 1}


def _cfg(**over):
    base = {"train.rounds": 3, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "data.synthetic.n_users": 30,
            **SMALL_FLAGS}
    base.update(over)
    return with_overrides(RunConfig(), base)


def _logits_fn(bb, private_names, dense_names):
    """One client's logits from plain tensors (differentiable in all of them)."""
    if bb.name == "ncf":
        def fn(ps, rows, items):
            x = torch.cat([ps["p"].expand(rows.shape[0], -1), rows], dim=1)[None]
            return mlp_forward({n: ps[n][None] for n in dense_names}, x, len(bb.shapes))[0]
        return fn

    def fn(ps, rows, items):
        params = ClientParams(rows, {}, {n: ps[n][None] for n in private_names})
        return reference_logits(bb, params, rows, items)
    return fn


GROUPS = {"mf": [("p", "theta")], "pfedrec": [("w", "b"), ("theta",)],
          "ncf": [("p", "w0", "b0", "w1", "b1", "w2", "b2", "w3", "b3", "theta")]}


@pytest.mark.parametrize("backbone", ["mf", "pfedrec", "ncf"])
@pytest.mark.parametrize("name", ["lora", "hash", "rqvae", "c-lora", "hash+senet",
                                  "c-hash+senet"])
@pytest.mark.parametrize("merged", [False, True], ids=["base-e0", "base-merged"])
def test_peft_training_equals_decode_then_full_table_reference(small_split, float64, backbone,
                                                               name, merged):
    """A chunk trained through PeftRows vs one client at a time, whole table decoded
    (``+senet``: the hash codec with its SENet, whose weights autograd differentiates
    in the reference, through the whole decoded table)."""
    name, senet = name.removesuffix("+senet"), name.endswith("+senet")
    peft = PeftConfig(**{**SMALL.__dict__, "hash_senet": 2 if senet else 0})
    sp = small_split
    cfg = LocalTrainConfig(epochs=2, batch_size=32, lr=0.05, grad_clip=0.5 if merged else None)
    excl = exclusion_csr(sp, "strict")
    clients = np.arange(12)
    s = draw_samples(0, 1, clients, sp.train_indptr, sp.train_items, *excl, sp.n_items, 4)
    order = clients[np.argsort(-num_steps(np.diff(s.indptr), cfg), kind="stable")]
    samples = draw_samples(0, 1, order, sp.train_indptr, sp.train_items, *excl, sp.n_items, 4)
    bb = models.build(backbone, sp.n_items, 8, seed=0, init_std=0.1)
    codec = codecs.build(name, sp.n_items, 8, {n: tuple(v.shape) for n, v in
                                               bb.init_dense().items()}, peft)
    assert isinstance(codec, PeftCodec) and codec.senet == senet
    e0 = torch.randn(sp.n_items, 8, generator=torch.Generator().manual_seed(1)) * 0.1
    theta0 = codec.prepare(e0, 0, 0.1)
    if senet:  # weights far from uniform, so that the SENet's gradients matter
        assert set(theta0) == {"H", "W1", "W2"}
        theta0["W1"], theta0["W2"] = theta0["W1"] * 10, theta0["W2"] * 10
    if "B" in theta0:  # a started LoRA, so that both A and B get gradients
        theta0["B"] = torch.randn(theta0["B"].shape) * 0.1
    k = len(order)
    theta = {n: v.expand(k, *v.shape).clone() for n, v in theta0.items()}
    q_start = codec.table(theta)
    if merged:  # a merge's per-client offset, kept in the client's frozen base
        q_start = q_start + 0.05 * torch.randn(q_start.shape)
    dense = {n: v.expand(k, *v.shape).clone() for n, v in bb.init_dense().items()}
    start = ClientParams(q_start, dense, bb.init_private(order))
    rows = codec.trainer(theta, base=None if merged else codec.e0)
    new, touched = bb.train_chunk(start, order, samples, cfg, 1, rows=rows)
    fn = _logits_fn(bb, list(start.private), list(dense))
    for j, c in enumerate(order.tolist()):
        base = q_start[j] - codec.delta({n: v[j:j + 1] for n, v in theta.items()})[0]
        if not merged:
            base = codec.e0
        params = {**{n: v[j] for n, v in start.private.items()},
                  **{n: v[j] for n, v in dense.items()}}
        items, labels = samples.of(j)
        ref_params, ref_theta = reference_codecs.reference_train_client(
            codec, fn, params, {n: v[j] for n, v in theta.items()}, base, items, labels, cfg,
            0, 1, c, GROUPS[backbone])
        for n, v in ref_theta.items():
            assert (rows.theta[n][j] - v).abs().max() < 1e-9, n
        for n, v in ref_params.items():
            got = new.private[n][j] if n in new.private else new.dense[n][j]
            assert (got - v).abs().max() < 1e-9, n
        table = base + codec.delta({n: v[None] for n, v in ref_theta.items()})[0]
        assert (new.items[j] - table).abs().max() < 1e-9
    moved = {n: (rows.theta[n] - theta[n]).abs().max() for n in theta}
    assert all(v > 0 for v in moved.values()), moved
    assert touched.any()


def test_e0_is_frozen_and_clients_differ_from_it_by_the_codec_alone(small_split):
    """After the warm-up E0 never changes, and a LoRA client's table minus E0 has rank
    <= k_L (a table trained in full would have full rank)."""
    sim = Simulation(_cfg(**{"federation.codec": "lora", "train.rounds": 4}), small_split)
    sim.step()  # the warm-up round: a full-table round
    assert sim.codec.e0 is None
    warm = sim.aggregator.table.clone()
    sim.step()
    e0 = sim.codec.e0.clone()
    assert torch.equal(e0, warm)
    for _ in range(2):
        sim.step()
        assert torch.equal(sim.codec.e0, e0)
    theta = {n: v[None] for n, v in sim.codec_server.params.items()}
    assert torch.allclose(sim.aggregator.table, sim.codec.table(theta)[0], atol=1e-6)
    for u in range(5):
        diff = (sim.state.q_local[u] - e0).double()
        assert diff.abs().max() > 0
        assert int(torch.linalg.matrix_rank(diff, atol=1e-5)) <= 3
    full = Simulation(_cfg(**{"train.rounds": 4}), small_split)
    full.run()
    diff = (full.state.q_local[0] - warm).double()
    assert int(torch.linalg.matrix_rank(diff, atol=1e-5)) > 3  # the test can fail


@pytest.mark.parametrize("name", ["full", "lora", "hash", "rqvae", "c-rqvae"])
@pytest.mark.parametrize("backbone", ["mf", "ncf"])
def test_bytes_counted_are_the_tensors_sizes(small_split, name, backbone):
    sim = Simulation(_cfg(**{"federation.codec": name, "federation.backbone": backbone}),
                     small_split)
    m, d, n = small_split.n_items, 8, small_split.n_users
    dense = sum(v.numel() for v in sim.backbone.init_dense().values())
    full = 4 * (m * d + dense)
    history = sim.run()
    sizes = {"full": m * d, "lora": (m + d) * 3, "hash": 16 * d, "rqvae": 2 * 8 * d,
             "c-rqvae": 2 * 8 * d}
    for h in history:
        peft = name != "full" and h.round > 1
        expect = 4 * (sizes[name] + dense) if peft else full
        assert h.comm["bytes_up"] == expect and h.comm["bytes_down"] == expect
        setup = 0
        if name != "full" and h.round == 2:  # E0 (P- codecs), codes, to every client
            setup = n * ((4 * m * d if not name.startswith("c-") else 0)
                         + (m * 2 if "rqvae" in name else 0)  # l = 2 one-byte codes
                         + (2 * 2 * 8 if "hash" in name else 0))  # h = 2 (a, b) int64
        assert h.comm["bytes_setup"] == setup
    if name != "full":
        assert history[-1].comm["bytes_up"] < full  # here d_H, l d_R < m


@pytest.mark.parametrize("name", ["lora", "hash", "rqvae"])
def test_encode_decode_round_trip_and_the_server_decodes_to_tables(small_split, name):
    sim = Simulation(_cfg(**{"federation.codec": name, "federation.backbone": "ncf"}),
                     small_split)
    seen = []
    sim.observers.append(seen.append)
    sim.run()
    codec = sim.codec
    theta = {n: torch.randn(4, *s) for n, s in codec.shapes.items()}
    dense = {n: torch.randn(4, *s) for n, s in codec.dense_shapes.items()}
    up = codec.encode(theta, dense)
    assert up.shape == (4, codec.rows, 8)
    back, back_dense = codec.decode(up)
    for n in theta:
        assert torch.equal(back[n], theta[n])
    for n in dense:
        assert torch.equal(back_dense[n], dense[n])
    # what the server saw in the last round: tables E0 + f_theta; sent = the global table
    last = [v for v in seen if v.round == 3]
    assert last and all(v.upload.shape == v.sent.shape for v in last)
    # without noise a client's upload decodes to its own trained table (SR: base E0)
    v = last[0]
    assert torch.allclose(v.upload, sim.state.q_local[torch.from_numpy(v.clients)], atol=1e-5)


@pytest.mark.parametrize("mode,norm", [("ldp-laplace", 1), ("ldp-gaussian", 2)])
def test_the_mechanism_clips_the_codecs_upload(small_split, mode, norm):
    """Sensitivity over theta: with no noise (eps = inf) each client's released theta
    moved from the sent theta by at most C in the mechanism's norm; with noise it differs."""
    clip = 0.05
    cfg = _cfg(**{"federation.codec": "lora", "privacy.mode": mode,
                  "privacy.epsilon": float("inf"), "privacy.clip": clip})
    sim = Simulation(cfg, small_split)
    sim.step()
    sim.step()  # starts the codec
    theta_sent = {n: v.clone() for n, v in sim.codec_server.params.items()}
    grabbed = []
    real_add = sim.codec_server.add
    sim.codec_server.add = lambda idx, up: (grabbed.append(up), real_add(idx, up))[1]
    sim.step()
    deltas = torch.cat([torch.cat([(g[n] - theta_sent[n]).reshape(g[n].shape[0], -1)
                                   for n in theta_sent], dim=1) for g in grabbed])
    norms = deltas.double().norm(p=norm, dim=1)
    assert norms.max() <= clip * (1 + 1e-5) and norms.max() > 0.5 * clip
    noisy = Simulation(with_overrides(cfg, {"privacy.epsilon": 5.0}), small_split)
    for _ in range(3):
        noisy.step()
    assert noisy.privacy.summary()["guarantee"]


def test_codecs_with_merges_central_dp_and_uniform(small_split):
    for over in ({"federation.merge": "em"}, {"federation.merge": "dm"},
                 {"federation.aggregation": "uniform"},
                 {"privacy.mode": "cdp-gaussian", "privacy.epsilon": 5.0,
                  "privacy.clip": 1.0, "privacy.sample_rate": 0.5}):
        sim = Simulation(_cfg(**{"federation.codec": "hash", **over}), small_split)
        history = sim.run()
        assert all(np.isfinite(float(sim.state.q_local.abs().max())) for _ in [0])
        assert history[-1].comm["bytes_up"] == 4 * 16 * 8
        if "federation.merge" in over:
            assert "rho_mean" in history[-1].merge


@pytest.mark.parametrize("over,match", [
    ({"federation.backbone": "gpfedrec"}, "backbone 'gpfedrec'"),
    ({"federation.backbone": "fedrap"}, "backbone 'fedrap'"),
    ({"federation.aggregation": "similarity"}, "aggregation 'similarity'"),
    ({"privacy.mode": "ldp-laplace", "privacy.epsilon": 1.0, "privacy.clip_auto": True},
     "--clip auto"),
    ({"federation.lora_rank": 0}, "--lora-rank"),
    ({"federation.peft_warmup": -1}, "--peft-warmup"),
])
def test_refused_compositions(over, match):
    with pytest.raises(UserError, match=match):
        _cfg(**{"federation.codec": "lora", **over}).validate()


def test_hash_functions_and_residual_codes():
    ab, codes = hash_codes(1000, 3, 64, torch.Generator().manual_seed(0))
    assert codes.shape == (1000, 3) and int(codes.min()) >= 0 and int(codes.max()) < 64
    assert bool((ab[:, 0] != 0).all()) and bool((ab[:, 0] != ab[:, 1]).all())
    for j in range(3):  # ((a i + b) mod p) mod d_H, recomputed in Python integers
        a, b = int(ab[j, 0]), int(ab[j, 1])
        assert [((a * i + b) % codecs.HASH_PRIME) % 64 for i in (0, 7, 999)] == \
            codes[[0, 7, 999], j].tolist()
        assert len(set(codes[:, j].tolist())) > 50  # spread over the table
    x = np.random.default_rng(0).normal(size=(300, 8))
    c = residual_kmeans(x, 3, 16, seed=0)
    assert c.shape == (300, 3) and c.min() >= 0 and c.max() < 16
    few = residual_kmeans(x[:5], 2, 16, seed=0)  # fewer items than codes: one code each
    assert len(set(few[:, 0].tolist())) == 5


def test_the_sweeps_codecs_axis():
    import tomllib

    from fedem_private.experiments.sweep_spec import grid, parse_spec

    text = ('[sweep]\nvariants = ["fedmf", "pfedrec"]\ncodecs = ["full", "lora", "c-hash"]\n'
            'seeds = [0]\n[base.train]\nrounds = 3\n')
    points = grid(parse_spec(tomllib.loads(text), "t"))
    names = sorted(p.name for p in points)
    assert len(names) == 6 and "synthetic/pfedrec_c-hash/none/strict/seed0" in names
    assert {p.config.federation.codec for p in points} == {"full", "lora", "c-hash"}
    with pytest.raises(UserError, match="codecs"):
        parse_spec(tomllib.loads(text.replace('"lora"', '"zip"')), "t")
    with pytest.raises(UserError, match="backbone 'gpfedrec'"):
        parse_spec(tomllib.loads(text.replace('"pfedrec"', '"gpfedrec"')), "t")


def test_report_has_bytes_column_and_figure(tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nvariants = ["fedmf"]\ncodecs = ["full", "lora"]\nseeds = [0]\n'
                    '[base.data.synthetic]\nn_users = 40\nn_items = 80\n'
                    '[base.train]\nrounds = 3\nlocal_epochs = 1\n'
                    '[base.federation]\npeft_warmup = 1\n')
    for args in (["sweep", str(spec), "--out", str(tmp_path / "runs")],
                 ["report", str(tmp_path / "runs")]):
        proc = subprocess.run([sys.executable, "-m", "fedem_private", *args],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "runs" / "report.md").read_text()
    assert "KB up / client / round (last)" in report
    assert (tmp_path / "runs" / "synthetic-hr10_vs_bytes.png").stat().st_size > 0
    import pandas as pd

    rows = pd.read_csv(tmp_path / "runs" / "results.csv").set_index("codec")
    d = 16
    assert rows.loc["full", "bytes_up_last"] == 4 * 80 * d
    assert rows.loc["lora", "bytes_up_last"] == 4 * (80 + d) * 4
    # mean over rounds: one full-table warm-up round, then two LoRA rounds
    assert rows.loc["lora", "bytes_up"] == pytest.approx((4 * 80 * d + 2 * 4 * (80 + d) * 4) / 3)


@pytest.mark.parametrize("name", ["hash", "rqvae"])
def test_zero_init_starts_at_e0_and_normal_does_not(small_split, name):
    tables = {}
    for init in ("normal", "zero"):
        sim = Simulation(_cfg(**{"federation.codec": name, "federation.peft_init": init}),
                         small_split)
        sim.step()
        warm = sim.aggregator.table.clone()
        sim._start_codec()  # what round 2 does first
        tables[init] = (sim.aggregator.table - warm).abs().max()
    assert tables["zero"] == 0 and tables["normal"] > 0.01
    with pytest.raises(UserError, match="--peft-init"):
        _cfg(**{"federation.codec": name, "federation.peft_init": "xavier"}).validate()


def test_senet_hash_codec_weights_uploads_and_refusals(small_split):
    """SENet (FedPEFT equations 6-9): with W2 = 0 every weight is sigmoid(0) = 1/2, which
    for h = 2 is mean pooling exactly; W1, W2 are uploaded (bytes) and only for hash."""
    m, d = small_split.n_items, 8
    mean = codecs.build("hash", m, d, {}, SMALL)
    se = codecs.build("hash", m, d, {}, PeftConfig(**{**SMALL.__dict__, "hash_senet": 4}))
    assert isinstance(mean, PeftCodec) and isinstance(se, PeftCodec) and se.senet
    h = SMALL.hash_functions
    assert se.shapes["W1"] == (4 * h, h) and se.shapes["W2"] == (h, 4 * h)
    assert se.upload_bytes() == mean.upload_bytes() + 4 * 2 * (4 * h * h)
    e0 = torch.randn(m, d, generator=torch.Generator().manual_seed(2))
    th_mean, th_se = mean.prepare(e0, 0, 0.1), se.prepare(e0, 0, 0.1)
    assert torch.equal(th_mean["H"], th_se["H"])  # same hashes, same draw of H
    zero_w2 = {"H": th_se["H"][None], "W1": th_se["W1"][None],
               "W2": torch.zeros_like(th_se["W2"])[None]}
    torch.testing.assert_close(se.table(zero_w2), mean.table({"H": th_mean["H"][None]}))
    varied = {n: v[None] * 10 for n, v in th_se.items()}
    assert not torch.allclose(se.table(varied), mean.table({"H": varied["H"]}))
    # a run with it: theta carries W1, W2 to the server
    sim = Simulation(_cfg(**{"federation.codec": "hash", "federation.hash_senet": 4}),
                     small_split)
    sim.run()
    assert sim.codec.senet and {"W1", "W2"} <= set(sim.codec_server.params)
    with pytest.raises(UserError, match="needs --codec hash or c-hash"):
        _cfg(**{"federation.codec": "lora", "federation.hash_senet": 4}).validate()
    with pytest.raises(UserError, match="positive expansion ratio"):
        _cfg(**{"federation.codec": "hash", "federation.hash_senet": -1}).validate()
