"""benchmarks/keep_runs.py: a sweep's finished runs kept without recordings resume as done."""

from __future__ import annotations

import pandas as pd
import pytest
from sweep_helpers import TINY_2X2, StubAttacks, write_spec

from benchmarks import keep_runs
from fedem_private.experiments import attack_step, runner
from fedem_private.experiments.sweep import run_sweep
from fedem_private.experiments.sweep_spec import grid, load_spec


@pytest.fixture
def stub(monkeypatch) -> StubAttacks:
    s = StubAttacks()
    monkeypatch.setattr(attack_step, "load", s.step)
    return s


def test_kept_runs_count_as_done_on_a_fresh_machine(tmp_path, stub, monkeypatch, capsys):
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    root = tmp_path / "runs"
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    names = [p.name for p in grid(load_spec(spec))]
    # a recording and a run in flight (no summary.json) that must not travel
    (root / names[0] / "observations").mkdir(exist_ok=True)
    (root / names[0] / "observations" / "extra.npz").write_bytes(b"x" * 100)
    (root / "in-flight").mkdir()
    (root / "in-flight" / "config.toml").write_text("")
    (root / ".x.tmp-1").mkdir()
    (root / ".x.tmp-1" / "summary.json").write_text("{}")

    kept = tmp_path / "kept"
    assert keep_runs.keep(root, kept) == (len(names), 0)
    files = {p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()}
    assert not any("observations" in f or "in-flight" in f or "tmp" in f for f in files)
    for name in names:
        assert {"summary.json", "sweep_point.json", "attacks.json", "config.toml",
                "metrics.csv"} <= {p.name for p in (kept / name).iterdir()}
    # a second keep copies nothing and overwrites nothing
    before = {p: p.stat().st_mtime_ns for p in kept.rglob("*")}
    assert keep_runs.keep(root, kept) == (0, len(names))
    assert {p: p.stat().st_mtime_ns for p in kept.rglob("*")} == before

    # the fresh machine: only the kept files; the sweep trains nothing and its table is the same
    fresh = tmp_path / "fresh"
    assert keep_runs.main([str(kept), str(fresh)]) == 0
    monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail("retrained"))
    capsys.readouterr()
    assert run_sweep(str(spec), str(fresh), jobs=1, progress=False) == 0
    assert f"0 ran, {len(names)} already done" in capsys.readouterr().out
    a = pd.read_csv(root / "results.csv").drop(columns=["run"], errors="ignore")
    b = pd.read_csv(fresh / "results.csv").drop(columns=["run"], errors="ignore")
    pd.testing.assert_frame_equal(a, b)


def test_missing_source_is_a_one_line_error(tmp_path, capsys):
    assert keep_runs.main([str(tmp_path / "nowhere"), str(tmp_path / "kept")]) == 2
    assert "is not a folder" in capsys.readouterr().err
