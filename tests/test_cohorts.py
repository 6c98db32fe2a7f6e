"""Cohorts, sampled evaluation and clients without kept item tables (issue 66, item 2;
docs/design.md section 17)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.errors import UserError
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.simulation.config import (
    DataConfig,
    FederationConfig,
    RunConfig,
    TrainConfig,
)
from fedem_private.simulation.loop import Simulation

SYN = SyntheticConfig(n_users=60, n_items=40, mean_activity=8)


@pytest.fixture(scope="module")
def split():
    return leave_one_out(generate(SYN, 0), 0)


def _cfg(**train) -> RunConfig:
    return RunConfig(data=DataConfig(synthetic=SYN),
                     train=TrainConfig(rounds=2, local_epochs=1, dim=4, **train),
                     federation=FederationConfig(method="fedmf"))


def test_a_cohort_is_exactly_k_clients_without_a_sampling_mechanism(split):
    sim = Simulation(_cfg(cohort_size=7), split)
    for t in (1, 2, 3):
        assert sim.participants(t).shape == (7,)
    assert sim.cfg.train.client_fraction == pytest.approx(7 / split.n_users)


def test_a_cohort_sets_the_poisson_rate_of_a_sampling_mechanism(split):
    cfg = _cfg(cohort_size=12)
    cfg = RunConfig(data=cfg.data, train=cfg.train, federation=cfg.federation,
                    privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=1.0,
                                          clip=1.0))
    sim = Simulation(cfg, split)
    assert sim.cfg.privacy.sample_rate == pytest.approx(12 / split.n_users)
    sizes = [sim.participants(t).shape[0] for t in range(1, 200)]
    assert abs(np.mean(sizes) - 12) < 4 * np.sqrt(12 / len(sizes))  # Poisson, mean K
    with pytest.raises(UserError, match="drop --sample-rate"):
        RunConfig(data=cfg.data, train=cfg.train, federation=cfg.federation,
                  privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=1.0, clip=1.0,
                                        sample_rate=0.3)).validate()
    with pytest.raises(UserError, match="more than the"):
        Simulation(_cfg(cohort_size=61), split)


def test_a_sample_of_users_is_evaluated_with_standard_errors(split):
    sim = Simulation(_cfg(eval_users=25), split)
    chosen = sim.eval_sample()
    assert chosen.shape == (25,) and np.array_equal(chosen, np.unique(chosen))
    assert np.array_equal(chosen, Simulation(_cfg(eval_users=25, nonce=9), split).eval_sample())
    sim.run()
    acc = sim.ranks()
    assert int((acc.full >= 0).sum()) == 25
    full = sim.evaluate()["full"]
    assert full["users"] == 25
    hit = (acc.full[chosen] < 10).double()
    assert full["hr@10"] == pytest.approx(float(hit.mean()))
    assert full["hr@10_se"] == pytest.approx(float(hit.std()) / 5)
    every = Simulation(_cfg(), split)
    every.run()
    assert "hr@10_se" not in every.evaluate()["full"]  # every user: nothing sampled
    # the sampled users' ranks are the full run's own (same seed, same training)
    assert torch.equal(every.ranks().full[chosen], acc.full[chosen])


def test_global_tables_train_the_same_and_evaluate_on_the_servers_table(split):
    """Merge sr starts every client from the sent table either way, so the server's table
    is the same; without kept tables a client is evaluated with that table and its own
    p_u, and no (n, m, d) state exists."""
    kept = Simulation(_cfg(), split)
    kept.run()
    free = Simulation(_cfg(client_tables="global"), split)
    free.run()
    assert free.state.q_local is None
    assert torch.equal(kept.aggregator.table, free.aggregator.table)
    assert torch.equal(kept.state.p, free.state.p)
    q, p = free.aggregator.table, free.state.p
    scores = p @ q.T  # (n, m): the shared table, each client's own vector
    from fedem_private.evaluation.metrics import RankAccumulator

    ref = RankAccumulator(split.n_users)
    ref.add_scores(np.arange(split.n_users), scores, free.eval_sets)
    assert torch.equal(ref.full, free.ranks().full)


@pytest.mark.parametrize("fed, words", [
    ({"method": "fedem"}, "merge sr"),
    ({"method": "fedmf", "aggregation": "similarity"}, "one shared table"),
    ({"method": "fedmf", "codec": "lora"}, "codec"),
])
def test_global_tables_refuse_what_reads_a_clients_own_table(fed, words):
    cfg = RunConfig(data=DataConfig(synthetic=SYN), train=TrainConfig(client_tables="global"),
                    federation=FederationConfig(**fed))
    with pytest.raises(UserError, match=words):
        cfg.validate()


def test_finetuned_evaluation_trains_from_the_servers_table_and_changes_no_state(split):
    sim = Simulation(_cfg(client_tables="global", eval_finetune=2, eval_users=30), split)
    sim.run()
    table, p = sim.aggregator.table.clone(), sim.state.p.clone()
    first = sim.evaluate()
    assert torch.equal(sim.aggregator.table, table) and torch.equal(sim.state.p, p)
    assert sim.evaluate() == first  # keyed: the same fine-tuning every time
    plain = Simulation(_cfg(client_tables="global", eval_users=30), split)
    plain.run()
    assert torch.equal(plain.aggregator.table, table)  # training is the same either way
    assert plain.evaluate() != first  # only the evaluated models differ


def test_a_baseline_ranks_the_same_sample_of_users(split):
    from fedem_private.baselines import evaluate, fit

    cfg = RunConfig(data=DataConfig(synthetic=SYN), train=TrainConfig(eval_users=25),
                    federation=FederationConfig(method="mostpop")).validate()
    out = evaluate(cfg, split, fit(cfg, split).scores)
    assert out["full"]["users"] == 25 and "hr@10_se" in out["full"]
    sim = Simulation(_cfg(eval_users=25), split)
    assert np.array_equal(sim.eval_sample(), np.sort(sim.eval_sample()))


def test_negatives_read_only_the_rows_of_the_users_drawn_for():
    """sample_excluding gives the same items whether the exclusion table holds the drawn
    users alone or a whole population beside them (its cost follows the cohort)."""
    from fedem_private.data.negatives import sample_excluding

    g = np.random.default_rng(1)
    m = 30
    rows = [np.sort(g.choice(m, size=int(g.integers(0, m - 1)), replace=False))
            for _ in range(40)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    excluded = np.concatenate(rows).astype(np.int64)
    users = np.array([3, 3, 17, 5, 39, 3])
    u = g.uniform(size=users.shape)
    got = sample_excluding(indptr, excluded, m, users, u)
    for j, (user, draw) in enumerate(zip(users, u, strict=True)):
        allowed = np.setdiff1d(np.arange(m), rows[user])
        assert got[j] == allowed[min(int(draw * allowed.shape[0]), allowed.shape[0] - 1)]


def test_a_csv_with_a_byte_order_mark_loads_and_what_is_set_aside_is_said(tmp_path, capsys):
    """Issue 67: a UTF-8 byte-order mark (as spreadsheet programs write it) is not part of
    the first column's name, and merged duplicates and dropped users are said, with counts."""
    import json
    import random

    from fedem_private.cli import main

    rnd = random.Random(0)
    lines = ["\ufeffuser,item"] + [f"u{u},i{i}" for u in range(30)
                                   for i in rnd.sample(range(40), 6)]
    lines += [lines[1], lines[2], "solo,i1"]  # two repeated rows, a user with one row
    path = tmp_path / "bom.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["run", "--dataset", "csv", "--data-dir", str(path), "--rounds", "1",
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "2 repeated (user, item) rows merged" in err and "1 users with fewer than 3" in err
    data = json.loads((tmp_path / "run" / "summary.json").read_text())["data"]
    assert data["duplicates_merged"] == 2 and data["users_dropped"] == 1


def test_a_cohort_runs_config_toml_repeats_the_run(tmp_path):
    """config.toml records the cohort as given, not the rate derived from it, so the run
    directory's config runs again (it had recorded both, which the config refuses)."""
    from fedem_private.experiments.runner import execute
    from fedem_private.simulation.config import load_toml

    cfg = RunConfig(data=DataConfig(synthetic=SYN),
                    train=TrainConfig(rounds=1, local_epochs=1, dim=4, cohort_size=9),
                    federation=FederationConfig(method="fedmf"),
                    privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=1.0, clip=1.0))
    first = execute(cfg, tmp_path / "a")
    again = load_toml(tmp_path / "a" / "config.toml")
    assert again.privacy.sample_rate == 1.0 and again.train.cohort_size == 9
    assert execute(again, tmp_path / "b")["metrics"] == first["metrics"]
