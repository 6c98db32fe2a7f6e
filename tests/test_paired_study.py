"""The population studies' paired verdicts (benchmarks/paired.py; issue 78, item 3): the
paired test on shared users, Holm's rule, and the floor's k chosen on validation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks import paired as pr
from benchmarks import population_study as study


def test_paired_is_the_mean_of_per_user_differences_and_its_standard_error():
    a = [{1: 1, 2: 1, 3: 0, 4: 1}]
    b = [{1: 0, 2: 1, 3: 0, 4: 0, 5: 1}]  # user 5 is not in a: left out
    t = pr.paired(a, b)
    d = np.array([1, 0, 0, 1])
    assert t.users == 4 and t.seeds == 1
    assert t.diff == pytest.approx(d.mean())
    assert t.se == pytest.approx(d.std(ddof=1) / 2)


def test_paired_takes_the_seeds_spread_when_it_is_larger():
    users = range(400)
    # each seed's paired difference is tiny in-sample, but the seeds disagree in sign
    a = [{u: int(u < 200) for u in users}, {u: 0 for u in users}]
    b = [{u: 0 for u in users}, {u: int(u < 200) for u in users}]
    t = pr.paired(a, b)
    assert t.diff == pytest.approx(0.0)
    assert t.se == pytest.approx(np.std([0.5, -0.5], ddof=1) / math.sqrt(2))


def test_holm_rejects_step_down_and_stops_at_the_first_failure():
    # m = 4: thresholds 0.0125, 0.0167, 0.025, 0.05
    assert pr.holm([0.01, 0.02, 0.06, 0.001]) == [True, True, False, True]
    # 0.03 fails 0.025 and stops the rule, though alone it would pass 0.05
    assert pr.holm([0.03, 0.013, 0.001, 0.04]) == [False, True, True, False]
    assert pr.holm([0.02, 0.001]) == [True, True]  # 0.001 <= 0.025, then 0.02 <= 0.05
    assert pr.holm([0.04, 0.04]) == [False, False]


def test_verdicts_are_two_sided_with_the_sign_of_the_difference():
    strong_up = pr.Paired(0.02, 0.004, 2000, 1)
    strong_down = pr.Paired(-0.02, 0.004, 2000, 1)
    weak = pr.Paired(-0.0022, 0.0009, 6000, 3)  # 2.4 SE: p = 0.015, rejected alone
    assert pr.verdicts([weak]) == ["below"]
    # beside two strong ones it is third: 0.0145 <= 0.05 / 1, still rejected
    assert pr.verdicts([strong_up, strong_down, weak]) == ["beats", "below", "below"]
    many = [strong_down] * 6 + [weak] * 3  # the weak ones meet thresholds 0.0167 ... 0.05
    assert pr.verdicts(many)[-1] == "below"
    weaker = pr.Paired(-0.0022, 0.00094, 6000, 3)  # p = 0.019 > 0.05 / 3: not shown
    assert pr.verdicts([strong_down] * 6 + [weaker] * 3)[-1] == "not shown"
    assert pr.verdicts([pr.Paired(0.001, 0.01, 100, 1)]) == ["not shown"]


def _write_ranks(path, hit_users, users=200):
    path.mkdir(parents=True)
    rank = [0 if u in hit_users else 500 for u in range(users)]
    pd.DataFrame({"user": range(users), "full_rank": rank}).to_csv(path / "ranks.csv",
                                                                   index=False)


def test_the_study_table_chooses_k_on_validation_and_pairs_on_ranks(tmp_path):
    n = 1000
    frame = pd.DataFrame([
        {"users": n, "rung": "mostpop", "seed": 0, "hr10_full": 0.1, "hr10_full_se": 0.02},
        {"users": n, "rung": "dp-mostpop-k10-eps4", "seed": 0, "hr10_full": 0.05,
         "hr10_full_se": 0.015, "val_hr10_full": 0.06},
        {"users": n, "rung": "dp-mostpop-k200-eps4", "seed": 0, "hr10_full": 0.09,
         "hr10_full_se": 0.02, "val_hr10_full": 0.08},
        {"users": n, "rung": "fedmf-cdp-gaussian-eps4", "seed": 0, "hr10_full": 0.3,
         "hr10_full_se": 0.03},
    ])
    runs = tmp_path / "runs"
    _write_ranks(runs / f"N{n}" / "dp-mostpop-k200-eps4-seed0", set(range(18)))
    _write_ranks(runs / f"N{n}" / "fedmf-cdp-gaussian-eps4-seed0", set(range(60)))
    assert study.floor_rungs(frame) == {(n, 4.0): "dp-mostpop-k200-eps4"}
    text = study.table(frame, [4.0], runs)
    line = next(x for x in text.splitlines() if "fedmf-cdp-gaussian-eps4" in x)
    assert "(k 200)" in line and "+0.2100" in line and line.endswith("| beats |")
    assert "(200; 1)" in line  # 200 users, one run
    # a second training nonce of seed 0 is one more replicate against seed 0's floor
    _write_ranks(runs / f"N{n}" / "fedmf-cdp-gaussian-eps4-nonce1-seed0", set(range(18)))
    again = next(x for x in study.table(frame, [4.0], runs).splitlines()
                 if "fedmf-cdp-gaussian-eps4" in x)
    assert "+0.1050" in again and "(400; 2)" in again  # (0.21 + 0.0) / 2 over 2 runs
    # without the ranks the older, unpaired rule is used and says so
    unpaired = study.table(frame, [4.0], tmp_path / "none")
    assert "beats (unpaired)" in unpaired


def test_a_study_csv_from_before_the_k_grid_keeps_its_k50_floor():
    frame = pd.DataFrame([
        {"users": 10, "rung": "dp-mostpop-central-eps4", "seed": 0, "hr10_full": 0.07,
         "hr10_full_se": 0.01},
        {"users": 10, "rung": "fedmf-cdp-gaussian-eps4", "seed": 0, "hr10_full": 0.07,
         "hr10_full_se": 0.01}])
    assert study.floor_rungs(frame) == {(10, 4.0): "dp-mostpop-central-eps4"}
    assert "within noise (unpaired)" in study.table(frame, [4.0])


def test_the_study_runs_every_k_of_the_grid_with_validation():
    args = study.parse_args(["--epsilons", "4", "--k-grid", "25", "200", "--data-dir", "d"])
    names = dict(study.rungs(10_000, 0, args))
    for k in (25, 200):
        cfg = names[f"dp-mostpop-k{k}-eps4-seed0"]
        assert cfg["baseline"]["k"] == k and cfg["train"]["select_round"] == "best-val-full"


def test_a_second_nonce_tags_the_federated_rungs_and_keeps_the_users():
    args = study.parse_args(["--epsilons", "4", "--k-grid", "50", "--data-dir", "d",
                             "--nonce", "1"])
    names = dict(study.rungs(10_000, 0, args))
    cfg = names["fedmf-cdp-gaussian-eps4-nonce1-seed0"]
    assert cfg["train"]["nonce"] == 1 and cfg["train"]["seed"] == 0
    assert "fedmf-none-nonce1-seed0" in names
    assert "nonce" not in names["dp-mostpop-k50-eps4-seed0"]["train"]  # baselines: one each


def _strategy_frame() -> pd.DataFrame:
    """A study.csv: DP-FedAvg at three seeds, banded and the tree at seed 0 (N = 10^4, eps 4),
    and one cell where the tree is not below DP-FedAvg (eps 8)."""
    rows = [(10_000, "fedmf-cdp-gaussian-eps4", s, hr) for s, hr in
            ((0, 0.0975), (1, 0.0815), (2, 0.0810))]
    rows += [(10_000, "fedmf-dp-ftrl-banded-eps4", 0, 0.0920),
             (10_000, "fedmf-dp-ftrl-eps4", 0, 0.0510),
             (10_000, "fedmf-cdp-gaussian-eps8", 0, 0.0700),
             (10_000, "fedmf-dp-ftrl-eps8", 0, 0.0710),
             (10_000, "fedmf-dp-ftrl-banded-eps8", 0, 0.0600)]
    return pd.DataFrame([{"users": n, "rung": r, "seed": s, "hr10_full": hr,
                          "hr10_full_se": 0.0063} for n, r, s, hr in rows])


def test_the_strategy_table_reads_every_arm_at_the_strategys_seeds():
    from benchmarks import strategy_grid as grid

    text = grid.table(_strategy_frame(), "fedmf", "dp-ftrl-banded", None)
    eps4 = next(line for line in text.splitlines() if line.startswith("| 10,000 | 4 |"))
    # DP-FedAvg at seed 0 only (0.0975), not its three-seed mean (0.0867): banded's 0.0920 is
    # within one SE (0.0063) of it, and above the tree
    assert "| 0 | 0.0975 ± 0.0063 | 0.0510 ± 0.0063 | 0.0920 ± 0.0063 | yes | yes |" in eps4
    head = text.splitlines()[0]  # strategies no row ran (BLT, amplified) are left out
    assert "| tree | banded |" in head and "BLT" not in head and "amplified" not in head
    eps8 = next(line for line in text.splitlines() if line.startswith("| 10,000 | 8 |"))
    assert "| no | n/a |" in eps8  # 0.0600 < 0.0700 - 0.0063; the tree is not below DP-FedAvg


@pytest.mark.parametrize("strategy, fedavg, tree, want", [
    ((0.09, 0.006), (0.095, 0.006), (0.05, 0.005), ("yes", "yes")),
    ((0.08, 0.006), (0.095, 0.006), (0.05, 0.005), ("no", "yes")),
    ((0.04, 0.006), (0.095, 0.006), (0.05, 0.005), ("no", "no")),
    ((0.09, 0.006), (0.095, 0.006), None, ("yes", "n/a")),
    (None, (0.095, 0.006), (0.05, 0.005), ("-", "-")),
])
def test_the_issues_two_checks(strategy, fedavg, tree, want):
    from benchmarks import strategy_grid as grid

    assert grid.checks(strategy, fedavg, tree) == want
