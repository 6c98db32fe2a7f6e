"""The report's ladder (fedem_private.experiments.floors): which rows are references, floors
and models, and the verdict of a private point against DP-MostPop of its relation."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedem_private.experiments import floors


def _row(variant, mode, eps, mean, std, n=3, dataset="d", protocol="strict"):
    return {"dataset": dataset, "protocol": protocol, "variant": variant, "mode": mode,
            "eps_target": eps, "hr10_full_mean": mean, "hr10_full_std": std,
            "hr10_sampled_mean": mean * 5, "hr10_sampled_std": std, "n_seeds": n}


def _agg(*rows):
    return pd.DataFrame([_row(*r) for r in rows])


def test_parts_split_references_floors_and_models():
    agg = _agg(("mostpop", "none", math.inf, 0.08, 0.0), ("ease [ease_lambda=500]", "none",
               math.inf, 0.14, 0.0), ("dp-mostpop", "central-gaussian", 4.0, 0.08, 0.0),
               ("fedmf", "cdp-gaussian", 4.0, 0.05, 0.0), ("fedem-em", "none", math.inf, 0.01,
                                                           0.0))
    assert list(floors.part(agg, "references")["variant"]) == ["mostpop",
                                                               "ease [ease_lambda=500]"]
    assert list(floors.part(agg, "floors")["variant"]) == ["dp-mostpop"]
    assert list(floors.part(agg, "models")["variant"]) == ["fedmf", "fedem-em"]
    with pytest.raises(ValueError):
        floors.part(agg, "ceilings")


@pytest.mark.parametrize(("model", "expected"), [
    (0.10, "beats"),         # 0.02 above, 2 SE = 2 * sqrt(2 * 0.005^2 / 3) = 0.0082
    (0.06, "below"),
    (0.084, "within noise"),
])
def test_verdict_needs_two_standard_errors(model, expected):
    agg = _agg(("dp-mostpop", "central-gaussian", 4.0, 0.08, 0.005),
               ("fedmf", "cdp-gaussian", 4.0, model, 0.005))
    row = floors.part(agg, "models").iloc[0]
    assert floors.verdict(row, floors.part(agg, "floors")).startswith(expected)


def test_verdict_compares_only_the_same_relation_and_epsilon():
    agg = _agg(("dp-mostpop", "central-gaussian", 4.0, 0.01, 0.001),  # another relation
               ("dp-mostpop", "ldp-interaction-laplace", 16.0, 0.01, 0.001),  # another eps
               ("fedmf", "ldp-dpsgd", 4.0, 0.05, 0.001),
               ("fedmf", "none", math.inf, 0.06, 0.001),
               ("fedmf", "paper", 4.0, 0.05, 0.001))
    fl = floors.part(agg, "floors")
    models = floors.part(agg, "models")
    dpsgd, none, paper = (models.iloc[i] for i in range(3))
    assert floors.verdict(dpsgd, fl).startswith("– (no interaction-local DP-MostPop at ε=4")
    assert floors.verdict(none, fl) == "–"
    assert floors.verdict(paper, fl) == "–"  # no guarantee, so no floor


@pytest.mark.parametrize(("protocol", "judged"), [
    ("strict+bestval", True), ("strict+bestvalfull", True),  # round chosen on validation
    ("strict+besttest", False),  # chosen on the test: not comparable
    ("strict+sharedneg", False),  # another evaluation
])
def test_a_run_whose_round_validation_chose_meets_its_protocols_floor(protocol, judged):
    """A tuned run reports the round its validation item chose, sampled (+bestval) or
    ranked in full (+bestvalfull); both meet the floors of the plain protocol."""
    agg = _agg(("dp-mostpop", "central-gaussian", 4.0, 0.08, 0.001),
               ("pfedrec", "cdp-gaussian", 4.0, 0.06, 0.001, 3, "d", protocol))
    row = floors.part(agg, "models").iloc[0]
    got = floors.verdict(row, floors.part(agg, "floors"))
    assert got.startswith("below (central 0.080)") if judged else got.startswith("– (no")
    assert floors.comparable("strict+bestvalfull+agg10") == "strict+agg10"


def test_one_seed_is_not_judged_beyond_noise():
    agg = _agg(("dp-mostpop", "ldp-oue", 1.0, 0.01, math.nan, 1),
               ("fedmf", "ldp-laplace", 1.0, 0.05, math.nan, 1))
    row = floors.part(agg, "models").iloc[0]
    assert floors.verdict(row, floors.part(agg, "floors")).startswith("above, one seed")


def test_report_writes_the_verdict_column_and_the_ladder(tmp_path):
    from fedem_private.experiments.report import results_table

    agg = _agg(("mostpop", "none", math.inf, 0.08, 0.001),
               ("dp-mostpop", "central-gaussian", 4.0, 0.08, 0.005),
               ("fedmf", "cdp-gaussian", 4.0, 0.10, 0.005))
    for c in ("ndcg10_full", "ndcg10_sampled", "eps_reported", "seconds_per_round"):
        agg[f"{c}_mean"], agg[f"{c}_std"] = 0.0, 0.0
    agg["audit"] = ""
    text = results_table(agg, [])
    assert "vs DP-MostPop" in text
    assert "beats (central 0.080)" in text
    rows = floors.ladder_table(agg, 0.006)
    assert [r[0] for r in rows] == ["chance (random ranking, ≈)", "mostpop"]


def test_sweep_references_run_the_matched_floor_at_each_epsilon_and_report_it(tmp_path):
    """``[sweep] references``: mostpop once, dp-mostpop at (matched architecture, eps) of
    every private mode and finite eps; the report judges the private points against it."""
    from fedem_private.experiments.report import write_report
    from fedem_private.experiments.sweep import run_sweep
    from fedem_private.experiments.sweep_spec import grid, load_spec

    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nmethods = ["fedmf"]\nprivacy = ["ldp-dpsgd", "cdp-gaussian"]\n'
                    'epsilons = [inf, 4]\nseeds = [0, 1]\n'
                    'references = ["mostpop", "dp-mostpop"]\n\n'
                    "[base.train]\nrounds = 2\n\n"
                    "[base.data.synthetic]\nn_users = 40\nn_items = 60\nmean_activity = 8\n")
    floors_run = {(p.config.baseline.architecture, p.config.baseline.epsilon)
                  for p in grid(load_spec(str(spec))) if p.variant == "dp-mostpop"}
    assert floors_run == {("interaction-local", 4.0), ("central", 4.0)}
    run_sweep(str(spec), str(tmp_path / "out"), jobs=1)
    write_report(str(tmp_path / "out"), str(tmp_path / "rep"))
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "vs DP-MostPop" in text and "The ladder without privacy" in text
    assert "interaction-local 0." in text and "central 0." in text  # both judged
    # issue 67: the second pass resumes every point, the references included
    assert run_sweep(str(spec), str(tmp_path / "out"), jobs=1) == 0
    from fedem_private.experiments.sweep import point_state

    for p in grid(load_spec(str(spec))):
        assert point_state(tmp_path / "out" / p.name, p.digest(False), ()) == "done", p.name


def test_beating_a_floor_at_chance_is_not_a_finding():
    agg = _agg(("dp-mostpop", "ldp-oue", 1.0, 0.003, 0.001),
               ("fedmf", "ldp-laplace", 1.0, 0.0065, 0.001))
    row = floors.part(agg, "models").iloc[0]
    fl = floors.part(agg, "floors")
    assert floors.verdict(row, fl).startswith("beats")
    assert floors.verdict(row, fl, chance=0.006).startswith("at chance")
    assert floors.verdict(row, fl, chance=0.001).startswith("beats")


def test_combining_old_tables_keeps_runs_that_differ_only_in_a_setting():
    """Rows without a config_id (older tables) are the same run only when their settings
    agree too: a baseline with fixed and with tuned settings stays two runs."""
    from fedem_private.experiments.results import combine

    def row(lr, hr, config_id=None):
        out = {"run": "centralised-seed0", "dataset": "d", "method": "centralised",
               "variant": "centralised", "protocol": "strict", "mode": "none",
               "eps_target": math.inf, "seed": 0, "cfg.train.lr": lr, "hr10_full": hr}
        if config_id:
            out["config_id"] = config_id
        return out

    fixed, tuned = pd.DataFrame([row(0.1, 0.04)]), pd.DataFrame([row(0.001, 0.13)])
    both, replaced = combine([fixed, tuned])
    assert len(both) == 2 and replaced == 0
    again, replaced = combine([fixed, pd.DataFrame([row(0.1, 0.05)])])
    assert len(again) == 1 and replaced == 1 and again["hr10_full"].iloc[0] == 0.05
    ids, _ = combine([pd.DataFrame([row(0.1, 0.04, "a")]), pd.DataFrame([row(0.1, 0.06, "a")])])
    assert len(ids) == 1


@pytest.mark.parametrize(("model", "std", "expected"), [
    (0.019, 0.004, "at chance"),  # below chance, level with a floor at chance (issue 67)
    (0.021, 0.004, "at chance"),  # not 2 SE above chance
    (0.005, 0.001, "below"),      # below the floor beyond noise, and at chance
])
def test_a_model_at_or_below_chance_is_never_within_noise(model, std, expected):
    """The old quick sweep's FedMF at eps 8 read 0.017 against DP-MostPop 0.023 (chance
    0.020): level with a floor that is itself at chance is no finding; such a point was
    'within noise'."""
    agg = _agg(("dp-mostpop", "ldp-oue", 8.0, 0.023, 0.003),
               ("fedmf", "ldp-laplace", 8.0, model, std))
    row = floors.part(agg, "models").iloc[0]
    got = floors.verdict(row, floors.part(agg, "floors"), chance=0.020)
    assert got.startswith(expected) and "within noise" not in got
    assert "at chance" in got
    # without a chance level nothing is said about it
    assert "at chance" not in floors.verdict(row, floors.part(agg, "floors"))


def test_a_model_above_chance_and_level_with_its_floor_is_within_noise():
    agg = _agg(("dp-mostpop", "central-gaussian", 8.0, 0.229, 0.003),
               ("fedmf", "cdp-gaussian", 8.0, 0.232, 0.004))
    row = floors.part(agg, "models").iloc[0]
    assert floors.verdict(row, floors.part(agg, "floors"), chance=0.033).startswith(
        "within noise (central 0.229)")
