"""Sweeps as Ray tasks (``sweep --ray``): the pool's run directories and results, resumable.

The tests that start their own Ray come first; the rest share one local
instance (2 CPUs, no dashboard), started once for this module and shut down
after it.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import time
from pathlib import Path

import pytest
from sweep_helpers import TINY_2X2, write_spec

from fedem_private import cli
from fedem_private.errors import UserError
from fedem_private.experiments import ray_tasks, sweep_cli
from fedem_private.experiments.sweep import POINT_FILE, _Progress, run_sweep
from fedem_private.experiments.sweep_spec import grid, load_spec

needs_ray = pytest.mark.skipif(not ray_tasks.ray_installed(),
                               reason="Ray is not installed (pip install 'fedem-private[ray]')")


@pytest.fixture(scope="module")
def shared_ray():
    """One local Ray for the module; sweeps use it instead of starting their own."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny grid (real projection attack) swept without Ray: (sweep file, its root)."""
    tmp = tmp_path_factory.mktemp("reference")
    spec = write_spec(tmp / "tiny.toml", TINY_2X2)
    assert run_sweep(str(spec), str(tmp / "out"), jobs=1, progress=False) == 0
    return spec, tmp / "out"


def deterministic_csv(path: Path) -> list[list[str]]:
    """results.csv as text cells, timing columns (``*seconds*``) blanked: the rest is seeded."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    timed = [i for i, name in enumerate(rows[0]) if "seconds" in name]
    return [[("" if i in timed and r else c) for i, c in enumerate(row)]
            for r, row in enumerate(rows)]


def assert_same_rows(path: Path, ref: Path) -> None:
    """deterministic_csv(path) == deterministic_csv(ref), naming each differing cell."""
    got, want = deterministic_csv(path), deterministic_csv(ref)
    header = want[0]
    cells = [f"{w[0]}: {h} {g_!r} != {w_!r}"
             for g, w in zip(got[1:], want[1:], strict=False)
             for h, g_, w_ in zip(header, g, w, strict=False) if g_ != w_]
    assert got[0] == header and len(got) == len(want) and not cells, cells[:20]


def mtimes(root: Path, names: list[str]) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for n in names for p in (root / n).rglob("*")}


def hidden(root: Path) -> list[Path]:
    return list(root.rglob(".*"))


def complete(root: Path, name: str) -> bool:
    return all((root / name / f).is_file() for f in ("summary.json", "config.toml",
                                                    "metrics.csv", POINT_FILE, "attacks.json"))


# ------------------------------------------------------------------ no Ray, bad addresses
def test_ray_missing_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    import sys

    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    monkeypatch.setattr(sweep_cli, "ray_installed", lambda: False)
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'fedem-private[ray]'" in err
    assert not (tmp_path / "o").exists()
    monkeypatch.setitem(sys.modules, "ray", None)  # the import itself fails (the API path)
    with pytest.raises(UserError, match=r"fedem-private\[ray\]"):
        run_sweep(str(spec), str(tmp_path / "o"), ray="local", progress=False)
    assert not (tmp_path / "o").exists()


def test_sweep_file_after_ray_is_not_taken_for_an_address(tmp_path, capsys):
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    assert cli.main(["sweep", "--ray", str(spec)]) == 2
    assert "put CONFIG before --ray" in capsys.readouterr().err


@needs_ray
@pytest.mark.parametrize("address,needle", [
    ("127.0.0.1:1", "cannot reach Ray at 127.0.0.1:1"),
    ("ray://127.0.0.1:1", "cannot reach Ray at ray://127.0.0.1:1"),
    ("nonsense", "cannot connect to Ray at nonsense"),
])
def test_bad_ray_address_is_a_one_line_error(tmp_path, capsys, address, needle):
    import ray

    assert not ray.is_initialized(), "run before the tests that share a Ray instance"
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    t0 = time.perf_counter()
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress",
                     "--ray", address]) == 2
    assert time.perf_counter() - t0 < 15
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1] and err[-1].startswith("fedem-private: error:")
    assert not ray.is_initialized()
    assert not any((tmp_path / "o").rglob("summary.json"))


# ------------------------------------------------------------ a local Ray of its own
@needs_ray
def test_cli_ray_sweep_starts_and_stops_a_local_ray(tmp_path, capsys):
    import ray

    assert not ray.is_initialized(), "run before the tests that share a Ray instance"
    spec = write_spec(tmp_path / "one.toml", 'methods = ["fedmf"]\nseeds = [0]')
    root = tmp_path / "out"
    assert cli.main(["sweep", str(spec), "--out", str(root), "--jobs", "1", "--no-progress",
                     "--ray"]) == 0
    out = capsys.readouterr()
    assert "1 to run in" in out.out and "(local Ray, 1 CPU)" in out.out
    assert "1 ran, 0 already done, 0 failed" in out.out
    (name,) = [p.name for p in grid(load_spec(spec))]
    assert f"done {name}: HR@10 " in out.err  # the pool's line
    assert not ray.is_initialized()  # the sweep shut down the Ray it started
    assert (root / name / "summary.json").is_file() and hidden(root) == []
    assert (root / "results.csv").is_file()


# ------------------------------------------------------------- a shared local Ray
@needs_ray
def test_interrupted_ray_sweep_resumes_only_the_missing_points(tmp_path, reference, shared_ray,
                                                               monkeypatch, capsys):
    spec, ref = reference
    root = tmp_path / "out"
    names = [p.name for p in grid(load_spec(spec))]
    real_done = _Progress.done
    seen: list[str] = []

    def ctrl_c_after_the_first(self, outcome):  # Ctrl-C in the driver, a task still running
        real_done(self, outcome)
        seen.append(outcome.name)
        other = root / names[1 - names.index(outcome.name)]
        deadline = time.monotonic() + 20
        while not (other.exists() or list(other.parent.glob(f".{other.name}.tmp-*"))):
            assert time.monotonic() < deadline, "the other point never started"
            time.sleep(0.005)
        raise KeyboardInterrupt

    monkeypatch.setattr(_Progress, "done", ctrl_c_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(str(spec), str(root), jobs=2, progress=False, ray="local")
    out = capsys.readouterr().out
    assert "(Ray already running here, 2 CPUs)" in out and "interrupted" in out
    trained = [n for n in names if (root / n).exists()]
    assert seen[0] in trained and names[2] not in trained and names[3] not in trained
    # whole run directories or none; the other point may have been stopped in its attack step
    assert all((root / n / "summary.json").is_file() for n in trained)
    finished = [n for n in trained if complete(root, n)]
    assert seen[0] in finished
    assert hidden(root) == []  # a cancelled task removes its temporary directory
    assert deterministic_csv(root / "results.csv")[0] == deterministic_csv(
        ref / "results.csv")[0]
    before = mtimes(root, finished)
    summaries = {n: (root / n / "summary.json").stat().st_mtime_ns for n in trained}

    monkeypatch.setattr(_Progress, "done", real_done)
    assert run_sweep(str(spec), str(root), jobs=2, progress=False, ray="local") == 0
    out = capsys.readouterr().out
    assert (f"{4 - len(finished)} ran, {len(finished)} already done, 0 failed" in out)
    assert mtimes(root, finished) == before  # nothing finished was redone or touched
    assert summaries == {n: (root / n / "summary.json").stat().st_mtime_ns for n in trained}
    assert all(complete(root, n) for n in names) and hidden(root) == []
    # the same results.csv and run directories as the pool's, timings aside
    assert_same_rows(root / "results.csv", ref / "results.csv")
    for name in names:
        assert sorted(p.relative_to(root).as_posix() for p in (root / name).rglob("*")) == \
            sorted(p.relative_to(ref).as_posix() for p in (ref / name).rglob("*"))
        for f in ("config.toml", POINT_FILE):
            assert (root / name / f).read_text() == (ref / name / f).read_text()

    # a finished sweep needs no Ray at all
    assert run_sweep(str(spec), str(root), progress=False, ray="local") == 0
    assert "0 to run" in capsys.readouterr().out


@needs_ray
def test_a_failing_point_is_reported_as_by_the_pool(tmp_path, shared_ray, capsys):
    spec = write_spec(tmp_path / "tiny.toml", TINY_2X2)
    root = tmp_path / "out"
    names = [p.name for p in grid(load_spec(spec))]
    blocker = root / names[1]
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the run directory goes\n")
    assert run_sweep(str(spec), str(root), jobs=2, progress=False, ray="local") == 1
    out = capsys.readouterr()
    assert f"FAILED {names[1]}: output path exists and is not a directory" in out.err
    assert "3 ran, 0 already done, 1 failed" in out.out
    assert "failures are described in" in out.out
    assert "not a directory" in (root / "sweep_errors.log").read_text()
    blocker.unlink()
    assert run_sweep(str(spec), str(root), jobs=2, progress=False, ray="local") == 0
    assert "1 ran, 3 already done, 0 failed" in capsys.readouterr().out
    assert all(complete(root, n) for n in names) and hidden(root) == []
    assert not (root / "sweep_errors.log").exists()


# ------------------------------------------------------------------- run_tasks itself
@needs_ray
def test_run_tasks_bounds_in_flight_and_reports_dead_workers(shared_ray):
    def work(i: int, path: str) -> int:
        if i == 2:
            os._exit(1)  # a worker killed under the task
        with open(path, "a") as fh:
            fh.write(f"{i}\n")
        return i * i

    got: dict[int, object] = {}

    def on_result(i, value, error):
        got[i] = value if error is None else type(error).__name__

    ray_tasks.run_tasks(work, [(i, os.devnull) for i in range(5)], 2, on_result)
    assert got == {0: 0, 1: 1, 2: "WorkerCrashedError", 3: 9, 4: 16}


@needs_ray
def test_every_task_gets_a_fresh_worker(shared_ray):
    """A worker never runs a second task: a cancel that interrupts an import leaves that
    process with half-initialised modules (CI: "module 'sympy' has no attribute 'printing'"
    in the next point run by the same worker), so whatever one task leaves in its process
    must not reach the next."""
    import sys

    def work(i: int) -> tuple[int, bool]:
        inherited = "_fedem_test_leftover" in sys.modules
        sys.modules["_fedem_test_leftover"] = sys  # what a half-finished import leaves
        return os.getpid(), inherited

    got: dict[int, tuple[int, bool]] = {}
    ray_tasks.run_tasks(work, [(i,) for i in range(4)], 1,
                        lambda i, value, error: got.__setitem__(i, value))
    assert len({pid for pid, _ in got.values()}) == 4
    assert not any(inherited for _, inherited in got.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@needs_ray
def test_interrupt_cancels_running_tasks_and_lets_them_clean_up(tmp_path, shared_ray):
    """Ctrl-C in the driver: the running task is interrupted (it gets a KeyboardInterrupt and
    cleans up) or, where Ray drops every polite cancel (seen under heavy load), killed with its
    worker; either way it stops running, and tasks not yet submitted never start. The marker,
    made inside the ``try``, holds the task's pid; whichever way task 1 ended, that process
    is gone or the marker is."""
    def slow(i: int, folder: str) -> int:
        marker = Path(folder) / f"running-{i}"
        try:
            marker.write_text(str(os.getpid()))
            for _ in range(60000 if i > 0 else 0):  # 600 s; the interrupt lands between sleeps
                time.sleep(0.01)
            return i
        except KeyboardInterrupt:
            (Path(folder) / f"interrupted-{i}").write_text("")
            raise
        finally:
            marker.unlink(missing_ok=True)

    def stop(i, value, error):  # once task 1 is running
        deadline = time.monotonic() + 300  # a safety net: the wait is on the file
        while not (tmp_path / "running-1").exists():
            assert time.monotonic() < deadline, "task 1 never started"
            time.sleep(0.005)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ray_tasks.run_tasks(slow, [(i, str(tmp_path)) for i in range(4)], 2, stop)

    def settled() -> bool:
        names = {p.name for p in tmp_path.iterdir()}
        if names - {"interrupted-1", "running-1"}:
            return False  # tasks 2 and 3 must never start
        marker = tmp_path / "running-1"
        if not marker.exists():
            return "interrupted-1" in names  # it cleaned up after the interrupt
        text = marker.read_text()
        return bool(text) and not _alive(int(text))  # killed before its cleanup ran

    deadline = time.monotonic() + 300  # a safety net: the wait is on the files and the pid
    while not settled():
        assert time.monotonic() < deadline, sorted(p.name for p in tmp_path.iterdir())
        time.sleep(0.1)


# ------------------------------------------------------------- what a cluster gets
def test_addresses_checked_before_ray_and_the_code_shipped_to_a_cluster():
    from fedem_private.experiments.sweep import _code_dirs

    assert ray_tasks._host_port("ray://head.example:10001") == ("head.example", 10001)
    assert ray_tasks._host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert ray_tasks._host_port("[::1]:6379") == ("::1", 6379)
    assert ray_tasks._host_port("auto") is None and ray_tasks._host_port("local") is None
    ray_tasks.check_reachable("auto")  # left to Ray
    dirs = [Path(d) for d in _code_dirs()]
    assert [d.name for d in dirs] == ["fedem_private", "attacks"]
    assert all((d / "__init__.py").is_file() for d in dirs)
