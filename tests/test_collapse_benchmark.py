"""benchmarks/probes/collapse.py: the dead-unit and constant-score measures can tell a dead MLP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package

from benchmarks.common import run_config  # noqa: E402
from benchmarks.probes.collapse import collapse_stats  # noqa: E402
from fedem_private.experiments.runner import prepare  # noqa: E402


@pytest.mark.parametrize("method, group", [("fedncf", "dense_local"), ("gpfedrec", "private")])
def test_collapse_stats_tell_a_live_mlp_from_a_dead_one(method, group):
    sim = prepare(run_config("synthetic", **{"federation.method": method, "train.rounds": 1}))
    live = collapse_stats(sim)
    assert live["constant"] == 0.0  # a freshly initialised MLP ranks the items
    assert 0.0 <= live["dead_l0"] < 0.5 and 0.0 <= live["dead_last"] < 1.0
    mlp = getattr(sim.state, group)
    last_hidden = max(int(n[1:]) for n in mlp if n.startswith("w")) - 1
    mlp[f"b{last_hidden}"].fill_(-1e3)  # the last hidden layer off for every input
    dead = collapse_stats(sim)
    assert dead["dead_last"] == 1.0 and dead["constant"] == 1.0
    assert dead["dead_l0"] == pytest.approx(live["dead_l0"])  # the first layer untouched
    mlp["b0"].fill_(-1e3)
    assert collapse_stats(sim)["dead_l0"] == 1.0
