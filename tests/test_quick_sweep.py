"""The main job (issue 67): the built-in quick sweep, shrunk to seconds, runs, resumes on its
second pass with nothing re-run, and its report judges the points against their floor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sweep_helpers import StubAttacks

from fedem_private.experiments import attack_step
from fedem_private.experiments.sweep import POINT_FILE, run_sweep
from fedem_private.experiments.sweep_spec import QUICK_SPEC, grid, load_spec

# the quick sweep's own file with its sizes cut down; every other line as shipped
SHRINK = {
    r"n_users = 4000": "n_users = 60",
    r"n_items = 300": "n_items = 40",
    r"mean_activity = 20.0": "mean_activity = 8.0",
    r"rounds = 25": "rounds = 2\ndim = 4",
    r"local_epochs = 3": "local_epochs = 1",
    r"cohort_size = 800 ": "cohort_size = 20 ",
    r"eval_users = 1000 ": "eval_users = 30 ",
    r"seeds = \[0, 1, 2\]": "seeds = [0, 1]",
}


def tiny_quick_spec(path: Path) -> Path:
    text = QUICK_SPEC
    for pattern, repl in SHRINK.items():
        text, n = re.subn(pattern, repl, text)
        assert n == 1, f"the quick sweep no longer has {pattern!r}"
    path.write_text(text + "\n[base.baseline]\nepochs = 2\n")  # centralised MF's epochs
    return path


@pytest.fixture
def stub(monkeypatch) -> StubAttacks:
    s = StubAttacks()
    monkeypatch.setattr(attack_step, "load", s.step)
    return s


def test_the_quick_sweep_resumes_and_its_report_judges_each_point(tmp_path, stub):
    """First pass; second pass: exit 0, nothing trained, attacked or rewritten; then the
    report: every private point carries a verdict against central DP-MostPop at its
    epsilon, and none reads 'within noise' or 'beats' while not above chance."""
    import pandas as pd

    from fedem_private.experiments.report import write_report

    spec = tiny_quick_spec(tmp_path / "quick.toml")
    points = grid(load_spec(str(spec)))
    # the same grid as the shipped sweep (its cohort, in the names, and its seeds aside)
    def cells(pts):
        return {re.sub(r"-k\d+-", "-k-", p.name.rsplit("/", 1)[0]) for p in pts}

    assert cells(points) == cells(grid(load_spec(None)))
    out = tmp_path / "out"
    assert run_sweep(str(spec), str(out), jobs=1, progress=False) == 0
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()
             and p.name in ("summary.json", POINT_FILE, "attacks.json", "metrics.csv")}
    assert sum(p.name == "summary.json" for p in files) == len(points)
    trained, attacked = len(stub.recorded), len(stub.attacked)
    assert trained == attacked == sum(bool(p.attacks) for p in points) > 0
    assert run_sweep(str(spec), str(out), jobs=1, progress=False) == 0
    assert (len(stub.recorded), len(stub.attacked)) == (trained, attacked)
    assert {p: p.stat().st_mtime_ns for p in files} == files

    write_report(str(out), str(tmp_path / "rep"))
    text = (tmp_path / "rep" / "report.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(("| fedmf |", "| fedem-em-fedavg |"))]
    private = [r for r in rows if r[2] in ("8", "1")]
    assert len(private) == 4  # two methods at eps 8 and 1
    for r in private:
        assert r[9].split(" (")[0] in ("beats", "below", "within noise", "at chance"), r[9]
        assert "central 0." in r[9]
    res = pd.read_csv(tmp_path / "rep" / "results.csv")
    chance = 10.0 / res["n_items"].iloc[0]
    means = res.groupby(["variant", "eps_target"])["hr10_full"].mean()
    for r in private:
        if r[9].startswith(("within noise", "beats")):
            assert means[(r[0], float(r[2]))] > chance, r
