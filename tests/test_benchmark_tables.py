"""benchmarks/codec_table.py: shares of the full table and seed-noise verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package

from benchmarks.codec_table import codec_rows  # noqa: E402


def _results(lora: list[float]) -> pd.DataFrame:
    rows = []
    for codec, values in (("full", [0.50, 0.52, 0.54]), ("lora", lora)):
        for seed, hr in enumerate(values):
            rows.append({"dataset": "d", "protocol": "strict", "method": "fedmf", "mode": "none",
                         "codec": codec, "seed": seed, "hr10_sampled": hr, "hr10_full": hr / 5,
                         "bytes_up_last": 27_168 if codec == "lora" else 107_648,
                         "bytes_up": 30_000 if codec == "lora" else 107_648})
    return pd.DataFrame(rows)


def test_codec_table_shares_and_verdicts():
    far = codec_rows(_results([0.60, 0.62, 0.64]))
    lora = next(line for line in far if "| lora |" in line)
    assert "| 3 | 0.6200 ± 0.0200 |" in lora and "| 27.2; 30.0 |" in lora
    assert "| 119% |" in lora and "+0.1000" in lora and "beyond" in lora
    near = next(line for line in codec_rows(_results([0.51, 0.53, 0.55])) if "| lora |" in line)
    assert "+0.0100" in near and "within" in near


def test_codec_table_refuses_private_runs():
    frame = _results([0.6, 0.6, 0.6])
    frame.loc[0, "mode"] = "ldp-laplace"
    with pytest.raises(SystemExit, match="private runs"):
        codec_rows(frame)


def _headline_rows(values: dict[tuple[str, float], list[float]]) -> pd.DataFrame:
    rows = []
    for (variant, eps), hrs in values.items():
        for seed, hr in enumerate(hrs):
            rows.append({"dataset": "d", "protocol": "strict", "mode": "cdp-gaussian",
                         "variant": variant, "eps_target": eps, "seed": seed,
                         "hr10_sampled": hr, "hr10_full": hr / 10,
                         "projection_auc": 0.3, "support_auc": 0.55})
    return pd.DataFrame(rows)


def test_headline_table_chance_and_em_verdicts():
    from benchmarks.headline_table import above, attack_table, em_table, utility_table

    inf = float("inf")
    df = _headline_rows({("fedmf", inf): [0.30, 0.31, 0.29], ("fedmf", 4.0): [0.15, 0.16, 0.14],
                         ("fedmf", 1.0): [0.10, 0.13, 0.07],  # mean 0.10: not above chance
                         ("fedmf-em", inf): [0.20, 0.21, 0.19], ("fedmf-em", 4.0): [0.15, 0.17,
                                                                                    0.13]})
    assert above(df[(df.variant == "fedmf") & (df.eps_target == 4.0)], 0.006)
    assert not above(df[(df.variant == "fedmf") & (df.eps_target == 1.0)], 0.006)
    # full chance above the full HR@10 (0.015) fails the setting even when sampled passes
    assert not above(df[(df.variant == "fedmf") & (df.eps_target == 4.0)], 0.02)
    table = utility_table(df, "d", 0.006)
    fedmf = next(line for line in table.splitlines() if "| fedmf |" in line)
    assert "0.300 / 0.030 *" in fedmf and fedmf.endswith("| 3 | 4 |")
    em = next(line for line in em_table(df, "d").splitlines() if "fedmf-em vs fedmf" in line)
    assert "-0.100 beyond" in em and "+0.000 |" in em  # eps 4: same means, no verdict
    assert "0.700 (fedmf, projection)" in attack_table(df, "d")  # max(AUC, 1 - AUC)


def _fake_run(root: Path, variant: str, seed: int, hr: float, rhos: list[float]) -> None:
    import json

    run = root / "d" / variant / "none" / "strict" / f"seed{seed}"
    run.mkdir(parents=True)
    metrics = {"sampled": {"hr@10": hr}, "full": {"hr@10": hr / 10}}
    (run / "summary.json").write_text(json.dumps({"dataset": "d", "seed": seed,
                                                  "metrics": metrics}))
    (run / "sweep_point.json").write_text(json.dumps(
        {"name": f"d/{variant}/none/strict/seed{seed}"}))
    pd.DataFrame({"round": [10 * (i + 1) for i in range(len(rhos))],
                  "rho_mean": rhos}).to_csv(run / "metrics.csv", index=False)


def test_holdout_table_verdicts_trajectory_and_identity(tmp_path, capsys):
    import json

    from benchmarks.holdout_table import main

    runs, abl = tmp_path / "runs", tmp_path / "ablation"
    abl.mkdir()
    for seed, (mf, em) in enumerate([(0.50, 0.20), (0.52, 0.21), (0.48, 0.19)]):
        for variant, hr in (("FedMF-SR", mf), ("FedSim-SR", mf), ("FedSim-EM", em)):
            metrics = {"sampled": {"hr@10": hr}, "full": {"hr@10": hr / 10}}
            (abl / f"d__strict__{variant}__seed{seed}.json").write_text(json.dumps(
                {"dataset": "d", "variant": variant, "seed": seed, "metrics": metrics}))
        _fake_run(runs, "fedem-em-holdout", seed, em + 0.002, [0.5, 0.3 + seed / 10])
    _fake_run(runs, "fedem-em", 0, 0.25, [0.4, 0.2])  # not the ablation's 0.20
    assert main([str(runs), "--ablation", str(abl)]) == 0
    out = capsys.readouterr().out
    assert "| FedMF (ablation) | 3 | 0.5000 ± 0.0200 |" in out and "-0.2980 (beyond noise" in out
    assert "| FedEM (train), this grid | 1 | 0.2500 |" in out and "one seed: no noise" in out
    assert "+0.0020 (within noise" in out  # holdout vs FedEM (train)
    assert "| holdout (3 seeds) | 0.500 | 0.400 |" in out and "| train (1 seed) | 0.400 |" in out
    assert "d train seed 0 at round 100 against the ablation's record: DIFFERENT" in out


def _attribution_run(root: Path, dataset: str, variant: str, proto: str, seed: int,
                     curve: list[float]) -> None:
    import json

    run = root / dataset / variant / "none" / proto / f"seed{seed}"
    run.mkdir(parents=True)
    summary = {"seed": seed, "protocol": "paper", "protocol_label": proto,
               "metrics": {"sampled": {"hr@10": curve[-1]}}, "merge_rho_mean": None}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "sweep_point.json").write_text(json.dumps(
        {"name": f"{dataset}/{variant}/none/{proto}/seed{seed}"}))
    pd.DataFrame({"round": range(1, len(curve) + 1),
                  "sampled_hr@10": curve}).to_csv(run / "metrics.csv", index=False)


def test_attribution_table_per_dataset_best_round_and_verdicts(tmp_path):
    from benchmarks.attribution_table import runs, table

    for seed, jitter in enumerate((0.0, 0.01, -0.01)):
        for dataset, base in (("filmtrust", 0.80), ("ml-100k", 0.45)):
            _attribution_run(tmp_path, dataset, "fedmf", "paper", seed,
                             [base + 0.05 + jitter, base + jitter])
            _attribution_run(tmp_path, dataset, "fedmf", "paper-code", seed,
                             [base - 0.10 + jitter, base - 0.15 + jitter])
    lines = table(runs(str(tmp_path)))
    rows = {(line.split(" | ")[0][2:], line.split(" | ")[2]): line for line in lines[2:]}
    assert [key[0] for key in rows] == ["filmtrust"] * 2 + ["ml-100k"] * 2  # order of the walk
    code = rows[("filmtrust", "paper-code")]
    # round 100 is the last row; the best test round is the highest of the curve
    assert "| 0.650 ± 0.010 | -0.150 (beyond noise) | 0.700 ± 0.010 | -0.150 (beyond noise)" in code
    assert code.endswith("| 0.6577 |")
    assert rows[("ml-100k", "paper")].endswith("| 0.4889 |")


def test_table3_selected_reads_the_reported_round():
    from benchmarks.table3 import METRICS, selected, table

    rows = []
    for seed in range(3):
        row = {"run": f"r{seed}", "dataset": "ml-100k", "protocol": "paper-code",
               "variant": "fedmf", "seed": seed}
        for m in METRICS:
            row[m], row[f"{m}_selected"] = 0.1, 0.5 + seed / 100
        rows.append(row)
    frame = pd.DataFrame(rows)
    assert "| 0.5100 ± 0.0100 |" in table(selected(frame))
    assert "| 0.1000 ± 0.0000 |" in table(frame)
    frame.loc[1, "hr10_sampled_selected"] = float("nan")
    with pytest.raises(SystemExit, match="selected round"):
        selected(frame)
    # a run that reports its last round (strict: no select_round) keeps its last values
    frame["cfg.train.select_round"] = ["best-test", "last", "best-test"]
    assert "| 0.3733 ± 0.2369 |" in table(selected(frame))  # 0.50, 0.10, 0.52


def test_tables_label_paper_ldp_runs_and_show_each_table_s_published_figure():
    from benchmarks.table3 import table

    rows = [{"run": f"{v}{mode}", "dataset": "ml-100k", "protocol": "paper-code",
             "variant": v, "mode": mode, "seed": 0, "hr10_sampled": 0.9,
             "ndcg10_sampled": 0.8, "hr10_full": 0.5, "ndcg10_full": 0.4}
            for v, mode in [("fedem-em", "none"), ("fedem-em", "paper"), ("fedem-dm", "none"),
                            ("fedmf", "none"), ("fedmf-em", "none")]]
    text = table(pd.DataFrame(rows))
    assert "| fedem-em | 1 |" in text and "0.9958 / 0.9427" in text  # Table 1
    assert "| fedem-em + paper LDP | 1 |" in text and "0.9936 / 0.9399" in text  # Table 4
    assert "0.9427 / 0.8175" in text  # Table 2's FedSim-DM
    lines = text.splitlines()
    assert lines.index(next(x for x in lines if "| fedem-em |" in x)) < lines.index(
        next(x for x in lines if "paper LDP" in x))
    fedem = next(x for x in lines if "| fedem-em |" in x)
    assert fedem.endswith("|  |")  # FedEM is not "FedEM's backbone + EM": no gain column
    assert next(x for x in lines if "| fedmf-em |" in x).endswith("+0.0000 (?) |")


def _score_rows(variant: str, protocol: str, values: list[float], **extra) -> list[dict]:
    return [{"run": f"{variant}/{protocol}/{extra.get('mode', 'none')}/{seed}",
             "dataset": extra.get("dataset", "ml-100k"), "variant": variant,
             "protocol": protocol, "seed": seed, "mode": extra.get("mode", "none"),
             "hr10_sampled": v, "method": variant.split("-")[0], "backbone": "mf",
             "aggregation": "fedavg", "merge": "sr", "eps_target": None,
             **{k: x for k, x in extra.items() if k not in ("dataset", "mode")}}
            for seed, v in enumerate(values)]


def test_scorecard_verdict_uses_the_prediction_interval_of_one_more_seed():
    from benchmarks.scorecard import verdict

    # s = 0.01, n = 3: 2 s sqrt(4/3) = 0.0231
    assert verdict(0.50, 0.01, 3, 0.48) == "+0.020 reproduced"
    assert verdict(0.50, 0.01, 3, 0.475) == "+0.025 above"
    assert verdict(0.50, 0.01, 3, 0.53) == "-0.030 below"
    assert verdict(0.50, float("nan"), 1, 0.40) == "+0.100 (1 seed)"
    assert verdict(float("nan"), float("nan"), 0, 0.40) == "-"


def test_scorecard_reads_sources_labels_runs_and_later_sources_win(tmp_path):
    import json

    from benchmarks.scorecard import main, runs, scorecard
    from benchmarks.table3 import METRICS

    # a benchmarks.ablation folder: Table 2's FedSim-SR under strict, 2 seeds
    abl = tmp_path / "ablation"
    abl.mkdir()
    for seed, hr in enumerate([0.20, 0.30]):
        (abl / f"ml-100k__strict__FedSim-SR__seed{seed}.json").write_text(json.dumps(
            {"dataset": "ml-100k", "protocol": "strict", "variant": "FedSim-SR", "seed": seed,
             "metrics": {"sampled": {"hr@10": hr}}, "privacy": {"mode": "none"}}))
    rows = (_score_rows("fedsim", "strict", [0.25])  # replaces the ablation's seed 0
            + _score_rows("fedmf", "paper-code", [0.1, 0.1, 0.1],
                          **{f"{m}_selected": 0.49 for m in METRICS},
                          **{"cfg.train.select_round": "best-test"})
            + _score_rows("fedrap", "paper-code", [0.7], **{"cfg.train.optimizer": "sgd"})
            + _score_rows("pfedrec-em", "paper-code+agg10", [0.96, 0.98],
                          **{"cfg.train.optimizer": "sgd"})
            + _score_rows("fedem-em", "paper-code", [0.95], mode="paper")
            + _score_rows("fedmf", "strict", [0.01], mode="ldp-laplace")
            + _score_rows("fedmf", "strict", [0.5], dataset="lastfm-2k"))
    csv = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    frame = runs([abl, csv])
    fedsim = frame[frame["variant"] == "fedsim"].sort_values("seed")["hr10_sampled"].tolist()
    assert fedsim == [0.25, 0.30]
    assert set(frame["variant"]) >= {"fedrap (sgd)", "fedem-em + paper LDP"}
    assert "ldp-laplace" not in set(frame["mode"])  # a real mechanism is not the paper's
    text = "\n".join(scorecard(frame))
    # paper-code at the reported round: 0.49 on all 3 seeds against 0.4889
    assert "| fedmf | 1, 2, 3 | 0.4889 | 0.490 ± 0.000 (3) | +0.001 above |" in text
    # ... and the same runs at their last round (0.1), the other reporting rule
    fedmf = next(x for x in text.splitlines() if x.startswith("| fedmf |"))
    assert fedmf.endswith("| 0.100 ± 0.000 (3) | -0.389 below |")
    assert "| fedrap (sgd) | 1, 3 | 0.8897 | 0.700 (1) | -0.190 (1 seed) |" in text
    lines = text.splitlines()
    assert lines.index(next(x for x in lines if x.startswith("| fedrap (sgd) |"))) == \
        lines.index(next(x for x in lines if x.startswith("| fedrap |"))) + 1
    assert "| fedem-em + paper LDP | 4 | 0.9936 | 0.950 (1) |" in text
    # the preset and an option it leaves off: its own row, in the paper-code column
    assert ("| pfedrec-em (sgd) with agg10 | 3 | 0.9905 | 0.970 ± 0.014 (2) | -0.021 reproduced |"
            in text)
    assert "| fedsim | 2 | 0.6320 | - | - | - | 0.275 ± 0.035 (2) |" in text
    assert "another file" in text  # LastFM-2K's published figures
    assert "Not run here: fedem-private sweep benchmarks/specs/reproduction/ml1m.toml" in text
    assert main([str(tmp_path / "missing.csv")]) == 2


def test_scorecard_committed_reads_every_committed_source(capsys):
    from benchmarks.scorecard import COMMITTED, main

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    missing = [name for name in COMMITTED if not (root / name).exists()]
    assert not missing, f"COMMITTED names sources that are not committed: {missing}"
    assert main(["--committed", "--dataset", "ml-100k"]) == 0
    text = capsys.readouterr().out
    # FedMF's three attribution seeds under paper-code, at their reported round
    assert "| fedmf | 1, 2, 3 | 0.4889 | 0.487 ± 0.009 (3) |" in text
    with pytest.raises(SystemExit) as exc:
        main([])  # neither SOURCE nor --committed
    assert exc.value.code == 2


def test_fedrap_rates_reads_the_committed_rate_grids():
    from benchmarks.fedrap_rates import rows

    lines = rows()
    assert lines[0].startswith("| dataset | table rate |")
    # the README's rate on ML-100K (benchmarks/specs/reproduction/fedrap_sgd.toml), three seeds,
    # best rounds 15
    assert ("| ml-100k | 1000 (README) | fedrap (sgd) | paper-code | 3 | 0.705 ± 0.006 "
            "(15, 15, 15) |") in "\n".join(lines)
    assert any(line.startswith("| filmtrust | 100 | fedrap (sgd) | paper-code |")
               for line in lines)


def test_table2_without_agg10_reads_the_reported_round_and_round_100(capsys):
    from benchmarks.table2_no_agg10_table import main

    assert main([]) == 0
    text = capsys.readouterr().out
    # FedSim-SR on ML-100K, three seeds: best test rounds 19, 18, 23 against round 100
    assert ("| ml-100k | fedsim | preset - agg10 | 3 | 0.866 ± 0.011 (19, 18, 23) | 0.6320 "
            "| +0.234 above | 0.568 ± 0.037 |") in text
    assert text.count("\n| filmtrust | fedem-dm |") == 1
    # FedEM's own row without the share: ML-100K within seed noise of 0.9958
    assert ("| ml-100k | fedem-em | preset - agg10 | 3 | 0.975 ± 0.013 (74, 51, 67) | 0.9958 "
            "| -0.021 reproduced") in text


def test_table2_without_agg10_labels_the_preset_without_its_share():
    from benchmarks.table2_no_agg10_table import protocol_label

    assert protocol_label("paper+min10+firstseen+sharedneg+besttest+pcasim+batchmerge"
                          "+earlystop") == "preset - agg10"
    assert protocol_label("paper+min10+sharedneg+bestval+pcasim") == "preset - agg10"
    # the share itself, or an option of the core missing: the protocol as recorded
    assert protocol_label("paper+min10+sharedneg+besttest+agg10+pcasim") == \
        "paper+min10+sharedneg+besttest+agg10+pcasim"
    assert protocol_label("paper+min10+sharedneg+pcasim") == "paper+min10+sharedneg+pcasim"
    assert protocol_label("paper+firstseen") == "paper+firstseen"


def test_speed_adam_bound_counts_the_engine_steps_and_each_clients_own_rows():
    import numpy as np
    import torch

    from benchmarks.probes.speed import adam_bound

    # one chunk: 3 clients touching 5, 4 and 2 rows (compact height 5); steps 3, 2, 1
    active = np.array([3, 2, 1])
    out = adam_bound([(5, active, np.array([5, 4, 2]))], d=4, device=torch.device("cpu"))
    assert out["padded_rows"] == (3 + 2 + 1) * 5
    assert out["tight_rows"] == (5 + 4 + 2) + (5 + 4) + 5
    assert out["padded_s"] > 0 and out["tight_s"] > 0


def test_speed_recording_plans_sees_every_chunk_of_a_round_and_restores_make_plan():
    from benchmarks.common import run_config
    from benchmarks.probes.speed import _recording_plans
    from fedem_private.experiments.runner import prepare
    from fedem_private.models import mf

    original = mf.make_plan
    cfg = run_config("synthetic", **{"federation.method": "fedmf", "train.rounds": 1,
                                     "train.eval_every": 10_000})
    sim = prepare(cfg)
    with _recording_plans() as plans:
        sim.step()
    assert mf.make_plan is original
    assert plans
    # every client trains in exactly one chunk, and no chunk's active count exceeds its size
    assert sum(int(active.max()) for _, active, _ in plans) == sim.split.n_users
    assert all(int(touched.max()) <= rows for rows, _, touched in plans)
