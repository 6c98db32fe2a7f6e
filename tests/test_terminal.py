"""The finished points' table printed after sweep, report and tune (plain text, and rich)."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pandas as pd
import pytest
from sweep_helpers import TINY_BASE

from fedem_private.cli import main
from fedem_private.experiments import terminal
from fedem_private.experiments.results import read_results

SWEEP = """[sweep]
methods = ["fedmf"]
privacy = ["ldp-laplace"]
epsilons = [inf, 8]
seeds = [0, 1]

""" + TINY_BASE.lstrip()


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[Path, str]:
    """A 4-point sweep (two budgets x two seeds) run through the command; its folder and
    what it printed."""
    base = tmp_path_factory.mktemp("swept")
    (base / "two.toml").write_text(SWEEP)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["sweep", str(base / "two.toml"), "--out", str(base / "out"),
                     "--no-progress"]) == 0
    return base / "out", printed.getvalue()


def _mean_std(frame: pd.DataFrame, column: str, eps: float) -> str:
    values = frame.loc[frame["eps_target"] == eps, column]
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}"


def test_the_sweep_prints_the_plain_table_with_mean_and_spread(swept):
    root, printed = swept
    frame = read_results(root / "results.csv")
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("finished runs in"))
    header, rows = lines[start + 1], lines[start + 2:start + 4]
    assert header.split()[:4] == ["method", "privacy", "ε", "seeds"]
    assert "HR@10 full" in header and "NDCG@10 sampled" in header
    by_eps = {"∞": rows[0], "8": rows[1]}
    assert "∞ (clip only)" in by_eps["∞"]
    for eps_text, eps in (("∞", math.inf), ("8", 8.0)):
        row = by_eps[eps_text]
        assert row.startswith("fedmf") and " 2 " in row  # two seeds
        for column in ("hr10_full", "ndcg10_full", "hr10_sampled", "ndcg10_sampled"):
            assert _mean_std(frame, column, eps) in row
    # aligned: every value column ends where its header does
    for name in ("seeds", "HR@10 full", "NDCG@10 sampled"):
        end = header.index(name) + len(name)
        assert all(row[end - 1] != " " and (len(row) == end or row[end] == " ")
                   for row in rows)


def test_report_prints_the_same_table(swept, capsys):
    root, printed = swept
    assert main(["report", str(root)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("runs reported in"):].splitlines()[1:4]
    swept_table = printed[printed.index("finished runs in"):].splitlines()[1:4]
    assert table == swept_table


def test_the_rich_table_renders_on_a_terminal(swept):
    root, _ = swept
    frame = read_results(root / "results.csv")
    table = terminal.results_table(frame, "finished")
    text = io.StringIO()
    from rich.console import Console

    terminal.show(table, Console(file=text, force_terminal=True, width=160))
    drawn = text.getvalue()
    assert "\x1b[" in drawn  # a terminal's styles
    assert "━" in drawn or "─" in drawn  # a box
    for row in table.rows:
        for cell in row:
            assert cell in drawn


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rich_is_used_only_on_a_terminal(swept):
    root, _ = swept
    table = terminal.results_table(read_results(root / "results.csv"), "finished")
    plain, tty = io.StringIO(), _Terminal()
    terminal.show(table, stream=plain)
    terminal.show(table, stream=tty)
    assert plain.getvalue().strip() == terminal.plain_text(table)
    assert "━" in tty.getvalue() or "─" in tty.getvalue()


def test_a_long_table_is_cut_with_a_count(swept):
    root, _ = swept
    table = terminal.results_table(read_results(root / "results.csv"), "t", limit=1)
    assert len(table.rows) == 1 and "1 more" in table.note
    assert terminal.plain_text(table).splitlines()[-1] == table.note


def test_tune_prints_its_trials_labelled_by_their_settings(tmp_path, capsys):
    pytest.importorskip("optuna", reason="tune needs Optuna (pip install 'fedem-private[tune]')")
    spec = tmp_path / "tune.toml"
    body = SWEEP.split("\n\n", 1)[1].replace("[base.privacy]\nclip = 5.0\n", "")
    spec.write_text('[tune]\ntrials = 2\nseed = 0\n\n[tune.space]\n'
                    '"train.lr" = { low = 0.01, high = 0.3, log = true }\n\n' + body)
    assert main(["tune", str(spec), "--out", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("trials in"):].splitlines()
    trials = [line for line in lines[2:] if line.startswith("fedmf [lr=")]
    assert len(trials) == 2 and trials[0] != trials[1]
