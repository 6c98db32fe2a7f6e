"""Issue 69's measurement helpers: the held-out-row probe's percentile, its run on a tiny
synthetic FedEM, and the private elastic-merging rungs' configs."""
from __future__ import annotations

import csv
import tomllib

import numpy as np

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
