"""Issue 18, a newcomer's friction list: umask, resolved configs, sweeps that never overwrite,
reports that never mix, light validation, rating columns."""

from __future__ import annotations

import math
import os
import stat

import pandas.testing as pd_testing
import pytest

from fedem_private.cli import main

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def _synthetic_toml(path, **train):
    lines = ["[data.synthetic]", "n_users = 40", "n_items = 60", "mean_activity = 8", "",
             "[train]"] + [f"{k} = {v}" for k, v in train.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def umask():
    """Set the process umask for one test, then put the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _modes(root):
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode)
            for p in [root, *root.rglob("*")]}


# ----------------------------------------------------------------- 8: the user's umask
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path, umask, mask):
    from attacks._atomic import write_json
    from fedem_private.experiments.report import write_report

    umask(mask)
    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=1)
    root = tmp_path / "runs"
    assert main(["run", "--config", str(cfg), "--out", str(root / "a"), *TINY]) == 0
    write_json(root / "a" / "attacks.json", {"records": []})
    write_report(str(root))
    modes = _modes(root)
    assert {"a", "a/config.toml", "a/attacks.json", "report.md", "results.csv"} <= set(modes)
    for name, mode in modes.items():
        want = (0o777 if (root / name).is_dir() else 0o666) & ~mask
        assert mode == want, f"{name}: {oct(mode)} != {oct(want)}"


# --------------------------------------------- 7: config.toml re-creates a recorded run
def test_config_toml_recreates_a_recorded_run_that_can_be_attacked(tmp_path, capsys):
    from fedem_private.simulation.config import load_toml

    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=2)
    first = tmp_path / "first"
    assert main(["run", "--config", str(cfg), "--out", str(first), "--record-rounds", "1,last",
                 "--record-clients", "7", *TINY]) == 0
    resolved = load_toml(first / "config.toml")
    assert (resolved.record.rounds, resolved.record.clients) == ("1,last", 7)
    again = tmp_path / "again"
    assert main(["run", "--config", str(first / "config.toml"), "--out", str(again),
                 "--no-progress"]) == 0
    assert (again / "observations").is_dir()
    assert (again / "config.toml").read_text() == (first / "config.toml").read_text()
    capsys.readouterr()
    assert main(["attack", str(again), "--attacks", "projection", "--quiet"]) == 0
    assert (again / "attacks.json").is_file()


def test_record_section_is_validated_before_anything_runs(tmp_path, capsys):
    toml = tmp_path / "c.toml"
    toml.write_text('[train]\nrounds = 2\n\n[record]\nrounds = [1, "last"]\nclients = 5\n')
    from fedem_private.simulation.config import load_toml

    assert load_toml(toml).validate().resolved().record.rounds == "1,last"
    toml.write_text('[train]\nrounds = 2\n\n[record]\nrounds = "3"\n')
    assert main(["run", "--config", str(toml), "--out", str(tmp_path / "o")]) == 2
    assert "round 3 is beyond the run's 2 rounds" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# the built-in quick sweep before issue 67 (Laplace LDP on the default synthetic data):
# the sweep file whose digests version 0.1.0 wrote
QUICK_SPEC_0_1 = """\
# The built-in quick sweep: FedMF vs FedEM on the default synthetic data
# (600 users, 500 items) under clipped Laplace local DP, eps in {inf, 8, 1}
# (inf: clipped, no noise), attacked by the projection attack in the last round;
# beside them the accuracy ladder's references: MostPop, EASE, centralised MF and
# DP-MostPop under local DP (optimal unary encoding) at eps 8 and 1, the private floor
# ldp-laplace's points are judged against.
[sweep]
datasets = ["synthetic"]
methods = ["fedmf", "fedem"]
privacy = ["ldp-laplace"]
epsilons = [inf, 8, 1]
seeds = [0, 1, 2]
protocols = ["strict"]
attacks = ["projection"]
record_rounds = ["last"]
record_clients = 100
references = ["mostpop", "dp-mostpop", "ease", "centralised"]

[base.train]
rounds = 15
local_epochs = 5

[base.privacy]
# L1 clip bound of the uploaded delta: about the typical pre-clip L1 norm of a
# FedMF client's delta in these runs (mean_pre_clip_norm in metrics.csv: ~880
# in round 1, ~690 from round 10 on; FedEM's grows from ~880 to ~3000).
clip = 800.0
"""


def test_sweep_point_identity_is_unchanged_by_new_config_sections(tmp_path):
    """Digests written by version 0.1.0 still match where what runs is unchanged, so
    existing sweeps resume: here a point without privacy. A point under a mechanism does
    not resume: since issue 39 its server weights are uniform (data sizes private), so
    the old quick sweep's first point (ldp-laplace) has a new digest (it was
    b83c5189...)."""
    from dataclasses import replace

    from fedem_private.experiments.sweep_spec import grid, load_spec
    from fedem_private.privacy.config import PrivacyConfig

    (tmp_path / "quick-0.1.toml").write_text(QUICK_SPEC_0_1)
    point = grid(load_spec(str(tmp_path / "quick-0.1.toml")))[0]
    plain = replace(point, config=replace(point.config, privacy=PrivacyConfig()))
    assert plain.digest(True) == ("501a1645eed86f346063bc4416cbca69"
                                  "d7cefbe3bab84e2e27a2404cd5b24d98")
    assert plain.digest(False) == ("d16c199685f504479d42193692afb4b7"
                                   "ab039f939bbf7d9e9e908e9608f21aa8")
    assert point.config.privacy.mode == "ldp-laplace"
    assert point.digest(True) == ("e3aeaf0923ac07bb7be6b05829310255"
                                  "f821956ebabf6affa0c3036ca13caa73")
    assert point.digest(True) != ("b83c5189bd6a764133c9bf240403552b"
                                  "97c1b7e1a495e06b020a17cb75d70b20")


# ----------------------------------------- 1: a changed sweep never overwrites finished runs
@pytest.fixture
def stub(monkeypatch):
    from sweep_helpers import StubAttacks

    from fedem_private.experiments import attack_step

    s = StubAttacks()
    monkeypatch.setattr(attack_step, "load", s.step)
    return s


def _mtimes(root):
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_changed_sweep_stops_naming_what_changed_and_force_replaces(tmp_path, stub, capsys):
    from sweep_helpers import TINY_BASE, write_spec

    from fedem_private.errors import UserError
    from fedem_private.experiments.sweep import SPEC_FILE, run_sweep
    from fedem_private.experiments.sweep_spec import grid, load_spec
    from fedem_private.simulation.config import load_toml

    axes = 'methods = ["fedmf", "fedem"]\nprivacy = ["none"]\nattacks = ["projection"]\n'
    spec = write_spec(tmp_path / "s.toml", axes + "seeds = [0]")
    root = tmp_path / "out"
    assert run_sweep(str(spec), str(root), progress=False) == 0
    names = [p.name for p in grid(load_spec(spec))]
    cfg = load_toml(root / names[0] / "config.toml")
    assert (cfg.record.rounds, cfg.record.clients) == ("last", 100)  # item 7 in a sweep
    before, spec_text = _mtimes(root), (root / SPEC_FILE).read_text()

    # more rounds: same directory names, different runs -> refused, nothing touched
    write_spec(spec, axes + "seeds = [0]", TINY_BASE.replace("rounds = 2", "rounds = 3"))
    with pytest.raises(UserError) as err:
        run_sweep(str(spec), str(root), progress=False)
    msg = str(err.value)
    assert "2 finished runs" in msg and "train.rounds 2 -> 3" in msg and "--force" in msg
    assert "\n" not in msg
    assert _mtimes(root) == before and (root / SPEC_FILE).read_text() == spec_text
    # through the command line: one line, exit 2
    assert main(["sweep", str(spec), "--out", str(root), "--no-progress"]) == 2
    assert "train.rounds 2 -> 3" in capsys.readouterr().err
    assert _mtimes(root) == before

    # back to the old base plus a new seed: identical points resume, only the new ones run
    write_spec(spec, axes + "seeds = [0, 1]")
    assert run_sweep(str(spec), str(root), progress=False) == 0
    assert "2 ran, 2 already done" in capsys.readouterr().out
    assert all(_mtimes(root)[p] == t for p, t in before.items() if p.name == "summary.json")

    # a recording change is a change too; --force replaces
    write_spec(spec, axes + "seeds = [0, 1]\nrecord_rounds = [1, 'last']")
    with pytest.raises(UserError, match="recording rounds last of 100 clients -> rounds "
                                        "1,last of 100 clients"):
        run_sweep(str(spec), str(root), progress=False)
    assert run_sweep(str(spec), str(root), force=True, progress=False) == 0
    assert load_toml(root / names[0] / "config.toml").record.rounds == "1,last"


# ------------------------------------------------------ 2: reports never mix unrelated runs
def test_report_keeps_runs_of_two_sweeps_apart(tmp_path, stub, capsys):
    import pandas as pd
    from sweep_helpers import TINY_BASE, write_spec

    from fedem_private.experiments.report import write_report
    from fedem_private.experiments.sweep import run_sweep

    axes = 'methods = ["fedmf"]\nprivacy = ["none"]\nseeds = [0, 1]\n'
    a = write_spec(tmp_path / "a.toml", axes)
    b = write_spec(tmp_path / "b.toml", axes, TINY_BASE.replace("rounds = 2", "rounds = 3"))
    assert run_sweep(str(a), str(tmp_path / "A"), progress=False) == 0
    assert run_sweep(str(b), str(tmp_path / "B"), progress=False) == 0
    capsys.readouterr()
    write_report([str(tmp_path / "A"), str(tmp_path / "B")], str(tmp_path / "both"))
    out = capsys.readouterr().out
    assert "several sources" not in out  # nothing was replaced: the same paths, other runs
    assert "runs differ in rounds" in out
    both = pd.read_csv(tmp_path / "both" / "results.csv")
    assert len(both) == 4 and both["run"].nunique() == 2 and both["config_id"].nunique() == 4
    assert sorted(both["cfg.train.rounds"]) == [2, 2, 3, 3]
    md = (tmp_path / "both" / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| fedmf")]
    assert len(rows) == 2, md
    assert any("fedmf [rounds=2]" in r for r in rows) and any("fedmf [rounds=3]" in r for r in rows)
    assert all("| 2 |" in r for r in rows)  # two seeds each, not four of one mixed setting
    # a run reported twice (its folder and a kept results.csv) is still one row
    write_report([str(tmp_path / "both" / "results.csv"), str(tmp_path / "A")],
                 str(tmp_path / "again"))
    assert len(pd.read_csv(tmp_path / "again" / "results.csv")) == 4
    assert "2 runs found in several sources" in capsys.readouterr().out
    # an older results.csv (no config columns) cannot tell those runs apart: refused, one line
    legacy = pd.read_csv(tmp_path / "both" / "results.csv")
    legacy = legacy[[c for c in legacy.columns if c != "config_id" and not c.startswith("cfg.")]]
    legacy.to_csv(tmp_path / "legacy.csv", index=False)
    assert main(["report", str(tmp_path / "legacy.csv"), "--out", str(tmp_path / "L")]) == 2
    err = capsys.readouterr().err
    assert "share a seed" in err and err.count("\n") == 1
    assert not (tmp_path / "L" / "results.csv").exists()


# ------------------------------------------- 5: validation errors load no heavy library
HEAVY = ("torch", "pandas", "cvxpy", "opacus", "matplotlib", "sklearn", "scipy", "dp_accounting")


def _heavy_after(argv: list[str], cwd) -> tuple[int, str, list[str]]:
    """Run the CLI in a fresh interpreter; exit code, stderr, heavy modules it imported."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, sys\nfrom fedem_private.cli import main\n"
            f"rc = main({argv!r})\n"
            f"print(json.dumps([rc, [m for m in {HEAVY!r} if m in sys.modules]]))\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    rc, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    return rc, proc.stderr, heavy


def test_validation_errors_import_no_heavy_library(tmp_path):
    (tmp_path / "notarun").mkdir()
    (tmp_path / "bad.toml").write_text("[sweep]\ncolours = [1]\n")
    (tmp_path / "atk.toml").write_text("[sweep]\nattacks = ['telepathy']\n")
    (tmp_path / "run.toml").write_text("[train]\nroundz = 3\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    cases = [
        (["run", "--rounds", "0"], "train.rounds"),
        (["run", "--dataset", "nope"], "unknown dataset"),
        (["run", "--privacy", "ldp-laplace", "--epsilon", "-1"], "epsilon"),
        (["run", "--config", "run.toml"], "unknown key 'roundz'"),
        (["run", "--config", "missing.toml"], "config file not found"),
        (["run", "--dataset", "ml-100k", "--data-dir", "nowhere"], "directory not found"),
        (["run", "--rounds", "2", "--record-rounds", "5"], "beyond the run's 2 rounds"),
        (["run", "--min-rating", "4"], "min-rating"),
        (["sweep", "missing.toml"], "sweep file not found"),
        (["sweep", "bad.toml"], "unknown axis 'colours'"),
        (["sweep", "atk.toml"], "telepathy"),
        (["report", "nowhere"], "nowhere"),
        (["attack", "notarun"], "not a run directory"),
        (["attack", "run", "--attacks", "telepathy"], "unknown attack 'telepathy'"),
        (["attack", "run", "--known-fraction", "2"], "--known-fraction"),
        (["datasets", "download", "ml-99m"], "unknown dataset"),
    ]
    for argv, needle in cases:
        rc, err, heavy = _heavy_after(argv, tmp_path)
        assert rc == 2 and needle in err and err.count("\n") == 1, (argv, err)
        assert heavy == [], (argv, heavy)


def test_attack_names_known_without_import_match_the_attack_step():
    from attacks.registry import REGISTRY, attack_class
    from fedem_private.experiments.attack_step import known_attacks

    assert known_attacks() == tuple(REGISTRY)
    assert all(attack_class(n).capabilities.kind in ("item", "client", "mechanism")
               for n in REGISTRY)


# ------------------------------------------ 6: rating columns are checked; --min-rating
@pytest.mark.parametrize("text,needle", [
    ("u1,i1,5\nu1,i2,five\n", "line 2: rating is not a number: 'five'"),
    ("user,item,rating\nu1,i1,NaN\n", "line 2: rating is not a number: 'NaN'"),
    ("u1,i1,4\nu1,i2,\n", "line 2: rating is not a number"),
    ("u1,i1,inf\n", "line 1: rating is not a finite number: 'inf'"),
])
def test_csv_rating_column_is_validated(tmp_path, capsys, text, needle):
    (tmp_path / "r.csv").write_text(text)
    assert main(["run", "--dataset", "csv", "--data-dir", str(tmp_path / "r.csv"), *TINY]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def _rated_csv(path):
    rows = [f"u{u},i{i},{1 + (u + i) % 5}" for u in range(12) for i in range(10)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_min_rating_keeps_only_high_ratings_as_positives(tmp_path):
    from fedem_private.data import load_dataset

    csv = _rated_csv(tmp_path / "r.csv")
    everything = load_dataset("csv", csv)
    high = load_dataset("csv", csv, min_rating=4)
    assert everything.n_interactions == 120
    assert high.n_interactions == sum((u + i) % 5 >= 3 for u in range(12) for i in range(10))
    ml = tmp_path / "ml"
    ml.mkdir()
    (ml / "u.data").write_text("1\t1\t5\t10\n1\t2\t2\t11\n2\t1\t4\t12\n2\t3\t1\t13\n")
    assert load_dataset("ml-100k", ml, min_rating=4).n_interactions == 2
    (ml / "ratings.txt").write_text("1 1 3.5\n1 2 0.5\n2 2 4\n")
    assert load_dataset("filmtrust", ml, min_rating=3).n_interactions == 2


def test_min_rating_errors_are_one_line(tmp_path, capsys):
    csv = _rated_csv(tmp_path / "r.csv")
    (tmp_path / "pairs.csv").write_text("u1,i1\nu1,i2\n")
    cases = [
        (["--min-rating", "3"], "dataset synthetic has no ratings"),
        (["--dataset", "lastfm-2k", "--data-dir", str(tmp_path), "--min-rating", "3"],
         "dataset lastfm-2k has no ratings"),
        (["--dataset", "csv", "--data-dir", str(csv), "--min-rating", "nan"],
         "min_rating must be a number, got NaN"),
        (["--dataset", "csv", "--data-dir", str(csv), "--min-rating", "9"],
         "no rating >= 9"),
        (["--dataset", "csv", "--data-dir", str(tmp_path / "pairs.csv"), "--min-rating", "3"],
         "needs a rating column"),
    ]
    for argv, needle in cases:
        assert main(["run", *argv, *TINY, "--out", str(tmp_path / "o")]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "o").exists()
    # and it is part of the written config, so it re-creates the run
    assert main(["run", "--dataset", "csv", "--data-dir", str(csv), "--min-rating", "3",
                 *TINY, "--out", str(tmp_path / "o")]) == 0
    assert "min_rating = 3.0" in (tmp_path / "o" / "config.toml").read_text()


# -------------------------------------------------------------- 10: the Python API
def test_python_api_run_attack_sweep_load(tmp_path, stub):
    import pandas as pd
    from sweep_helpers import write_spec

    import fedem_private as fp
    import fedem_private.experiments.sweep  # noqa: F401  (the submodule must not shadow fp.sweep)

    assert callable(fp.sweep) and fp.sweep.__module__ == "fedem_private.api"
    res = fp.run({"data": {"synthetic": {"n_users": 40, "n_items": 60, "mean_activity": 8}},
                  "train": {"rounds": 2, "local_epochs": 1, "dim": 4},
                  "record": {"rounds": "last", "clients": 10}},
                 out=tmp_path / "r", overrides={"federation.method": "fedem"})
    assert isinstance(res.metrics, pd.DataFrame) and list(res.metrics["round"]) == [1, 2]
    assert res.config.federation.method == "fedem" and res.ledger is not None
    assert res.hr10 == res.summary["metrics"]["full"]["hr@10"]
    report = fp.attack(tmp_path / "r", ["projection"])
    assert (tmp_path / "r" / "attacks.json").is_file() and report["records"]
    table = fp.sweep(write_spec(tmp_path / "s.toml", 'methods = ["fedmf"]\nseeds = [0, 1]'),
                     out=tmp_path / "s")
    assert len(table) == 2 and len(fp.load_results(tmp_path / "s" / "results.csv")) == 2
    with pytest.raises(fp.api.UserError, match="not a run directory"):
        fp.attack(tmp_path)


# ------------------------------------------ 3: --clip auto, a DP and accounted warm-up
def _auto_run(tmp_path, name, **privacy):
    import fedem_private as fp

    return fp.run({"data": {"synthetic": {"n_users": 80, "n_items": 60, "mean_activity": 10}},
                   "train": {"rounds": 2, "local_epochs": 1, "dim": 4},
                   "privacy": {"mode": "ldp-laplace", **privacy}}, out=tmp_path / name)


def test_clip_auto_warmup_is_charged_to_every_client_within_the_total(tmp_path):
    res = _auto_run(tmp_path, "a", epsilon=4.0, clip_auto=True)
    warm = res.ledger["log"][0]
    assert warm["round"] == 0 and warm["n_clients"] == res.summary["n_users"]
    assert warm["epsilon"]["reported"] == pytest.approx(0.4, rel=1e-3)  # 10% of the total
    assert res.ledger["rounds"][0]["mechanism"] == {"kind": "laplace",
                                                    "noise_multiplier": pytest.approx(2.5)}
    priv = res.summary["privacy"]
    assert priv["clip_auto"]["rounds_epsilon_target"] == pytest.approx(3.6)
    assert 3.9 < priv["epsilon"]["reported"] <= 4.0 + 1e-9  # warm-up + rounds within 4
    assert priv["clip"] == priv["clip_auto"]["clip"]
    assert set(res.metrics["clip"]) == {priv["clip"]}
    assert 0.1 <= priv["clip"] <= 1e5


def test_clip_auto_estimates_the_median_and_leaves_the_run_untouched(tmp_path):
    # an enormous warm-up budget makes the release nearly exact: C ~ the median norm
    precise = _auto_run(tmp_path, "p", epsilon=math.inf, clip_auto=True,
                        clip_auto_epsilon=1e9)
    assert 0.3 <= precise.metrics["frac_clipped"].iloc[0] <= 0.7
    # the warm-up trains nothing that stays: the same run with that C given by hand agrees
    clip = precise.summary["privacy"]["clip"]
    by_hand = _auto_run(tmp_path, "h", epsilon=math.inf, clip=clip)
    cols = ["full_hr@10", "sampled_hr@10", "frac_clipped", "mean_pre_clip_norm"]
    pd_testing.assert_frame_equal(precise.metrics[cols], by_hand.metrics[cols])


def test_clip_auto_release_has_the_stated_sensitivity():
    import numpy as np

    from fedem_private.privacy.clip_auto import noisy_log_norms

    clients = np.arange(5)
    low, high = 0.1, 1e5
    small = noisy_log_norms(np.full(5, 1e-30), clients, low, high, 0.5, seed=3)
    big = noisy_log_norms(np.full(5, 1e30), clients, low, high, 0.5, seed=3)
    middle = noisy_log_norms(np.full(5, 7.0), clients, low, high, 0.5, seed=3)
    assert np.allclose(big - small, math.log(high / low))  # the most one client can move
    assert np.all((middle > small) & (middle < big))
    other = noisy_log_norms(np.full(5, 7.0), clients, low, high, 0.5, seed=4)
    assert not np.allclose(middle, other)  # noise is keyed by the seed


@pytest.mark.parametrize("argv,needle", [
    (["--clip", "auto"], "needs privacy mode ldp-laplace or ldp-gaussian"),
    (["--privacy", "ldp-laplace", "--epsilon-round", "1", "--clip", "auto"],
     "needs privacy.clip_auto_epsilon"),
    (["--privacy", "ldp-laplace", "--epsilon", "1", "--clip", "auto",
      "--clip-auto-epsilon", "2"], "must be below the total epsilon"),
    (["--privacy", "ldp-touched-rows", "--epsilon", "1", "--clip", "auto"], "ldp-gaussian"),
])
def test_clip_auto_errors_are_one_line(tmp_path, capsys, argv, needle):
    assert main(["run", *argv, *TINY, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
