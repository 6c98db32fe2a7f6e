"""benchmarks.tuning_curves reads each trial's own objective (issue 42)."""

from __future__ import annotations

import json

from benchmarks.tuning_curves import table, trials


def _trial(folder, n, select_round, val, val_full):
    run = folder / "trials" / f"{n:04d}"
    run.mkdir(parents=True)
    metrics = {"val": {"hr@10": val}, "val_full": {"hr@10": val_full},
               "sampled": {"hr@10": 0.5}, "full": {"hr@10": 0.1}}
    (run / "summary.json").write_text(json.dumps({"metrics": metrics}))
    (run / "config.toml").write_text(f'[train]\nselect_round = "{select_round}"\nlr = {n}.0\n'
                                     '[privacy]\nmode = "none"\n')


def test_a_full_ranking_study_is_read_by_its_full_validation(tmp_path):
    sampled, full = tmp_path / "s", tmp_path / "f"
    for n in (1, 2):
        _trial(sampled, n, "best-val", 0.6 + n / 100, 0.02)
        _trial(full, n, "best-val-full", 0.6, 0.02 + n / 100)
    assert [r["val"] for r in trials(sampled)] == [0.61, 0.62]
    got = trials(full)
    assert [r["val"] for r in got] == [0.03, 0.04] and {r["objective"] for r in got} == {"full"}
    assert "val HR@10 (full ranking; the objective)" in table("f", got)
    assert "val HR@10 (sampled; the objective)" in table("s", trials(sampled))


def test_the_plot_axes_name_the_studies_objective(tmp_path, monkeypatch):
    """A full-ranking study's panels say "full ranking", a mix of studies says so; the
    axes never claim "sampled" for a full-ranking objective."""
    import matplotlib.axes

    from benchmarks.tuning_curves import main

    for n in (1, 2):
        _trial(tmp_path / "s", n, "best-val", 0.6 + n / 100, 0.02)
        _trial(tmp_path / "f", n, "best-val-full", 0.6, 0.02 + n / 100)
    labels: list[str] = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel",
                        lambda self, text, *a, **k: labels.append(text))
    main([str(tmp_path / "f"), "--out", str(tmp_path / "out")])
    assert labels[0] == "best validation HR@10 so far (full ranking)"
    main([str(tmp_path / "f"), str(tmp_path / "s"), "--out", str(tmp_path / "out")])
    assert labels[-2] == "best validation HR@10 so far (each study's objective)"
