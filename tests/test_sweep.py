"""Sweeps: grid naming, resume after an interrupt without redoing or losing runs, bad files."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sweep_helpers import TINY_2X2, TINY_BASE, StubAttacks, write_spec

from fedem_private.errors import UserError
from fedem_private.experiments import attack_step, runner
from fedem_private.experiments.results import collect
from fedem_private.experiments.rundir import is_stale, remove_stale
from fedem_private.experiments.sweep import POINT_FILE, run_sweep
from fedem_private.experiments.sweep_spec import grid, load_spec


@pytest.fixture
def stub(monkeypatch) -> StubAttacks:
    s = StubAttacks()
    monkeypatch.setattr(attack_step, "load", s.step)
    return s


def mtimes(root: Path, names: list[str]) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for n in names for p in (root / n).rglob("*")}


def hidden(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*")]


def finished(root: Path) -> list[Path]:
    """The summaries of finished runs: a point in progress writes its summary.json inside its
    hidden temporary directory before the atomic rename, and that one does not count."""
    return [p for p in root.rglob("summary.json")
            if not any(part.startswith(".") for part in p.relative_to(root).parts)]


def complete(root: Path, name: str) -> bool:
    d = root / name
    return all((d / f).is_file() for f in ("summary.json", "config.toml", "metrics.csv",
                                          POINT_FILE, "attacks.json"))


# ------------------------------------------------------------------------- the grid
def test_quick_spec_grid_names_are_readable_and_deterministic():
    points = grid(load_spec(None))
    names = [p.name for p in points]
    assert names == [p.name for p in grid(load_spec(None))]
    assert "synthetic/fedmf/cdp-gaussian-k800-epsinf/strict/seed0" in names
    assert "synthetic/fedem-em-fedavg/cdp-gaussian-k800-eps1/strict/seed0" in names
    federated = [p for p in points if p.variant in ("fedmf", "fedem-em-fedavg")]
    seeds = len(load_spec(None).seeds)
    assert len(names) == len(set(names))
    assert len(federated) == 2 * 3 * seeds
    assert all(p.attacks == ("projection",) for p in federated)
    # the ladder beside them: three references and the central floor at eps 8 and 1
    others = sorted(p.name.split("/", 2)[2] for p in points if p not in federated
                    and p.name.endswith("seed0"))
    assert others == sorted(["none/strict/seed0"] * 3 + ["central-eps8/strict/seed0",
                                                          "central-eps1/strict/seed0"])
    assert all(p.attacks == () for p in points if p not in federated)
    cfg = next(p.config for p in points if "eps8" in p.name)
    assert cfg.privacy.epsilon == 8 and cfg.privacy.mode == "cdp-gaussian"
    assert cfg.train.cohort_size == 800 and cfg.data.synthetic.n_users == 4000
    assert math.isinf(next(p.config for p in points if "epsinf" in p.name).privacy.epsilon)


def test_mode_none_ignores_epsilons_and_merges_make_variants(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.toml", """
methods = ["fedem"]
merges = ["sm", "em"]
privacy = ["none", "ldp-gaussian"]
epsilons = [4, 2]
"""))
    names = sorted(p.name.split("/", 2)[1] + "/" + p.name.split("/")[2] for p in grid(spec))
    assert names == ["fedem-em/ldp-gaussian-eps2", "fedem-em/ldp-gaussian-eps4", "fedem-em/none",
                     "fedem-sm/ldp-gaussian-eps2", "fedem-sm/ldp-gaussian-eps4", "fedem-sm/none"]
    d1, d2 = (p.digest(False) for p in grid(spec)[:2])
    assert d1 != d2 and grid(spec)[0].digest(True) != d1


def test_variants_pick_method_merge_pairs(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.toml", """
variants = ["fedmf", "fedsim", "fedem-sm", "fedem-em"]
privacy = ["none"]
"""))
    variants = [p.variant for p in grid(spec)]
    assert variants == ["fedmf", "fedsim", "fedem-sm", "fedem-em"]
    merges = [p.config.federation.resolved_merge for p in grid(spec)]
    assert merges == ["sr", "sr", "sm", "em"]


@pytest.mark.parametrize("sweep,needle", [
    ("colours = [1]", "unknown axis 'colours'"),
    ("methods = ['fedfoo']", "methods: unknown value 'fedfoo'"),
    ("methods = []", "methods must not be empty"),
    ("privacy = ['ldp-laplace']\nepsilons = [-1]", "epsilons: -1"),
    ("privacy = ['ldp-laplace']\nepsilons = ['big']", "epsilons: 'big'"),
    ("privacy = ['none']\nepsilons = [1]", "epsilons needs an ldp privacy mode"),
    ("privacy = ['ldp-laplace']", "needs a budget"),
    ("seeds = [1.5]", "seeds: 1.5"),
    ("datasets = ['nope']", "datasets: unknown value 'nope'"),
    ("record_rounds = [0]", "record_rounds: 0"),
    ("attacks = ['projection']\nrecord_rounds = [1, 5]", "round 5 is beyond the 2 rounds"),
    ("attacks = ['telepathy']", "telepathy"),
    ("variants = ['fedem-xx']", "unknown variant 'fedem-xx'"),
    ("variants = ['fedmf']\nmethods = ['fedem']", "variants replaces methods and merges"),
])
def test_bad_sweep_files_give_one_line_user_errors(tmp_path, sweep, needle, monkeypatch):
    monkeypatch.setattr(attack_step, "known_attacks", lambda: ("projection", "support"))
    with pytest.raises(UserError) as err:
        load_spec(write_spec(tmp_path / "bad.toml", sweep))
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text,needle", [
    ("[sweep]\nmethods = [", "not valid TOML"),
    ("[sweep]\n[extra]\n", "unknown table [extra]"),
    ("[sweep]\n[base.train]\nrounds = 0\n", "train.rounds must be a positive integer"),
    ("[sweep]\n[base.train]\nspeed = 3\n", "unknown key 'speed'"),
])
def test_bad_sweep_documents(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=None) as err:
        load_spec(path)
    assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="sweep file not found"):
        load_spec(tmp_path / "missing.toml")


# --------------------------------------------------------------- interrupt and resume
def test_interrupted_sweep_resumes_without_redoing_or_losing_runs(tmp_path, stub, monkeypatch,
                                                                   capsys):
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    root = tmp_path / "out"
    names = [p.name for p in grid(load_spec(spec))]
    assert len(names) == 4
    real_execute = runner.execute
    calls: list[str] = []

    def interrupting(cfg, out, force=False, on_round=None, setup=None, on_start=None,
                     checkpoint=None):
        calls.append(str(out))
        if len(calls) == 3:  # Ctrl-C in the middle of the third run, after setup wrote files
            def setup_then_stop(sim, path):
                setup(sim, path)
                raise KeyboardInterrupt
            return real_execute(cfg, out, force, on_round, setup_then_stop, on_start,
                                checkpoint)
        return real_execute(cfg, out, force, on_round, setup, on_start, checkpoint)

    monkeypatch.setattr(runner, "execute", interrupting)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(str(spec), str(root), jobs=1, force=False, progress=False)
    assert "interrupted" in capsys.readouterr().out
    assert complete(root, names[0]) and complete(root, names[1])
    assert not (root / names[2]).exists() and not (root / names[3]).exists()
    assert hidden(root) == []  # no half-written (temporary) directory left behind
    assert len(pd.read_csv(root / "results.csv")) == 2
    before = mtimes(root, names[:2])

    monkeypatch.setattr(runner, "execute", real_execute)
    calls.clear()
    n_attacked = len(stub.attacked)
    assert run_sweep(str(spec), str(root), jobs=1, force=False, progress=False) == 0
    assert mtimes(root, names[:2]) == before  # nothing finished was redone or touched
    assert all(complete(root, n) for n in names)
    assert len(stub.attacked) - n_attacked == 2
    assert len(stub.recorded) == 5  # 2 + the interrupted one (its temporary dir is gone) + 2
    results = pd.read_csv(root / "results.csv")
    assert sorted(results["run"]) == sorted(names)
    assert "2 ran, 2 already done, 0 failed" in capsys.readouterr().out

    # a third start finds everything done and runs nothing
    assert run_sweep(str(spec), str(root), jobs=1, force=False, progress=False) == 0
    assert "0 ran, 4 already done" in capsys.readouterr().out
    assert mtimes(root, names) == {**before, **mtimes(root, names[2:])}


def test_missing_attacks_rerun_only_the_attack_step(tmp_path, stub, monkeypatch):
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    root = tmp_path / "out"
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    name = grid(load_spec(spec))[1].name
    (root / name / "attacks.json").unlink()
    summary_mtime = (root / name / "summary.json").stat().st_mtime_ns
    monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail("retrained"))
    stub.attacked.clear()
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    assert [p.relative_to(root).as_posix() for p in stub.attacked] == [name]
    assert (root / name / "summary.json").stat().st_mtime_ns == summary_mtime
    assert complete(root, name)


def test_changed_config_is_refused_then_rerun_with_force(tmp_path, stub):
    root = tmp_path / "out"
    spec = write_spec(tmp_path / "one.toml", 'methods = ["fedmf"]\nseeds = [0]')
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    (name,) = [p.name for p in grid(load_spec(spec))]
    old = (root / name / "summary.json").stat().st_mtime_ns
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    assert (root / name / "summary.json").stat().st_mtime_ns == old
    write_spec(spec, 'methods = ["fedmf"]\nseeds = [0]',
               TINY_BASE.replace("[base.train]\n", "[base.train]\nlr = 0.05\n"))
    assert [p.name for p in grid(load_spec(spec))] == [name]  # same directory, new config
    with pytest.raises(UserError, match="train.lr 0.1 -> 0.05"):
        run_sweep(str(spec), str(root), jobs=1, progress=False)
    assert (root / name / "summary.json").stat().st_mtime_ns == old
    assert run_sweep(str(spec), str(root), jobs=1, force=True, progress=False) == 0
    assert (root / name / "summary.json").stat().st_mtime_ns != old
    assert "lr = 0.05" in (root / name / "config.toml").read_text()
    assert hidden(root) == []


def test_foreign_run_directory_in_the_way_is_replaced_only_with_force(tmp_path, stub):
    spec = write_spec(tmp_path / "one.toml", 'methods = ["fedmf"]\nseeds = [0]')
    root = tmp_path / "out"
    (point,) = grid(load_spec(spec))
    runner.execute(point.config, root / point.name)  # a plain run: no sweep_point.json
    with pytest.raises(UserError, match="not written by a sweep"):
        run_sweep(str(spec), str(root), jobs=1, progress=False)
    assert not (root / point.name / POINT_FILE).exists()
    assert run_sweep(str(spec), str(root), jobs=1, force=True, progress=False) == 0
    assert (root / point.name / POINT_FILE).is_file() and hidden(root) == []


def test_sweep_without_attack_step_still_trains(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attack_step, "load", lambda: "attack step unavailable: no attacks.run")
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    root = tmp_path / "out"
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    assert "attacks skipped (attack step unavailable" in capsys.readouterr().out
    frame = collect(root)
    assert len(frame) == 4 and frame["audit"].fillna("").eq("").all()
    assert not any(root.rglob("attacks.json"))


def test_parallel_jobs_finish_every_point(tmp_path):
    spec = write_spec(tmp_path / "par.toml", """
methods = ["fedmf", "fedem"]
privacy = ["none"]
seeds = [0, 1]
""")
    root = tmp_path / "out"
    assert run_sweep(str(spec), str(root), jobs=2, progress=False) == 0
    names = [p.name for p in grid(load_spec(spec))]
    assert all((root / n / "summary.json").is_file() for n in names)
    assert sorted(pd.read_csv(root / "results.csv")["run"]) == sorted(names)
    assert hidden(root) == []


def test_argparse_helpers_parse_and_run(tmp_path, stub, capsys):
    import argparse
    import subprocess
    import sys

    from fedem_private.experiments import naming, sweep_cli

    parser = argparse.ArgumentParser()
    sweep_cli.add_sweep_arguments(parser)
    args = parser.parse_args([])
    assert (args.config, args.out, args.jobs, args.force, args.no_progress, args.ray) == (
        None, None, None, False, False, None)
    assert parser.parse_args(["s.toml", "--ray"]).ray == "local"
    assert parser.parse_args(["s.toml", "--ray", "auto"]).ray == "auto"
    assert naming.default_out(None) == "runs/quick-sweep"
    assert naming.default_out("conf/big.toml") == "runs/sweep-big"
    spec = write_spec(tmp_path / "one.toml", 'methods = ["fedmf"]\nseeds = [0]')
    args = parser.parse_args([str(spec), "--out", str(tmp_path / "o"), "--no-progress"])
    assert sweep_cli.run_sweep_from_args(args) == 0
    assert "1 run, 0 already done, 1 to run" in capsys.readouterr().out
    # building the parser must not import the heavy machinery
    code = ("import sys, fedem_private.experiments.sweep_cli; "
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_failing_point_is_reported_and_retried(tmp_path, stub, monkeypatch, capsys):
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    root = tmp_path / "out"
    names = [p.name for p in grid(load_spec(spec))]
    real_execute = runner.execute

    def broken(cfg, out, *args, **kwargs):
        if str(out).endswith(names[1]):
            raise RuntimeError("simulated bug")
        return real_execute(cfg, out, *args, **kwargs)

    monkeypatch.setattr(runner, "execute", broken)
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 1
    out = capsys.readouterr()
    assert f"FAILED {names[1]}: RuntimeError: simulated bug" in out.err
    assert "3 ran, 0 already done, 1 failed" in out.out
    log = (root / "sweep_errors.log").read_text()
    assert "simulated bug" in log and "Traceback" in log
    assert not (root / names[1]).exists() and hidden(root) == []
    monkeypatch.setattr(runner, "execute", real_execute)
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    assert "1 ran, 3 already done, 0 failed" in capsys.readouterr().out
    assert all(complete(root, n) for n in names)
    assert not (root / "sweep_errors.log").exists()


def test_the_documented_example_is_a_valid_sweep():
    import textwrap
    import tomllib

    from fedem_private.experiments import sweep_spec

    doc = sweep_spec.__doc__
    block = textwrap.dedent(doc[doc.index("    [sweep]"):doc.index("Two more axes")])
    points = grid(sweep_spec.parse_spec(tomllib.loads(block), "docstring"))
    assert len(points) == 2 * 3 * (1 + 3) * 3  # datasets x methods x (none + 3 eps) x seeds
    ml = [p for p in points if p.name.startswith("ml-100k/")]
    assert ml and all(p.config.data.data_dir == "../shared/datasets/ml-100k" for p in ml)
    assert all(p.config.train.rounds == 10 for p in points)


def test_missing_data_dir_refuses_to_start_and_writes_nothing(tmp_path, capsys):
    """A dataset that points still to run cannot find is one exit-2 line before anything is
    written, not one failure per point; points already done need no data."""
    from fedem_private.cli import main

    spec = tmp_path / "real.toml"
    spec.write_text('[sweep]\ndatasets = ["ml-100k"]\nmethods = ["fedmf"]\nseeds = [0, 1]\n'
                    f'[sweep.data_dirs]\nml-100k = "{tmp_path / "nowhere"}"\n' + TINY_BASE)
    root = tmp_path / "out"
    with pytest.raises(UserError, match=r"directory not found: .*nowhere: 2 runs of"):
        run_sweep(str(spec), str(root), jobs=1, progress=False)
    assert not root.exists()
    assert main(["sweep", str(spec), "--out", str(root), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing was run" in err and not root.exists()


def test_data_check_looks_only_at_points_still_to_run(tmp_path, stub):
    """A finished sweep whose data has since moved still resumes (there is nothing to run)."""
    data = tmp_path / "ml-100k"
    data.mkdir()
    (data / "u.data").write_text("".join(f"{u}\t{(u + k) % 30 + 1}\t5\t{u * 100 + k}\n"
                                         for u in range(1, 13) for k in range(8)))
    spec = tmp_path / "real.toml"
    spec.write_text('[sweep]\ndatasets = ["ml-100k"]\nmethods = ["fedmf"]\nseeds = [0]\n'
                    f'[sweep.data_dirs]\nml-100k = "{data}"\n' + TINY_BASE)
    root = tmp_path / "out"
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0
    data.rename(tmp_path / "moved")
    assert run_sweep(str(spec), str(root), jobs=1, progress=False) == 0


def blocked_sweep(tmp_path: Path, jobs: int) -> tuple[Any, list[str], Path, dict[str, str]]:
    """A sweep of 6 tiny points in a subprocess (tests/blocking_sweep.py) once seed0 is finished
    and another point waits mid-run, its temporary directory written: (process, the plain
    command, root, env). Waits on files, not on how long a point takes."""
    spec = write_spec(tmp_path / "s.toml", 'methods = ["fedmf"]\nseeds = [0, 1, 2, 3, 4, 5]')
    root, markers = tmp_path / "out", tmp_path / "markers"
    markers.mkdir()
    args = ["sweep", str(spec), "--out", str(root), "--jobs", str(jobs), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BLOCKING_SWEEP_MARKERS": str(markers),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("blocking_sweep.py")),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.monotonic() + 600  # a safety net only: the wait is on the files
    while not (len(finished(root)) == 1 and [m for m in markers.iterdir()
                                             if not m.name.startswith(".")]):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep never reached its second point"
        time.sleep(0.05)
    blocked = [Path(m.read_text()) for m in markers.iterdir() if not m.name.startswith(".")]
    assert all(b.is_dir() and b.name.startswith(".seed") for b in blocked)
    return proc, [sys.executable, "-m", "fedem_private", *args], root, env


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_stops_a_sweep_cleanly_and_it_resumes(tmp_path, jobs):
    """SIGTERM (a scheduler's time limit) mid-point: exit 143, the point in progress leaves no
    temporary directory, finished runs and results.csv stay, and the same command resumes."""
    proc, cmd, root, env = blocked_sweep(tmp_path, jobs)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert "terminated" in err and "interrupted" in out
    assert hidden(root) == []
    assert len(finished(root)) == 1 and (root / "results.csv").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "1 already done, 5 to run" in again.stdout
    assert len(finished(root)) == 6 and hidden(root) == []


def test_sigkilled_sweep_leaves_a_folder_the_resumed_sweep_removes(tmp_path):
    """SIGKILL cannot be caught: the point in progress keeps its temporary directory, which the
    next start recognises by its dead process and removes."""
    proc, cmd, root, env = blocked_sweep(tmp_path, 1)
    proc.kill()
    proc.communicate(timeout=300)
    left = [p for p in hidden(root) if ".tmp-" in p.name]
    assert len(left) == 1 and left[0].name.startswith(f".seed1.tmp-{proc.pid}@")
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "removed 1 temporary folder left by a sweep that was killed" in again.stdout
    assert len(finished(root)) == 6 and hidden(root) == []


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


def test_only_folders_of_dead_writers_on_this_machine_are_stale(tmp_path):
    host = socket.gethostname()
    dead = dead_pid()
    names = {f".seed1.tmp-{dead}@{host}-0a1b2c3d": True,  # killed on this machine
             ".seed1.tmp-k2j4x9_a": True,  # an older version's name: no pid to ask
             f".seed2.old-{dead}": True,  # a replaced run, its replacer killed
             f".seed3.tmp-{os.getpid()}@{host}-0a1b2c3d": False,  # alive: a run in progress
             f".seed4.tmp-{dead}@another-host-0a1b2c3d": False,  # a Ray node's, not ours
             ".hidden-notes": False, "seed5": False}
    for name in names:
        (tmp_path / "a" / name).mkdir(parents=True)
        (tmp_path / "a" / name / "summary.json").write_text("{}")
    assert {p.name: is_stale(p) for p in (tmp_path / "a").iterdir()} == names
    assert remove_stale(tmp_path, "seed1") == []  # only direct children
    removed = remove_stale(tmp_path)
    assert sorted(p.name for p in removed) == sorted(n for n, stale in names.items() if stale)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        n for n, stale in names.items() if not stale)


def test_an_interrupt_as_the_temporary_folder_is_made_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM landing just after the temporary run directory was made (the moment a
    test watching for it would signal) must not leave it behind."""
    (point,) = grid(load_spec(write_spec(tmp_path / "one.toml", 'methods = ["fedmf"]\n'
                                         'seeds = [0]')))
    real_mkdir = os.mkdir

    def mkdir_then_interrupt(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if ".tmp-" in str(path):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", mkdir_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        runner.execute(point.config, tmp_path / "out" / "run")
    assert list((tmp_path / "out").iterdir()) == []


def test_an_interrupt_while_replacing_a_run_keeps_the_old_one(tmp_path, monkeypatch):
    (point,) = grid(load_spec(write_spec(tmp_path / "one.toml", 'methods = ["fedmf"]\n'
                                         'seeds = [0]')))
    out = tmp_path / "out" / "run"
    runner.execute(point.config, out)
    before = (out / "summary.json").read_text()
    real_replace = os.replace

    def interrupt_moving_the_new_one(src, dst, *args, **kwargs):
        if ".tmp-" in str(src):  # the old run has just been moved aside
            raise KeyboardInterrupt
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", interrupt_moving_the_new_one)
    with pytest.raises(KeyboardInterrupt):
        runner.execute(point.config, out, force=True)
    assert (out / "summary.json").read_text() == before
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["run"]


def test_a_run_directorys_clean_up_finishes_through_a_second_interrupt(tmp_path, monkeypatch):
    """An interrupt landing inside the clean-up of an interrupted run (a SIGTERM right after
    Ctrl-C) still leaves no temporary directory, and the interrupt is not lost."""
    import shutil

    from fedem_private.experiments import rundir

    real, calls = shutil.rmtree, []

    def interrupted_once(path, ignore_errors=False):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(rundir.shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        with rundir.RunDir(tmp_path / "run") as writer:
            writer.write_text("config.toml", "x")
            raise KeyboardInterrupt
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_a_point_killed_part_way_resumes_from_its_checkpoint(tmp_path, kill_after):
    """[sweep] checkpoint_every: a point saves its state beside its run directory; the
    sweep started again resumes it (summary.checkpoint) and removes the file; the same
    point run unbroken reads the same."""
    from conftest import Killed

    base = TINY_BASE.replace("rounds = 2", "rounds = 4")
    sweep = 'methods = ["fedmf"]\nprivacy = ["ldp-laplace"]\nepsilons = [8]\nseeds = [0]\n'
    spec = write_spec(tmp_path / "ck.toml", sweep + "checkpoint_every = 2\n", base)
    plain = write_spec(tmp_path / "plain.toml", sweep, base)
    (name,) = [p.name for p in grid(load_spec(spec))]
    kill_after(3)
    root = tmp_path / "out"
    with pytest.raises(Killed):
        run_sweep(str(spec), str(root), jobs=1, force=False, progress=False)
    ck = root / (name + ".checkpoint")
    assert ck.is_file() and not (root / name).exists()
    kill_after(None)
    assert run_sweep(str(spec), str(root), jobs=1, force=False, progress=False) == 0
    assert not ck.exists()
    resumed = pd.read_json(root / name / "summary.json", typ="series")
    assert resumed["checkpoint"]["resumed_at"] == [2]
    assert run_sweep(str(plain), str(tmp_path / "plain"), jobs=1, force=False,
                     progress=False) == 0
    unbroken = pd.read_json(tmp_path / "plain" / name / "summary.json", typ="series")
    assert resumed["metrics"] == unbroken["metrics"]
    assert "checkpoint" not in unbroken
    with pytest.raises(UserError, match="checkpoint_every must be a positive"):
        load_spec(write_spec(tmp_path / "bad.toml", sweep + "checkpoint_every = 0\n", base))
