"""results.csv (one tidy row per run) and the report (Markdown tables plus PNG plots)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from sweep_helpers import TINY_BASE, StubAttacks, write_spec

from fedem_private.errors import UserError
from fedem_private.experiments import attack_step
from fedem_private.experiments.report import write_report
from fedem_private.experiments.results import (
    EPS_COLUMNS,
    ID_COLUMNS,
    METRIC_COLUMNS,
    attack_columns,
    collect,
)
from fedem_private.experiments.sweep import run_sweep
from fedem_private.experiments.sweep_spec import grid, load_spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished tiny sweep: 2 methods x (none + eps {inf, 8}) x 2 seeds, stub attacks."""
    tmp = tmp_path_factory.mktemp("report")
    spec = write_spec(tmp / "spec.toml", """
methods = ["fedmf", "fedem"]
privacy = ["none", "ldp-laplace"]
epsilons = [inf, 8]
seeds = [0, 1]
attacks = ["projection"]
""", TINY_BASE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attack_step, "load", StubAttacks().step)
        assert run_sweep(str(spec), str(tmp / "runs"), jobs=1, progress=False) == 0
    return tmp / "runs", [p.name for p in grid(load_spec(spec))]


def test_results_table_has_one_row_per_run_with_expected_columns(sweep_root):
    root, names = sweep_root
    frame = pd.read_csv(root / "results.csv")
    assert len(frame) == len(names) == 12
    assert sorted(frame["run"]) == sorted(names)
    for col in ID_COLUMNS + METRIC_COLUMNS + EPS_COLUMNS + [
            "projection_auc", "projection_tpr@1%fpr", "audit", "seconds_per_round",
            "seconds_total"]:
        assert col in frame.columns, col
    assert set(frame["variant"]) == {"fedmf", "fedem-em"}
    assert set(frame["mode"]) == {"none", "ldp-laplace"}
    eps8 = frame[frame["eps_target"] == 8]
    assert len(eps8) == 4 and (eps8["eps_reported"] - 8).abs().max() < 1e-3
    assert eps8["guarantee"].all()
    clip_only = frame[(frame["mode"] == "ldp-laplace") & (frame["eps_target"] == math.inf)]
    assert len(clip_only) == 4 and (clip_only["eps_reported"] == math.inf).all()
    assert not clip_only["guarantee"].any()
    assert frame["hr10_full"].between(0, 1).all() and frame["hr10_sampled"].between(0, 1).all()
    # the last recorded round's score, not the first's (the stub gives round 1 0.1 less)
    assert set(frame["projection_auc"].round(3)) == {0.9, 0.55}
    assert set(frame["projection_vs_any_auc"].round(3)) == {0.99}
    noisy = frame["eps_target"] == 8
    assert (frame.loc[noisy, "audit"] == "pass").all()
    assert frame.loc[~noisy, "audit"].isna().all()  # nothing to audit without noise


def test_attack_columns_flatten_the_last_round_and_the_audit_verdict():
    cols, verdict = attack_columns([
        {"attack": "imia", "round": 3, "audit_ok": True, "eps_lower_bound": "inf",
         "relations": {"positive_vs_any": {"auc": 0.7, "f1": 0.2},
                       "positive_vs_sampled": {"auc": 0.6, "tpr@1%fpr": 0.1}}},
        {"attack": "imia", "round": 1, "audit_ok": False,
         "relations": {"positive_vs_sampled": {"auc": 0.9}}},
        {"attack": "canary", "round": None, "audit_ok": None, "eps_lower_bound": None,
         "relations": {"canary": {"auc": 0.5}}},
        {"attack": "attribute", "round": 3, "auc": 0.8, "skipped": "no gender"}])
    assert cols["imia_auc"] == 0.6 and cols["imia_tpr@1%fpr"] == 0.1
    assert cols["imia_vs_any_auc"] == 0.7 and "imia_vs_any_f1" not in cols
    assert math.isinf(cols["imia_eps_lower_bound"])
    assert cols["canary_auc"] == 0.5 and math.isnan(cols["canary_eps_lower_bound"])
    assert cols["attribute_auc"] == 0.8 and cols["attribute_skipped"] == "no gender"
    assert verdict == "FAIL"  # round 1's failure counts even though round 3 is shown
    assert attack_columns([])[1] == ""
    assert attack_columns([{"attack": "support", "round": 1, "audit_ok": None}])[1] == ""


def test_report_writes_markdown_and_valid_pngs(sweep_root, tmp_path):
    root, _ = sweep_root
    written = write_report(str(root), str(tmp_path / "rep"))
    names = sorted(p.name for p in written)
    assert names == ["report.md", "results.csv", "synthetic-auc_vs_eps.png",
                     "synthetic-frontier.png", "synthetic-hr10_vs_eps.png"]
    for p in written:
        assert p.parent == tmp_path / "rep" and p.is_file()
        if p.suffix == ".png":
            data = p.read_bytes()
            assert data[:8] == PNG_MAGIC and len(data) > 20_000
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| fedem-em | ldp-laplace | 8 | 2 |" in md
    assert "∞ (clip only)" in md and "– (no DP)" in md
    assert " ± " in md and "projection AUC" in md and "## Privacy accounting" in md
    assert "![synthetic-frontier](synthetic-frontier.png)" in md
    assert len(pd.read_csv(tmp_path / "rep" / "results.csv")) == 12


def test_report_without_attacks_or_runs(tmp_path, sweep_root):
    root, names = sweep_root
    single = tmp_path / "single"
    # one run, no attacks.json: utility plot only, and the report says why
    src = root / names[0]
    dst = single / "run"
    dst.mkdir(parents=True)
    for f in ("summary.json", "config.toml", "metrics.csv"):
        (dst / f).write_bytes((src / f).read_bytes())
    (single / "sweep_errors.log").write_text("x/seed0: RuntimeError: boom\n")
    written = write_report(str(single))
    assert sorted(p.name for p in written) == ["report.md", "results.csv",
                                               "synthetic-hr10_vs_eps.png"]
    md = (single / "report.md").read_text()
    assert "No attack scores found" in md and "Some grid points failed" in md
    assert len(collect(single)) == 1
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no run directories"):
        write_report(str(tmp_path / "empty"))
    with pytest.raises(UserError, match="not a directory"):
        write_report(str(tmp_path / "nowhere"))


def test_report_argparse_helper(sweep_root, tmp_path, capsys):
    import argparse

    from fedem_private.experiments import sweep_cli

    parser = argparse.ArgumentParser()
    sweep_cli.add_report_arguments(parser)
    args = parser.parse_args([str(sweep_root[0]), "--out", str(tmp_path / "r")])
    assert sweep_cli.run_report_from_args(args) == 0
    assert "report.md" in capsys.readouterr().out
    assert (tmp_path / "r" / "report.md").is_file()


def test_frontier_folds_a_reversed_attack_onto_the_leaky_side():
    import numpy as np

    from fedem_private.experiments.report_plots import oriented_auc

    np.testing.assert_allclose(oriented_auc(np.array([0.1, 0.5, 0.9, 0.62])),
                               [0.9, 0.5, 0.9, 0.62])


def test_eps_labels_share_one_prefix_in_numeric_order():
    from fedem_private.experiments.report_plots import _join_eps

    assert _join_eps(["ε=64", "ε=4", "ε=16", "ε=1"]) == "ε=1, 4, 16, 64"
    assert _join_eps(["ε=∞", "ε=1"]) == "ε=1, ∞"
    assert _join_eps(["no DP", "ε=8"]) == "ε=8, no DP"


def _copy_run(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())


def _table_lines(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("|")]


def test_report_combines_a_kept_results_csv_with_fresh_run_directories(sweep_root, tmp_path,
                                                                       capsys):
    root, names = sweep_root
    full = write_report(str(root), str(tmp_path / "full"))[0].parent
    whole = pd.read_csv(full / "results.csv")
    # seed 0's rows survive only as a results.csv; seed 1's run directories are fresh
    kept = tmp_path / "kept.csv"
    whole[whole["seed"] == 0].to_csv(kept, index=False)
    fresh = tmp_path / "fresh"
    seed1 = [n for n in names if n.endswith("seed1")]
    for name in seed1:
        _copy_run(root / name, fresh / name)
    write_report([str(kept), str(fresh)], str(tmp_path / "both"))
    both = pd.read_csv(tmp_path / "both" / "results.csv")
    assert list(both.columns) == list(whole.columns)
    left = both.sort_values("run").reset_index(drop=True)
    right = whole.sort_values("run").reset_index(drop=True)
    pd.testing.assert_frame_equal(left, right)
    md = (tmp_path / "both" / "report.md").read_text()
    assert f"12 runs from `{kept}`, `{fresh}`" in md
    assert _table_lines(md) == _table_lines((full / "report.md").read_text())
    assert "several sources" not in capsys.readouterr().out
    # a run named by two sources keeps the last one's row, and the report says so
    fresh_row = both.set_index("run").loc[seed1[0], "hr10_full"]
    stale = whole.copy()
    stale.loc[stale["run"] == seed1[0], "hr10_full"] = fresh_row + 0.25
    stale.to_csv(kept, index=False)
    write_report([str(kept), str(fresh)], str(tmp_path / "again"))
    again = pd.read_csv(tmp_path / "again" / "results.csv").set_index("run")
    assert len(again) == 12 and again.loc[seed1[0], "hr10_full"] == fresh_row
    assert "6 runs found in several sources" in capsys.readouterr().out


def test_report_source_errors_are_one_line(sweep_root, tmp_path, capsys):
    from fedem_private.cli import main

    root, _ = sweep_root
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(ID_COLUMNS) + "\n")
    cases = [
        ([str(root / "results.csv")], "give --out"),
        ([str(root), str(root / "results.csv")], "give --out"),
        ([str(bad), "--out", str(tmp_path / "o")], "not a fedem-private results.csv"),
        ([str(empty), "--out", str(tmp_path / "o")], "holds no runs"),
        ([str(root), str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")],
         "not a directory"),
    ]
    for argv, needle in cases:
        assert main(["report", *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "o" / "results.csv").exists()  # nothing written on an error


def test_report_keeps_only_the_variants_asked_for(sweep_root, tmp_path):
    root, _ = sweep_root
    write_report(str(root), str(tmp_path / "mf"), variants=["fedmf"])
    table = pd.read_csv(tmp_path / "mf" / "results.csv")
    assert set(table["variant"]) == {"fedmf"} and len(table) == 6
    with pytest.raises(UserError, match="no run of fedncf"):
        write_report(str(root), str(tmp_path / "none"), variants=["fedncf"])


def test_a_table_from_before_backbones_reads_with_each_method_s_backbone(sweep_root, tmp_path):
    """results.csv of version 0.1.0 had no backbone column: it is filled from the method."""
    root, _ = sweep_root
    full = write_report(str(root), str(tmp_path / "full"))[0].parent
    old = pd.read_csv(full / "results.csv").drop(columns=["backbone"])
    old.to_csv(tmp_path / "old.csv", index=False)
    write_report([str(tmp_path / "old.csv")], str(tmp_path / "again"))
    again = pd.read_csv(tmp_path / "again" / "results.csv")
    assert set(again["backbone"]) == {"mf"} and len(again) == len(old)


def test_bytes_figure_gives_each_mechanism_its_own_panels(tmp_path, monkeypatch):
    """Two mechanisms at the same epsilon: separate panels, so one label never means both."""
    import pandas as pd

    from fedem_private.experiments import report_plots as rp

    rows = []
    for mode, eps, hr in (("none", rp.NO_DP, 0.30), ("ldp-laplace", 16.0, 0.11),
                          ("ldp-gaussian", 16.0, 0.12), ("ldp-gaussian", rp.CLIP_ONLY, 0.2)):
        for codec, size in (("full", 107_648), ("lora", 27_168)):
            rows.append({"protocol": "strict", "mode": mode, "variant": f"fedmf~{codec}",
                         "codec": codec, "x_key": eps, "bytes_up_last_mean": size,
                         "hr10_full_mean": hr, "hr10_full_std": 0.0})
    saved = {}

    def keep(fig, path):
        saved["titles"] = [ax.get_title() for ax in fig.axes]
        saved["points"] = [len(ax.lines) for ax in fig.axes]
        return path

    monkeypatch.setattr(rp, "_save", keep)
    rp.bytes_figure(pd.DataFrame(rows), "ml-100k", tmp_path / "f.png", "1")
    assert saved["titles"] == ["protocol strict · ldp-gaussian", "protocol strict · ldp-laplace"]
    # gaussian: no-DP, eps 16 and clip-only for two codecs; laplace: no-DP and eps 16
    assert saved["points"][0] > saved["points"][1] > 0


def test_architectures_get_a_row_of_panels_each(tmp_path, monkeypatch):
    """Two methods under two private modes: a row per mode, each with only its own lines
    (and the runs without privacy); one method under two modes stays on one row."""
    import pandas as pd

    from fedem_private.experiments import report_plots as rp

    rows = []
    for variant in ("fedmf", "pfedrec"):
        for mode, eps, hr in (("none", rp.NO_DP, 0.30), ("ldp-dpsgd", 16.0, 0.13),
                              ("ldp-dpsgd", 4.0, 0.11), ("cdp-gaussian", 1.0, 0.25)):
            rows.append({"protocol": "strict", "mode": mode, "variant": variant, "x_key": eps,
                         "hr10_full_mean": hr, "hr10_full_std": 0.0,
                         "hr10_sampled_mean": hr, "hr10_sampled_std": 0.0,
                         "projection_auc_mean": 0.5, "projection_auc_std": 0.0})
    agg = pd.DataFrame(rows)
    groups = rp.architectures(agg)
    assert [m for m, _ in groups] == ["cdp-gaussian", "ldp-dpsgd"]
    assert set(groups[0][1]["mode"]) == {"cdp-gaussian", "none"}
    assert len(rp.architectures(agg[agg["variant"] == "fedmf"])) == 1
    saved = {}

    def keep(fig, path):
        saved["titles"] = [ax.get_title() for ax in fig.axes]
        saved["lines"] = [len(ax.get_legend_handles_labels()[1]) for ax in fig.axes]
        return path

    monkeypatch.setattr(rp, "_save", keep)
    rp.utility_figure(agg, "ml-100k", tmp_path / "u.png", 0.006, "1")
    assert saved["titles"] == ["cdp-gaussian: HR@10, full ranking",
                               "cdp-gaussian: HR@10, sampled (1 + 99 negatives)",
                               "ldp-dpsgd: HR@10, full ranking",
                               "ldp-dpsgd: HR@10, sampled (1 + 99 negatives)"]
    # each panel: the two methods' lines and the random-ranking line
    assert saved["lines"] == [3, 3, 3, 3]
    rp.attack_figure(agg, "ml-100k", ["projection"], tmp_path / "a.png", "1")
    assert len(saved["titles"]) == 2 and saved["titles"][1].startswith("ldp-dpsgd: ")
    rp.frontier_figure(agg, "ml-100k", ["projection"], tmp_path / "f.png", "1")
    assert len(saved["titles"]) == 2 and saved["titles"][0].startswith("cdp-gaussian: ")


def test_a_method_keeps_its_colour_across_architecture_rows():
    import pandas as pd

    from fedem_private.experiments import report_plots as rp

    agg = pd.DataFrame([{"protocol": "strict", "mode": "ldp-dpsgd", "variant": v, "x_key": 4.0}
                        for v in ("fedmf", "pfedrec")])
    only_pfedrec = agg[agg["variant"] == "pfedrec"]
    assert rp.lines(only_pfedrec)[0].color == "C0"  # alone, the first colour
    assert rp.lines(only_pfedrec, ["fedmf", "pfedrec"])[0].color == "C1"  # as in the full set


def test_a_plain_point_of_another_protocol_is_not_dropped():
    """A method's private lines under one protocol and its no-privacy point under another
    (a tuned run, ``strict+bestval``): the point is a line of its own, not lost."""
    import pandas as pd

    from fedem_private.experiments import report_plots as rp

    agg = pd.DataFrame([
        {"protocol": "strict", "mode": "cdp-gaussian", "variant": "pfedrec", "x_key": 4.0},
        {"protocol": "strict", "mode": "none", "variant": "pfedrec", "x_key": "no DP"},
        {"protocol": "strict+bestval", "mode": "none", "variant": "pfedrec", "x_key": "no DP"}])
    got = rp.lines(agg)
    assert sorted(len(line.points) for line in got) == [1, 2]
    assert {p for line in got for p in line.points["protocol"]} == {"strict", "strict+bestval"}


def test_paper_mode_shows_its_heuristic_eps_labelled_not_a_guarantee(tmp_path):
    """Mode ``paper`` has no accountant: results.csv keeps its heuristic eps apart from the
    bounds (all empty, no guarantee) and the report labels it as the paper's heuristic."""
    spec = write_spec(tmp_path / "spec.toml", 'methods = ["fedem"]\nprivacy = ["paper"]\n'
                      'seeds = [0]', TINY_BASE)
    assert run_sweep(str(spec), str(tmp_path / "runs"), jobs=1, progress=False) == 0
    row = pd.read_csv(tmp_path / "runs" / "results.csv").iloc[0]
    assert row["mode"] == "paper" and not row["guarantee"]
    assert all(math.isnan(row[c]) for c in EPS_COLUMNS)
    assert row["eps_paper_heuristic"] > 0
    report = write_report([str(tmp_path / "runs")], str(tmp_path / "rep"))
    text = next(p for p in report if str(p).endswith(".md")).read_text()
    assert f"{row['eps_paper_heuristic']:.3f} (paper's heuristic)" in text


def test_a_variants_lines_under_two_protocols_do_not_draw_alike():
    """PFedRec under ``strict`` (settings fixed in advance) and under
    ``strict+bestvalfull`` (tuned, its round chosen on validation) share colour and
    marker; the second protocol's markers are hollow, so the two lines can be told apart."""
    import pandas as pd

    from fedem_private.experiments import report_plots as rp

    agg = pd.DataFrame([
        {"protocol": p, "mode": "cdp-gaussian", "variant": "pfedrec", "x_key": 4.0}
        for p in ("strict", "strict+bestvalfull")])
    got = {line.label: line for line in rp.lines(agg)}
    plain, tuned = got["PFedRec · strict"], got["PFedRec · strict+bestvalfull"]  # display names
    assert (plain.color, plain.marker) == (tuned.color, tuned.marker)
    assert (plain.hollow, plain.face) == (False, None)
    assert (tuned.hollow, tuned.face) == (True, "none")


def test_the_report_opens_with_its_verdict(sweep_root, tmp_path):
    """Issue 80: report.md's first paragraph is its verdict, before the tables."""
    root, _ = sweep_root
    write_report(str(root), str(tmp_path / "rep"))
    lines = (tmp_path / "rep" / "report.md").read_text().splitlines()
    assert lines[0] == "# fedem-private report" and lines[2].startswith("**Verdict**")
    assert "On synthetic, protocol `strict`: without privacy the best is" in lines[2]
    assert "under privacy the best is" in lines[2] and "MostPop" in lines[2]
    assert "chance" in lines[2]
