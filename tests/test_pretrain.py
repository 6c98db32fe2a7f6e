"""FedPEFT's server-side pre-training (docs/design.md §11; FedPEFT paper, section "Pre-train"):
item attributes, the autoencoder, its latent as the initial item table, and the refusals."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from fedem_private.cli import main
from fedem_private.data import leave_one_out, load_dataset
from fedem_private.data.attributes import ML100K_GENRES, item_attributes, strip_year
from fedem_private.errors import UserError
from fedem_private.experiments.runner import prepare
from fedem_private.server.pretrain import (
    AEConfig,
    init_autoencoder,
    pretrain_items,
    reconstruction_mse,
    rescale,
)
from fedem_private.simulation.config import RunConfig, identity_dict, with_overrides
from fedem_private.simulation.loop import Simulation

SMALL_AE = AEConfig(hidden=16, epochs=150, lr=0.01)


def _features(m: int = 120, seed: int = 3) -> np.ndarray:
    """Attribute-like rows: sparse binary "genres" plus low-rank real "text" columns."""
    g = np.random.default_rng(seed)
    genres = (g.random((m, 10)) < 0.2).astype(np.float64)
    text = np.abs(g.normal(size=(m, 4)) @ g.normal(size=(4, 20))) * 0.3
    return np.concatenate([genres, text], axis=1)


# ---------------------------------------------------------------------- autoencoder
def test_autoencoder_reduces_reconstruction_error_below_the_column_means():
    x = _features()
    out = pretrain_items(x, 8, seed=0, init_std=0.1, cfg=SMALL_AE)
    xt = torch.from_numpy(x)
    untrained = init_autoencoder(x.shape[1], 8, SMALL_AE.hidden, 0)
    assert out.mse_start == pytest.approx(float(reconstruction_mse(untrained, xt)))
    assert out.mse_end < 0.3 * out.mse_start
    # better than predicting every item's row by the column means (the variance)
    assert out.mse_end < 0.5 * float(x.var(axis=0).mean())


def test_latent_table_has_the_items_rows_and_init_std_entries():
    x = _features()
    out = pretrain_items(x, 8, seed=0, init_std=0.07, cfg=SMALL_AE)
    assert out.table.shape == (120, 8) and out.table.dtype == torch.float32
    t = out.table.double()
    assert float(t.pow(2).mean().sqrt()) == pytest.approx(0.07, rel=1e-5)
    assert t.mean(dim=0).abs().max() < 1e-6  # centred per dimension
    assert torch.isfinite(t).all()
    # not collapsed: the items are told apart by their latents
    assert torch.linalg.matrix_rank(t).item() == 8


def test_latent_follows_the_attributes_row_for_row():
    """Permuting the items permutes the table: row i is item i's latent."""
    x = _features()
    perm = np.random.default_rng(0).permutation(x.shape[0])
    a = pretrain_items(x, 8, seed=1, init_std=0.1, cfg=SMALL_AE).table
    b = pretrain_items(x[perm], 8, seed=1, init_std=0.1, cfg=SMALL_AE).table
    torch.testing.assert_close(b, a[perm], atol=1e-5, rtol=1e-4)


def test_pretraining_is_deterministic_per_seed_and_differs_across_seeds():
    x = _features()
    a = pretrain_items(x, 8, seed=4, init_std=0.1, cfg=SMALL_AE)
    b = pretrain_items(x, 8, seed=4, init_std=0.1, cfg=SMALL_AE)
    c = pretrain_items(x, 8, seed=5, init_std=0.1, cfg=SMALL_AE)
    assert torch.equal(a.table, b.table) and a.mse_end == b.mse_end
    assert (a.table - c.table).abs().max() > 1e-2


def test_rescale_of_a_table_without_spread_is_zero():
    z = torch.ones((5, 3), dtype=torch.float64) * 2.0
    assert torch.equal(rescale(z, 0.1), torch.zeros_like(z))


# ------------------------------------------------------------------------ attributes
def test_strip_year():
    assert strip_year("Toy Story (1995)") == "Toy Story"
    assert strip_year("Shanghai Triad (Yao a yao yao dao waipo qiao) (1995)") == \
        "Shanghai Triad (Yao a yao yao dao waipo qiao)"
    assert strip_year("unknown") == "unknown"


def test_datasets_without_attributes_have_none():
    for name in ("synthetic", "filmtrust", "lastfm-2k", "csv"):
        assert item_attributes(name, "/nonexistent", np.arange(3)) is None


def _u_item_genres(directory, raw_id: int) -> list[str]:
    for line in (directory / "u.item").read_text(encoding="latin-1").splitlines():
        parts = line.split("|")
        if int(parts[0]) == raw_id:
            return [g for g, f in zip(ML100K_GENRES, parts[5:], strict=True) if f == "1"]
    raise AssertionError(raw_id)


def test_ml100k_attributes_match_u_item_and_the_split_indices(ml100k_dir):
    data = load_dataset("ml-100k", ml100k_dir)
    split = leave_one_out(data, 0)
    x = item_attributes("ml-100k", ml100k_dir, data.item_ids)
    assert x.shape[0] == split.n_items == 1682
    assert 19 < x.shape[1] <= 19 + 300
    genres = x[:, :19]
    assert set(np.unique(genres)) <= {0.0, 1.0}

    def named(i):
        return [g for g, f in zip(ML100K_GENRES, genres[i], strict=True) if f == 1.0]

    by_raw = {int(r): i for i, r in enumerate(data.item_ids)}
    assert named(by_raw[1]) == ["Animation", "Children's", "Comedy"]  # Toy Story (1995)
    assert named(by_raw[2]) == ["Action", "Adventure", "Thriller"]  # GoldenEye (1995)
    # every split index i carries the genres of raw item item_ids[i], test items included
    for i in np.unique(np.concatenate([split.test_items[:40], split.train_items[:200:7]])):
        assert named(i) == _u_item_genres(ml100k_dir, int(data.item_ids[i]))
    # the title part: unit-norm TF-IDF rows (or zero rows: no kept word in the title)
    norms = np.linalg.norm(x[:, 19:], axis=1)
    assert np.allclose(norms[norms > 0], 1.0) and (norms > 0).mean() > 0.4
    # the rows follow the ids asked for: Toy Story's title words differ from GoldenEye's
    pair = item_attributes("ml-100k", ml100k_dir, np.array([2, 1]))
    assert np.array_equal(pair[:, :19], genres[[by_raw[2], by_raw[1]]])


def test_ml100k_attributes_refuse_an_item_without_a_row(ml100k_dir):
    with pytest.raises(UserError, match="no row for item 99999"):
        item_attributes("ml-100k", ml100k_dir, np.array([1, 2, 99999]))


def test_ml1m_movies_dat(tmp_path):
    (tmp_path / "movies.dat").write_text(
        "1::Toy Story (1995)::Animation|Children's|Comedy\n"
        "2::Jumanji (1995)::Adventure|Children's|Fantasy\n"
        "5::Father of the Bride Part II (1995)::Comedy\n", encoding="latin-1")
    x = item_attributes("ml-1m", tmp_path, np.array([5, 1]))
    assert x.shape[0] == 2 and x.shape[1] > 18
    assert np.flatnonzero(x[0, :18]).tolist() == [4]  # Comedy
    assert np.flatnonzero(x[1, :18]).tolist() == [2, 3, 4]  # Animation, Children's, Comedy
    (tmp_path / "movies.dat").write_text("1::Toy Story (1995)::Cartoon\n")
    with pytest.raises(UserError, match="unknown genre 'Cartoon'"):
        item_attributes("ml-1m", tmp_path, np.array([1]))


def test_missing_attribute_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="item attribute file not found"):
        item_attributes("ml-100k", tmp_path, np.array([1]))


# ------------------------------------------------------------------------- a run
def test_short_lora_run_starts_from_the_autoencoder_latent(ml100k_dir):
    cfg = with_overrides(RunConfig(), {
        "data.dataset": "ml-100k", "data.data_dir": str(ml100k_dir), "train.rounds": 3,
        "train.local_epochs": 1, "train.eval_every": 3, "federation.codec": "lora",
        "federation.peft_pretrain": "attributes", "federation.peft_warmup": 1})
    sim = prepare(cfg)
    data = load_dataset("ml-100k", ml100k_dir)
    x = item_attributes("ml-100k", ml100k_dir, data.item_ids)
    latent = pretrain_items(x, cfg.train.dim, cfg.train.seed, cfg.train.init_std).table
    assert not torch.equal(latent, sim.backbone.init_items())
    assert torch.equal(sim.aggregator.table, latent)
    sent: dict[int, torch.Tensor] = {}

    def observe(view):
        if view.round == 1:
            for j, c in enumerate(view.clients.tolist()):
                sent[c] = view.sent[j]

    sim.observers.append(observe)
    history = sim.run()
    assert len(sent) == sim.split.n_users
    assert all(torch.equal(t, latent) for t in sent.values())  # round 1 starts from it
    assert sim.codec.e0 is not None and not torch.equal(sim.codec.e0, latent)  # warm-up trained
    m = history[-1].metrics
    assert 0.0 < m["sampled"]["hr@10"] <= 1.0
    assert history[-1].comm["bytes_up"] < history[0].comm["bytes_up"]  # lora after warm-up


# ------------------------------------------------------------------------- refusals
def test_config_refuses_a_dataset_without_attributes_and_the_full_codec():
    with pytest.raises(UserError, match="dataset synthetic has no item attributes"):
        with_overrides(RunConfig(), {"federation.codec": "lora",
                                     "federation.peft_pretrain": "attributes"}).validate()
    with pytest.raises(UserError, match="needs a FedPEFT codec"):
        with_overrides(RunConfig(), {"data.dataset": "ml-100k",
                                     "federation.peft_pretrain": "attributes"}).validate()
    with pytest.raises(UserError, match="unknown --peft-pretrain"):
        with_overrides(RunConfig(), {"federation.peft_pretrain": "bert"}).validate()


def test_simulation_refuses_pretraining_without_item_features(small_split):
    cfg = with_overrides(RunConfig(), {"data.dataset": "ml-100k", "federation.codec": "lora",
                                       "federation.peft_pretrain": "attributes",
                                       "train.dim": 4})
    with pytest.raises(UserError, match="has no item attributes"):
        Simulation(cfg, small_split)
    # given features, the same split starts from their latent
    x = _features(m=small_split.n_items)
    sim = Simulation(cfg, small_split, item_features=x)
    assert torch.equal(sim.aggregator.table, pretrain_items(x, 4, 0, 0.1).table)


def test_run_identity_is_unchanged_without_pretraining():
    assert "peft_pretrain" not in identity_dict(RunConfig().resolved())["federation"]
    cfg = with_overrides(RunConfig(), {"data.dataset": "ml-100k", "federation.codec": "lora",
                                       "federation.peft_pretrain": "attributes"}).resolved()
    assert identity_dict(cfg)["federation"]["peft_pretrain"] == "attributes"


def test_cli_refusal_is_one_line_and_exit_2(capsys):
    assert main(["run", "--codec", "full", "--dataset", "ml-100k",
                 "--peft-pretrain", "attributes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a FedPEFT codec" in err
    proc = subprocess.run([sys.executable, "-m", "fedem_private", "run", "--codec", "lora",
                           "--peft-pretrain", "attributes", "--no-progress"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "dataset synthetic has no item attributes" in proc.stderr
