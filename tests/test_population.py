"""Populations calibrated to a real dataset (docs/design.md section 17): keyed draws, the
model file, the fit, the wiring into load_dataset and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedem_private import rng
from fedem_private.cli import main
from fedem_private.data import (
    SyntheticConfig,
    calibrated_population,
    leave_one_out,
    load_dataset,
    population_record,
)
from fedem_private.data import calibration as cal
from fedem_private.data.population import (
    FitOptions,
    cache_path,
    draw_bytes,
    draw_population,
    draw_users,
    fit_population,
    load_population,
    mean_activity,
    options_record,
    save_population,
    taste_scores,
)
from fedem_private.data.synthetic import generate
from fedem_private.errors import UserError

# a fit in about a second: few steps, one calibration draw, one round
QUICK = FitOptions(steps=40, draws=1, rounds=1, popularity_steps=2, evals=4)


@pytest.fixture(scope="module")
def planted():
    """A synthetic source with planted popularity and taste clusters (300 users, 100 items)."""
    return generate(SyntheticConfig(n_users=300, n_items=100, n_clusters=4,
                                    mean_activity=20, taste_strength=4.0), seed=11)


@pytest.fixture(scope="module")
def model(planted):
    return fit_population(planted, QUICK)


def _rows(data, u):
    """User u's (items, timestamps), in the order drawn."""
    mine = data.users == u
    return data.items[mine], data.timestamps[mine]


def test_a_user_is_the_same_among_50_or_500_users_and_in_any_block(model) -> None:
    small = draw_population(model, 3, 50, block=7)
    large = draw_population(model, 3, 500, block=64)
    assert small.n_users == 50 and large.n_users == 500 and small.n_items == model.n_items
    for u in range(50):
        items_s, ts_s = _rows(small, u)
        items_l, ts_l = _rows(large, u)
        assert np.array_equal(items_s, items_l) and np.array_equal(ts_s, ts_l)
    # and any subset of users, drawn alone, is what the population holds for them
    some = np.array([42, 5, 17])
    counts, items, stamps = draw_users(model, 3, some)
    ends = np.cumsum(counts)
    for j, u in enumerate(some):
        lo = ends[j] - counts[j]
        assert np.array_equal(items[lo:ends[j]], _rows(small, u)[0])
        assert np.array_equal(stamps[lo:ends[j]], _rows(small, u)[1])


def test_another_seed_draws_another_population(model) -> None:
    a, b = draw_population(model, 0, 40), draw_population(model, 1, 40)
    assert not np.array_equal(a.items[:50], b.items[:50])


def test_users_draw_distinct_items_within_activity_bounds(model) -> None:
    data = draw_population(model, 0, 200)
    pairs = data.users * data.n_items + data.items
    assert np.unique(pairs).shape[0] == pairs.shape[0]  # without replacement
    counts = np.bincount(data.users, minlength=data.n_users)
    assert counts.min() >= 3 and counts.max() <= data.n_items - 1
    split = leave_one_out(data, 0)
    assert split.n_users == 200 and split.dropped_users == 0


def test_the_model_file_round_trips_with_its_hash(model, tmp_path) -> None:
    path = tmp_path / "pop.npz"
    assert save_population(model, path) == model.sha256
    again = load_population(path)
    assert again.sha256 == model.sha256
    assert again.options == model.options
    assert np.array_equal(again.item_factors, model.item_factors)
    assert again.taste_strength == model.taste_strength
    assert np.array_equal(draw_population(again, 2, 30).items,
                          draw_population(model, 2, 30).items)


def test_a_tampered_model_file_is_refused(model, tmp_path) -> None:
    path = tmp_path / "pop.npz"
    save_population(model, path)
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["item_bias"] = arrays["item_bias"] + 1e-9
    np.savez(path, **arrays)
    with pytest.raises(UserError, match="does not match"):
        load_population(path)
    path.write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a readable model"):
        load_population(path)


def test_the_model_keeps_aggregates_only(model, planted) -> None:
    """No array is as long as the source's users or interactions: no user's row is kept."""
    sizes = {a.shape[0] for a in (model.item_bias, model.item_factors, model.mix_weights,
                                  model.mix_means, model.mix_chol, model.activity)}
    assert planted.n_users not in sizes and planted.n_interactions not in sizes
    assert model.activity.shape[1] == QUICK.quantiles


def test_the_fit_recovers_the_planted_popularity(model, planted) -> None:
    drawn = draw_population(model, 5, planted.n_users)
    real = np.bincount(planted.items, minlength=planted.n_items)
    ours = np.bincount(drawn.items, minlength=planted.n_items)
    ranks = [np.argsort(np.argsort(c)) for c in (real, ours)]
    assert np.corrcoef(*ranks)[0, 1] > 0.9  # Spearman's rank correlation
    # activity: the drawn users' median is the source's, within a fifth
    act = [np.median(np.bincount(d.users)) for d in (planted, drawn)]
    assert abs(act[1] / act[0] - 1) < 0.2


def test_the_fit_keeps_the_structure_that_makes_personalisation_pay(model, planted) -> None:
    """EASE beats MostPop on the drawn population as on the source (planted clusters), and
    the calibration reached its targets at the source's size within 25%."""
    split = leave_one_out(draw_population(model, 6, planted.n_users), 6)
    mostpop, ease = cal.rungs(split, 6, 500.0)
    assert ease > 1.5 * mostpop
    assert np.all(np.abs(model.achieved / model.targets - 1) < 0.25)


def test_a_source_beyond_the_dense_fit_is_refused(planted, monkeypatch) -> None:
    from fedem_private.data import population

    monkeypatch.setattr(population, "MAX_FIT_ENTRIES", 1000)
    with pytest.raises(UserError, match="beyond the dense fit"):
        fit_population(planted, QUICK)


def test_ease_dual_form_is_the_primal() -> None:
    """Equation (C.1): the Woodbury form equals Steck's closed form when users < items."""
    from fedem_private.baselines.models import ease_weights

    x = (np.random.default_rng(0).random((30, 50)) < 0.2).astype(np.float64)
    primal = x @ ease_weights(x, 5.0)
    assert np.allclose(cal.ease_scores(x, 5.0), primal, atol=1e-10)
    tall = (np.random.default_rng(1).random((60, 20)) < 0.3).astype(np.float64)
    assert np.allclose(cal.ease_scores(tall, 5.0), tall @ ease_weights(tall, 5.0))


def test_sparse_ease_dual_is_the_primal_block_by_block() -> None:
    """(C.1)-(C.2) from a sparse X, a few users and items at a time, equal Steck's closed
    form to 1e-8 (an item nobody trained on included)."""
    from scipy import sparse

    from fedem_private.baselines.models import ease_weights

    x = (np.random.default_rng(3).random((25, 70)) < 0.15).astype(np.float64)
    x[:, 7] = 0.0
    primal = x @ ease_weights(x, 3.0)
    csr = sparse.csr_matrix(x)
    k, diag_p = cal.ease_dual(csr, 3.0, block=60)  # 2 items a block
    rows = np.vstack([cal.ease_rows(csr, k, diag_p, lo, min(25, lo + 4))
                      for lo in range(0, 25, 4)])
    assert np.abs(rows - primal).max() < 1e-8
    assert np.abs(primal).max() > 0.1  # not a comparison of zeros


def test_calibration_ranks_ease_in_the_dual_when_users_are_fewer(planted, monkeypatch
                                                                 ) -> None:
    """ease_hit_rate takes the sparse dual when n < m and gives the primal's HR@10."""
    from fedem_private.baselines.models import ease_weights

    wide = generate(SyntheticConfig(n_users=60, n_items=150, n_clusters=3, mean_activity=25,
                                    taste_strength=4.0), seed=5)
    for source in (wide, planted):  # 60 users x 150 items (dual), 300 x 100 (primal)
        split = leave_one_out(source, 0)
        x = cal.training_matrix(split)
        want = cal.hit_rate(split, x @ ease_weights(x, 50.0))
        assert cal.ease_hit_rate(split, 50.0, block=500) == pytest.approx(want, abs=1e-12)
        assert want > 0
    calls = []
    real_dual = cal.ease_dual
    monkeypatch.setattr(cal, "ease_dual", lambda *a, **k: calls.append(1) or real_dual(*a, **k))
    cal.rungs(leave_one_out(wide, 0), 0, 50.0)
    cal.rungs(leave_one_out(planted, 0), 0, 50.0)
    assert calls == [1]  # the wide split only


def test_hit_rate_is_the_projects_full_hr10(planted) -> None:
    """The calibration's numpy HR@10 equals the evaluation room's (ties count against)."""
    from fedem_private import baselines
    from fedem_private.api import resolve_config

    split = leave_one_out(planted, 0)
    cfg = resolve_config({"train": {"seed": 0}, "federation": {"method": "mostpop"}})
    scores = np.floor(np.random.default_rng(2).random((split.n_users, split.n_items)) * 5)
    for s in (scores, scores[0]):
        want = baselines.evaluate(cfg, split, s)["full"]["hr@10"]
        assert cal.hit_rate(split, s) == pytest.approx(want, abs=1e-12)


def test_the_stream_is_appended_last() -> None:
    assert rng.Stream.SYNTHETIC_POP == 25 and list(rng.Stream)[-1] == rng.Stream.SYNTHETIC_POP


# ---------------------------------------------------------------- wiring: a CSV source


@pytest.fixture()
def csv_source(tmp_path, planted, monkeypatch):
    """The planted data as a user,item,timestamp CSV, and a cache folder for the fit."""
    monkeypatch.setenv("FEDEM_PRIVATE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "source.csv"
    rows = zip(planted.users.tolist(), planted.items.tolist(), planted.timestamps.tolist(),
               strict=True)
    path.write_text("user,item,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    return path


def test_load_dataset_draws_the_asked_users_from_a_cached_fit(csv_source, tmp_path) -> None:
    data = load_dataset("synthetic", csv_source, seed=4, calibrate_to="csv", users=120)
    source = load_dataset("csv", csv_source)  # named after the file: "source"
    assert data.n_users == 120 and data.name == "synthetic:source"
    assert data.n_items == source.n_items
    model = calibrated_population("csv", csv_source)
    path = cache_path(source, FitOptions(), tmp_path / "cache" / "populations")
    assert path.is_file() and load_population(path).sha256 == model.sha256
    record = population_record("csv", csv_source, 120)
    assert record["model_sha256"] == model.sha256 and record["users"] == 120
    default = load_dataset("synthetic", csv_source, seed=4, calibrate_to="csv")
    assert default.n_users == source.n_users  # the source's size by default


def test_run_and_baselines_name_the_model(csv_source, tmp_path, capsys) -> None:
    common = ["--dataset", "synthetic", "--calibrate-to", "csv", "--data-dir",
              str(csv_source), "--users", "60", "--no-progress"]
    for method, extra in (("fedmf", ["--rounds", "1", "--local-epochs", "1", "--dim", "4"]),
                          ("mostpop", []), ("ease", [])):
        out = tmp_path / method
        assert main(["run", *common, "--method", method, *extra, "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["n_users"] == 60 and summary["dataset"] == "synthetic:source"
        assert len(summary["population"]["model_sha256"]) == 64
        assert summary["population"]["users"] == 60
    capsys.readouterr()


@pytest.mark.parametrize("argv, needle", [
    (["--calibrate-to", "nonsense"], "not a real dataset"),
    (["--calibrate-to", "synthetic"], "not a real dataset"),
    (["--calibrate-to", "ml-100k", "--data-dir", "/no/such/folder"], "not found"),
    (["--users", "100"], "--calibrate-to too"),
    (["--calibrate-to", "csv", "--data-dir", "SOURCE", "--users", "5"], ">= 10"),
    (["--calibrate-to", "csv", "--data-dir", "SOURCE", "--population-taste", "cubic"],
     "bilinear, max"),
    (["--population-taste", "max"], "--calibrate-to too"),
])
def test_bad_population_flags_are_one_line_exit_2(csv_source, tmp_path, capsys, argv,
                                                  needle) -> None:
    argv = [str(csv_source) if a == "SOURCE" else a for a in argv]
    assert main(["run", "--dataset", "synthetic", *argv, "--rounds", "1", "--no-progress",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err


def test_calibrate_to_needs_dataset_synthetic(csv_source, tmp_path, capsys) -> None:
    assert main(["run", "--dataset", "csv", "--data-dir", str(csv_source), "--calibrate-to",
                 "csv", "--rounds", "1", "--no-progress", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--dataset synthetic" in err


# ---------------------------------------------------------------- the real source


@pytest.mark.slow
def test_ml100k_population_reproduces_its_calibration_targets(ml100k_dir, tmp_path) -> None:
    """Fitted to ML-100K (about 10 s): the calibration's own draws are within 5% of the
    source's MostPop and EASE full HR@10, and 2,000 users draw in well under a second."""
    model = calibrated_population("ml-100k", ml100k_dir, cache_dir=tmp_path)
    assert np.all(np.abs(model.achieved / model.targets - 1) < 0.05)
    data = load_dataset("synthetic", ml100k_dir, seed=0, calibrate_to="ml-100k", users=2000,
                        cache_dir=tmp_path)
    assert data.n_users == 2000 and data.n_items == 1682


def test_the_cells_of_a_study_share_one_draw_of_the_population(csv_source) -> None:
    """issue 66: a calibrated population's split is drawn once per process for the runs
    that share its model, size and seed (a study's cells), and drawn anew otherwise."""
    from fedem_private.experiments.baseline_run import load_split
    from fedem_private.simulation.config import from_dict

    def cfg(seed: int, users: int):
        return from_dict({"data": {"dataset": "synthetic", "calibrate_to": "csv",
                                        "data_dir": str(csv_source), "users": users},
                               "train": {"seed": seed}}).validate().resolved()

    name, first = load_split(cfg(0, 60))
    assert load_split(cfg(0, 60))[1] is first and name == "synthetic:source"
    other = load_split(cfg(1, 60))[1]
    assert other is not first and other.n_users == 60
    again = load_split(cfg(0, 60))[1]  # one population kept: seed 0 is drawn again
    assert again is not first
    assert np.array_equal(again.train_items, first.train_items)
    assert np.array_equal(again.test_items, first.test_items)


def test_the_clip_only_probe_is_the_study_rung_with_a_fixed_multiplier():
    """benchmarks/probes/clip_only.py: the study's private rung, its clip and settings kept,
    eps swapped for the noise multiplier (docs/population.md, PFedRec's DP-FTRL cells)."""
    from benchmarks import population_study as study
    from benchmarks.probes import clip_only

    settings = "benchmarks/results/population/participation/pfedrec-settings.toml"
    name, cfg = clip_only.config("pfedrec", settings, 100_000, 1, "dp-ftrl", 0.01, "data")
    args = study.parse_args(["--epsilons", "4", "--methods", "pfedrec", "--mechanisms",
                             "dp-ftrl", "--settings", f"pfedrec={settings}", "--data-dir",
                             "data", "--no-reference"])
    rung = dict(study.rungs(100_000, 1, args))["pfedrec-dp-ftrl-eps4-seed1"]
    assert name == "pfedrec-dp-ftrl-z0.01-seed1"
    assert "epsilon" not in cfg["privacy"] and cfg["privacy"]["noise_multiplier"] == 0.01
    assert "noise_multiplier" not in rung["privacy"]  # the study's rung is left as it was
    assert {k: v for k, v in cfg.items() if k != "privacy"} == {
        k: v for k, v in rung.items() if k != "privacy"}
    assert cfg["privacy"]["clip"] == rung["privacy"]["clip"] == pytest.approx(4.3633296)


# ------------------------------------------------- a population too large to draw (issue 80)


def test_the_expected_draw_matches_a_real_one(model) -> None:
    """mean_activity is the mean of the activity the draw takes (within 5% on 4,000 users),
    and draw_bytes what the drawn arrays hold, blocks and concatenation counted."""
    data = draw_population(model, 3, 4000)
    assert abs(data.users.shape[0] / 4000 / mean_activity(model) - 1) < 0.05
    held = 2 * (data.items.nbytes + data.timestamps.nbytes) + data.users.nbytes
    assert abs(draw_bytes(model, 4000) / held - 1) < 0.05


def test_a_population_too_large_for_memory_is_refused_before_drawing(
        model, csv_source, tmp_path, capsys, monkeypatch) -> None:
    """--users 10^9 drew for hours before the kernel killed it; now one line, exit 2, naming
    the GiB it needs and the GiB available, and no user is drawn. (The run's population is
    this module's quick fit, not a fit of the CSV: the refusal is what is tested.)"""
    from fedem_private import hostmem
    from fedem_private.data import population

    # the CSV's fit, as this process's cache holds it, is the module's quick fit
    fit = cache_path(load_dataset("csv", csv_source), FitOptions(),
                     tmp_path / "cache" / "populations")
    monkeypatch.setitem(population._FITTED, fit, model)
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 8 * 2**30)

    def no_draw(*args, **kwargs):
        raise AssertionError("drew users before refusing")

    monkeypatch.setattr(population, "draw_users", no_draw)
    assert main(["run", "--dataset", "synthetic", "--calibrate-to", "csv", "--data-dir",
                 str(csv_source), "--users", "1000000000", "--no-progress",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    need = hostmem.gib(draw_bytes(model, 10**9))
    assert "\n" not in err and "--users 1,000,000,000" in err
    assert f"needs about {need}" in err and "8.0 GiB is available" in err
    assert not (tmp_path / "run").exists()
    # where the host's memory is unknown, nothing is refused
    monkeypatch.setattr(hostmem, "available_bytes", lambda: None)
    population.check_draw_fits(model, 10**9)
    # and a population that fits is not refused
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 8 * 2**30)
    population.check_draw_fits(model, 1000)


def test_the_max_taste_is_each_users_best_facet() -> None:
    """(P.2'): max_f z_uf . v_i, the same in numpy and torch; one facet is Z V' (P.2)."""
    import torch

    g = np.random.default_rng(4)
    z, v = g.normal(size=(5, 3 * 4)), g.normal(size=(7, 4))
    want = np.array([[max(z[u, 4 * f:4 * f + 4] @ v[i] for f in range(3)) for i in range(7)]
                     for u in range(5)])
    assert np.allclose(taste_scores(z, v, 3), want)
    assert np.allclose(taste_scores(torch.from_numpy(z), torch.from_numpy(v), 3).numpy(), want)
    assert not np.allclose(want, z[:, :4] @ v.T)  # the max is not the first facet alone
    assert np.allclose(taste_scores(z[:, :4], v, 1), z[:, :4] @ v.T)


def test_a_max_taste_population_fits_draws_and_calibrates(planted) -> None:
    """taste "max": F d-wide tastes per user, drawn users in bounds, (P.4) still met."""
    from dataclasses import replace

    m = fit_population(planted, replace(QUICK, taste="max", facets=3))
    assert m.facets == 3 and m.mix_means.shape[1] == 3 * m.dim
    data = draw_population(m, 2, 50)
    counts = np.bincount(data.users, minlength=50)
    assert counts.min() >= 3 and data.n_items == planted.n_items
    assert np.all(np.abs(m.achieved / m.targets - 1) < 0.25)
    again = FitOptions(**options_record(m.options))  # what the model file keeps
    assert again.taste == "max" and again.facets == 3


def test_the_bilinear_models_hash_and_cache_key_ignore_the_taste_option(planted, tmp_path
                                                                        ) -> None:
    """A bilinear fit's options record has no taste fields (its hash and cache key are
    those fitted before the option existed); a max fit's has, so its key differs."""
    from dataclasses import asdict

    record = options_record(FitOptions())
    assert "taste" not in record and "facets" not in record
    assert set(record) == set(asdict(FitOptions())) - {"taste", "facets"}
    assert options_record(FitOptions(taste="max"))["taste"] == "max"
    keys = {cache_path(planted, FitOptions(taste=t), tmp_path) for t in ("bilinear", "max")}
    assert len(keys) == 2
    with pytest.raises(UserError, match="taste must be one of"):
        FitOptions(taste="cubic").validate()


def test_the_fidelity_probes_gini_and_dp_mostpop_choice() -> None:
    """benchmarks/probes/fidelity.py: Gini 0 for equal counts, (m - 1) / m for one item
    holding all; DP-MostPop's k the best validation (the first name on a tie)."""
    from benchmarks.probes.fidelity import best_dp_mostpop, gini

    assert gini(np.full(10, 3)) == pytest.approx(0.0)
    assert gini(np.array([0] * 9 + [5])) == pytest.approx(0.9)
    rows = {"dp-mostpop-k10-eps4": {"val": 0.02}, "dp-mostpop-k25-eps4": {"val": 0.03},
            "dp-mostpop-k50-eps4": {"val": 0.03}, "dp-mostpop-k25-eps1": {"val": 0.09},
            "mostpop": {"val": None}}
    assert best_dp_mostpop(rows) == "dp-mostpop-k25-eps4"


def test_the_population_study_names_the_taste_only_when_not_bilinear() -> None:
    from benchmarks import population_study as study

    common = ["--users", "1000", "--epsilons", "4", "--methods", "fedmf"]
    plain = study.rungs(1000, 0, study.parse_args(common))
    maxed = study.rungs(1000, 0, study.parse_args([*common, "--taste", "max"]))
    assert all("population_taste" not in cfg["data"] for _, cfg in plain)
    assert all(cfg["data"]["population_taste"] == "max" for _, cfg in maxed)
