"""The ``paper-code`` protocol: each fact of docs/design.md section 2a as a named option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.data.interactions import from_raw
from fedem_private.errors import UserError
from fedem_private.evaluation.metrics import RankAccumulator, build_eval_sets
from fedem_private.experiments.runner import selected_round
from fedem_private.reference.aggregation import pca_similarity_weights_reference
from fedem_private.reference.models import reference_train_client
from fedem_private.server.aggregation import (
    fedavg_weights,
    pca_codes,
    pca_similarity,
    pca_similarity_weights,
    similarity_aggregate,
)
from fedem_private.simulation.config import (
    DataConfig,
    FederationConfig,
    RunConfig,
    TrainConfig,
    identity_dict,
    parse_protocol_label,
    protocol_label,
    protocol_options,
    with_overrides,
)
from fedem_private.simulation.loop import RoundStats, Simulation

F64 = torch.float64


def _cfg(protocol="paper", method="fedem", dataset="synthetic", **over) -> RunConfig:
    base = RunConfig(data=DataConfig(dataset=dataset, protocol=protocol),
                     federation=FederationConfig(method=method))
    return with_overrides(base, over).validate().resolved()


# ------------------------------------------------------------------ config, preset, labels
def test_paper_and_strict_are_untouched_by_the_options():
    for protocol in ("paper", "strict"):
        cfg = _cfg(protocol)
        assert protocol_options(cfg) == {} and protocol_label(cfg) == protocol
        # the new fields leave a default config's identity (and so every digest) as it was
        keys = {key for section in identity_dict(cfg).values() if isinstance(section, dict)
                for key in section}
        for name in ("min_user_ratings", "first_seen_order", "shared_eval_negatives",
                     "select_round", "early_stop_tol", "agg_clients_ratio", "similarity",
                     "merge_every_batch"):
            assert name not in keys


def test_paper_code_preset_turns_on_what_applies():
    fedem = _cfg("paper-code", "fedem")
    assert fedem.data.protocol == "paper"
    assert protocol_options(fedem) == {"min_user_ratings": 10, "shared_eval_negatives": True,
                                       "select_round": "best-test", "early_stop_tol": 1e-4,
                                       "agg_clients_ratio": 0.1, "similarity": "pca",
                                       "merge_every_batch": True}
    assert protocol_label(fedem) == "paper-code"
    fedmf = _cfg("paper-code", "fedmf", dataset="filmtrust")  # no similarity aggregation
    assert protocol_options(fedmf) == {"min_user_ratings": 10, "first_seen_order": True,
                                       "shared_eval_negatives": True,
                                       "select_round": "best-test", "early_stop_tol": 1e-4}
    assert protocol_label(fedmf) == "paper-code"
    assert _cfg("paper-code", "pfedrec").train.select_round == "best-val"
    # one option fewer than the preset is not the preset
    partial = _cfg("paper", "fedem", **{"data.min_user_ratings": 10,
                                        "data.shared_eval_negatives": True})
    assert protocol_label(partial) == "paper+min10+sharedneg"


def test_protocol_labels_round_trip():
    for label in ("paper+min10", "paper+sharedneg", "paper+besttest", "paper+bestval",
                  "paper+agg10", "paper+pcasim", "paper+min10+agg10+pcasim"):
        protocol, over = parse_protocol_label(label)
        cfg = _cfg(protocol, "fedem", **over)
        assert protocol_label(cfg) == label
    assert parse_protocol_label("paper-code") == ("paper-code", {})
    with pytest.raises(UserError, match="unknown option"):
        parse_protocol_label("paper+nonsense")
    with pytest.raises(UserError, match="unknown protocol"):
        parse_protocol_label("strict+min10")


@pytest.mark.parametrize("method, over, needle", [
    ("fedmf", {"federation.similarity": "pca"}, "--similarity pca"),
    ("local", {"federation.agg_clients_ratio": 0.1}, "agg-clients-ratio"),
    ("fedmerge", {"federation.agg_clients_ratio": 0.1}, "agg-clients-ratio"),
    ("fedmf", {"federation.agg_clients_ratio": 0.1, "federation.codec": "lora"},
     "codec full"),
    ("fedmf", {"federation.agg_clients_ratio": 0.1, "privacy.mode": "cdp-gaussian",
               "privacy.epsilon": 8.0}, "agg-clients-ratio"),
])
def test_options_refused_where_they_mean_nothing(method, over, needle):
    with pytest.raises(UserError, match=needle):
        _cfg("paper", method, **over)


def test_agg10_stays_fedem_only_in_the_preset_and_in_sweep_labels():
    """The share is the FedEM code's, for its similarity aggregation: the preset and the
    sweep's ``+agg10`` never put it on another aggregation (set the field to ask that)."""
    assert _cfg("paper-code", "pfedrec").federation.agg_clients_ratio == 1.0
    assert _cfg("paper-code", "gpfedrec", **{"federation.merge": "em"}
                ).federation.agg_clients_ratio == 1.0
    asked = _cfg("paper-code", "pfedrec", **{"federation.merge": "em",
                                             "federation.agg_clients_ratio": 0.1})
    assert asked.federation.agg_clients_ratio == 0.1
    assert protocol_label(asked) == "paper-code+agg10"
    assert parse_protocol_label("paper-code+agg10") == (
        "paper-code", {"federation.agg_clients_ratio": 0.1})
    # a value the preset sets otherwise is no longer the preset
    other = _cfg("paper-code", "pfedrec", **{"train.select_round": "best-test"})
    assert protocol_label(other) == "paper+min10+sharedneg+besttest"


def test_sweep_paper_code_plus_an_option_is_asked_for():
    from fedem_private.experiments.sweep_spec import grid, parse_spec

    spec = parse_spec({"sweep": {"variants": ["pfedrec-em", "fedem-em"],
                                 "protocols": ["paper-code+agg10", "paper+agg10"]},
                       "base": {"train": {"rounds": 2}}}, "test")
    labels = {(p.variant, p.name.split("/")[3]): protocol_label(p.config) for p in grid(spec)}
    # paper+agg10 drops PFedRec+EM (not the FedEM code's); paper-code+agg10 asks for it
    assert labels == {("pfedrec-em", "paper-code+agg10"): "paper-code+agg10",
                      ("fedem-em", "paper-code+agg10"): "paper-code",
                      ("fedem-em", "paper+agg10"): "paper+agg10"}
    with pytest.raises(UserError, match="agg-clients-ratio"):
        grid(parse_spec({"sweep": {"variants": ["fedmerge"], "protocols": ["paper-code+agg10"]},
                         "base": {"train": {"rounds": 2}}}, "test"))


@pytest.mark.parametrize("over, needle", [
    ({"data.min_user_ratings": 2}, "min-user-ratings"),
    ({"federation.agg_clients_ratio": 0.0}, "agg-clients-ratio"),
    ({"federation.similarity": "cosine"}, "similarity"),
    ({"train.select_round": "best"}, "select-round"),
])
def test_bad_option_values_are_one_line_errors(over, needle):
    with pytest.raises(UserError, match=needle):
        _cfg("paper", "fedem", **over)


def test_first_seen_order_refused_on_timed_datasets():
    with pytest.raises(UserError, match="has timestamps"):
        _cfg("paper", "fedmf", dataset="ml-100k", **{"data.first_seen_order": True})


# ------------------------------------------------------------------ 1, 2: data
def test_min_user_ratings_drops_users_below_it():
    data = generate(SyntheticConfig(n_users=80, n_items=60, mean_activity=12), seed=1)
    counts = np.bincount(data.users, minlength=data.n_users)
    for k in (3, 10):
        sp = leave_one_out(data, 0, k)
        assert sp.n_users == int((counts >= k).sum())
        assert sp.dropped_users == int(((counts > 0) & (counts < k)).sum())
        assert (sp.train_counts + 2 >= k).all()


def test_first_seen_order_uses_items_first_appearance():
    # file order: item 7 first seen at row 0, 5 at row 1, 9 at row 3, 3 at row 5
    # (user 1's last row, item 11, leaves user 0 an item to sample as a negative)
    users = np.array([0, 0, 1, 0, 1, 1, 0, 1])
    items = np.array([7, 5, 7, 9, 5, 3, 3, 11])
    sp = leave_one_out(from_raw("f", users, items), seed=0, first_seen=True)
    raw = {v: i for i, v in enumerate([3, 5, 7, 9, 11])}  # re-indexed item ids
    # user 0 has 7, 5, 9, 3 -> by first appearance 7 < 5 < 9 < 3: test 3, validation 9
    assert sp.test_items[0] == raw[3] and sp.val_items[0] == raw[9]
    assert sorted(sp.train_of(0).tolist()) == sorted([raw[7], raw[5]])
    # the order does not depend on the seed (the random order does)
    other = leave_one_out(from_raw("f", users, items), seed=5, first_seen=True)
    assert np.array_equal(other.test_items, sp.test_items)
    timed = from_raw("t", users, items, np.arange(8.0))
    with pytest.raises(UserError, match="has timestamps"):
        leave_one_out(timed, 0, first_seen=True)


# ------------------------------------------------------------------ 3, 4: evaluation
def test_shared_validation_negatives_are_the_test_ones(small_split):
    plain = build_eval_sets(small_split, "paper", 0)
    shared = build_eval_sets(small_split, "paper", 0, validation="shared")
    separate = build_eval_sets(small_split, "paper", 0, validation="separate")
    assert plain.val_sampled is None
    assert torch.equal(shared.sampled, plain.sampled)  # the test's own draw is unchanged
    assert torch.equal(shared.val_sampled, shared.sampled)
    assert torch.equal(separate.sampled, plain.sampled)
    assert not torch.equal(separate.val_sampled, separate.sampled)
    # neither contains an item the user interacted with (paper protocol)
    for u in range(small_split.n_users):
        seen = set(small_split.train_of(u).tolist()) | {int(small_split.val_items[u]),
                                                        int(small_split.test_items[u])}
        assert not seen & set(separate.val_sampled[u].tolist())


def test_validation_rank_counts_ties_against_the_item(small_split):
    sets = build_eval_sets(small_split, "paper", 0, validation="shared")
    n, m = small_split.n_users, small_split.n_items
    acc = RankAccumulator(n)
    acc.add_scores(np.arange(n), torch.zeros(n, m), sets)  # every score tied
    res = acc.result()
    assert res["val"]["hr@10"] == 0.0 and res["sampled"]["hr@10"] == 0.0


def _stats(r: int, test: float, val: float | None) -> RoundStats:
    metrics = {"sampled": {"hr@10": test, "ndcg@10": test / 2}}
    if val is not None:
        metrics["val"] = {"hr@10": val, "ndcg@10": val / 2}
    return RoundStats(r, 0.0, 1, metrics=metrics)


def test_selected_round_rules():
    history = [_stats(1, 0.2, 0.5), RoundStats(2, 0.0, 1), _stats(3, 0.4, 0.3),
               _stats(4, 0.4, 0.1), _stats(5, 0.1, 0.5)]
    best_test = selected_round(history, "best-test")
    assert best_test["round"] == 3  # ties go to the earliest round
    assert selected_round(history, "best-val")["round"] == 1
    assert selected_round(history, "last") is None
    for h, full in zip(history, (0.1, None, 0.05, 0.3, 0.2), strict=True):
        if full is not None:  # the validation item ranked in full picks its own round
            h.metrics["val_full"] = {"hr@10": full, "ndcg@10": full / 2}
    assert selected_round(history, "best-val-full")["round"] == 4


def test_best_val_full_run_ranks_validation_in_full_and_names_its_protocol(tmp_path):
    from fedem_private.experiments.runner import execute

    cfg = RunConfig(data=DataConfig(synthetic=SyntheticConfig(n_users=40, n_items=50)),
                    train=TrainConfig(rounds=2, local_epochs=1, select_round="best-val-full"),
                    federation=FederationConfig(method="fedmf"))
    summary = execute(cfg, tmp_path / "run")
    assert summary["protocol_label"] == "strict+bestvalfull"
    sel = summary["selected"]
    assert sel["rule"] == "best-val-full" and "val_full" in sel["metrics"]
    assert summary["metrics"]["val_full"]["users"] == 40


def test_run_reports_selected_and_last_rounds(tmp_path):
    from fedem_private.experiments.results import collect
    from fedem_private.experiments.runner import execute

    cfg = RunConfig(data=DataConfig(protocol="paper", shared_eval_negatives=True,
                                    synthetic=SyntheticConfig(n_users=40, n_items=50)),
                    train=TrainConfig(rounds=3, local_epochs=1, select_round="best-val"),
                    federation=FederationConfig(method="fedmf"))
    summary = execute(cfg, tmp_path / "run")
    assert summary["protocol_label"] == "paper+sharedneg+bestval"
    assert summary["protocol_options"] == {"shared_eval_negatives": True,
                                           "select_round": "best-val"}
    sel = summary["selected"]
    assert sel["rule"] == "best-val" and 1 <= sel["round"] <= 3 and "val" in sel["metrics"]
    row = collect(tmp_path).iloc[0]
    assert row["protocol"] == "paper+sharedneg+bestval"
    assert row["selected_round"] == sel["round"]
    assert row["hr10_sampled_selected"] == pytest.approx(sel["metrics"]["sampled"]["hr@10"])
    assert row["hr10_sampled"] == pytest.approx(summary["metrics"]["sampled"]["hr@10"])
    assert "private" not in sel  # no mechanism: nothing to label


def test_a_round_selected_under_a_mechanism_is_labelled_not_private(tmp_path):
    """Issue 65: best-val picks a round by exact validation metrics, which no mechanism
    noised; under a mechanism the summary says the choice is not covered by the eps."""
    from fedem_private.experiments.runner import execute
    from fedem_private.privacy.config import PrivacyConfig

    cfg = RunConfig(data=DataConfig(synthetic=SyntheticConfig(n_users=40, n_items=50)),
                    train=TrainConfig(rounds=2, local_epochs=1, select_round="best-val"),
                    federation=FederationConfig(method="fedmf"),
                    privacy=PrivacyConfig(mode="cdp-gaussian", clip=1.0, sample_rate=0.5,
                                          noise_multiplier=1.0))
    summary = execute(cfg, tmp_path / "run")
    sel = summary["selected"]
    assert sel["private"] is False and sel["note"].startswith("not private")
    # the summary says which of its figures are releases and which measurements
    assert summary["not_private"].startswith("not private") and "privacy block" in \
        summary["not_private"]


# ------------------------------------------------------------------ 6: the code's similarity
def test_pca_codes_are_the_first_principal_component():
    g = torch.Generator().manual_seed(0)
    tables = torch.randn(4, 30, 5, generator=g, dtype=F64)
    codes = pca_codes(tables, chunk_clients=3)
    for u in range(4):
        x = tables[u] - tables[u].mean(dim=0)
        _, _, vh = torch.linalg.svd(x, full_matrices=False)
        ref = x @ vh[0]
        ref = ref * torch.sign(ref[ref.abs().argmax()])
        torch.testing.assert_close(codes[u], ref, rtol=1e-9, atol=1e-9)
        assert codes[u][codes[u].abs().argmax()] > 0
    # a table's sign flip (another eigenvector sign) gives the same code
    torch.testing.assert_close(pca_codes(-tables), codes, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.9, 5.0])
def test_pca_similarity_weights_equal_the_slow_reference(alpha):
    g = torch.Generator().manual_seed(1)
    # a few near-identical tables, so that some similarities pass the 0.9 cap
    base = 0.3 * torch.randn(1, 12, 4, generator=g, dtype=F64)
    tables = torch.cat([base + 0.001 * torch.randn(3, 12, 4, generator=g, dtype=F64),
                        0.3 * torch.randn(5, 12, 4, generator=g, dtype=F64)])
    mask = torch.tensor([True, True, False, True, True, True, False, True])
    p = fedavg_weights(torch.arange(1, 9, dtype=F64), mask)
    codes = pca_codes(tables)
    sim = pca_similarity(codes, codes)
    assert bool((sim[:3, :3] == 1).all())  # capped
    w = pca_similarity_weights(p, sim, alpha, mask)
    ref = pca_similarity_weights_reference(p, tables, alpha, mask)
    torch.testing.assert_close(w, ref, rtol=0, atol=1e-6)
    # planted bug: dividing by 1 + alpha (equation 13) gives other weights for alpha > 0
    if alpha > 0:
        wrong = pca_similarity_weights(p / (1 + alpha), sim / (1 + alpha), alpha, mask)
        assert (wrong - ref).abs().max() > 1e-4


def test_similarity_aggregate_with_pca_equals_loop():
    g = torch.Generator().manual_seed(2)
    tables = 0.3 * torch.randn(6, 10, 3, generator=g, dtype=F64)
    p = fedavg_weights(torch.arange(1, 7, dtype=F64))
    out = similarity_aggregate(tables, p, 0.9, chunk_clients=4, similarity="pca")
    w = pca_similarity_weights_reference(p, tables, 0.9)
    ref = torch.einsum("uv,vmd->umd", w, tables)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ 5: aggregating 10%
def _sent_in_round(sim: Simulation, round_: int) -> dict[int, torch.Tensor]:
    """Filled as ``sim`` runs: client -> the table the loop starts it from in ``round_``."""
    seen: dict[int, torch.Tensor] = {}

    def observe(view):
        if view.round == round_:
            seen.update({int(c): view.sent[i].clone() for i, c in enumerate(view.clients)})

    sim.observers.append(observe)
    return seen


def test_agg_clients_ratio_sends_tables_only_to_the_sampled(small_split):
    cfg = RunConfig(data=DataConfig(protocol="paper"),
                    train=TrainConfig(rounds=3, local_epochs=1),
                    federation=FederationConfig(method="fedem", agg_clients_ratio=0.2))
    sim = Simulation(cfg, small_split)
    seen = _sent_in_round(sim, 2)
    sim.step()
    chosen = sim.aggregator.receiving.clone()
    n = small_split.n_users
    assert int(chosen.sum()) == int(np.ceil(0.2 * n))
    q_after_1 = sim.state.q_local.clone()
    tables_1 = sim.aggregator.global_tables.clone()
    rho_before = [w.clone() for w in sim.merger.state.weights]
    sim.step()
    for u in range(n):
        if chosen[u]:  # a personalised table from the sampled uploads
            torch.testing.assert_close(seen[u], tables_1[u])
        else:  # no table: its own model, no merge, its adapter untouched
            assert torch.equal(seen[u], q_after_1[u])
            for before, after in zip(rho_before, sim.merger.state.weights, strict=True):
                assert torch.equal(before[u], after[u])
    # another round samples other uploads (keyed by round)
    assert not torch.equal(sim.aggregator.receiving, chosen)
    # the sampled clients' weights are over the sampled uploads only
    p = fedavg_weights(sim.sizes, chosen)
    ref = similarity_aggregate(q_after_1, p, cfg.federation.alpha, participating=chosen)
    torch.testing.assert_close(tables_1[chosen], ref[chosen])


# ------------------------------------------------------------------ 8: early stop
@pytest.mark.parametrize("tol", [0.02, 0.1])
def test_early_stop_equals_per_client_reference(small_split, sorted_chunk, tol):
    """Lock-step training with the per-client early stop vs one client at a time."""
    from fedem_private import models
    from fedem_private.models.base import ClientParams, LocalTrainConfig

    sp = small_split
    cfg = LocalTrainConfig(epochs=6, batch_size=32, lr=0.1, early_stop_tol=tol)
    order, samples = sorted_chunk(cfg)
    bb = models.build("mf", sp.n_items, 8, seed=0, init_std=0.1)
    k = len(order)
    q0 = bb.init_items().expand(k, -1, -1).clone()
    start = ClientParams(q0, {}, bb.init_private(order))
    new, _ = bb.train_chunk(start, order, samples, cfg, 1)
    full, _ = bb.train_chunk(start, order, samples, LocalTrainConfig(
        epochs=6, batch_size=32, lr=0.1), 1)
    stopped = 0
    for j, c in enumerate(order.tolist()):
        one = ClientParams(q0[j:j + 1], {}, {"p": start.private["p"][j:j + 1]})
        items, labels = samples.of(j)
        ref = reference_train_client(bb, one, items, labels, cfg, 1, c)
        assert (new.items[j] - ref.items[0]).abs().max() < 1e-4
        assert (new.private["p"][j] - ref.private["p"][0]).abs().max() < 1e-4
        stopped += bool((new.items[j] - full.items[j]).abs().max() > 1e-3)
    # the test means something: some clients stopped early, and not all of them
    assert 0 < stopped < k


def test_early_stop_needs_the_mf_backbone():
    with pytest.raises(UserError, match="early-stop-tol"):
        _cfg("paper", "pfedrec", **{"train.early_stop_tol": 1e-4})
    assert _cfg("paper-code", "pfedrec").train.early_stop_tol == 0.0
    assert _cfg("paper-code", "fedem").train.early_stop_tol == 1e-4


# ------------------------------------------------------------------ sweeps
def test_sweep_protocol_labels_expand_and_drop_what_does_not_apply():
    from fedem_private.experiments.sweep_spec import grid, parse_spec

    spec = parse_spec({"sweep": {"variants": ["fedmf", "fedem-em"], "seeds": [0, 1],
                                 "protocols": ["paper", "paper+agg10", "paper+min10+pcasim",
                                               "paper-code"]},
                       "base": {"train": {"rounds": 2}}}, "test")
    points = grid(spec)
    names = {p.name for p in points}
    # fedmf has no similarity aggregation: no agg10 / pcasim point for it
    assert len(points) == 2 * (2 + 2 + 1 + 1)
    assert "synthetic/fedem-em/none/paper+agg10/seed0" in names
    assert not any("fedmf/none/paper+agg10" in n or "fedmf/none/paper+min10" in n
                   for n in names)
    by_name = {p.name: p.config for p in points}
    cfg = by_name["synthetic/fedem-em/none/paper+min10+pcasim/seed1"]
    assert protocol_options(cfg) == {"min_user_ratings": 10, "similarity": "pca"}
    assert protocol_label(by_name["synthetic/fedmf/none/paper-code/seed0"]) == "paper-code"
    assert protocol_options(by_name["synthetic/fedmf/none/paper/seed0"]) == {}
    with pytest.raises(UserError, match="protocols"):
        parse_spec({"sweep": {"protocols": ["paper+bogus"]}}, "test")


def test_attribution_sweep_file_expands_to_its_points():
    from pathlib import Path

    from fedem_private.experiments.sweep_spec import grid, load_spec

    specs = Path(__file__).resolve().parents[1] / "benchmarks" / "specs"
    path = specs / "reproduction" / "attribution.toml"
    points = grid(load_spec(path))
    assert len(points) == 45
    labels = {(p.variant, protocol_label(p.config)) for p in points}
    assert ("fedem-em", "paper+agg10") in labels and ("fedmf", "paper+agg10") not in labels
    assert ("fedem-em", "paper+batchmerge") in labels
    assert ("fedmf", "paper+batchmerge") not in labels
    assert all(p.config.train.rounds == 100 for p in points)


def test_attribution_subset_files_are_points_of_the_full_grid():
    """benchmarks/specs/reproduction/attribution_fedem.toml runs into runs/attribution: each of
    its points must be a point of attribution.toml, same directory and same config identity."""
    from pathlib import Path

    from fedem_private.experiments.sweep_spec import grid, load_spec

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "specs" / "reproduction"
    full = {p.name: p.digest(False) for p in grid(load_spec(bench / "attribution.toml"))}
    part = grid(load_spec(bench / "attribution_fedem.toml"))
    assert len(part) == 18
    assert all(full.get(p.name) == p.digest(False) for p in part)


# ------------------------------------------------------------------ command line
def test_cli_flags_and_the_protocol_line(tmp_path, capsys):
    from fedem_private.cli import main

    out = tmp_path / "run"
    assert main(["run", "--method", "fedem", "--protocol", "paper", "--min-user-ratings", "10",
                 "--shared-eval-negatives", "--select-round", "best-test",
                 "--agg-clients-ratio", "0.5", "--similarity", "pca", "--early-stop-tol",
                 "1e-4", "--rounds", "2", "--local-epochs", "1", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "protocol: paper+min10+sharedneg+besttest+agg50+pcasim+earlystop" in text
    assert "selected (best-test): round" in text
    summary = (out / "summary.json").read_text()
    assert '"agg_clients_ratio": 0.5' in summary and '"similarity": "pca"' in summary
    config = (out / "config.toml").read_text()
    assert "min_user_ratings = 10" in config and 'similarity = "pca"' in config


@pytest.mark.parametrize("argv, needle", [
    (["--method", "fedem", "--merge", "dm", "--merge-every-batch"], "use --merge em"),
    (["--method", "local", "--agg-clients-ratio", "0.1"], "agg-clients-ratio"),
    (["--method", "fedmf", "--similarity", "pca"], "--similarity pca"),
    (["--protocol", "paper-codes"], "unknown protocol"),
])
def test_cli_refusals_are_one_line(tmp_path, capsys, argv, needle):
    from fedem_private.cli import main

    assert main(["run", *argv, "--rounds", "1", "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


# ------------------------------------------------------------------ a round, end to end
@pytest.mark.parametrize("method, merge", [("fedmf", "sr"), ("pfedrec", "em"),
                                           ("gpfedrec", "em"), ("gpfedrec", "sr")])
def test_sampled_share_of_other_aggregations_equals_per_client_reference(
        small_split, method, merge):
    """--agg-clients-ratio on the sums (FedAvg, FedRAP's uniform mean) and GPFedRec's graph:
    rounds 1-3 against the one-client-at-a-time loop, which sums (or builds the graph
    over) the keyed 30% of the uploads and lets only their owners start from the server's
    table (and merge) next round."""
    _sampled_share_rounds(small_split, method, merge, tol=1e-4)


def test_sampled_share_of_fedrap_equals_per_client_reference(small_split, float64):
    """The same for FedRAP+EM, in float64: in float32 its round 2 moved the two paths
    1.0e-4 apart on one machine (an Intel Xeon; 2026-11-27) and under that on another
    (an AMD EPYC), a rounding difference amplified, not a disagreement: in float64 they
    agree to 1e-12 over the three rounds."""
    _sampled_share_rounds(small_split, "fedrap", "em", tol=1e-9)


@pytest.mark.parametrize("merge", ["sr", "em"])
def test_sampled_share_of_fedncf_equals_per_client_reference(small_split, merge, float64):
    """The same for FedNCF, whose shared MLP is averaged over the same share and sent to the
    same owners; in float64, since its shared MLP drifts by ~1e-4 between two float32 paths
    over rounds (tests/test_backbones.py says why)."""
    _sampled_share_rounds(small_split, "fedncf", merge, tol=1e-7)


def _sampled_share_rounds(small_split, method: str, merge: str, tol: float) -> None:
    from fedem_private.reference import round as reference

    over = {"train.rounds": 4, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "federation.method": method,
            "federation.merge": merge, "federation.agg_clients_ratio": 0.3,
            "data.protocol": "paper"}
    sim = Simulation(with_overrides(RunConfig(), over), small_split)
    n = small_split.n_users
    for t in (1, 2, 3):
        before = sim.aggregator.receiving
        ref = reference.simulation_round(sim)
        stats = sim.step()
        assert (sim.state.q_local - ref["q_local"]).abs().max() < tol
        for name, value in ref["private"].items():
            assert (sim.state.private[name] - value).abs().max() < tol
        assert (sim.state.q_global - ref["q_global"]).abs().max() < tol
        assert set(ref["dense"]) == set(sim.state.dense_local)
        for name, value in ref["dense"].items():
            assert (sim.state.dense_local[name] - value).abs().max() < tol
            assert (sim.dense.params[name] - ref["dense_global"][name]).abs().max() < tol
        got = sim.aggregator.receiving.cpu()
        assert torch.equal(got, ref["server"]["receiving"])
        assert int(got.sum()) == int(np.ceil(0.3 * n))
        if before is not None:  # another round samples other uploads (keyed by round)
            assert not torch.equal(got, before.cpu())
        if "personal" in ref["server"]:
            assert (sim.aggregator.personal.cpu() - ref["server"]["personal"]).abs().max() < tol
        if ref["rho_mean"] is not None and t > 1:
            assert stats.merge["rho_mean"] == pytest.approx(ref["rho_mean"], abs=tol / 10)


def test_sampled_share_of_a_sum_leaves_the_others_alone(small_split):
    """FedAvg over a 20% share: round 2's non-sampled clients start from their own round-1
    table, the sampled ones from the weighted mean of the sampled uploads only."""
    cfg = with_overrides(RunConfig(), {"train.rounds": 3, "train.local_epochs": 1,
                                       "federation.method": "fedmf",
                                       "federation.agg_clients_ratio": 0.2,
                                       "data.protocol": "paper"})
    sim = Simulation(cfg, small_split)
    seen = _sent_in_round(sim, 2)
    sim.step()
    chosen = sim.aggregator.receiving.clone()
    q_after_1 = sim.state.q_local.clone()
    p = fedavg_weights(sim.sizes, chosen)
    mean = torch.einsum("n,nmd->md", p, q_after_1.double()).float()
    torch.testing.assert_close(sim.aggregator.global_table, mean)
    sim.step()
    for u in range(small_split.n_users):
        if chosen[u]:
            torch.testing.assert_close(seen[u], mean)
        else:
            assert torch.equal(seen[u], q_after_1[u])


@pytest.mark.parametrize("over", [
    {"federation.agg_clients_ratio": 0.3},
    {"federation.agg_clients_ratio": 0.3, "federation.method": "fedsim"},  # no merge (SR)
    {"federation.similarity": "pca"},
    {"federation.agg_clients_ratio": 0.3, "federation.similarity": "pca",
     "train.early_stop_tol": 0.05},
])
def test_second_round_with_code_options_equals_per_client_reference(small_split, over):
    """Round 2 of FedEM (EM merge active) with the code's server options against the
    one-client-at-a-time loop (sklearn PCA, cvxpy, torch.optim, the keyed 30% draw)."""
    from fedem_private.reference import round as reference

    base = {"train.rounds": 3, "train.local_epochs": 2, "train.batch_size": 32,
            "train.dim": 8, "train.eval_every": 100, "federation.method": "fedem",
            "data.protocol": "paper"}
    sim = Simulation(with_overrides(RunConfig(), {**base, **over}), small_split)
    sim.step()
    ref = reference.simulation_round(sim)
    stats = sim.step()
    assert (sim.state.q_local - ref["q_local"]).abs().max() < 1e-4
    assert (sim.state.p - ref["p"]).abs().max() < 1e-4
    assert (sim.state.q_global - ref["q_global"]).abs().max() < 1e-4
    if ref["rho_mean"] is not None:
        assert stats.merge["rho_mean"] == pytest.approx(ref["rho_mean"], abs=1e-5)
    if "federation.agg_clients_ratio" in over:
        assert torch.equal(sim.aggregator.receiving.cpu(), ref["server"]["receiving"])
