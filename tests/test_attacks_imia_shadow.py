"""IMIA's shadow per backbone (issue 44): built from the registration, recorded dense groups,
and candidates that do not assume every trained row changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from recorded_runs import recorded_run

from attacks.ground_truth import load_ground_truth
from attacks.imia import assumption_note, imia
from attacks.labels import labels_for
from attacks.observations import Observation, PublicKnowledge, load_observations, load_public
from attacks.scoring import score_attack
from attacks.shadow import ShadowModel, train_shadow
from fedem_private.experiments.shadow import shadow_model


def _public(backbone: str, **kw) -> PublicKnowledge:
    base = dict(n_clients=10, n_items=50, dim=4, lr=0.1, local_epochs=2, batch_size=16,
                num_negatives=4, method=backbone, backbone=backbone, extra={"init_std": 0.1})
    base.update(kw)
    return PublicKnowledge(**base)


def test_the_shadow_comes_from_the_backbone_registration() -> None:
    gen = torch.Generator().manual_seed(0)
    # MF's registration asks for the attack's built-in MF shadow; the generic one exists
    assert shadow_model(_public("mf")) is None and assumption_note(_public("mf")) is None
    mf = shadow_model(_public("mf"), generic=True)
    ncf, pfedrec = (shadow_model(_public(b)) for b in ("ncf", "pfedrec"))
    assert mf is not None and ncf is not None and pfedrec is not None
    assert mf.dense_names == () and not mf.alternating
    assert set(ncf.dense_names) == {"w0", "b0", "w1", "b1", "w2", "b2", "w3", "b3"}
    assert pfedrec.alternating and pfedrec.dense_names == ()
    # the private part is drawn as a client draws it at the start, one per client
    p = ncf.init_private(3, gen)["p"]
    assert p.shape == (3, 4) and not torch.equal(p[0], p[1])
    head = pfedrec.init_private(3, gen)
    assert head["w"].shape == (3, 4) and head["b"].shape == (3,)
    params = {**ncf.init_private(2, gen),
              **{n: v[None].expand(2, *v.shape) for n, v in ncf.init_dense(gen).items()}}
    assert ncf.logits(params, torch.randn(2, 5, 4)).shape == (2, 5)
    # GPFedRec: the MLP is private, drawn as at the start (the same for every client then)
    # by measurement its registration asks for the MF shadow; its own is built on request
    assert shadow_model(_public("gpfedrec")) is None
    assert "retrains an MF client" in assumption_note(_public("gpfedrec"))
    gpfedrec, fedrap = (shadow_model(_public(b), generic=True) for b in ("gpfedrec", "fedrap"))
    assert gpfedrec is not None and fedrap is not None
    assert gpfedrec.dense_names == () and gpfedrec.init_rows is None
    mlp = gpfedrec.init_private(2, gen)
    assert set(mlp) == {"p", *ncf.dense_names} and torch.equal(mlp["w0"][0], mlp["w0"][1])
    # FedRAP: its personal rows travel with the item rows; its regularisers join the loss
    assert set(fedrap.init_private(2, gen)) == {"w", "b"} and fedrap.row_loss is not None
    assert fedrap.init_rows is not None and fedrap.init_rows(2, 5, gen).shape == (2, 5, 4)
    wide = torch.randn(2, 5, 8)
    assert fedrap.logits(fedrap.init_private(2, gen), wide).shape == (2, 5)
    assert fedrap.row_loss(wide).shape == (2, 5)
    assert assumption_note(_public("fedrap"), fedrap) is None
    # a backbone without a shadow score: the attack falls back on MF and says so
    assert "retrains an MF client" in assumption_note(_public("fedrap"))
    assert assumption_note(_public("ncf"), ncf) is None
    assert assumption_note(_public("ncf")) is not None


@pytest.fixture(scope="module")
def ncf_run(tmp_path_factory: pytest.TempPathFactory):
    path = recorded_run(tmp_path_factory.mktemp("imia_ncf") / "run", rounds="1,last",
                        clients=30, federation__method="fedncf")
    truth = {g.round: g for g in load_ground_truth(path)}
    return load_observations(path), load_public(path), truth


def test_recordings_hold_the_sent_mlp_and_the_ncf_shadow_uses_it(ncf_run) -> None:
    observations, public, truth = ncf_run
    assert public.backbone == "ncf"
    model = shadow_model(public)
    assert model is not None
    for obs in observations:
        assert set(obs.sent_dense) == set(model.dense_names)
        assert obs.sent_dense["w0"].shape == (obs.n_clients, 2 * public.dim, 32)
        labels = labels_for(obs, truth[obs.round], "positive_vs_sampled")
        own = score_attack(imia(obs, public, shadow=model, restarts=1, iterations=3), labels,
                           relation="positive_vs_sampled")
        assert own["auc_client_mean"] > 0.75
        assert own["f1@20%"] > own["f1@20%_random_baseline"] + 0.2


# --------------------------------------------------------------- trained rows left unchanged

def _gated() -> ShadowModel:
    """An MF score whose rows with q[0] <= 0 get no gradient (a dead ReLU path): such a row
    stays exactly where it was even when trained."""

    def logits(params, q):
        return torch.bmm(q, params["p"][:, :, None]).squeeze(2) * (q[..., 0] > 0).to(q.dtype)

    def init_private(c, gen):
        return {"p": 0.1 * torch.randn((c, 4), generator=gen)}

    return ShadowModel(backbone="gated", logits=logits, init_private=init_private,
                       init_dense=lambda gen: {})


def _gated_observation(seed: int = 0):
    """8 clients, 200 items; each trains 12 positives and 48 sampled negatives, and about half
    of the rows it trains cannot move. Returns (obs, public, positives, sampled negatives)."""
    rng = np.random.default_rng(seed)
    c, m, d, n_pos, n_neg = 8, 200, 4, 12, 4
    sent = rng.normal(0.0, 0.5, (m, d)).astype(np.float32)
    public = _public("gated", n_clients=c, n_items=m, lr=0.05, local_epochs=5, batch_size=32)
    model = _gated()
    upload = np.repeat(sent[None], c, axis=0).astype(np.float64)
    pos = np.zeros((c, m), dtype=bool)
    neg = np.zeros((c, m), dtype=bool)
    gen = torch.Generator().manual_seed(seed)
    for j in range(c):
        items = rng.permutation(m)[: n_pos * (1 + n_neg)]
        pos[j, items[:n_pos]] = True
        neg[j, items[n_pos:]] = True
        rows = torch.from_numpy(sent[items].astype(np.float64))[None]
        valid = torch.ones((1, items.size), dtype=torch.bool)
        label = torch.from_numpy(pos[j, items])[None]
        p_true = {"p": torch.from_numpy(rng.normal(0.0, 1.0, (1, d)))}
        sim = train_shadow(model, rows, valid, label, valid, p_true,
                           torch.tensor([items.size]), lr=public.lr,
                           epochs=public.local_epochs, batch_size=public.batch_size, gen=gen)
        mine = sim[0, 1].numpy() * label[0, :, None].numpy() + \
            sim[0, 0].numpy() * (~label[0, :, None]).numpy()
        upload[j, items] += mine
    obs = Observation(1, np.arange(c), np.repeat(sent[None], c, axis=0),
                      upload.astype(np.float32), np.ones(c, dtype=bool))
    return obs, public, pos, neg


def test_trained_rows_left_unchanged_still_rank_sensibly() -> None:
    obs, public, pos, neg = _gated_observation()
    changed = np.linalg.norm(obs.upload.astype(np.float64) - obs.sent, axis=2) > 0
    trained = pos | neg
    assert (trained & ~changed).sum() > 0.3 * trained.sum()  # the case this test is about
    assert not (changed & ~trained).any()
    sampled = np.where(pos, 1.0, np.where(neg, 0.0, np.nan))
    anyone = pos.astype(np.float64)
    model = _gated()
    results = {}
    for unchanged in ("shadow", "below"):
        s = imia(obs, public, shadow=model, unchanged=unchanged)
        results[unchanged] = (
            score_attack(s, sampled, relation="positive_vs_sampled")["auc_client_mean"],
            score_attack(s, anyone, relation="positive_vs_any")["auc_client_mean"])
    # no inversion: positives still rank above the negatives trained beside them
    assert results["shadow"][0] > 0.55 and results["below"][0] > 0.5
    # a trained row the shadow leaves still is not ranked with the rows it would have moved
    # (the untrained ones): positives among all items rank better than with every unchanged
    # row put below the changed ones
    assert results["shadow"][1] > 0.7
    assert results["shadow"][1] > results["below"][1] + 0.03


# ------------------------------------------ GPFedRec's and FedRAP's shadows replay their client

def _one_client_round(backbone, private, n_pos: int = 6, n_neg: int = 18, seed: int = 0):
    """One client's round of the backbone's own training (one batch per epoch, so the batch
    order cannot matter). Returns (sent table, trained table, items, labels)."""
    from fedem_private.models.base import ClientParams, ClientSamples, LocalTrainConfig

    rng = np.random.default_rng(seed)
    items = rng.permutation(backbone.n_items)[: n_pos + n_neg].astype(np.int64)
    labels = np.r_[np.ones(n_pos), np.zeros(n_neg)]
    samples = ClientSamples(indptr=np.array([0, items.size]), items=items, labels=labels,
                            negatives_indptr=np.array([0, n_neg]), negatives=items[n_pos:])
    cfg = LocalTrainConfig(epochs=3, batch_size=64, lr=0.05)
    sent = backbone.init_items()
    start = ClientParams(sent[None].clone(), {}, {n: v.clone() for n, v in private.items()})
    trained, _ = backbone.train_chunk(start, np.array([7]), samples, cfg, round_=1)
    return sent, trained.items[0], items, labels, cfg


@pytest.mark.parametrize("backbone", ["gpfedrec", "fedrap"])
def test_the_shadow_replays_the_client_given_its_data_and_start(backbone) -> None:
    from fedem_private.models import build

    public = _public(backbone, n_items=40, dim=8)
    model = shadow_model(public, generic=True)
    assert model is not None and model.backbone == backbone
    client = build(backbone, 40, 8, 3, 0.1)
    private = client.init_private(np.array([7]))
    sent, trained, items, labels, cfg = _one_client_round(client, private)
    rows0 = None
    theta = dict(private)
    if model.init_rows is not None:  # FedRAP: the client's own personal rows of these items
        rows0 = theta.pop("personal")[:, items]
        assert model.init_rows(1, items.size, torch.Generator()).shape == rows0.shape
    assert set(theta) == set(model.init_private(1, torch.Generator()))
    valid = torch.ones((1, items.size), dtype=torch.bool)
    guess = torch.from_numpy(labels.astype(bool))[None]
    sim = train_shadow(model, sent[items][None].double(), valid, guess, valid, theta,
                       torch.tensor([items.size]), lr=cfg.lr, epochs=cfg.epochs,
                       batch_size=cfg.batch_size, gen=torch.Generator().manual_seed(0),
                       rows0=rows0)
    mine = torch.where(guess[0, :, None], sim[0, 1], sim[0, 0])
    true = (trained[items] - sent[items]).double()
    assert true.abs().max() > 1e-3  # the rows moved
    torch.testing.assert_close(mine, true, rtol=1e-4, atol=2e-6)
    # the other label gives another delta: the shadow tells the labels apart
    other = torch.where(guess[0, :, None], sim[0, 0], sim[0, 1])
    assert (other - true).abs().max() > 1e-3


def test_a_codec_run_is_labelled_a_heuristic() -> None:
    """Under a FedPEFT codec the client trains theta, not rows: imia's record says its
    shadow does not model that, beside any backbone note."""
    lora = _public("mf", extra={"init_std": 0.1, "codec": "lora"})
    assert "codec 'lora'" in assumption_note(lora)
    # with a shadow to train through the codec (sr: the base is the sent table's): no note
    mf = shadow_model(lora)
    assert mf is not None and assumption_note(lora, mf) is None
    assert "codec 'lora'" in assumption_note(lora, mf, through_codec=False)
    em = _public("mf", extra={"init_std": 0.1, "codec": "lora", "merge": "em"})
    assert "frozen base" in assumption_note(em, mf)
    assert assumption_note(_public("mf", extra={"init_std": 0.1, "codec": "full"})) is None
    both = assumption_note(_public("gpfedrec", extra={"init_std": 0.1, "codec": "hash"}))
    assert "retrains an MF client" in both and "codec 'hash'" in both


# --------------------------------------------------- LoRA: the shadow trains through the codec

def _lora_client_round(backbone_name: str, seed: int = 0):
    """One client's round of FedPEFT LoRA training on ``backbone_name`` (one batch per epoch):
    (the backbone, its private start, theta sent, theta trained, E0, items, labels, cfg)."""
    from fedem_private.client import codecs
    from fedem_private.models import build
    from fedem_private.models.base import ClientParams, ClientSamples, LocalTrainConfig

    m, d = 40, 8
    client = build(backbone_name, m, d, 3, 0.1)
    codec = codecs.build("lora", m, d, {n: tuple(v.shape) for n, v in client.init_dense().items()})
    e0 = client.init_items()
    theta = {n: v[None] for n, v in codec.prepare(e0, seed, 0.1).items()}
    theta["B"] = 0.3 * torch.randn(theta["B"].shape, generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(seed)
    n_pos, n_neg = 6, 18
    items = rng.permutation(m)[: n_pos + n_neg].astype(np.int64)
    labels = np.r_[np.ones(n_pos), np.zeros(n_neg)]
    samples = ClientSamples(indptr=np.array([0, items.size]), items=items, labels=labels,
                            negatives_indptr=np.array([0, n_neg]), negatives=items[n_pos:])
    cfg = LocalTrainConfig(epochs=3, batch_size=64, lr=0.05)
    private = client.init_private(np.array([7]))
    dense = {n: v[None].clone() for n, v in client.init_dense().items()}
    start = ClientParams(codec.table(theta), dense, {n: v.clone() for n, v in private.items()})
    trainer = codec.trainer(theta)
    client.train_chunk(start, np.array([7]), samples, cfg, round_=1, rows=trainer)
    return client, private, dense, theta, trainer.theta, e0, items, labels, cfg


@pytest.mark.parametrize("backbone", ["mf", "pfedrec", "ncf"])
def test_the_lora_shadow_replays_the_client_given_its_data_and_start(backbone) -> None:
    """Through the codec, the shadow gives the trained rows of A to float32 precision (MF;
    PFedRec, whose head steps first and theta second; FedNCF, whose MLP trains beside)."""
    from attacks.shadow import LORA_B, through_lora

    public = _public(backbone, n_items=40, dim=8, extra={"init_std": 0.1, "codec": "lora"})
    inner = shadow_model(public)
    assert inner is not None  # a LoRA run gets the generic shadow even for MF
    client, private, dense, sent, trained, e0, items, labels, cfg = _lora_client_round(backbone)
    rank = sent["A"].shape[2]
    model = through_lora(inner, rank, 8)
    rows = torch.cat([sent["A"][0, items], e0[items]], dim=1)[None].double()
    params = {**private, **dense, LORA_B: sent["B"]}
    valid = torch.ones((1, items.size), dtype=torch.bool)
    guess = torch.from_numpy(labels.astype(bool))[None]
    sim = train_shadow(model, rows, valid, guess, valid, params, torch.tensor([items.size]),
                       lr=cfg.lr, epochs=cfg.epochs, batch_size=cfg.batch_size,
                       gen=torch.Generator().manual_seed(0))
    assert torch.equal(sim[..., rank:], torch.zeros_like(sim[..., rank:]))  # the base is frozen
    mine = torch.where(guess[0, :, None], sim[0, 1], sim[0, 0])[:, :rank]
    true = (trained["A"][0, items] - sent["A"][0, items]).double()
    assert true.abs().max() > 1e-3
    torch.testing.assert_close(mine, true, rtol=1e-4, atol=2e-6)
    other = torch.where(guess[0, :, None], sim[0, 0], sim[0, 1])[:, :rank]
    assert (other - true).abs().max() > 1e-3
    # rows of A the client never trained stay exactly where they were: B hides them in the
    # decoded table only
    untrained = np.setdiff1d(np.arange(40), items)
    assert torch.equal(trained["A"][0, untrained], sent["A"][0, untrained])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory):
    path = recorded_run(tmp_path_factory.mktemp("imia_lora") / "run", rounds="3,6",
                        clients=30, train__rounds=6, train__eval_every=6,
                        federation__codec="lora")
    truth = {g.round: g for g in load_ground_truth(path)}
    return load_observations(path), load_public(path), truth


def test_a_lora_recording_holds_theta_and_the_attack_reads_the_codec_rows(lora_run) -> None:
    """The recording keeps theta as sent and as decoded; the decoded table is E0 + B a_i; the
    rows of A that changed are the rows the client trained; through the codec imia ranks
    positives well above chance, and above imia on the decoded table, where every row
    changed."""
    from attacks.imia import lora_view

    observations, public, truth = lora_run
    inner = shadow_model(public)
    for obs in observations:
        assert set(obs.sent_theta) == {"A", "B"} == set(obs.upload_theta)
        a0, b0 = obs.sent_theta["A"], obs.sent_theta["B"]
        a1, b1 = obs.upload_theta["A"], obs.upload_theta["B"]
        e0 = obs.sent[0] - a0[0] @ b0[0].T
        np.testing.assert_allclose(obs.upload - np.einsum("kmr,kdr->kmd", a1, b1), e0[None]
                                   .repeat(obs.n_clients, 0), atol=1e-5)
        gt = truth[obs.round]
        assert np.array_equal(gt.clients, obs.clients)
        trained = gt.positives.to_mask(obs.n_items) | gt.negatives.to_mask(obs.n_items)
        for j in range(obs.n_clients):
            moved = np.abs(a1[j] - a0[j]).max(axis=1) > 0
            assert np.array_equal(moved, trained[j])
            # the decoded table moves every row: support cannot find the trained rows there
            assert (np.abs(obs.upload[j] - obs.sent[j]).max(axis=1) > 0).all()
        view, model = lora_view(obs, public, inner)
        assert view.dim == a0.shape[2] + public.dim and model.frozen_tail == public.dim
        labels = labels_for(obs, gt, "positive_vs_sampled")
        through, decoded = (
            score_attack(imia(obs, public, shadow=inner, restarts=1, iterations=3, codec=c),
                         labels, relation="positive_vs_sampled") for c in ("through", "decoded"))
        # measured: AUC 0.80 / 0.87 through the codec against 0.57 / 0.60 on the decoded table
        assert through["auc_client_mean"] > 0.75
        assert through["auc_client_mean"] > decoded["auc_client_mean"] + 0.1
        assert through["f1@20%"] > through["f1@20%_random_baseline"] + 0.2
