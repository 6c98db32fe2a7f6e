"""Non-federated baselines selected like methods (docs/design.md section 14, issue 42)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

import fedem_private as fp
from fedem_private import baselines
from fedem_private.baselines.models import ease_weights, interaction_matrix
from fedem_private.baselines.popularity import mostpop_scores, tiebreak, train_counts
from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.errors import UserError
from fedem_private.evaluation.metrics import RankAccumulator
from fedem_private.experiments.runner import prepare
from fedem_private.simulation.config import (
    BASELINE_METHODS,
    RunConfig,
    from_dict,
    identity_dict,
)

SYN = {"n_users": 60, "n_items": 80, "mean_activity": 12}
HAS_IMPLICIT = importlib.util.find_spec("implicit") is not None


def _cfg(method: str, **sections) -> dict:
    cfg = {"data": {"synthetic": SYN}, "federation": {"method": method}}
    cfg.update(sections)
    return cfg


def _split(seed: int = 0):
    return leave_one_out(generate(SyntheticConfig(**SYN), seed), seed)


def test_every_baseline_name_has_a_registered_fit():
    assert set(baselines.REGISTRY) == set(BASELINE_METHODS)


def test_mostpop_ranks_by_training_count_and_breaks_ties_only():
    sp = _split()
    counts = train_counts(sp)
    scores = mostpop_scores(sp, seed=0)
    assert np.array_equal(counts, np.bincount(sp.train_items, minlength=sp.n_items))
    jitter = tiebreak(sp.n_items, 0)
    assert ((0 <= jitter) & (jitter < 0.5)).all()
    # distinct counts keep their order; equal counts are ordered, not tied
    i, j = np.nonzero(counts[:, None] > counts[None, :])
    assert (scores[i] > scores[j]).all()
    assert len(np.unique(scores)) == sp.n_items


def test_baseline_is_scored_on_the_federated_runs_evaluation_sets():
    """The same scores give the same metrics through baselines.evaluate and through the
    RankAccumulator over a federated Simulation's own evaluation sets."""
    cfg = from_dict(_cfg("fedmf", train={"seed": 4})).validate().resolved()
    sim = prepare(cfg)
    scores = np.random.default_rng(0).standard_normal((sim.split.n_users, sim.split.n_items))
    acc = RankAccumulator(sim.split.n_users)
    acc.add_scores(np.arange(sim.split.n_users), torch.from_numpy(scores), sim.eval_sets)
    mp = from_dict(_cfg("mostpop", train={"seed": 4})).validate().resolved()
    assert baselines.evaluate(mp, sim.split, scores) == acc.result()


def test_ease_weights_solve_the_constrained_least_squares():
    """KKT conditions of min ||X - XB||^2 + lambda ||B||^2 s.t. diag(B) = 0 (Steck 2019):
    (X'X + lambda I) B - X'X is zero off the diagonal, and diag(B) = 0."""
    x = interaction_matrix(_split())
    lam = 7.0
    b = ease_weights(x, lam)
    g = x.T @ x
    resid = (g + lam * np.eye(len(g))) @ b - g
    off = ~np.eye(len(g), dtype=bool)
    assert np.abs(np.diag(b)).max() == 0.0
    assert np.abs(resid[off]).max() < 1e-8 * max(1.0, np.abs(g).max())
    # a larger lambda shrinks the weights
    assert np.abs(ease_weights(x, 70.0)).sum() < np.abs(b).sum()


@pytest.mark.parametrize("method", [m for m in BASELINE_METHODS
                                    if m != "als" or HAS_IMPLICIT])
def test_baseline_run_directory_reads_like_a_federated_run(method, tmp_path):
    extra = {"baseline": {"epochs": 2}} if method == "centralised" else {}
    res = fp.run(_cfg(method, **extra), out=tmp_path / method)
    assert res.summary["method"] == method and res.summary["rounds"] == 0
    for kind in ("sampled", "full"):
        for metric in ("hr@10", "ndcg@10"):
            assert 0.0 <= res.summary["metrics"][kind][metric] <= 1.0
    assert list(res.metrics["round"]) == [0]
    row = fp.load_results(tmp_path).iloc[0]
    assert row["method"] == method and row["variant"] == method
    assert row["hr10_full"] == pytest.approx(res.summary["metrics"]["full"]["hr@10"])
    if method == "dp-mostpop":
        assert row["eps_target"] == 1.0 and row["mode"] == "central-gaussian"
        assert row["eps_reported"] <= 1.0 and bool(row["guarantee"])
    else:
        assert row["mode"] == "none" and math.isinf(row["eps_target"])


def test_models_beat_chance_on_clustered_data(tmp_path):
    """On the synthetic clustered tastes, popularity, EASE and a few epochs of pooled MF
    rank the held-out item above random ranking (sampled HR@10 of chance: 10/100)."""
    for method in ("mostpop", "ease", "centralised"):
        extra = {"baseline": {"epochs": 5}} if method == "centralised" else {}
        res = fp.run(_cfg(method, **extra), out=tmp_path / method)
        assert res.summary["metrics"]["sampled"]["hr@10"] > 0.2, method


@pytest.mark.skipif(not HAS_IMPLICIT, reason="the implicit library is not installed "
                    "(pip install 'fedem-private[baselines]')")
def test_als_is_seeded_and_deterministic(tmp_path):
    a = fp.run(_cfg("als"), out=tmp_path / "a").summary["metrics"]
    b = fp.run(_cfg("als"), out=tmp_path / "b").summary["metrics"]
    assert a == b


def test_baseline_config_refusals():
    with pytest.raises(UserError, match="does not apply"):
        from_dict(_cfg("mostpop", privacy={"mode": "ldp-laplace", "epsilon": 1.0})).validate()
    with pytest.raises(UserError, match="--aggregation"):
        from_dict({"federation": {"method": "ease", "aggregation": "fedavg"}}).validate()
    with pytest.raises(UserError, match=r"\[baseline\] settings"):
        from_dict({"baseline": {"k": 5}}).validate()
    with pytest.raises(UserError, match="architecture"):
        from_dict(_cfg("dp-mostpop", baseline={"architecture": "shuffle"})).validate()
    with pytest.raises(UserError, match="epsilon"):
        from_dict(_cfg("dp-mostpop", baseline={"epsilon": 0.0})).validate()


def test_default_baseline_section_leaves_a_federated_configs_identity_alone():
    ident = identity_dict(RunConfig().validate().resolved())
    assert "baseline" not in ident
    changed = identity_dict(from_dict(_cfg("dp-mostpop", baseline={"k": 3})))
    assert changed["baseline"] == {"k": 3}


def test_a_sweep_and_its_report_take_baselines_as_variants(tmp_path):
    from fedem_private.experiments.report import write_report
    from fedem_private.experiments.sweep import run_sweep

    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nvariants = ["mostpop", "dp-mostpop", "ease"]\n'
                    'privacy = ["none"]\nseeds = [0]\n\n'
                    "[base.data.synthetic]\nn_users = 40\nn_items = 60\nmean_activity = 8\n")
    run_sweep(str(spec), str(tmp_path / "out"), jobs=1)
    table = fp.load_results(tmp_path / "out")
    assert sorted(table["variant"]) == ["dp-mostpop", "ease", "mostpop"]
    assert table["hr10_sampled"].notna().all()
    write_report(str(tmp_path / "out"), str(tmp_path / "rep"))
    assert "mostpop" in (tmp_path / "rep" / "report.md").read_text()
    # the ladder's combined report names the results.csv files it read, not the temporary
    # copies it passes on (their names changed at every regeneration)
    from benchmarks.ladder import combined_report

    ladder = tmp_path / "ladder"
    (ladder / "tiny").mkdir(parents=True)
    (ladder / "tiny" / "results.csv").write_text((tmp_path / "rep" / "results.csv").read_text())
    combined_report(ladder, ["tiny"], tmp_path / "no-headline.csv")
    header = (ladder / "report" / "report.md").read_text().splitlines()[2]
    assert header.startswith(f"3 runs from `{(ladder / 'tiny' / 'results.csv').as_posix()}`;")
    assert "part0.csv" not in header


def test_ladder_chance_is_the_mean_over_every_rank():
    from benchmarks.ladder import expected_random
    from fedem_private.evaluation.metrics import hr_ndcg

    for n in (3, 10, 12, 100):
        exact = hr_ndcg(torch.arange(n), ks=(10,))  # every rank once: the uniform mean
        hr, ndcg = expected_random(np.array([n]))
        assert hr == pytest.approx(exact["hr@10"], abs=1e-12)
        assert ndcg == pytest.approx(exact["ndcg@10"], abs=1e-12)
    hr, _ = expected_random(np.array([20, 100]))
    assert hr == pytest.approx((10 / 20 + 10 / 100) / 2)


def test_ladder_plans_each_federated_method_and_its_private_rungs():
    """PFedRec+EM is PFedRec with the elastic merge; fixed-in-advance private rungs exist for
    each method asked for, at every eps, with FedMF's run names unchanged; every config
    validates."""
    from benchmarks.ladder import PRIVATE_EPSILONS, private_rungs, rungs

    plan = rungs("synthetic", "", [0], 5, {}, ("pfedrec", "pfedrec-em"))
    fed = {name: cfg for _, name, cfg in plan if name.startswith("pfedrec")}
    assert fed["pfedrec-em-seed0"]["federation"] == {"method": "pfedrec", "merge": "em"}
    assert fed["pfedrec-seed0"]["federation"] == {"method": "pfedrec"}
    private = private_rungs("synthetic", "", [0], [], ["cdp-gaussian"], None,
                            ("fedmf", "pfedrec"))
    names = [name for _, name, _ in private]
    assert names[: len(PRIVATE_EPSILONS)] == [f"fedmf-cdp-gaussian-eps{e:g}-seed0"
                                              for e in PRIVATE_EPSILONS]
    assert len(names) == 2 * len(PRIVATE_EPSILONS)
    for label, _, cfg in private + [r for r in plan if r[1].startswith("pfedrec")]:
        cfg = {**cfg, "data": {"dataset": "synthetic"}}
        from_dict(cfg).validate()
        assert ("PFedRec" in label) == (cfg["federation"]["method"] == "pfedrec")


def test_ladder_runs_tuned_private_rungs_at_the_asked_epsilons_only(tmp_path):
    """``--epsilons 4`` restricts the tuned private rungs as it does the fixed-in-advance
    ones (so a long grid can run eps 4 first); each rung runs the tuned config at its own
    eps and says which eps it was tuned at."""
    from benchmarks.ladder import private_rungs

    best = tmp_path / "best.toml"
    best.write_text('[data]\ndataset = "synthetic"\n[federation]\nmethod = "pfedrec"\n'
                    '[privacy]\nmode = "cdp-gaussian"\nepsilon = 4.0\n')
    private = private_rungs("synthetic", "", [0, 1], [("cdp-gaussian", str(best))],
                            ["cdp-gaussian"], None, (), (4.0,))
    assert [name for _, name, _ in private] == [
        f"pfedrec-cdp-gaussian-tuned-eps4-seed{s}" for s in (0, 1)]
    assert all(cfg["privacy"]["epsilon"] == 4.0 for _, _, cfg in private)
    assert all("val-tuned at eps 4" in label for label, _, _ in private)
    wider = private_rungs("synthetic", "", [0], [("cdp-gaussian", str(best))],
                          ["cdp-gaussian"], None, (), (1.0, 16.0))
    assert [cfg["privacy"]["epsilon"] for _, _, cfg in wider] == [1.0, 16.0]
    # a second study of the same method and mode gets rungs (and runs) of its own
    both = private_rungs("synthetic", "", [0], [("cdp-gaussian", str(best)),
                                                ("cdp-gaussian:stage2", str(best))],
                         ["cdp-gaussian"], None, (), (4.0,))
    assert [name for _, name, _ in both] == ["pfedrec-cdp-gaussian-tuned-eps4-seed0",
                                             "pfedrec-stage2-cdp-gaussian-tuned-eps4-seed0"]
    assert both[1][0] == "PFedRec cdp-gaussian eps 4 (val-tuned at eps 4, stage2)"


def test_ladder_names_a_narrow_state_in_the_rung_and_its_run():
    """A bfloat16-state federated rung has its own label and run directory (never a float32
    run's), the setting reaches train.state_dtype, and the other methods keep their names."""
    from benchmarks.ladder import rungs

    plain = {name: (label, cfg) for label, name, cfg in rungs("synthetic", "", [0], 5, {},
                                                              ("fedem",))}
    narrow = {name: (label, cfg) for label, name, cfg in rungs("synthetic", "", [0], 5, {},
                                                               ("fedmf", "fedem"), ("fedem",))}
    assert plain["fedem-seed0"][0] == "FedEM (5 rounds)"
    assert "fedem-seed0" not in narrow
    assert narrow["fedmf-seed0"][0] == "FedMF (5 rounds)"
    assert narrow["fedmf-seed0"][1]["train"]["state_dtype"] == "float32"
    label, cfg = narrow["fedem-bfloat16-seed0"]
    assert label == "FedEM (5 rounds, bfloat16 state)"
    assert cfg["train"]["state_dtype"] == "bfloat16"
    from_dict({**cfg, "data": {"dataset": "synthetic"}}).validate()


def test_tuned_label_names_the_chosen_merge_and_a_narrow_state():
    from benchmarks.ladder import tuned_label

    assert tuned_label({"federation": {"method": "fedmf"}}) == ("FedMF", "fedmf")
    assert tuned_label({"federation": {"method": "fedem", "merge": "dm",
                                       "aggregation": "fedavg"}}) == (
        "FedEM [dm, fedavg]", "fedem-dm-fedavg")
    assert tuned_label({"federation": {"method": "fedmf"},
                        "train": {"state_dtype": "bfloat16"}}) == (
        "FedMF (bfloat16 state)", "fedmf-bfloat16")
    assert tuned_label({"federation": {"method": "fedmf"},
                        "train": {"state_dtype": "float32"}}) == ("FedMF", "fedmf")


def test_ladder_reads_an_earlier_checkouts_rungs_from_its_results_csv(tmp_path):
    """A rung whose run directory is gone (runs/ is not committed) is read from the
    committed results.csv row; a run directory here supersedes that row."""
    import json

    import pandas as pd

    from benchmarks.ladder import METRICS, _finished, recorded

    out, runs = tmp_path / "out", tmp_path / "runs"
    assert recorded(out, "d") == {}
    (out / "d").mkdir(parents=True)
    row = {"run": "mostpop-seed0", "eps_reported": float("nan"), "seconds_total": 2.0,
           **{m: 0.1 * (i + 1) for i, m in enumerate(METRICS)}}
    pd.DataFrame([row, {**row, "run": "dp-seed0", "eps_reported": 4.0}]).to_csv(
        out / "d" / "results.csv", index=False)
    rows = recorded(out, "d")
    got = _finished(runs, "mostpop-seed0", rows)
    assert got is not None and got["eps"] is None and got["seconds"] == 2.0
    assert [got[m] for m in METRICS] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert _finished(runs, "dp-seed0", rows)["eps"] == 4.0
    assert _finished(runs, "absent-seed0", rows) is None
    (runs / "mostpop-seed0").mkdir(parents=True)  # a run here wins over the row
    metrics = {"sampled": {"hr@10": 0.5, "ndcg@10": 0.6}, "full": {"hr@10": 0.7,
                                                                    "ndcg@10": 0.8}}
    (runs / "mostpop-seed0" / "summary.json").write_text(json.dumps(
        {"metrics": metrics, "seconds_total": 3.0}))
    here = _finished(runs, "mostpop-seed0", rows)
    assert [here[m] for m in METRICS] == [0.5, 0.6, 0.7, 0.8] and here["seconds"] == 3.0


def test_ladder_reads_the_baselines_validation_choices_back_from_recorded_rows():
    """Without the grids' run directories (--no-tune, or a fresh checkout) the tuned
    baseline rungs keep the choice an earlier checkout recorded; a value left out of the
    row (equal to the config default) reads as the default, typed as the grid's."""
    from benchmarks.ladder import recorded_tuning

    nan = float("nan")
    rows = {"als-tuned-seed0": {"cfg.baseline.als_factors": 32.0,
                                "cfg.baseline.als_regularization": 1.0,
                                "cfg.baseline.als_alpha": 10.0},
            "ease-tuned-seed0": {"cfg.baseline.ease_lambda": nan},
            "centralised-tuned-seed1": {"cfg.train.lr": 0.001, "cfg.baseline.epochs": 50.0}}
    got = recorded_tuning(rows, 0)
    assert got == {"als": {"baseline.als_factors": 32, "baseline.als_regularization": 1.0,
                           "baseline.als_alpha": 10.0},
                   "ease": {"baseline.ease_lambda": 500.0}}
    assert isinstance(got["als"]["baseline.als_factors"], int)
    assert recorded_tuning(rows, 1) == {"centralised": {"train.lr": 0.001,
                                                        "baseline.epochs": 50}}


def test_ladder_table_gets_the_recorded_rows_whether_or_not_the_grids_ran(tmp_path,
                                                                           monkeypatch):
    """The validation grids' own rows never stand in for the recorded results.csv rows the
    table reads (they once shared a name); without the grids the recorded choices stand."""
    import pandas as pd

    import benchmarks.ladder as ladder

    out, runs = tmp_path / "out", tmp_path / "runs"
    (out / "synthetic").mkdir(parents=True)
    pd.DataFrame([{"run": "ease-tuned-seed0", "cfg.baseline.ease_lambda": 50.0,
                   **{m: 0.1 for m in ladder.METRICS}}]).to_csv(out / "synthetic" / "results.csv",
                                                                 index=False)
    (runs / "synthetic" / "tune").mkdir(parents=True)
    seen = []
    monkeypatch.setattr(ladder, "tune", lambda *a: ({"baseline.ease_lambda": 50.0},
                                                    [("ease_lambda=10", 0.5, 0.3, 0.1)]))
    monkeypatch.setattr(ladder, "table", lambda *a: seen.append((a[4], a[5])) or "table\n")
    base = ["--dataset", "synthetic", "--data-dir", str(tmp_path), "--runs", str(runs), "--out",
            str(out), "--only", "table", "--seeds", "0"]
    assert ladder.main(base) == 0
    assert ladder.main([*base, "--no-tune"]) == 0
    (with_grids, rows), (without, rows_again) = seen
    assert set(rows) == set(rows_again) == {"ease-tuned-seed0"}
    labels = {label for label, _, _ in with_grids}
    assert "EASE (val-tuned: ease_lambda=50)" in labels  # the grid here ran and chose 50
    assert "EASE (val-tuned: ease_lambda=50)" in {label for label, _, _ in without}
    assert (out / "synthetic-tuning.md").read_text().count("ease_lambda=10") >= 1


def test_ladder_grid_chooses_by_sampled_or_full_validation(tmp_path, monkeypatch):
    """--select-by full ranks the grid by the validation item ranked among every item:
    the two objectives can choose different settings (as on LastFM-2K)."""
    import benchmarks.ladder as ladder

    monkeypatch.setitem(ladder.GRIDS, "ease", {"baseline.ease_lambda": (10.0, 50.0)})
    val = {10.0: (0.9, 0.01), 50.0: (0.8, 0.05)}  # lambda: (sampled, full) val HR@10

    def fake(path, cfg):
        sampled, full = val[cfg["baseline"]["ease_lambda"]]
        return {"metrics": {"val": {"hr@10": sampled, "ndcg@10": sampled / 2},
                            "val_full": {"hr@10": full}}}

    monkeypatch.setattr(ladder, "ensure", fake)
    best, rows = ladder.tune(tmp_path, "d", "x", "ease", 0)
    assert best == {"baseline.ease_lambda": 10.0}
    assert rows == [("ease_lambda=10", 0.9, 0.45, 0.01), ("ease_lambda=50", 0.8, 0.4, 0.05)]
    assert ladder.tune(tmp_path, "d", "x", "ease", 0, "full")[0] == {
        "baseline.ease_lambda": 50.0}


def test_ladder_runs_only_the_named_grids_and_keeps_the_others(tmp_path, monkeypatch):
    """--grids centralised runs that grid alone: EASE keeps its recorded choice, and the
    tuning file keeps EASE's earlier section beside centralised's new one."""
    import pandas as pd

    import benchmarks.ladder as ladder

    out, runs = tmp_path / "out", tmp_path / "runs"
    (out / "synthetic").mkdir(parents=True)
    pd.DataFrame([{"run": "ease-tuned-seed0", "cfg.baseline.ease_lambda": 50.0,
                   **{m: 0.1 for m in ladder.METRICS}}]).to_csv(out / "synthetic" / "results.csv",
                                                                 index=False)
    (out / "synthetic-tuning.md").write_text("### ease (seed 0; chosen: ease_lambda=50)\n\nold\n")
    (runs / "synthetic" / "tune").mkdir(parents=True)
    called, seen = [], []
    monkeypatch.setattr(ladder, "tune", lambda runs, d, dd, method, seed, by: (
        called.append((method, by)) or ({"train.lr": 0.01, "baseline.epochs": 5},
                                         [("lr=0.01,epochs=5", 0.5, 0.3, 0.2)])))
    monkeypatch.setattr(ladder, "table", lambda *a: seen.append(a[4]) or "table\n")
    assert ladder.main(["--dataset", "synthetic", "--data-dir", str(tmp_path), "--runs", str(runs),
                        "--out", str(out), "--only", "table", "--seeds", "0",
                        "--grids", "centralised", "--select-by", "full"]) == 0
    assert called == [("centralised", "full")]
    labels = {label for label, _, _ in seen[0]}
    assert "EASE (val-tuned: ease_lambda=50)" in labels
    assert "Centralised MF (val-tuned: lr=0.01,epochs=5)" in labels
    text = (out / "synthetic-tuning.md").read_text()
    assert text.index("### ease") < text.index("### centralised")
    assert "old" in text and "chosen by full validation HR@10" in text


def test_a_grid_that_chooses_anew_drops_the_recorded_rows_of_the_old_choice():
    """A recorded tuned rung measured the old choice: when the grid here chooses another
    setting its rows go (and the rungs run again); an unchanged choice keeps them."""
    from benchmarks.ladder import stale_tuned_rows_dropped

    rows = {f"{m}-tuned-seed{s}": {} for m in ("ease", "als") for s in (0, 1)}
    rows["ease-seed0"] = {}
    recorded = {"ease": {"baseline.ease_lambda": 500.0}, "als": {"baseline.als_alpha": 1.0}}
    kept = stale_tuned_rows_dropped(rows, recorded, {"ease": {"baseline.ease_lambda": 50.0},
                                                     "als": {"baseline.als_alpha": 1.0}})
    assert set(kept) == {"als-tuned-seed0", "als-tuned-seed1", "ease-seed0"}
    assert stale_tuned_rows_dropped(rows, recorded, {}) == rows


def test_a_recorded_row_of_another_setting_does_not_stand_for_its_rung(tmp_path):
    """A tuned file changed since a rung's row was recorded (a study found a new best):
    the row, read back from results.csv as a fresh checkout reads it, is dropped with the
    keys that differ; the same setting keeps it, and a column the row was written without
    (empty there) is no difference."""
    import pandas as pd

    from benchmarks.ladder import recorded, stale_recorded_rows_dropped
    from fedem_private.api import resolve_config
    from fedem_private.experiments.results import config_columns

    cfg = {"data": {"dataset": "synthetic"}, "federation": {"method": "fedem", "merge": "sm"},
           "train": {"lr": 0.0512837168758, "dim": 32, "seed": 0, "state_dtype": "bfloat16"}}
    old = {"run": "fedem-tuned-seed0", **config_columns(resolve_config(cfg))}
    older = {**old, "run": "fedem-tuned-seed1", "cfg.train.lr": None}  # column absent then
    (tmp_path / "d").mkdir()
    pd.DataFrame([old, older]).to_csv(tmp_path / "d" / "results.csv", index=False)
    rows = recorded(tmp_path, "d")
    seed1 = {**cfg, "train": {**cfg["train"], "seed": 1}}
    plan = [("FedEM", "fedem-tuned-seed0", cfg), ("FedEM", "fedem-tuned-seed1", seed1)]
    assert stale_recorded_rows_dropped(rows, plan) == (rows, [])
    new = {**cfg, "train": {**cfg["train"], "lr": 0.064, "dim": 16}}
    kept, stale = stale_recorded_rows_dropped(rows, [("FedEM", "fedem-tuned-seed0", new)])
    assert set(kept) == {"fedem-tuned-seed1"}
    assert stale == ["fedem-tuned-seed0 (train.dim, train.lr)"]
    # the row without an lr column still differs on dim
    new1 = {**new, "train": {**new["train"], "seed": 1}}
    _, stale = stale_recorded_rows_dropped(rows, [("FedEM", "fedem-tuned-seed1", new1)])
    assert stale == ["fedem-tuned-seed1 (train.dim)"]


def test_dp_mostpop_local_refuses_an_infinite_epsilon():
    with pytest.raises(UserError, match="finite epsilon"):
        from_dict(_cfg("dp-mostpop", baseline={"architecture": "local",
                                                "epsilon": float("inf")})).validate()
    from_dict(_cfg("dp-mostpop", baseline={"architecture": "central",
                                            "epsilon": float("inf")})).validate()


@pytest.mark.slow
def test_ladder_floor_and_ceiling_on_ml100k(ml100k_dir, tmp_path):
    """On the real ML-100K (strict, seed 0): MostPop and EASE read as pinned, and EASE sits
    far above MostPop. The pins moved when the split's tie-break was keyed by source ids
    (issue 65; 262 of 943 test items changed): MostPop sampled 0.3881 -> 0.4104, full
    0.0774 -> 0.0764, EASE sampled 0.6501 -> 0.6532 (over seeds 0-5 MostPop's sampled
    HR@10 ranged 0.388-0.425 before and 0.400-0.425 after: seed-to-seed noise).
    benchmarks/results/ladder/ml-100k.md still has the old split's figures."""
    out = {}
    for method in ("mostpop", "ease"):
        cfg = {"data": {"dataset": "ml-100k", "data_dir": str(ml100k_dir)},
               "federation": {"method": method}}
        out[method] = fp.run(cfg, out=tmp_path / method).summary["metrics"]
    assert out["mostpop"]["sampled"]["hr@10"] == pytest.approx(0.4104, abs=1e-4)
    assert out["mostpop"]["full"]["hr@10"] == pytest.approx(0.0764, abs=1e-4)
    assert out["ease"]["sampled"]["hr@10"] == pytest.approx(0.6532, abs=1e-4)
    assert out["ease"]["full"]["hr@10"] > 1.5 * out["mostpop"]["full"]["hr@10"]


def test_ladder_refuses_unrunnable_rungs_before_running_any(tmp_path, capsys):
    """FedEM's preset (similarity aggregation, learned merge) cannot run under
    cdp-gaussian or, without adapter steps, ldp-dpsgd: the ladder says so in one line per
    reason and exits 2 before any rung runs, instead of a traceback part way."""
    import benchmarks.ladder as ladder

    runs = tmp_path / "runs"
    code = ladder.main(["--dataset", "synthetic", "--data-dir", str(tmp_path), "--runs",
                        str(runs), "--out", str(tmp_path / "out"), "--only", "private",
                        "--no-tune", "--seeds", "0", "--private-methods", "fedmf", "fedem"])
    assert code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "cannot run" in line]
    assert len(lines) == 2
    assert "aggregation 'similarity'" in lines[0] and "fedem-cdp-gaussian-eps1-seed0" in lines[0]
    assert "--dpsgd-adapter-steps" in lines[1]
    assert not runs.exists() or not any(runs.rglob("summary.json"))
    assert ladder.unrunnable([("ok", {"data": {"dataset": "synthetic"}})]) == []
