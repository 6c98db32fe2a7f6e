"""Clients that keep only the rows they trained (``--client-tables sparse``; issue 79,
docs/design.md sections 7 and 17): the same run as ``kept``, state that grows with the
rows trained, and the refusals."""

from __future__ import annotations

import pickle

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
from fedem_private.simulation.sparse_tables import estimate_bytes

# 80 items, about 6 positives a user: a round trains about 30 rows of a client's 80
SYN = SyntheticConfig(n_users=40, n_items=80, mean_activity=6)
ROUNDS = 4

METHODS = {
    "fedem": {"method": "fedem", "aggregation": "fedavg"},  # learned rho per item
    "fedem-frozen": {"method": "fedem", "aggregation": "fedavg", "merge": "sm"},  # rho 0.5
    "fedem-seen": {"method": "fedem", "aggregation": "fedavg", "merge_rows": "seen"},
    "pfedrec-em": {"method": "pfedrec", "merge": "em"},
    "fedmf": {"method": "fedmf"},
}
MECHANISMS = {
    "none": {},
    "ldp-laplace": {"mode": "ldp-laplace", "epsilon": 10.0, "clip": 1.0},
    "cdp-gaussian": {"mode": "cdp-gaussian", "noise_multiplier": 1.0, "clip": 1.0,
                     "sample_rate": 0.5},
}


@pytest.fixture(scope="module")
def split():
    return leave_one_out(generate(SYN, 0), 0)


def _cfg(tables: str, fed: dict, privacy: dict | None = None, **train) -> RunConfig:
    privacy = privacy or {}
    # half the clients a round (the mechanism's Poisson sample under cdp-gaussian), so
    # clients skip rounds and merge with tables of different rounds
    fraction = 1.0 if privacy.get("mode") == "cdp-gaussian" else 0.5
    return RunConfig(data=DataConfig(synthetic=SYN),
                     train=TrainConfig(**{"rounds": ROUNDS, "local_epochs": 1, "dim": 4,
                                          "client_fraction": fraction,
                                          "client_tables": tables, **train}),
                     federation=FederationConfig(**fed), privacy=PrivacyConfig(**privacy))


def _both(split, fed: dict, privacy: dict | None = None,
          **train) -> tuple[Simulation, Simulation]:
    runs = []
    for tables in ("kept", "sparse"):
        sim = Simulation(_cfg(tables, fed, privacy, **train), split)
        sim.run()
        runs.append(sim)
    return runs[0], runs[1]


def _assert_same(kept: Simulation, sparse: Simulation, n: int) -> None:
    """The server's table, every client's own table and private groups, and the metrics
    of the sparse run equal the kept run's (up to the float order of batched products)."""
    assert sparse.state.q_local is None and sparse.state.sparse is not None
    idx = torch.arange(n)
    close = {"rtol": 0.0, "atol": 1e-6}
    torch.testing.assert_close(sparse.aggregator.table, kept.aggregator.table, **close)
    torch.testing.assert_close(sparse.state.items(idx), kept.state.items(idx), **close)
    for name, value in kept.state.private.items():
        torch.testing.assert_close(sparse.state.private[name], value, **close)
    got, want = sparse.evaluate(), kept.evaluate()
    assert set(got) == set(want)
    for kind, values in want.items():
        assert got[kind] == pytest.approx(values, abs=1e-9)


def _depth(sim: Simulation) -> int:
    """The most merges any client has recorded since its base."""
    assert sim.state.sparse is not None
    return max(len(h or ()) for h in sim.state.sparse.merges)


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("method", list(METHODS))
def test_sparse_tables_run_as_kept_tables(split, method, mechanism):
    """FedEM (learned rho, rho frozen at 0.5, --merge-rows seen), PFedRec+EM and FedMF,
    without a mechanism, under ldp-laplace and under cdp-gaussian: four rounds with half
    the clients a round give the same tables and metrics kept or sparse."""
    kept, sparse = _both(split, METHODS[method], MECHANISMS[mechanism])
    _assert_same(kept, sparse, split.n_users)
    tables = sparse.state.sparse
    if sparse.merger.merges:  # some client's table is a replay of two merges or more
        assert _depth(sparse) >= 2
        assert (tables.base > 0).any()  # ... from a base other than the initial table
    else:  # static replacement: each client keeps only its last round's rows
        assert _depth(sparse) == 0
    assert tables.stored_rows().mean() < split.n_items / 2  # rows, not whole tables


@pytest.mark.parametrize("fed, privacy, train", [
    ({"method": "fedem", "aggregation": "fedavg", "merge": "dm"}, None, {}),
    ({"method": "fedem", "aggregation": "fedavg", "adapter_objective": "holdout"}, None, {}),
    ({"method": "fedem", "aggregation": "fedavg", "merge_every": 2}, None, {}),
    ({"method": "fedem", "aggregation": "fedavg", "prox_mu": 0.5}, None, {}),
    ({"method": "fedem", "aggregation": "uniform", "merge_every_batch": True}, None, {}),
    ({"method": "fedem", "aggregation": "fedavg"},
     {"mode": "ldp-dpsgd", "epsilon": 8.0, "dpsgd_adapter_steps": 1}, {}),
    ({"method": "fedem", "aggregation": "fedavg"}, None, {"state_dtype": "bfloat16"}),
    ({"method": "fedmf"}, None, {"state_dtype": "bfloat16"}),
])
def test_sparse_tables_follow_the_merges_variants(split, fed, privacy, train):
    """The merge's variants and a bfloat16 state: a replayed merge is the one the round
    applied (dm's mean over every row, the holdout adapter, rounds without a merge, the
    proximal pull, the adapter trained on every batch, ldp-dpsgd's DP-SGD adapter), and
    each replayed step is rounded as kept rounds its stored table."""
    kept, sparse = _both(split, fed, privacy, **train)
    _assert_same(kept, sparse, split.n_users)


def test_static_replacement_keeps_the_last_rounds_trained_rows_only(split):
    """FedMF: a client's table is the table it was last sent but for the rows its last
    round trained (at most its positives and their negatives), so its state is those rows,
    never n m d; its base is the round it last took part in."""
    sim = Simulation(_cfg("sparse", METHODS["fedmf"]), split)
    last = np.zeros(split.n_users, dtype=np.int64)
    for t in range(1, ROUNDS + 1):
        last[sim.participants(t)] = t
        sim.step()
    tables = sim.state.sparse
    assert np.array_equal(tables.base, last)
    bound = np.minimum(split.n_items, split.train_counts * (1 + sim.cfg.train.num_negatives))
    rows = tables.stored_rows()
    assert (rows <= bound).all() and (rows[last > 0] > 0).all() and (rows[last == 0] == 0).all()
    # a table no client refers to any more is freed
    assert set(tables.sent) == {0, *np.unique(last[last > 0]).tolist()}
    dense = split.n_users * split.n_items * 4 * 4
    assert tables.nbytes() < dense / 2


def test_seen_rows_drop_what_a_merge_replaces(split):
    """--merge-rows seen: after a merge a client keeps, outside its training items, only
    the rows its last round trained (the merge took the sent table's rows there)."""
    sim = Simulation(_cfg("sparse", METHODS["fedem-seen"]), split)
    last = np.zeros(split.n_users, dtype=np.int64)
    for t in range(1, ROUNDS + 1):
        last[sim.participants(t)] = t
        sim.step()
    tables = sim.state.sparse
    ptr, items = split.train_indptr, split.train_items
    checked = 0
    for u in range(split.n_users):
        if tables.items[u] is None or not tables.merges[u]:
            continue
        own = set(items[ptr[u]:ptr[u + 1]].tolist())
        depth = len(tables.merges[u])
        outside = [int(s) for i, s in zip(tables.items[u].tolist(), tables.steps[u].tolist(),
                                          strict=True) if i not in own]
        assert all(s == depth for s in outside)  # trained in the last participation only
        checked += bool(outside)
    assert checked > 0


def test_the_estimate_bounds_the_state_when_every_client_takes_part(split):
    """With every client in every round the estimate's participations are exact, so it
    bounds what the sparse tables hold (rows, their items and indices, adapters, sent
    tables)."""
    sim = Simulation(_cfg("sparse", METHODS["fedem"], client_fraction=1.0), split)
    q0 = sim.aggregator.table
    estimate = sim._sparse_estimate(q0, torch.float32)
    sim.run()
    assert 0 < sim.state.sparse.nbytes() <= estimate
    seen = estimate_bytes(split.train_counts, split.n_items, 4, 4, 4, ROUNDS, 1.0, 0, False)
    every = estimate_bytes(split.train_counts, split.n_items, 4, 4, 4, ROUNDS, 1.0, 0, True)
    assert seen < every  # a merge of every row keeps the union of the rounds' rows


def test_a_sparse_population_that_cannot_fit_is_refused_in_one_line(monkeypatch):
    from fedem_private import hostmem
    from fedem_private.experiments.runner import prepare

    cfg = RunConfig(data=DataConfig(synthetic=SyntheticConfig(n_users=40, n_items=50)),
                    train=TrainConfig(rounds=3, dim=8, client_tables="sparse"),
                    federation=FederationConfig(method="fedem", aggregation="fedavg"))
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 10_000)
    with pytest.raises(UserError, match=r"--client-tables sparse keeps the rows each client "
                                        r"trained: about .* GiB of state for 40 clients") as err:
        prepare(cfg)
    assert "\n" not in str(err.value)
    monkeypatch.setattr(hostmem, "available_bytes", lambda: None)  # unknown: no refusal
    prepare(cfg)


@pytest.mark.parametrize("fed, words", [
    ({"method": "fedem"}, "aggregation fedavg or uniform.*got aggregation 'similarity'"),
    ({"method": "fedem", "aggregation": "fedavg", "agg_clients_ratio": 0.5},
     "--agg-clients-ratio 1"),
    ({"method": "fedmf", "codec": "lora"}, "codec 'lora' trains its own parameters"),
])
def test_sparse_tables_refuse_what_needs_per_client_sent_tables(fed, words):
    cfg = RunConfig(data=DataConfig(synthetic=SYN), train=TrainConfig(client_tables="sparse"),
                    federation=FederationConfig(**fed))
    with pytest.raises(UserError, match=words) as err:
        cfg.validate()
    assert "\n" not in str(err.value)


def test_sparse_tables_refusals_exit_2(split, tmp_path, capsys):
    from fedem_private.cli import main

    assert main(["run", "--dataset", "synthetic", "--method", "fedem", "--client-tables",
                 "sparse", "--rounds", "1", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--client-tables sparse" in err and len(err.splitlines()) == 1
    with pytest.raises(UserError, match="--client-tables sparse: backbone 'fedrap' keeps"):
        Simulation(_cfg("sparse", {"method": "fedrap"}), split)
    from fedem_private.simulation.shards import InProcessShards

    sim = Simulation(_cfg("sparse", METHODS["fedmf"], MECHANISMS["cdp-gaussian"]), split)
    with pytest.raises(UserError, match="--client-tables sparse keeps an item table"):
        sim.shard(InProcessShards(sim, 2))


@pytest.mark.parametrize("name", ["fedem", "fedem-frozen"])
def test_a_finetuned_evaluation_of_a_merge_is_the_same_sparse_or_kept(split, name):
    """--eval-finetune under a merge starts from equation 10's merge of the user's own
    table with the one sent (issue 79: FedEM in the population study): sparse reads what
    kept reads, and the evaluation leaves the state as it was."""
    kept, sparse = _both(split, METHODS[name], eval_finetune=1, eval_users=20)
    before = kept.state.items(torch.arange(SYN.n_users)).clone()
    a, b = kept.evaluate(), sparse.evaluate()
    assert a["full"]["hr@10"] == pytest.approx(b["full"]["hr@10"])
    assert torch.equal(kept.state.items(torch.arange(SYN.n_users)), before)


def test_a_finetuned_merge_with_rho_zero_starts_from_the_users_own_table(split):
    """With rho frozen at 0 equation 10 gives the user's own table: the fine-tune's start
    is Q_l, so the evaluation equals one whose start is swapped for Q_l by hand."""
    fed = {**METHODS["fedem-frozen"], "rho": 0.0}
    sim = Simulation(_cfg("kept", fed, eval_finetune=1, eval_users=20), split)
    sim.run()
    merged = sim.evaluate()
    own = sim._sent_params  # noqa: SLF001  (the start the fine-tune would take without a merge)

    def own_start(idx):
        params = own(idx)
        params.items = sim.state.items(idx)
        return params

    sent = sim._sent_params  # noqa: SLF001
    sim._sent_params = own_start  # noqa: SLF001
    assert sim.evaluate() == merged  # Q_l merged with itself is Q_l
    sim._sent_params = sent  # noqa: SLF001
    sim._remerge = lambda users, q_prev, table, used: table  # noqa: SLF001  (no merge)
    assert sim.evaluate() != merged  # from the server's table alone: another start


def test_a_sparse_run_resumes_from_a_pickled_state(split):
    """A checkpoint (the simulation pickled without its data) of a sparse run goes on as
    the unbroken run does."""
    cfg = _cfg("sparse", METHODS["fedem"])
    whole = Simulation(cfg, split)
    whole.run()
    part = Simulation(cfg, split)
    part.step()
    part.step()
    again = pickle.loads(pickle.dumps(part))
    again.attach_split(split)
    again.run()
    _assert_same(whole, again, split.n_users)
