"""Large catalogues under user-level DP (issue 78, item 1; docs/design.md section 18): the
secure sum formed from the rows each client trained (equal to the dense reference, taken only
where exact), and private row selection (accounted, harnessed, only its rows released)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.errors import Diverged
from fedem_private.privacy.central import packed_rows, sparse_sum_part, sum_part
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.simulation.config import DataConfig, FederationConfig, RunConfig, TrainConfig
from fedem_private.simulation.loop import SecureSumUploads, Simulation

SYN = SyntheticConfig(n_users=50, n_items=60, mean_activity=8)


def _uploads(k: int = 6, n: int = 30, d: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sent = torch.randn(n, d, generator=g).expand(k, n, d)  # every client was sent the same
    rows = torch.rand(k, n, generator=g) < 0.2
    rows[0] = False  # a client that trained nothing
    rows[1] = True  # and one that trained every row
    scale = torch.tensor([1.0, 5.0, 0.01, 3.0, 0.2, 9.0])[:k, None, None]
    local = sent + rows[:, :, None] * torch.randn(k, n, d, generator=g) * scale
    return sent, local.float(), rows


@pytest.mark.parametrize("clip", [0.05, 1.0, 100.0])
def test_the_sparse_sum_equals_the_dense_sum_over_every_row(clip):
    sent, local, rows = _uploads()
    dense, sparse = sum_part(sent, local, clip), sparse_sum_part(sent, local, rows, clip)
    torch.testing.assert_close(sparse.total, dense.total, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(sparse.stats.norms, dense.stats.norms, rtol=1e-12, atol=0)
    assert sparse.stats.fraction_clipped == dense.stats.fraction_clipped
    assert sparse.k == dense.k == 6
    assert 0 < dense.stats.fraction_clipped < 1 or clip == 100.0


def test_packed_rows_lists_each_clients_rows_in_order():
    rows = torch.tensor([[False, True, False, True], [False, False, False, False],
                         [True, True, True, False]])
    ids, valid = packed_rows(rows)
    assert ids.shape == (3, 3)
    assert ids[valid].tolist() == [1, 3, 0, 1, 2]
    assert valid.sum(dim=1).tolist() == [2, 0, 3]


def test_a_non_finite_trained_row_is_refused():
    sent, local, rows = _uploads()
    local[3, int(rows[3].nonzero()[0, 0])] = float("nan")
    with pytest.raises(Diverged, match="non-finite"):
        sparse_sum_part(sent, local, rows, 1.0)


def _sim(split, method: str = "fedmf", tables: str = "global", sparse: bool = True,
         **fed: str) -> Simulation:
    cfg = RunConfig(data=DataConfig(synthetic=SYN),
                    train=TrainConfig(rounds=2, local_epochs=2, dim=4, cohort_size=20,
                                      client_tables=tables),
                    federation=FederationConfig(method=method, **fed),
                    privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=0.7, clip=0.5))
    sim = Simulation(cfg, split)
    assert isinstance(sim.uploads, SecureSumUploads)
    sim.uploads.sparse_sums = sparse
    return sim


@pytest.fixture(scope="module")
def split():
    return leave_one_out(generate(SYN, 0), 0)


@pytest.mark.parametrize("tables", ["global", "kept"])
def test_a_private_run_reads_the_same_with_sparse_and_dense_sums(split, tables):
    sims = [_sim(split, tables=tables, sparse=s) for s in (True, False)]
    for sim in sims:
        sim.step()
        sim.step()
    a, b = (s.aggregator.table for s in sims)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(a, sims[0].state.q_global * 0)  # the table moved


def test_the_sparse_sum_is_taken_without_a_merge_and_not_with_one(split, monkeypatch):
    seen: list[bool] = []
    original = SecureSumUploads.sum_rows

    def spy(self, rnd, work):
        rows = original(self, rnd, work)
        seen.append(rows is not None)
        return rows

    monkeypatch.setattr(SecureSumUploads, "sum_rows", spy)
    _sim(split).step()
    assert seen and all(seen)  # FedMF: every client trains from the table it was sent
    seen.clear()
    sim = _sim(split, method="fedem", tables="kept", aggregation="fedavg")
    sim.step()
    sim.step()  # from round 2 FedEM merges: the start is not what was sent
    assert seen and not all(seen)


# ------------------------------------------------------------------ private row selection
def _selecting(split, rows: int = 6, z: float = 1.0, **privacy) -> Simulation:
    cfg = RunConfig(data=DataConfig(synthetic=SYN),
                    train=TrainConfig(rounds=3, local_epochs=1, dim=4, cohort_size=25,
                                      client_tables="global"),
                    federation=FederationConfig(method="fedmf"),
                    privacy=PrivacyConfig(mode="cdp-gaussian", noise_multiplier=z, clip=0.5,
                                          select_rows=rows, **privacy))
    return Simulation(cfg, split)


def test_the_counts_and_the_table_share_the_rounds_multiplier():
    from fedem_private.privacy.params import resolve_params

    p = resolve_params(PrivacyConfig(mode="cdp-gaussian", epsilon=4.0, clip=1.0,
                                     sample_rate=0.1, select_rows=10, select_share=0.2), 20)
    plain = resolve_params(PrivacyConfig(mode="cdp-gaussian", epsilon=4.0, clip=1.0,
                                         sample_rate=0.1), 20)
    assert p.noise_multiplier == plain.noise_multiplier  # the accounting is unchanged
    z, zs, zc = p.noise_multiplier, p.sum_noise_multiplier, p.select_noise_multiplier
    assert zs ** -2 + zc ** -2 == pytest.approx(z ** -2, rel=1e-12)
    assert zc ** -2 == pytest.approx(0.2 * z ** -2, rel=1e-12)
    assert p.noise_scale == pytest.approx(zs * 1.0)  # the table's noise is z_s C


def test_only_the_selected_rows_move_and_none_before_the_first_count(split):
    sim = _selecting(split)
    start = sim.aggregator.table.clone()
    sim.step()
    assert torch.equal(sim.aggregator.table, start)  # round 1: no row selected yet
    selection = sim.privacy.secure.selection
    chosen = selection.selected.clone()
    assert int(chosen.sum()) == 6
    sim.step()
    moved = (sim.aggregator.table != start).any(dim=1)
    assert torch.equal(moved, chosen)  # exactly the selected rows, noise included


def test_without_noise_the_selection_is_the_top_of_the_normalised_counts(split):
    sim = _selecting(split, rows=5, z=0.0)
    sim.step()
    clients = sim.participants(1)
    counts = np.zeros(split.n_items)
    for u in clients.tolist():
        own = np.unique(split.train_of(u))
        counts[own] += 1.0 / np.sqrt(own.shape[0])
    selection = sim.privacy.secure.selection
    np.testing.assert_allclose(selection.counts.numpy(), counts, rtol=1e-12)
    top = np.lexsort((np.arange(split.n_items), -counts))[:5]
    assert sorted(np.flatnonzero(selection.selected.numpy()).tolist()) == sorted(top.tolist())


@pytest.mark.parametrize("pair", ["replace", "removal"])
def test_row_selection_passes_the_neighbour_world_harness(pair):
    from fedem_private.experiments import neighbours as nb

    settings = {**nb.MODE_SETTINGS["cdp-gaussian"], "select_rows": 8}
    if pair == "removal":  # one divisor q N in both worlds (nb.removal_pair)
        settings["public_population"] = 60
    cfg = nb.make_config("cdp-gaussian", method="fedmf", settings=settings)
    if pair == "replace":
        found = nb.run_pair(cfg)
    else:
        found = nb.removal_pair(cfg, nb.population_split(60, 30))
    assert found.sound, found.violations
    assert found.target_gap > 0.05  # the target's data did move a release: it was checked


def test_the_harness_finds_counts_that_exceed_their_sensitivity(monkeypatch):
    from fedem_private.experiments import neighbours as nb
    from fedem_private.privacy.central import RowSelection

    def unnormalised(self, indptr, items, n_items, device):
        if self._sum is None:
            self._sum = torch.zeros(n_items, dtype=torch.float64, device=device)
        self._sum.index_add_(0, torch.from_numpy(np.asarray(items, dtype=np.int64)),
                             torch.ones(len(items), dtype=torch.float64))

    monkeypatch.setattr(RowSelection, "add", unnormalised)  # a count of 1 per item: norm sqrt(n)
    settings = {**nb.MODE_SETTINGS["cdp-gaussian"], "select_rows": 8}
    found = nb.run_pair(nb.make_config("cdp-gaussian", method="fedmf", settings=settings))
    assert not found.sound and any("item counts" in v for v in found.violations)


@pytest.mark.parametrize("privacy, words", [
    ({"mode": "ldp-laplace", "epsilon": 4.0, "select_rows": 5}, "is for cdp-gaussian"),
    ({"mode": "cdp-gaussian", "epsilon": 4.0, "select_rows": -1}, "integer >= 0"),
    ({"mode": "cdp-gaussian", "epsilon": 4.0, "select_rows": 5, "clip_quantile": 0.5},
     "drop --clip-quantile"),
    ({"mode": "cdp-gaussian", "epsilon": 4.0, "select_rows": 5, "select_share": 1.0},
     "must be in \\(0, 1\\)"),
])
def test_row_selection_is_refused_where_it_does_not_apply(privacy, words):
    from fedem_private.errors import UserError

    with pytest.raises(UserError, match=words):
        PrivacyConfig(**privacy).validate()


def test_items_never_selected_rank_below_the_selected_by_their_noisy_counts(split):
    sim = _selecting(split, rows=5)
    sim.step()
    sim.step()
    selection = sim.privacy.secure.selection
    scores = torch.randn(3, split.n_items, dtype=torch.float64)
    ranked = sim.privacy.selection_prior(scores)
    chosen = selection.ever
    assert torch.equal(ranked[:, chosen], scores[:, chosen])  # the model ranks the selected
    assert bool((ranked[:, ~chosen].amax(dim=1) < ranked[:, chosen].amin(dim=1)).all())
    order = torch.argsort(ranked[0, ~chosen], descending=True)
    counts = selection.counts[~chosen]
    assert bool((counts[order][:-1] >= counts[order][1:]).all())  # then by noisy count


def test_the_blend_adds_beta_log_counts_to_the_selected_items_scores(split):
    """The slow reference: item by item, s_ui + beta log(1 + max(c_i, 0)) for a selected
    item; every never-selected item still below every selected one, by its count."""
    import math

    beta = 0.7
    sim = _selecting(split, rows=5, select_blend=beta)
    sim.step()
    sim.step()
    selection = sim.privacy.secure.selection
    scores = torch.randn(2, split.n_items, dtype=torch.float64)
    ranked = sim.privacy.selection_prior(scores)
    counts = selection.counts.tolist()
    for u in range(2):
        for i in range(split.n_items):
            if bool(selection.ever[i]):
                want = float(scores[u, i]) + beta * math.log1p(max(counts[i], 0.0))
                assert float(ranked[u, i]) == pytest.approx(want, rel=1e-12, abs=1e-12)
    chosen = selection.ever
    assert bool((ranked[:, ~chosen].amax(dim=1) < ranked[:, chosen].amin(dim=1)).all())
    plain = _selecting(split, rows=5)
    plain.step()
    plain.step()
    assert torch.equal(plain.privacy.selection_prior(scores)[:, chosen], scores[:, chosen])


def test_a_large_blend_ranks_the_selected_by_their_noisy_counts(split):
    sim = _selecting(split, rows=5, select_blend=1e6)
    sim.step()
    sim.step()
    selection = sim.privacy.secure.selection
    ranked = sim.privacy.selection_prior(torch.randn(1, split.n_items, dtype=torch.float64))
    chosen = torch.nonzero(selection.ever).flatten()
    by_score = chosen[torch.argsort(ranked[0, chosen], descending=True)]
    counts = selection.counts[by_score].clamp(min=0)
    assert bool((counts[:-1] >= counts[1:]).all())  # popularity decides among the selected


@pytest.mark.parametrize("privacy, words", [
    ({"mode": "cdp-gaussian", "epsilon": 4.0, "select_blend": 1.0}, "needs --select-rows"),
    ({"mode": "cdp-gaussian", "epsilon": 4.0, "select_rows": 5, "select_blend": -1.0},
     ">= 0"),
    ({"mode": "cdp-gaussian", "epsilon": 4.0, "select_rows": 5, "select_blend": 1.0,
      "select_prior": False}, "needs --select-rows"),
])
def test_the_blend_is_refused_without_a_selection(privacy, words):
    from fedem_private.errors import UserError

    with pytest.raises(UserError, match=words):
        PrivacyConfig(**privacy).validate()


@pytest.mark.parametrize("method", ["fedmf", "mostpop"])
def test_a_sampled_evaluation_writes_each_users_ranks_for_paired_tests(tmp_path, method):
    import csv
    import json

    from fedem_private import api

    cfg = {"data": {"dataset": "synthetic", "synthetic": {"n_users": 50, "n_items": 150}},
           "train": {"rounds": 2, "local_epochs": 1, "dim": 4, "eval_users": 30},
           "federation": {"method": method}}
    api.run(cfg, out=tmp_path / "r")
    rows = list(csv.DictReader((tmp_path / "r" / "ranks.csv").open()))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert len(rows) == 30 and len({r["user"] for r in rows}) == 30
    hits = np.mean([int(r["full_rank"]) < 10 for r in rows])
    assert hits == pytest.approx(summary["metrics"]["full"]["hr@10"])
    sampled = np.mean([int(r["sampled_rank"]) < 10 for r in rows])
    assert sampled == pytest.approx(summary["metrics"]["sampled"]["hr@10"])


def test_a_selecting_runs_evaluation_ranks_through_the_prior(split, monkeypatch):
    from fedem_private.privacy.layer import PrivacyLayer

    calls: list[int] = []
    original = PrivacyLayer.selection_prior

    def spy(self, scores):
        calls.append(scores.shape[0])
        return original(self, scores)

    monkeypatch.setattr(PrivacyLayer, "selection_prior", spy)
    sim = _selecting(split)
    sim.step()
    calls.clear()
    sim.evaluate()
    assert sum(calls) == split.n_users  # every evaluated user's scores went through it


def test_the_summary_states_the_row_selection(split):
    sim = _selecting(split, rows=7)
    for _ in range(2):
        sim.step()
    block = sim.privacy.summary()["row_selection"]
    assert block["rows"] == 7 and block["share"] == 0.1
    assert block["counts_noise_multiplier"] ** -2 + block["table_noise_multiplier"] ** -2 == \
        pytest.approx(sim.privacy.params.noise_multiplier ** -2)
    assert 7 <= block["rows_ever_selected"] <= 14
