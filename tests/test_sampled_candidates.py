"""Sampled metrics on a small catalogue: a user with fewer than 99 items to draw its sampled
negatives from gets repeated negatives; the run says so (summary.json and a warning line)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedem_private.cli import main
from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.evaluation.metrics import build_eval_sets, sampled_pools
from fedem_private.experiments.sweep import point_result


def _split(n_items: int, activity: int):
    data = generate(SyntheticConfig(n_users=40, n_items=n_items, mean_activity=activity,
                                    activity_sigma=1.0), seed=3)
    return leave_one_out(data, 3)


@pytest.mark.parametrize("protocol", ["strict", "paper"])
def test_pools_are_the_items_the_sampled_negatives_are_drawn_from(protocol):
    sp = _split(70, 20)
    pools = sampled_pools(sp)
    sets = build_eval_sets(sp, protocol, seed=0, n_sampled=2000)  # draws exhaust each pool
    distinct = np.array([np.unique(row).size for row in sets.sampled.numpy()])
    assert (distinct == pools).all()
    assert 0 < pools.min() and pools.max() < 70


def _cli_run(tmp_path, n_items: int, activity: int, extra=()):
    cfg = tmp_path / f"small-{n_items}.toml"
    cfg.write_text(f"[data.synthetic]\nn_users = 40\nn_items = {n_items}\n"
                   f"mean_activity = {activity}\n", encoding="utf-8")
    out = tmp_path / f"run-{n_items}-{'-'.join(extra) or 'fedmf'}"
    rc = main(["run", "--config", str(cfg), "--rounds", "1", "--local-epochs", "1",
               "--no-progress", "--out", str(out), *extra])
    assert rc == 0
    return out, json.loads((out / "summary.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("extra", [(), ("--method", "mostpop")])
def test_a_small_catalogue_is_flagged_once_in_the_summary_and_on_the_console(tmp_path, capsys,
                                                                             extra):
    out, summary = _cli_run(tmp_path, 60, 10, extra)
    err = capsys.readouterr().err
    note = summary["sampled_candidates"]
    n = summary["n_users"]
    assert note["asked"] == 99 and note["users"] == n > 0
    assert note["users_short"] == n and note["fewest"] < 60
    assert f"{n} of {n} users" in note["warning"]
    assert "not comparable" in note["warning"]
    warned = [line for line in err.splitlines() if "sampled" in line]
    assert len(warned) == 1 and warned[0].startswith("fedem-private: warning: "), err
    assert f"{n} users with fewer than 99 sampled candidates" in point_result(out)


def test_a_large_catalogue_carries_no_warning(tmp_path, capsys):
    out, summary = _cli_run(tmp_path, 400, 10)
    note = summary["sampled_candidates"]
    assert note["users_short"] == 0 and note["warning"] is None and note["fewest"] >= 99
    assert "sampled" not in capsys.readouterr().err
    assert "sampled" not in point_result(out)
