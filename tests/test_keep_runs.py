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


def test_a_kept_tune_study_resumes_on_a_fresh_machine(tmp_path):
    """A tune folder's trials and study.db travel; the study resumes from the copy with its
    finished trials (not rerun) and tops up; an older copy never replaces a newer file."""
    pytest.importorskip("optuna")
    from fedem_private.experiments.tune import run_tuning

    spec = tmp_path / "t.toml"
    spec.write_text('[tune]\ntrials = 2\nseed = 1\n[tune.space]\n'
                    '"baseline.ease_lambda" = { low = 1.0, high = 1000.0, log = true }\n'
                    '[base.data.synthetic]\nn_users = 30\nn_items = 40\nmean_activity = 8\n'
                    '[base.federation]\nmethod = "ease"\n')
    root, kept, fresh = tmp_path / "study", tmp_path / "kept", tmp_path / "fresh"
    run_tuning(spec, root)
    assert keep_runs.keep(root, kept) == (2, 0)
    assert (kept / "study.db").is_file() and not (kept / "trials.csv").exists()
    assert not keep_runs.keep_study(root, kept)  # as new already: nothing copied
    assert keep_runs.main([str(kept), str(fresh)]) == 0
    before = pd.read_csv(root / "trials.csv")
    out = run_tuning(spec, fresh, trials=3)
    assert out["completed"] == 3
    after = pd.read_csv(fresh / "trials.csv")
    pd.testing.assert_frame_equal(after.iloc[:2].drop(columns="run_dir"),
                                  before.drop(columns="run_dir"))
    assert (fresh / "best.toml").is_file()
    assert not keep_runs.keep_study(kept, fresh)  # the fresh study is newer: kept as is
