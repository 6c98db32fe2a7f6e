"""``fedem-private ladder`` (issue 70): the ladder on a user's CSV, with ML-100K-tuned settings
transferred unedited, resumable, its table and figures; the rung registry and the plot's
legend cap. Every run here is a tiny CSV the test writes (60 users, 2 rounds)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedem_private.cli import main
from fedem_private.experiments import ladder, ladder_plots

# a `fedem-private tune` best.toml as tuned on ML-100K: its [data] names that dataset and a
# folder relative to the checkout, neither of which exists where the test runs
TUNED = """\
# best of 15 trials by sampled validation HR@10 (0.6); trial 10
[data]
dataset = "ml-100k"
data_dir = "../shared/datasets/ml-100k"
protocol = "strict"
min_user_ratings = 3

[train]
rounds = 100
local_epochs = 2
lr = 0.0437
dim = 16
num_negatives = 8
eval_every = 5
select_round = "best-val"

[federation]
method = "fedmf"
server_lr = 4.9

[privacy]
mode = "none"
"""


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    """A folder (the working directory) holding ratings.csv (~500 interactions) and the
    ML-100K-tuned fedmf-best.toml."""
    rng = np.random.default_rng(7)
    with (tmp_path / "ratings.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "item"])
        for u in range(60):
            for i in sorted(rng.choice(80, size=int(rng.integers(6, 12)), replace=False)):
                w.writerow([f"u{u}", f"i{i}"])
    (tmp_path / "fedmf-best.toml").write_text(TUNED)
    monkeypatch.chdir(tmp_path)
    return tmp_path


ARGS = ["ladder", "--dataset", "csv", "--data-dir", "ratings.csv", "--out", "lad",
        "--rungs", "chance", "mostpop", "dp-mostpop:central", "fedmf",
        "--tuned", "fedmf-best.toml", "--seeds", "0", "--epsilons", "1", "4", "--rounds", "2"]


def test_ladder_on_a_csv_with_ml100k_tuned_settings(tiny, capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "plan:" in out and "FedMF, tuned" in out and "to run" in out
    root = tiny / "lad"
    # only the rungs asked for: no fixed rung added, no other DP-MostPop architecture
    assert sorted(p.name for p in (root / "runs").iterdir() if p.is_dir()) == [
        "dp-mostpop-central-eps1-seed0", "dp-mostpop-central-eps4-seed0",
        "fedmf-tuned-seed0", "mostpop-seed0"]
    # the tuned file's data section gave way to the command's; its settings were kept
    cfg = (root / "runs" / "fedmf-tuned-seed0" / "config.toml").read_text()
    assert 'dataset = "csv"' in cfg and "ratings.csv" in cfg and "ml-100k" not in cfg
    assert "lr = 0.0437" in cfg and "num_negatives = 8" in cfg
    assert 'select_round = "last"' in cfg  # the headline round, the same for every rung
    table = (root / "ladder.md").read_text()
    assert "full HR@10 (last round)" in table and "training s | wall s" in table
    for label in ("| chance |", "| MostPop |", "| DP-MostPop, central, eps 1 |",
                  "| DP-MostPop, central, eps 4 |", "| FedMF, tuned |"):
        assert label in table
    assert "tuned on ml-100k (fedmf-best.toml)" in table and "a centralised model" in table
    rows = list(csv.DictReader((root / "ladder.csv").open()))
    assert [r["label"] for r in rows] == ["chance", "MostPop", "DP-MostPop, central, eps 1",
                                          "DP-MostPop, central, eps 4", "FedMF, tuned"]
    summary = json.loads((root / "runs" / "fedmf-tuned-seed0" / "summary.json").read_text())
    fedmf = rows[-1]
    assert float(fedmf["hr10_full_mean"]) == pytest.approx(summary["metrics"]["full"]["hr@10"])
    assert float(fedmf["wall_s"]) >= float(fedmf["training_s"]) > 0
    for png in ("headline.png", "panels.png"):
        assert (root / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((root / "runs").glob("*.checkpoint"))  # none kept once finished


def test_a_second_call_resumes_and_a_changed_rung_needs_force(tiny, capsys):
    assert main(ARGS) == 0
    stamp = (tiny / "lad" / "runs" / "mostpop-seed0" / "summary.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "0 to run" in out and "1 finished, 0 to run" in out
    assert (tiny / "lad" / "runs" / "mostpop-seed0" / "summary.json").stat().st_mtime_ns \
        == stamp
    more = [*ARGS[:ARGS.index("--epsilons")], "--epsilons", "1", "4", "16", "--rounds", "2",
            "--dry-run"]
    assert main(more) == 0  # a new eps: estimated from this ladder's finished DP-MostPop
    assert "1 to run; about 0 s (measured rate)" in capsys.readouterr().out
    changed = [a if a != "fedmf" else "fedmf:lr=0.01" for a in ARGS]
    assert main(changed) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0] and "train.lr" in err[0]
    assert main([*changed, "--force"]) == 0
    assert "lr = 0.01" in (tiny / "lad" / "runs" / "fedmf-tuned-seed0" / "config.toml"
                           ).read_text()


@pytest.mark.parametrize(("rungs", "words"), [
    (["mostpop", "nosuch"], "unknown rung kind 'nosuch'"),
    (["dp-mostpop:centre"], "not 'centre'"),
    (["ease:alpha=1"], "no option 'alpha'"),
    (["mostpop"], "no rung fedmf is in --rungs"),  # the tuned file would serve nothing
])
def test_user_errors_are_one_line_exit_2(tiny, capsys, rungs, words):
    args = ["ladder", "--dataset", "csv", "--data-dir", "ratings.csv", "--out", "lad",
            "--rungs", *rungs, "--tuned", "fedmf-best.toml", "--dry-run"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert not (tiny / "lad" / "runs").exists()


def test_dry_run_plans_every_run_and_runs_none(tiny, capsys):
    args = ["ladder", "--dataset", "csv", "--data-dir", "ratings.csv", "--out", "lad",
            "--rungs", "dp-mostpop:central,local", "fedmf:none,cdp-gaussian", "--seeds", "0",
            "1", "--epsilons", "1", "4", "16", "--dry-run", "--round", "best-val"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "DP-MostPop, central" in out and "DP-MostPop, local" in out
    assert "FedMF, fixed (cdp-gaussian)" in out and "  6 run(s)" in out
    assert "rough rule:" in out and "headline round: best-val" in out
    assert not (tiny / "lad" / "runs").exists()


def test_private_fixed_rung_runs_at_each_eps_with_the_fixed_settings():
    opts = ladder.LadderOptions(data={"dataset": "synthetic"}, seeds=(0,), epsilons=(2.0, 8.0))
    (rung,) = ladder.build_rungs(["fedmf:cdp-gaussian"], [], opts)
    assert [r.eps for r in rung.runs] == [2.0, 8.0]
    cfg = ladder.resolved(rung.runs[1].config)
    assert cfg.privacy.epsilon == 8.0 and cfg.privacy.clip == 50.0
    assert cfg.privacy.sample_rate == 0.2 and cfg.train.rounds == 40


def test_checkpoints_are_sized_to_the_run():
    assert ladder.checkpoint_every(100, 120.0, 10.0) is None  # a short run keeps none
    assert ladder.checkpoint_every(100, 3600.0, 10.0) == 17  # about every 10 minutes
    assert ladder.checkpoint_every(100, 3600.0, 0.0) is None


def test_headline_legend_holds_at_most_eight_entries(tmp_path):
    pts = [ladder_plots.Point("MostPop", "popularity", "none", None, {"hr10_full": (0.08, 0)})]
    for f in range(12):
        pts += [ladder_plots.Point(f"Method {f}, tuned", "federated", "cdp-gaussian", e,
                                   {"hr10_full": (0.01 * f + 0.001 * e, 0.002)})
                for e in (1.0, 4.0)]
    entries = ladder_plots.headline(pts, tmp_path / "h.png", "t")
    assert entries == ladder_plots.MAX_LEGEND
    few = ladder_plots.headline(pts[:5], tmp_path / "few.png", "t")
    assert few == 2  # two families; MostPop is labelled on the figure, not in the legend


TUNING = """\
[tune]
trials = 2
seed = 0

[tune.space]
"train.lr" = { low = 0.01, high = 0.1, log = true }

[base]
data = { dataset = "ml-100k", data_dir = "../shared/datasets/ml-100k" }
federation = { method = "fedmf" }
train = { rounds = 2, eval_every = 1 }
"""


def test_tuning_runs_on_the_ladders_data_and_serves_its_rung(tiny, capsys):
    pytest.importorskip("optuna", reason="--tune needs pip install 'fedem-private[tune]'")
    (tiny / "fedmf-tune.toml").write_text(TUNING)
    args = ["ladder", "--dataset", "csv", "--data-dir", "ratings.csv", "--out", "lad",
            "--rungs", "fedmf", "--tune", "fedmf-tune.toml", "--seeds", "0", "--rounds", "2"]
    assert main(args) == 0
    study = tiny / "lad" / "tune" / "fedmf-tune"
    assert 'dataset = "csv"' in (study / "best.toml").read_text()
    assert len(list((study / "trials").iterdir())) == 2
    table = (tiny / "lad" / "ladder.md").read_text()
    assert "| FedMF, tuned |" in table and f"tuned here ({study.relative_to(tiny)})" in table
    chosen = (study / "best.toml").read_text().split("lr = ")[1].split("\n")[0]
    assert f"lr = {chosen}" in (tiny / "lad" / "runs" / "fedmf-tuned-seed0" / "config.toml"
                                ).read_text()


def test_a_private_search_here_must_be_accounted(tiny, capsys):
    (tiny / "cdp-tune.toml").write_text(TUNING.replace(
        'train = { rounds = 2, eval_every = 1 }',
        'train = { rounds = 2, eval_every = 1 }\nprivacy = { mode = "cdp-gaussian", '
        'epsilon = 4.0, clip = 1.0, sample_rate = 0.5 }'))
    args = ["ladder", "--dataset", "csv", "--data-dir", "ratings.csv", "--out", "lad",
            "--rungs", "fedmf:cdp-gaussian", "--tune", "cdp-tune.toml", "--seeds", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[tune.private]" in err[0]
    assert not (tiny / "lad" / "runs").exists()


def test_a_best_val_ladder_shows_the_round_chosen_and_the_last_beside_it(tiny, capsys):
    """Issue 79, item 3: under ``--round best-val`` each federated rung reports the round
    chosen on validation, with the last round's full HR@10 beside it, and says that a
    private rung's choice is not private."""
    args = [a for a in ARGS if a not in ("--rounds", "2")] + ["--rounds", "4", "--round",
                                                              "best-val"]
    args[args.index("--epsilons") + 1:args.index("--epsilons") + 3] = ["4"]
    assert main(args) == 0
    capsys.readouterr()
    root = tiny / "lad"
    table = (root / "ladder.md").read_text()
    assert "full HR@10 (val-selected round)" in table
    assert "| round chosen | full HR@10 (last round) |" in table
    assert "that choice is not private" in table
    summary = json.loads((root / "runs" / "fedmf-tuned-seed0" / "summary.json").read_text())
    line = next(x for x in table.splitlines() if x.startswith("| FedMF, tuned |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(summary["selected"]["metrics"]["full"]["hr@10"],
                                            abs=5e-5)
    assert cells[7] == str(summary["selected"]["round"])
    assert float(cells[8]) == pytest.approx(summary["metrics"]["full"]["hr@10"], abs=5e-5)
    mostpop = next(x for x in table.splitlines() if x.startswith("| MostPop |"))
    assert len(mostpop.split("|")) == len(line.split("|"))  # every row has every column
