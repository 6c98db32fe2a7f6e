"""The merge adapter's ``holdout`` objective (issue 17, item 5): folds, split, loop, config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private import rng
from fedem_private.cli import main
from fedem_private.client.holdout import (
    client_folds,
    fold_ids,
    split_samples,
    withheld,
    withheld_counts,
)
from fedem_private.client.merging import MergeConfig, Merger
from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.data.split import exclusion_csr
from fedem_private.errors import UserError
from fedem_private.models.base import draw_samples
from fedem_private.reference import round as reference
from fedem_private.simulation.config import RunConfig, identity_dict, with_overrides
from fedem_private.simulation.loop import Simulation

NNEG = 4


@pytest.fixture(scope="module")
def small_split():
    """40 users, 120 items; three users have a single training positive."""
    data = generate(SyntheticConfig(n_users=40, n_items=120, mean_activity=25,
                                    activity_sigma=1.0), seed=5)
    split = leave_one_out(data, 5)
    assert (split.train_counts == 1).sum() >= 1  # the edge case is exercised
    return split


def _cfg(**over) -> RunConfig:
    base = {"data.dataset": "synthetic", "train.rounds": 3, "train.local_epochs": 1,
            "train.batch_size": 32, "train.dim": 8, "federation.method": "fedem",
            "federation.adapter_objective": "holdout"}
    base.update(over)
    return with_overrides(RunConfig(), base)


def _round_samples(split, clients, round_, seed=0):
    excl = exclusion_csr(split, "strict")
    return draw_samples(seed, round_, clients, split.train_indptr, split.train_items, *excl,
                        split.n_items, NNEG)


# ------------------------------------------------------------------ the fold rule


@pytest.mark.parametrize("folds", [2, 3, 5, 7])
def test_folds_are_disjoint_cover_the_positives_and_rotate(folds):
    for n in range(0, 40):
        for client in (0, 3, 17):
            f_u = client_folds(n, folds)
            ids = fold_ids(11, client, n, folds)
            if n <= 1:  # no folds: nothing is ever withheld
                assert f_u == 0 and (ids == -1).all()
                assert not any(withheld(11, t, client, n, folds).any() for t in range(9))
                continue
            assert f_u == min(folds, n)
            sizes = np.bincount(ids, minlength=f_u)
            assert sizes.shape == (f_u,) and sizes.min() >= 1 and sizes.max() - sizes.min() <= 1
            # F_u consecutive rounds withhold every positive exactly once (disjoint, covering)
            times = sum(withheld(11, t, client, n, folds).astype(int) for t in range(5, 5 + f_u))
            assert (times == 1).all()
            for t in range(1, 12):
                held = withheld(11, t, client, n, folds)
                assert (held == (ids == t % f_u)).all()
                assert held.sum() == withheld_counts(t, np.array([n]), folds)[0]
                assert 1 <= held.sum() <= n - 1  # something to fit, something still trained


def test_folds_are_fixed_per_client_and_keyed_by_seed_and_client():
    a = fold_ids(0, 4, 30, 5)
    assert (fold_ids(0, 4, 30, 5) == a).all()  # a pure function: the same every call
    assert not (fold_ids(0, 5, 30, 5) == a).all()
    assert not (fold_ids(1, 4, 30, 5) == a).all()
    # round t withholds fold t mod F (n >= F)
    assert (withheld(0, 7, 4, 30, 5) == (a == 2)).all()


def test_split_partitions_the_round_samples(small_split):
    clients = np.arange(small_split.n_users)
    t = 3
    samples = _round_samples(small_split, clients, t)
    train, fold = split_samples(samples, clients, 0, t, 5, NNEG)
    assert train.stream == rng.Stream.SHUFFLE and fold.stream == rng.Stream.ADAPTER_SHUFFLE
    for j, c in enumerate(clients.tolist()):
        items, labels = samples.of(j)
        n_pos = int(small_split.train_counts[c])
        held = withheld(0, t, c, n_pos, 5)
        t_items, t_labels = train.of(j)
        f_items, f_labels = fold.of(j)
        pos = items[:n_pos]
        negs = items[n_pos:].reshape(n_pos, NNEG)  # negatives i*N .. belong to positive i
        # the fold: the withheld positives, then their own negatives, nothing else
        assert (f_items == np.concatenate([pos[held], negs[held].ravel()])).all()
        assert (f_labels == np.r_[np.ones(held.sum()), np.zeros(held.sum() * NNEG)]).all()
        # local training: the rest, in the original order
        assert (t_items == np.concatenate([pos[~held], negs[~held].ravel()])).all()
        assert (t_labels == np.r_[np.ones((~held).sum()), np.zeros((~held).sum() * NNEG)]).all()
        # the withheld positives appear nowhere in the round's local-training samples
        assert not set(pos[held].tolist()) & set(t_items.tolist())
        assert (train.negatives[train.negatives_indptr[j]: train.negatives_indptr[j + 1]]
                == negs[~held].ravel()).all()
        assert (fold.negatives[fold.negatives_indptr[j]: fold.negatives_indptr[j + 1]]
                == negs[held].ravel()).all()
        if n_pos == 1:
            assert f_items.size == 0 and t_items.size == items.size


def test_adapter_batches_hold_only_the_withheld_fold(small_split):
    clients = np.arange(small_split.n_users)
    t = 2
    samples = _round_samples(small_split, clients, t)
    merger = Merger(MergeConfig(adapter_objective="holdout"), len(clients), 8, 0)
    train, steps = merger.round_samples(t, clients, samples, 10, 8, NNEG)
    seen = {j: [] for j in range(len(clients))}
    for step in steps:
        for row, items, labels, mask in zip(step.rows.tolist(), step.items, step.labels,
                                            step.mask, strict=True):
            seen[row] += list(zip(items[mask].tolist(), labels[mask].tolist(), strict=True))
    for j, c in enumerate(clients.tolist()):
        items, labels = samples.of(j)
        n_pos = int(small_split.train_counts[c])
        held = withheld(0, t, c, n_pos, 5)
        in_fold = np.r_[held, np.repeat(held, NNEG)]
        want = sorted(zip(items[in_fold].tolist(), labels[in_fold].tolist(), strict=True))
        assert sorted(seen[j]) == want  # one adapter epoch: each fold sample exactly once
        t_items, _ = train.of(j)
        assert t_items.size == items.size - in_fold.sum()


def test_train_objective_hands_over_the_round_samples_unchanged(small_split):
    clients = np.arange(small_split.n_users)
    samples = _round_samples(small_split, clients, 2)
    merger = Merger(MergeConfig(), len(clients), 8, 0)
    train, steps = merger.round_samples(2, clients, samples, 10, 8, NNEG)
    assert train is samples and steps is not None
    assert not merger.withholds(2)
    assert (merger.kept_positives(2, small_split.train_counts) == small_split.train_counts).all()
    sr = Merger(MergeConfig(strategy="sr"), len(clients), 8, 0)
    assert sr.round_samples(2, clients, samples, 10, 8, NNEG) == (samples, None)


# ------------------------------------------------------------------ the loop


@pytest.mark.parametrize("merge,backbone", [("em", "mf"), ("dm", "mf"), ("em", "ncf")])
def test_holdout_rounds_equal_per_client_reference(small_split, merge, backbone):
    """Rounds 1-3 (2 and 3 merge, with different folds) against the one-client loop, float64."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        sim = Simulation(_cfg(**{"federation.merge": merge, "federation.backbone": backbone}),
                         small_split)
        for _ in range(3):
            ref = reference.simulation_round(sim)
            stats = sim.step()
            assert (sim.state.q_local - ref["q_local"]).abs().max() < 1e-7
            for name, value in sim.state.private.items():
                assert (value - ref["private"][name]).abs().max() < 1e-7
            assert (sim.state.q_global - ref["q_global"]).abs().max() < 1e-7
            if sim.state.round == 1:
                assert stats.merge == {}
            else:
                assert stats.merge["rho_mean"] == pytest.approx(ref["rho_mean"], abs=1e-9)
    finally:
        torch.set_default_dtype(old)


def test_holdout_differs_from_train_only_from_round_2(small_split):
    a = Simulation(_cfg(), small_split)
    b = Simulation(_cfg(**{"federation.adapter_objective": "train"}), small_split)
    a.step()
    b.step()
    assert torch.equal(a.state.q_local, b.state.q_local)  # round 1 merges nothing
    a.step()
    b.step()
    assert not torch.equal(a.state.q_local, b.state.q_local)


def test_local_training_never_sees_the_withheld_fold(small_split):
    sim = Simulation(_cfg(), small_split)
    views = []
    sim.observers.append(views.append)
    sim.run()
    assert {v.round for v in views} == {1, 2, 3}
    for view in views:
        for j, c in enumerate(view.clients.tolist()):
            items, labels = view.samples.of(j)
            n_pos = int(small_split.train_counts[c])
            pos = small_split.train_items[small_split.train_indptr[c]:
                                          small_split.train_indptr[c + 1]]
            held = (withheld(0, view.round, c, n_pos, 5) if view.round > 1
                    else np.zeros(n_pos, dtype=bool))
            assert (items[labels == 1] == pos[~held]).all()
            assert not set(pos[held].tolist()) & set(items.tolist())


def test_a_single_positive_client_keeps_its_adapter(small_split):
    sim = Simulation(_cfg(), small_split)
    single = np.flatnonzero(small_split.train_counts == 1)
    several = np.flatnonzero(small_split.train_counts > 1)
    sim.step()
    before = [w.clone() for w in sim.merger.state.weights]
    sim.step()
    for w0, w1 in zip(before, sim.merger.state.weights, strict=True):
        assert torch.equal(w0[single], w1[single])
        assert not torch.equal(w0[several], w1[several])


def test_chunking_does_not_change_holdout_results(small_split):
    a = Simulation(_cfg(), small_split)
    b = Simulation(_cfg(), small_split)
    b._chunk_size = lambda: 3  # many tiny chunks, each sorted by its round's workload
    a.run()
    b.run()
    assert (a.state.q_local - b.state.q_local).abs().max() < 1e-5
    for w0, w1 in zip(a.merger.state.weights, b.merger.state.weights, strict=True):
        assert (w0 - w1).abs().max() < 1e-5


# ------------------------------------------------------------------ configuration


def test_config_fields_validate_and_keep_old_identities():
    assert RunConfig().federation.adapter_objective == "train"
    assert RunConfig().federation.adapter_folds == 5
    fed = identity_dict(RunConfig().resolved())["federation"]
    assert "adapter_objective" not in fed and "adapter_folds" not in fed
    fed = identity_dict(_cfg().resolved())["federation"]
    assert fed["adapter_objective"] == "holdout" and "adapter_folds" not in fed
    with pytest.raises(UserError, match="unknown adapter objective"):
        _cfg(**{"federation.adapter_objective": "test"}).validate()
    with pytest.raises(UserError, match="adapter_folds"):
        _cfg(**{"federation.adapter_folds": 1}).validate()
    for merge in ("sr", "sm"):
        with pytest.raises(UserError, match="has none"):
            _cfg(**{"federation.merge": merge}).validate()
    with pytest.raises(UserError, match="has none"):
        MergeConfig(strategy="sm", adapter_objective="holdout")


@pytest.mark.parametrize("argv,needle", [
    (["--method", "fedmf", "--adapter-objective", "holdout"], "merge 'sr' has none"),
    (["--method", "fedem", "--merge", "sm", "--adapter-objective", "holdout"],
     "merge 'sm' has none"),
    (["--method", "fedem", "--adapter-objective", "heldout"], "unknown adapter objective"),
    (["--method", "fedem", "--adapter-objective", "holdout", "--adapter-folds", "1"],
     "adapter_folds"),
])
def test_cli_refuses_holdout_in_one_line(tmp_path, capsys, argv, needle):
    out = tmp_path / "out"
    assert main(["run", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_cli_holdout_run_reports_rho(tmp_path, capsys):
    import csv
    import json

    toml = tmp_path / "c.toml"
    toml.write_text("[data.synthetic]\nn_users = 40\nn_items = 60\nmean_activity = 8\n")
    out = tmp_path / "run"
    assert main(["run", "--config", str(toml), "--method", "fedem", "--adapter-objective",
                 "holdout", "--adapter-folds", "3", "--rounds", "3", "--local-epochs", "1",
                 "--dim", "4", "--out", str(out), "--no-progress"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert rows[0]["rho_mean"] == "" and 0.0 <= float(rows[2]["rho_mean"]) <= 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["merge_rho_mean"] == pytest.approx(float(rows[2]["rho_mean"]))
    assert "adapter_objective = \"holdout\"" in (out / "config.toml").read_text()
    capsys.readouterr()


def test_variant_label_names_the_objective():
    from fedem_private.experiments.sweep_spec import variant_label

    assert variant_label(RunConfig().resolved().federation) == "fedmf"
    assert variant_label(_cfg().resolved().federation) == "fedem-em-holdout"
    assert variant_label(_cfg(**{"federation.adapter_folds": 3}).resolved().federation) == (
        "fedem-em-holdout-f3")
    assert variant_label(_cfg(**{"federation.adapter_objective": "train"}).resolved()
                         .federation) == "fedem-em"


@pytest.mark.parametrize("objective", ["train", "holdout"])
def test_adapter_batches_gathered_on_a_device_are_the_cpu_batches(small_split, objective):
    """The GPU's way of building the adapter's steps (orders drawn and slots gathered on the
    device, rows kept on the CPU), run here on the CPU, gives the CPU path's batches."""
    from fedem_private.client import merging

    clients = np.arange(small_split.n_users)
    t = 3
    samples = _round_samples(small_split, clients, t)
    merger = Merger(MergeConfig(adapter_objective=objective), len(clients), 8, 0)
    _, cpu = merger.round_samples(t, clients, samples, 10, 8, NNEG)
    epochs, fold, e0 = merger.cfg.adapter_epochs, samples, 10
    if objective == "holdout":  # the withheld fold, as round_samples hands it to the adapter
        from fedem_private.client.holdout import split_samples
        fold, e0 = split_samples(samples, clients, 0, t, merger.cfg.adapter_folds, NNEG)[1], 0
    per_epoch = -(-np.diff(fold.indptr) // 8)
    order = fold.order_grid_t(0, t, clients, e0, epochs)
    dev = list(merging._device_batches(fold, order, epochs * per_epoch, per_epoch, 8,
                                       torch.device("cpu")))
    cpu = list(cpu)
    assert len(dev) == len(cpu) > 0
    for a, b in zip(cpu, dev, strict=True):
        assert b.rows.device.type == "cpu"
        for x, y in zip((a.rows, a.items, a.labels, a.mask), (b.rows, b.items, b.labels,
                                                              b.mask), strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y)
