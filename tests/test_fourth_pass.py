"""A newcomer's fourth pass (issue 80): a result beside its references, a report that opens
with its verdict, plots and ladder tables that name things as people do, a race's loser that
says where its results went, and a plan's time that counts the catalogue."""

from __future__ import annotations

import pytest

from fedem_private.cli import main

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def _synthetic(tmp_path, users=40, items=60):
    """A run config of a small synthetic population (its path, for --config)."""
    path = tmp_path / "synthetic.toml"
    path.write_text(f"[data.synthetic]\nn_users = {users}\nn_items = {items}\n"
                    "mean_activity = 8\n")
    return str(path)


# ------------------------------------------------------- 6: the losing run of a race
@pytest.mark.parametrize("method", ["fedmf", "mostpop"])
def test_the_losing_run_of_a_race_exits_0_and_says_where_its_results_went(
        tmp_path, capsys, monkeypatch, method):
    """Two runs started together into one --out: the one that finishes second keeps its
    results beside the folder (``-2``), reads them there and exits 0 with one line saying
    so; it exited 2 with an error line although nothing was lost."""
    from fedem_private.experiments import rundir

    out = tmp_path / "run"
    real = rundir.RunDir.commit_or_moved

    def other_finishes_first(self):  # the other run commits just before this one
        out.mkdir(exist_ok=True)  # it may hold this run's progress files
        (out / "summary.json").write_text("{}")
        return real(self)

    monkeypatch.setattr(rundir.RunDir, "commit_or_moved", other_finishes_first)
    code = main(["run", "--config", _synthetic(tmp_path), "--method", method, "--out", str(out),
                 *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    kept = tmp_path / "run-2"
    assert f"wrote {kept}" in captured.out
    assert (kept / "summary.json").is_file() and (kept / "config.toml").is_file()
    assert (out / "summary.json").read_text() == "{}"  # the other run's, untouched
    notes = [line for line in captured.err.splitlines() if "another run" in line]
    assert len(notes) == 1 and f"this run's results are in {kept}" in notes[0]
    assert "error:" not in captured.err


# ------------------------------------------------ 4: the progress bar's two epsilons
class _Bar:
    """A stand-in for tqdm that records what the progress hooks give it."""

    lines: list[str] = []
    postfixes: list[dict] = []

    def __init__(self, **kwargs):
        pass

    def set_postfix(self, post, refresh=True):
        _Bar.postfixes.append(dict(post))

    def update(self, n):
        pass

    def close(self):
        pass

    @classmethod
    def write(cls, text, file=None):
        cls.lines.append(text)


def test_the_central_bar_names_the_aggregators_eps_and_says_once_what_it_is(monkeypatch):
    """cdp-gaussian's bar showed ``eps_aggregator`` climbing past --epsilon with no word of
    what it is: it is named as the epsilon against the aggregator, unamplified, and one line
    above the bar, written when it first shows, says what each figure is."""
    from types import SimpleNamespace

    import tqdm

    from fedem_private import api

    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    _Bar.lines, _Bar.postfixes = [], []
    cfg = api.resolve_config(None, {"privacy.mode": "cdp-gaussian", "privacy.epsilon": 4.0,
                                    "privacy.clip": 1.0, "train.rounds": 3})
    on_start, on_round, close = api._progress_hooks(cfg)
    on_start(SimpleNamespace(state=SimpleNamespace(round=0)))
    for r, (observer, aggregator) in enumerate([(1.0, 3.0), (2.0, 8.0), (4.0, 12.0)], 1):
        on_round(SimpleNamespace(round=r, metrics=None, privacy={
            "eps_spent_observer": observer, "eps_spent": aggregator}))
    close()
    assert [p["eps vs aggregator (unamplified)"] for p in _Bar.postfixes] == ["3", "8", "12"]
    assert [p["eps (observers)"] for p in _Bar.postfixes] == ["1", "2", "4"]
    assert not any("eps_aggregator" in key for p in _Bar.postfixes for key in p)
    assert len(_Bar.lines) == 1  # said once, where the figures first appear
    assert "eps vs aggregator (unamplified)" in _Bar.lines[0]
    assert "climbs past --epsilon" in _Bar.lines[0] and "released models" in _Bar.lines[0]


# ------------------------------------ 1: chance and MostPop beside every run's figure
def test_every_run_gives_chance_and_mostpop_on_its_own_evaluated_users(tmp_path, capsys):
    """A single run printed full HR@10 with neither chance nor MostPop beside it: its summary
    and its console line now carry both, computed on the users it evaluated (here a sample
    of 30 of 40, --eval-users) with the same evaluation sets as a MostPop run."""
    import json

    import numpy as np

    from fedem_private.api import resolve_config
    from fedem_private.experiments.outcome import chance_reference
    from fedem_private.experiments.results import collect
    from fedem_private.experiments.runner import prepare

    cfg = _synthetic(tmp_path)
    out, pop = tmp_path / "fedmf", tmp_path / "mostpop"
    common = ["--config", cfg, "--eval-users", "30", *TINY]
    assert main(["run", "--out", str(out), *common]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.strip().startswith("full:"))
    assert main(["run", "--method", "mostpop", "--out", str(pop), *common]) == 0
    summary = json.loads((out / "summary.json").read_text())
    refs = summary["references"]
    assert refs["users"] == 30 == summary["metrics"]["full"]["users"]
    own_pop = json.loads((pop / "summary.json").read_text())["metrics"]["full"]["hr@10"]
    assert refs["mostpop"]["full"]["hr@10"] == pytest.approx(own_pop)  # the same users, sets
    chance = refs["chance"]["full"]
    assert 0 < chance["hr@10"] < 1 and 0 < chance["hr@10_se"] < chance["hr@10"]
    everyone = chance_reference(prepare(resolve_config(cfg)).split)
    assert everyone["users"] == 40 and everyone["hr@10"] != chance["hr@10"]  # not all users
    assert np.isclose(chance["hr@10_se"] * 30, np.sqrt(30 * chance["hr@10"] * (
        1 - chance["hr@10"])), rtol=0.05)  # ~ a binomial's: p varies little here
    assert f"chance {chance['hr@10']:.4f} ± {chance['hr@10_se']:.4f}" in line
    assert f"MostPop {own_pop:.4f}" in line and "same 30 users" in line
    table = collect(tmp_path).set_index("method")
    assert table.loc["fedmf", "mostpop_hr10_full"] == pytest.approx(own_pop)
    assert table.loc["fedmf", "chance_hr10_full"] == pytest.approx(chance["hr@10"])
    assert table.loc["fedmf", "chance_hr10_full_se"] == pytest.approx(chance["hr@10_se"])


def test_a_figure_within_two_standard_errors_of_chance_reads_at_chance_not_below():
    """FedEM at 0.042-0.050 against chance 0.033 read 'below': a figure statistically
    indistinguishable from chance (within 2 of its standard errors over the evaluated users)
    reads 'at chance'; one beneath that, 'below chance'; one above, nothing."""
    from types import SimpleNamespace

    from fedem_private.experiments.outcome import chance_reference, outcome_warnings

    # 1,000 users with 300 items and 20 training items each: chance 10 / 279 = 0.0358,
    # standard error sqrt(p (1 - p) / 1000) = 0.0059
    split = SimpleNamespace(n_items=300, train_counts=[20] * 1000)
    ref = chance_reference(split)
    assert ref["hr@10"] == pytest.approx(10 / 279)
    assert ref["hr@10_se"] == pytest.approx((10 / 279 * (1 - 10 / 279) / 1000) ** 0.5)
    for hr in (0.042, 0.046):
        (line,) = outcome_warnings(split, {"full": {"hr@10": hr}}, None)
        assert "is at chance (0.03584 ± 0.0059" in line and "below" not in line
    (line,) = outcome_warnings(split, {"full": {"hr@10": 0.02}}, None)
    assert "is below chance" in line
    assert outcome_warnings(split, {"full": {"hr@10": 0.06}}, None) == []


def test_the_reports_verdict_counts_chances_own_standard_error():
    """The quick sweep's FedEM at 0.042-0.050 (3 seeds) against chance 0.036 on 1,000
    evaluated users read 'below (central ...)': the seeds agree closely, but chance's figure
    over 1,000 users is itself uncertain by 0.006, so the point is at chance."""
    import pandas as pd

    from fedem_private.experiments import floors

    def row(variant, mode, mean, std, **extra):
        return {"dataset": "d", "protocol": "strict", "variant": variant, "mode": mode,
                "eps_target": 8.0, "hr10_full_mean": mean, "hr10_full_std": std,
                "n_seeds": 3, **extra}

    chance = {"chance_hr10_full_mean": 10 / 279, "chance_hr10_full_se_mean": 0.0059}
    agg = pd.DataFrame([row("dp-mostpop", "central-gaussian", 0.21, 0.003, **chance),
                        row("fedem-em", "cdp-gaussian", 0.046, 0.004, **chance),
                        row("fedmf", "cdp-gaussian", 0.31, 0.004, **chance)])
    fl, models = floors.part(agg, "floors"), floors.part(agg, "models")
    fedem, fedmf = models.iloc[0], models.iloc[1]
    assert floors.verdict(fedem, fl) == "at chance (central 0.210)"
    assert floors.verdict(fedmf, fl) == "beats (central 0.210)"
    # without chance's standard error (the seeds' alone) it would not be at chance
    no_se = fedem.drop(["chance_hr10_full_mean", "chance_hr10_full_se_mean"])
    assert floors.verdict(no_se, fl, chance=10 / 279).startswith("below")


# ------------------------------------------------------------- 3: plots for people
def test_display_names_are_the_docs_names():
    from fedem_private.experiments.display import attack_display, variant_display

    assert variant_display("fedem-em-fedavg") == "FedEM (FedAvg)"
    assert variant_display("fedem-em") == "FedEM"
    assert variant_display("fedmf") == "FedMF"
    assert variant_display("fedmf-em") == "FedMF (EM merge)"
    assert variant_display("fedmerge-em-k2") == "FedMerge (EM merge, K=2)"
    assert variant_display("fedem-em+ncf~hash") == "FedEM (NCF, codec hash)"
    assert variant_display("dp-mostpop") == "DP-MostPop"
    assert variant_display("ease [ease_lambda=500]") == "EASE [ease_lambda=500]"
    assert variant_display("fedmf [rounds=12]") == "FedMF [rounds=12]"
    assert attack_display("projection_control") == "projection control"


def _ladder_agg():
    """A report's seed-aggregated rows: FedEM (FedAvg) near chance at every eps, FedMF,
    DP-MostPop (central) meeting MostPop at large eps, and MostPop."""
    import math

    import pandas as pd

    from fedem_private.experiments.report_plots import x_key

    rows = []

    def add(variant, mode, eps, hr, auc):
        rows.append({"dataset": "d", "protocol": "strict", "variant": variant, "mode": mode,
                     "eps_target": eps, "n_seeds": 3, "hr10_full_mean": hr,
                     "hr10_full_std": 0.003, "hr10_sampled_mean": 5 * hr,
                     "hr10_sampled_std": 0.01, "projection_control_auc_mean": auc,
                     "projection_control_auc_std": 0.004,
                     "x_key": x_key(mode, eps, eps)})

    for eps, hr, auc in ((1.0, 0.0420, 0.5020), (4.0, 0.0440, 0.5070), (16.0, 0.0460, 0.5120),
                         (64.0, 0.0480, 0.5170)):
        add("fedem-em-fedavg", "cdp-gaussian", eps, hr, auc)
        add("fedmf", "cdp-gaussian", eps, 0.2 + eps / 400, 0.55 + eps / 1000)
        add("dp-mostpop", "central-gaussian", eps, 0.150 - 0.02 / eps, math.nan)
    add("fedem-em-fedavg", "none", math.inf, 0.0500, 0.5220)
    add("fedmf", "none", math.inf, 0.39, 0.62)
    add("mostpop", "none", math.inf, 0.150, math.nan)
    return pd.DataFrame(rows)


def _capture(monkeypatch):
    """Keep the figure a report_plots function would save (its artists, not its pixels)."""
    from fedem_private.experiments import report_plots as rp

    kept = []

    def keep(fig, path):
        fig.canvas.draw()
        kept.append(fig)
        return path

    monkeypatch.setattr(rp, "_save", keep)
    return kept


def test_the_utility_plot_names_methods_for_people_and_keeps_dp_mostpop_in_view(
        tmp_path, monkeypatch):
    from fedem_private.experiments import report_plots as rp

    kept = _capture(monkeypatch)
    rp.utility_figure(_ladder_agg(), "d", tmp_path / "u.png", 10 / 279, "3")
    fig = kept[0]
    legend = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "FedEM (FedAvg)" in legend and "FedMF" in legend
    assert not any("fedem-em" in text or "_" in text for text in legend)
    ax = fig.axes[0]
    mostpop = next(line for line in ax.get_lines() if line.get_label() == "MostPop")
    floor = next(c for c in ax.containers if c.get_label() == "DP-MostPop · central")
    marker = floor.lines[0]
    assert marker.get_zorder() > mostpop.get_zorder()  # drawn over the MostPop line
    assert marker.get_marker() not in ("x", "+", "1", "2", "None", "") \
        and marker.get_markersize() >= 6  # filled, not a thin cross that hides on a dash
    models = [c.lines[0] for c in ax.containers if c.get_label() != "DP-MostPop · central"]
    assert all(marker.get_zorder() > m.get_zorder() for m in models)


def test_frontier_eps_labels_do_not_overlap_and_attacks_read_as_words(tmp_path, monkeypatch):
    from fedem_private.experiments import report_plots as rp

    kept = _capture(monkeypatch)
    agg = _ladder_agg()
    models = agg[~agg["variant"].isin(["dp-mostpop", "mostpop"])]
    rp.frontier_figure(models, "d", ["projection_control"], tmp_path / "f.png", "3",
                       agg[agg["variant"] == "mostpop"], 10 / 279)
    fig = kept[0]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_text().startswith(("ε=", "no DP"))]
    assert len(labels) >= 6
    boxes = [t.get_window_extent(renderer) for t in labels]
    overlapping = [(labels[i].get_text(), labels[j].get_text())
                   for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                   if boxes[i].overlaps(boxes[j])]
    assert overlapping == []
    assert "projection control" in ax.get_title() and "_" not in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "FedEM (FedAvg)" in legend


def test_the_ladder_figure_draws_dp_mostpop_over_the_mostpop_line():
    import matplotlib.pyplot as plt

    from fedem_private.experiments.ladder_plots import Point, draw

    pts = [Point("MostPop", "popularity", "none", None, {"hr10_full": (0.15, 0.0)}),
           *(Point("DP-MostPop, central", "floor", "central", eps,
                   {"hr10_full": (0.15 - 0.01 / eps, 0.001)}) for eps in (1.0, 16.0, 64.0)),
           *(Point("FedMF, fixed (cdp-gaussian)", "federated", "cdp-gaussian", eps,
                   {"hr10_full": (0.2, 0.01)}) for eps in (1.0, 16.0, 64.0))]
    fig, ax = plt.subplots()
    try:
        draw(ax, pts)
        (mostpop,) = [line for line in ax.get_lines() if line.get_linestyle() == "-."]
        floor = next(c for c in ax.containers if c.get_label() == "DP-MostPop, central")
        marker = floor.lines[0]
        assert marker.get_zorder() > mostpop.get_zorder()
        assert marker.get_marker() not in ("x", "+", "1", "2", "None", "")
    finally:
        plt.close(fig)


# ------------------------------------------------------------ 5: the ladder's tables
def _table_after(out: str, title_word: str) -> list[str]:
    """The lines of the table the command printed last (from its title on)."""
    lines = out.splitlines()
    start = max(i for i, t in enumerate(lines) if t.startswith(title_word))
    return lines[start:]


def test_the_ladders_table_shows_only_its_rungs_by_their_names(tmp_path, capsys,
                                                                 monkeypatch):
    """Rungs changed in one --out: the terminal table kept the earlier call's rung (it
    showed every run under --out) and labelled rows by raw hyper-parameters; ladder.md
    named some rungs not run and not others. Now the terminal shows this call's rows under
    ladder.md's names, results.csv holds this call's runs, and ladder.md names each rung
    not in its table with its reason."""
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    base = ["ladder", "--dataset", "synthetic", "--config", _synthetic(tmp_path), "--out",
            "lad", "--seeds", "0", "--epsilons", "1", "--rounds", "2"]
    assert main([*base, "--rungs", "chance", "mostpop", "fedmf"]) == 0
    first = _table_after(capsys.readouterr().out, "ladder in lad")
    assert any(t.startswith("FedMF, fixed") for t in first)
    assert not any("[" in t or "rounds=" in t or t.startswith("fedmf") for t in first)
    assert main([*base, "--rungs", "chance", "mostpop", "dp-mostpop:central"]) == 0
    second = _table_after(capsys.readouterr().out, "ladder in lad")
    assert [t.split("  ")[0] for t in second[2:]] == ["chance", "MostPop",
                                                       "DP-MostPop, central, eps 1"]
    assert not any("FedMF" in t or "fedmf" in t for t in second)  # no stale rung
    md = (tmp_path / "lad" / "ladder.md").read_text()
    assert "Not in this table:" in md
    assert "not asked for" in md and "a centralised model" in md
    assert "not in this call's --rungs" in md and "fedmf-seed0" in md
    results = pd.read_csv(tmp_path / "lad" / "results.csv")
    assert sorted(results["run"]) == ["dp-mostpop-central-eps1-seed0", "mostpop-seed0"]


def test_ladder_md_names_a_rung_asked_for_with_no_finished_run():
    from fedem_private.experiments import ladder

    opts = ladder.LadderOptions(data={"dataset": "synthetic"}, seeds=(0,), epsilons=(1.0,),
                                rounds=2)
    rungs = ladder.build_rungs(["chance", "mostpop", "fedmf"], [], opts)
    text = ladder.markdown([], "t", "last", ladder.missing_references(rungs),
                           ladder.unfinished_rungs(rungs, []), [])
    assert "asked for, no run finished: chance, MostPop, FedMF, fixed" in text
    assert "DP-MostPop, a centralised model" in text


# ------------------------------------------------------------ 2: the report's verdict
def test_the_verdict_names_the_winner_its_margin_and_its_references():
    import math

    import pandas as pd

    from fedem_private.experiments.report import verdict_paragraph

    def row(variant, mode, eps, mean, std):
        return {"dataset": "synthetic", "protocol": "strict", "variant": variant,
                "mode": mode, "eps_target": eps, "n_seeds": 3, "hr10_full_mean": mean,
                "hr10_full_std": std, "chance_hr10_full_mean": 0.0358,
                "chance_hr10_full_se_mean": 0.0059, "mostpop_hr10_full_mean": 0.152}

    agg = pd.DataFrame([
        row("fedmf", "none", math.inf, 0.39, 0.004),
        row("fedem-em-fedavg", "none", math.inf, 0.050, 0.004),
        row("fedmf", "cdp-gaussian", 8.0, 0.38, 0.004),
        row("fedmf", "cdp-gaussian", 1.0, 0.31, 0.004),
        row("fedem-em-fedavg", "cdp-gaussian", 8.0, 0.046, 0.004),
        row("dp-mostpop", "central-gaussian", 8.0, 0.21, 0.003),
        row("mostpop", "none", math.inf, 0.152, 0.0),
    ])
    text = verdict_paragraph(agg, {"synthetic": (10 / 300, 0.006)})
    assert text.startswith("**Verdict**")
    plain, private = text.split("On synthetic, protocol `strict`: ")[1].split("; under privacy")
    assert "without privacy the best is FedMF at 0.390 ± 0.004" in plain
    assert "+0.340, beyond seed noise" in plain and "against FedEM (FedAvg)" in plain
    assert "above chance (0.036)" in plain and "+0.238 against MostPop (0.152)" in plain
    assert "FedMF under cdp-gaussian at ε 8 at 0.380 ± 0.004" in private
    assert "against FedEM (FedAvg) under cdp-gaussian at ε 8" in private
    assert "against DP-MostPop of its relation at that ε: beats (central 0.210)" in private
    # a model level with chance is said to be at chance, not ranked against the floor
    alone = agg[agg["variant"].isin(["fedem-em-fedavg", "dp-mostpop", "mostpop"])]
    assert "at chance (0.036)" in verdict_paragraph(alone, {})
    assert verdict_paragraph(agg[agg["variant"] == "mostpop"], {}) == ""


# ---------------------------------------------------------------- 7: the plan's time
def test_the_plans_time_counts_the_catalogue_the_cohort_and_the_local_work():
    """The ladder's plan said 'about 37 s' for FedMF under cdp-gaussian on a 610-user CSV
    of 9,724 items and took minutes: its rule (3 ms per client and round) ignored the
    catalogue and the local work. The time model counts both, and the cohort."""
    from fedem_private.experiments import ladder

    def cfg(**over):
        base = {"data": {"dataset": "synthetic"}, "federation": {"method": "fedmf"},
                "train": {"rounds": 40, "local_epochs": 10, "dim": 16, "num_negatives": 4,
                          "eval_every": 40},
                "privacy": {"mode": "cdp-gaussian", "delta": 1e-5, "sample_rate": 0.2,
                            "clip": 50.0, "epsilon": 4.0}}
        for section, values in over.items():  # None: the key left out
            merged = {**base.get(section, {}), **values}
            base[section] = {k: v for k, v in merged.items() if v is not None}
        return ladder.resolved(base)

    users, positives = 610, 160.0
    evaluation = users * ladder.S_EVAL_ITEM_DIM * (9724 - 1682) * 16
    # a local mechanism noises each participant's whole table: the catalogue, participant by
    # participant
    local = cfg(privacy={"mode": "ldp-laplace", "sample_rate": None, "delta": None,
                         "clip": 0.1})
    small, large = (ladder.estimate(local, users, m, {}, positives)[0] for m in (1682, 9724))
    assert large - small == pytest.approx(
        40 * users * ladder.S_PER_ITEM_DIM * (9724 - 1682) * 16 + evaluation)
    # cdp-gaussian's secure sum takes each FedMF client's trained rows only (design 18);
    # with a merge (FedEM) every row of the delta moves, so the catalogue counts again
    private = cfg()
    small, large = (ladder.estimate(private, users, m, {}, positives)[0] for m in (1682, 9724))
    assert large - small == pytest.approx(evaluation)
    merged = cfg(federation={"method": "fedem", "aggregation": "fedavg"})
    a, b = (ladder.estimate(merged, users, m, {}, positives)[0] for m in (1682, 9724))
    per_client_rounds = 40 * users * 0.2
    assert b - a == pytest.approx(
        per_client_rounds * ladder.S_PER_ITEM_DIM * (9724 - 1682) * 16 + evaluation)
    more_epochs = ladder.estimate(cfg(train={"local_epochs": 20}), users, 9724, {},
                                  positives)[0]
    assert more_epochs - large == pytest.approx(
        per_client_rounds * ladder.S_PER_EXAMPLE * 10 * positives * 5)  # local work
    cohorts = cfg(train={"cohort_size": 61}, privacy={"sample_rate": None})
    assert ladder._clients_per_round(cohorts, users) == 61
    assert ladder.estimate(cohorts, users, 9724, {}, positives)[0] < large
    # without noise a client moves only the rows it trained: no catalogue term per client
    plain = cfg(privacy={"mode": "none", "sample_rate": None, "clip": None,
                         "epsilon": None, "delta": None})
    a, b = (ladder.estimate(plain, users, m, {}, positives)[0] for m in (1682, 9724))
    assert b - a == pytest.approx(users * ladder.S_EVAL_ITEM_DIM * (9724 - 1682) * 16)
    # a rate measured here is kept apart for runs with and without noise
    assert ladder.rate_key(private) == ("fedmf", True)
    assert ladder.rate_key(plain) == ("fedmf", False)
    assert ladder.estimate(private, users, 9724, {("fedmf", False): 10.0}, positives)[1] \
        is False
