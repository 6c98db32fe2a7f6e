"""The ladder's rungs: a finished rung is reused only when its config is the rung's
(benchmarks/ladder.py)."""

from __future__ import annotations

import pytest

from benchmarks.ladder import changed_keys, ensure

CFG = {"data": {"dataset": "synthetic",
                "synthetic": {"n_users": 30, "n_items": 40, "mean_activity": 6}},
       "train": {"rounds": 2, "seed": 0, "local_epochs": 1}, "federation": {"method": "fedmf"}}


def test_a_finished_rung_of_another_config_stops_the_ladder(tmp_path):
    path = tmp_path / "fedmf-tuned-seed0"
    first = ensure(path, CFG)
    assert changed_keys(path, CFG) == []
    assert ensure(path, CFG) == first  # reused, not run again
    other = {**CFG, "train": {**CFG["train"], "lr": 0.5}}
    assert changed_keys(path, other) == ["train.lr"]
    with pytest.raises(SystemExit, match=r"another config \(train.lr\)"):
        ensure(path, other)
    assert not path.with_name(path.name + ".checkpoint").exists()
