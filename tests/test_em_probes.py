"""Issue 69's measurement helpers: the held-out-row probe's percentile, its run on a tiny
synthetic FedEM, the private elastic-merging rungs' configs, and (issue 79) the diagnostics'
rho by item class, start view under ``--merge-rows seen`` and best-validation run rows."""
from __future__ import annotations

import csv
import tomllib

import numpy as np
import pytest
import torch

from benchmarks import em_private_configs as epc
from benchmarks.probes import em_diagnostics
from benchmarks.probes import em_held_out_rows as probe


def test_percentile_counts_below_and_half_the_ties_and_leaves_the_target_out():
    delta = np.array([0.0, 1.0, 2.0, 2.0, 5.0, -1.0])
    cands = np.array([0, 1, 2, 3, 4])  # item 5 is not a candidate
    # target 3 (2.0): below it 0, 1 (two), tied with it item 2 (half), above it item 4
    assert probe.percentile(delta, cands, 3) == (2 + 0.5) / 4
    assert probe.percentile(delta, cands, 4) == 1.0
    assert probe.percentile(delta, cands, 0) == 0.0
    assert np.isnan(probe.percentile(delta, np.array([2]), 2))


def test_probe_writes_one_row_per_protocol_and_resumes(tmp_path, capsys):
    cfg = tmp_path / "fedem.toml"
    cfg.write_text('[data]\ndataset = "synthetic"\n[data.synthetic]\nn_users = 60\n'
                   'n_items = 40\n[train]\nrounds = 2\ndim = 8\nbatch_size = 32\n'
                   '[federation]\nmethod = "fedem"\nmerge = "sm"\naggregation = "fedavg"\n')
    out = tmp_path / "rows.csv"
    argv = ["--config", str(cfg), "--protocols", "strict", "paper", "--out", str(out)]
    assert probe.main(argv) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["protocol"] for r in rows] == ["strict", "paper"]
    for r in rows:
        assert 0.0 <= float(r["pct_test"]) <= 1.0
        assert int(r["clients"]) > 0
    assert probe.main(argv) == 0  # finished rows are not run again
    with out.open() as f:
        assert len(list(csv.DictReader(f))) == 2
    assert "done" in capsys.readouterr().err
    assert probe.main(["--table", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| base | strict | 1 | ")


def test_em_private_config_changes_only_merge_method_adapter_and_dpsgd(tmp_path):
    backbone = tmp_path / "b.toml"
    backbone.write_text('# a search\n[train]\nrounds = 10\n[federation]\nmethod = "pfedrec"\n'
                        'merge = "sr"\nadapter_lr = 0.1\n[privacy]\nmode = "ldp-dpsgd"\n'
                        'dpsgd_lr = 13.0\ndpsgd_adapter_steps = 0\n')
    em = tmp_path / "e.toml"
    em.write_text('[federation]\nmerge = "em"\nadapter_lr = 0.02\n')
    text = epc.em_config(backbone, em, "pfedrec", "dpsgd4")
    cfg = tomllib.loads(text)
    assert text.startswith("# em on the backbone's eps-4 choice: b.toml")
    assert cfg["federation"] == {"method": "pfedrec", "merge": "em", "adapter_lr": 0.02}
    assert cfg["privacy"]["dpsgd_adapter_steps"] == epc.ADAPTER_STEPS
    assert cfg["privacy"]["dpsgd_lr"] == epc.DPSGD_LR_CAP["pfedrec"]
    assert cfg["train"] == {"rounds": 10}
    mf = tomllib.loads(epc.em_config(backbone, em, "fedmf", "cdp4"))
    assert mf["federation"]["method"] == "fedem"
    assert mf["privacy"]["dpsgd_lr"] == 13.0  # no cap outside DP-SGD's adapter rungs


def test_diagnostics_plot_draws_a_png_from_the_csv(tmp_path):
    path = tmp_path / "d.csv"
    rows = ["label,seed,round,view,val_full_hr10,test_full_hr10,drift_all,drift_own,rho_now,"
            "rho_mean_round,seconds"]
    for label in ("base", "sr"):
        for rnd in (1, 10):
            for view in ("own", "global", "start"):
                rows.append(f"{label},0,{rnd},{view},0.1,0.2,0.1,0.1,0.5,,1.0")
    path.write_text("\n".join(rows) + "\n")
    png = tmp_path / "d.png"
    assert em_diagnostics.main(["--out", str(path), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ablation_table_takes_the_best_validation_round_and_the_fall(tmp_path):
    """Per label: the own view's test at its best validation round, at the last round, the
    difference, the server's view at the last round; and drift against fall over runs."""
    fields = ["label", "seed", "round", "view", "val_full_hr10", "test_full_hr10",
              "drift_all", "drift_own", "rho_now", "rho_mean_round", "seconds"]
    rows = []
    for label, seed, own, glob, drift in (
            ("a", 0, [(0.1, 0.2), (0.5, 0.6), (0.3, 0.3)], 0.7, 0.9),
            ("a", 1, [(0.1, 0.1), (0.6, 0.5), (0.4, 0.4)], 0.6, 0.7),
            ("b", 0, [(0.1, 0.1), (0.4, 0.4), (0.5, 0.45)], 0.5, 0.1)):
        for rnd, (val, test) in zip((1, 50, 100), own, strict=True):
            rows.append([label, seed, rnd, "own", val, test, 0.0, drift, 0.5, "", 1.0])
        rows.append([label, seed, 100, "global", 0.0, glob, 0.0, drift, 0.5, "", 1.0])
    path = tmp_path / "diag.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        writer.writerows(rows)
    text = em_diagnostics.ablation_table(path)
    a = next(line for line in text.splitlines() if line.startswith("| a |"))
    b = next(line for line in text.splitlines() if line.startswith("| b |"))
    # a: best-val tests 0.6 and 0.5, last 0.3 and 0.4, falls 0.3 and 0.1, server 0.7, 0.6
    # gaps (server - own, last round): 0.4 and 0.2 for a, 0.05 for b
    assert a.startswith("| a | 2 | 0.550 ± 0.050 | 0.350 ± 0.050 | 0.200 ± 0.100 | "
                        "0.650 ± 0.050 | 0.300 ± 0.100 | 0.800 ± 0.100 |")
    assert b.startswith("| b | 1 | 0.450 | 0.450 | 0.000 | 0.500 | 0.050 | 0.100 |")
    fall = np.corrcoef([0.9, 0.7, 0.1], [0.3, 0.1, 0.0])[0, 1]
    gap = np.corrcoef([0.9, 0.7, 0.1], [0.4, 0.2, 0.05])[0, 1]
    assert f"over 3 runs: with the fall {fall:.2f}, with the gap {gap:.2f}." in text


def test_popularity_terciles_split_items_by_training_count_ties_by_id():
    # counts per item: 0:3, 1:0, 2:1, 3:5, 4:0, 5:2
    train = np.array([0, 0, 0, 2, 3, 3, 3, 3, 3, 5, 5])
    t = em_diagnostics.popularity_terciles(train, 6)
    # ascending by count (ties by id): 1, 4 | 2, 5 | 0, 3
    assert t.tolist() == [2, 0, 1, 2, 0, 1]


def test_rho_by_class_averages_each_class_over_its_rows():
    rho = np.array([0.1, 0.2, 0.3, 0.9, 0.05, 0.6, 0.7, 0.8, 0.4])
    tercile = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    # own items 0, 1; validation item 2 (excluded with them); test item 5
    out = em_diagnostics.rho_by_class(rho, np.array([0, 1]), np.array([0, 1, 2]), 2, 5,
                                      tercile)
    assert out["rho_own"] == pytest.approx(0.15)
    assert out["rho_val"] == pytest.approx(0.3)
    assert out["rho_test"] == pytest.approx(0.6)
    assert np.isnan(out["rho_pop_low"])  # every least-popular item is excluded
    assert out["rho_pop_mid"] == pytest.approx((0.9 + 0.05) / 2)  # the test item left out
    assert out["rho_pop_high"] == pytest.approx((0.7 + 0.8 + 0.4) / 3)
    # candidates 3..8 (the test item among them): one row (4) below 0.25
    assert out["rho_cand_lt25"] == pytest.approx(1 / 6)
    assert np.isnan(em_diagnostics.rho_by_class(rho, np.array([], dtype=np.int64),
                                                np.array([0]), None, 5, tercile)["rho_own"])


def _synthetic(tmp_path, merge_rows: str = "all"):
    cfg = tmp_path / "fedem.toml"
    cfg.write_text('[data]\ndataset = "synthetic"\n[data.synthetic]\nn_users = 60\n'
                   'n_items = 40\n[train]\nrounds = 4\ndim = 8\nbatch_size = 32\n'
                   '[federation]\nmethod = "fedem"\nmerge = "em"\naggregation = "fedavg"\n'
                   f'merge_rows = "{merge_rows}"\n')
    return cfg


def test_start_view_under_seen_rows_is_the_sent_table_off_the_own_rows(tmp_path):
    """--merge-rows seen: the probe's start table is Q_g on every row but the client's
    training items, and the learned merge on those."""
    from fedem_private.api import resolve_config
    from fedem_private.client.merging import merge_with_rho, take_clients
    from fedem_private.experiments.runner import prepare

    sim = prepare(resolve_config(_synthetic(tmp_path, "seen"), {}))
    for _ in range(3):
        sim.step()
    users = np.arange(8)
    idx = sim._index(users)
    start = em_diagnostics.view_params(sim, "start", idx).items
    own, sent = sim.state.params(idx).items, sim.aggregator.sent(idx).to(start.dtype)
    merged = merge_with_rho(sim.merger.cfg, take_clients(sim.merger.state, idx), own, sent)[0]
    split = sim.split
    for j, u in enumerate(users):
        mine = np.zeros(split.n_items, dtype=bool)
        mine[split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]]] = True
        assert mine.any() and (~mine).any()
        assert torch.equal(start[j, ~mine], sent[j, ~mine])
        assert torch.equal(start[j, mine], merged[j, mine])
        assert not torch.equal(start[j, mine], sent[j, mine])


def test_probe_logs_rho_classes_and_the_best_val_round(tmp_path, capsys):
    out, runs = tmp_path / "d.csv", tmp_path / "runs.csv"
    argv = ["--config", str(_synthetic(tmp_path)), "--every", "2", "--eval-every", "1",
            "--seeds", "0", "1", "--label", "em", "--out", str(out), "--runs-out", str(runs)]
    assert em_diagnostics.main(argv) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert {int(r["round"]) for r in rows} == {1, 2, 4}
    late = [r for r in rows if int(r["round"]) == 4]
    for r in late:
        rho = [float(r[c]) for c in em_diagnostics.RHO_CLASSES]
        assert all(0.0 <= x <= 1.0 for x in rho)
        assert float(r["rho_own"]) != float(r["rho_pop_mid"])  # the adapter has trained
    with runs.open() as f:
        run_rows = list(csv.DictReader(f))
    assert [int(r["seed"]) for r in run_rows] == [0, 1]
    for r in run_rows:
        assert 1 <= int(r["selected_round"]) <= 4
        assert 0.0 <= float(r["hr10_full_selected"]) <= 1.0
        assert r["command"].endswith(" ".join(argv))
    assert em_diagnostics.main(["--class-table", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[1] for line in lines[2:]] == ["2", "4"]  # round 1 left out


def test_runs_table_pairs_seeds_and_marks_differences_beyond_two_standard_errors(tmp_path):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=em_diagnostics.RUN_FIELDS)
        writer.writeheader()
        for label, sel, last in (("em", (0.50, 0.60, 0.55), (0.40, 0.50, 0.45)),
                                 ("x", (0.61, 0.70, 0.66), (0.40, 0.52, 0.44))):
            for seed in range(3):
                writer.writerow({"label": label, "seed": seed, "rounds": 60, "eval_every": 5,
                                 "selected_round": 20 + seed, "hr10_full_selected": sel[seed],
                                 "hr10_full_last": last[seed], "rho_mean_last": 0.5})
    text = em_diagnostics.runs_table(path, "em")
    x = next(line for line in text.splitlines() if line.startswith("| x |"))
    # paired: +0.11, +0.10, +0.11 (mean 0.107, s.e. 0.003: beyond); last 0, +0.02, -0.01
    assert "| 0.107 ± 0.003* |" in x
    assert "| 0.003 ± 0.009 |" in x
    assert "| x | 0,1,2 | 20,21,22 | 0.657 ± 0.026 |" in x
