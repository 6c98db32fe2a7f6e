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
