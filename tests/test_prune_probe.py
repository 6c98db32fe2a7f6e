"""benchmarks/probes/prune_rule.py: stopping rules replayed on kept tuning trials."""

from __future__ import annotations

import json

from benchmarks.probes.prune_rule import _trial, replay

ITEMS = 10_000  # chance 0.001; with 1,000 users the band is 0.001 + 3 * 0.001 = 0.004


def _write(folder, readings):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"n_items": ITEMS}))
    lines = ["round,val_full_hr@10,val_full_users"]
    lines += [f"{r},{v},1000" for r, v in readings.items()]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    return _trial(folder)


def test_the_chance_rule_stops_a_late_learner_and_says_so(tmp_path):
    late = _write(tmp_path / "0000", {10: 0.0, 30: 0.002, 50: 0.05, 100: 0.09})
    early = _write(tmp_path / "0001", {10: 0.03, 30: 0.06, 50: 0.07, 100: 0.08})
    flat = _write(tmp_path / "0002", {10: 0.001, 30: 0.001, 50: 0.0, 100: 0.001})
    assert abs(late["band"] - 0.004) < 1e-3
    r = replay([late, early, flat], "chance", 30)
    assert [t["name"] for t in r["stopped"]] == ["0000", "0002"]
    assert [t["name"] for t in r["late"]] == ["0000"]  # it ended at 0.09, above chance
    assert r["best_stopped"]  # the study's best by last reading was the one stopped
    assert abs(r["saved"] - (70 + 70) / 300) < 1e-12


def test_the_median_rule_waits_for_five_finished_trials(tmp_path):
    good = [_write(tmp_path / f"{i:04d}", {30: 0.05, 60: 0.06, 100: 0.07}) for i in range(5)]
    first_low = _write(tmp_path / "0009", {30: 0.01, 60: 0.02, 100: 0.09})
    assert replay([first_low, *good], "median", 30)["stopped"] == []  # no five before it
    r = replay([*good, first_low], "median", 30)
    assert [t["name"] for t in r["stopped"]] == ["0009"]
    assert abs(r["saved"] - 70 / 600) < 1e-12  # stopped at round 30 of 100
