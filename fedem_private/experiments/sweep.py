"""Run a sweep: one run directory per grid point, resumable, optionally in parallel.

A grid point is finished when its run directory holds ``summary.json`` (the
runner commits the whole directory atomically, so it is all there or not at
all), its ``sweep_point.json`` carries the digest of the same resolved config,
and, when attacks were asked for, ``attacks.json`` covers them. A restarted
sweep skips finished points and re-runs only the attack step where training is
done but attacks are not. When the sweep file changed so that a finished run
directory now belongs to a different config (other rounds, clip, ...), the
sweep stops before running anything, with one line naming what changed;
``--force`` replaces such runs. Ctrl-C stops the runs in flight; their
temporary directories are removed and every finished run stays as it is.
Temporary directories left by a sweep that was killed outright (SIGKILL) are
removed when the sweep is started again.

Points run one after the other, in a pool of worker processes (``jobs``), or
as Ray tasks (``ray``: a local Ray instance or a cluster, see
:mod:`~fedem_private.experiments.ray_tasks`). Every way calls
:func:`execute_point` per point, so run directories, resuming and
``results.csv`` are the same whichever ran them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedem_private.data import dataset_problem
from fedem_private.errors import UserError
from fedem_private.experiments import attack_step, ray_tasks, runner
from fedem_private.experiments.attack_step import ATTACKS_FILE, AttackStep, read_records
from fedem_private.experiments.checkpoint import Checkpointing, beside
from fedem_private.experiments.naming import default_out, plural
from fedem_private.experiments.rundir import json_safe, remove_stale, write_text_atomic
from fedem_private.experiments.sweep_spec import QUICK_SPEC, GridPoint, grid, load_spec
from fedem_private.privacy.registry import capability, no_privacy
from fedem_private.simulation.config import RecordConfig, flatten

POINT_FILE = "sweep_point.json"
SPEC_FILE = "sweep.toml"
ERRORS_FILE = "sweep_errors.log"
@dataclass(frozen=True)
class Outcome:
    """What happened to one grid point."""

    name: str
    status: str  # done (skipped), ran, attacked (attack step only), failed, cancelled
    seconds: float = 0.0
    error: str | None = None
    detail: str | None = None  # traceback of an unexpected failure
    result: str | None = None  # e.g. "HR@10 0.1234, eps 8" of a finished point


# ------------------------------------------------------------------------ one point
def _attacks_cover(path: Path, wanted: Sequence[str]) -> bool:
    """True when ``attacks.json`` exists and (as far as it names attacks) covers ``wanted``."""
    records = read_records(path)
    if records is None:
        return False
    names = {str(r["attack"]) for r in records if "attack" in r}
    return not names or set(wanted) <= names


def point_state(out: Path, digest: str, attacks: Sequence[str]) -> str:
    """``done``, ``attack`` (trained, attacks missing), ``stale`` (replace) or ``todo``."""
    if not out.exists():
        return "todo"
    if not (out / "summary.json").is_file():
        return "stale" if out.is_dir() and any(out.iterdir()) else "todo"
    try:
        stored = json.loads((out / POINT_FILE).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        stored = None
    if stored != digest:
        return "stale"
    if attacks and not _attacks_cover(out / ATTACKS_FILE, attacks):
        return "attack"
    return "done"


def _recording_text(info: dict[str, Any] | None) -> str:
    if not info or not info.get("recording"):
        return "none"
    rounds = ",".join(str(r) for r in info.get("record_rounds") or [])
    return f"rounds {rounds} of {info.get('record_clients')} clients"


def describe_change(out: Path, point: GridPoint, recording: bool) -> list[str]:
    """What differs between the finished run in ``out`` and ``point`` (``key old -> new``)."""
    from fedem_private.simulation.config import identity_dict, load_toml

    try:
        info = json.loads((out / POINT_FILE).read_text())
    except (OSError, ValueError):
        info = None
    try:
        old = flatten(identity_dict(load_toml(out / "config.toml")))
    except (OSError, UserError):
        return ["its config.toml is missing or unreadable"]
    new = flatten(identity_dict(point.config))
    changes = [f"{key} {old.get(key)} -> {new.get(key)}" for key in sorted({*old, *new})
               if old.get(key) != new.get(key)]
    if info is None:
        changes.append("it was not written by a sweep (no sweep_point.json)")
    else:
        now = {"recording": recording, "record_rounds": list(point.record_rounds),
               "record_clients": point.record_clients}
        before, after = _recording_text(info), _recording_text(now)
        if before != after:
            changes.append(f"recording {before} -> {after}")
    return changes or ["its identity digest differs (written by another version?)"]


def changed_points(points: Sequence[GridPoint], root: Path, recording: bool
                   ) -> dict[str, list[str]]:
    """Finished run directories of ``points`` whose config is not the point's: name -> changes."""
    out: dict[str, list[str]] = {}
    for p in points:
        rec = recording and bool(p.attacks)
        state = point_state(root / p.name, p.digest(rec), p.attacks if rec else ())
        if state == "stale" and (root / p.name / "summary.json").is_file():
            out[p.name] = describe_change(root / p.name, p, rec)
    return out


def run_point(point: GridPoint, root: Path, step: AttackStep | None,
              force: bool = False) -> Outcome:
    """Bring one grid point to completion; failures are returned, Ctrl-C propagates."""
    out = root / point.name
    recording = step is not None and bool(point.attacks)
    digest = point.digest(recording)
    state = "stale" if force and out.exists() else point_state(
        out, digest, point.attacks if recording else ())
    if state == "done":
        return Outcome(point.name, "done")
    if state == "stale" and not force and (out / "summary.json").is_file():
        return Outcome(point.name, "failed", error="a finished run with a different config is "
                       "in the way; --force replaces it")
    t0 = time.perf_counter()

    def mark(path: Path) -> None:
        """The point's sweep_point.json: what a later pass compares (its digest)."""
        info = {"name": point.name, "variant": point.variant, "digest": digest,
                "recording": recording, "attacks": list(point.attacks)}
        if recording:
            info.update(record_rounds=list(point.record_rounds),
                        record_clients=point.record_clients)
        (path / POINT_FILE).write_text(json.dumps(json_safe(info), indent=2) + "\n")

    def setup(sim: Any, path: Path) -> None:
        mark(path)
        if recording:
            assert step is not None
            step.record(sim, path, point.record_rounds, point.record_clients)

    config = point.config
    if recording:  # the written config.toml says what was recorded, so it re-creates the run
        config = replace(config, record=RecordConfig(
            ",".join(str(r) for r in point.record_rounds), point.record_clients))
    # a recording point is not checkpointed: its recording would miss the rounds before
    checkpoint = (Checkpointing(beside(out), point.checkpoint_every)
                  if point.checkpoint_every and not recording else None)
    try:
        if state != "attack":
            # --force also removes a checkpoint of another config in the point's way
            runner.execute(config, out, force=force or state == "stale", setup=setup,
                           checkpoint=checkpoint)
            if not (out / POINT_FILE).is_file():  # a baseline runs no setup hook: the
                mark(out)  # reference points were written unmarked and never resumed
        if recording:
            assert step is not None
            step.attack(out, point.attacks)
    except UserError as exc:
        return Outcome(point.name, "failed", time.perf_counter() - t0, str(exc))
    except Exception as exc:  # a bug in one run must not stop the sweep
        return Outcome(point.name, "failed", time.perf_counter() - t0,
                       f"{type(exc).__name__}: {exc}", traceback.format_exc())
    status = "attacked" if state == "attack" else "ran"
    return Outcome(point.name, status, time.perf_counter() - t0, result=point_result(out))


def point_result(out: Path) -> str | None:
    """``HR@10 0.1234, eps 8`` (and a clipping warning) of a finished run, for the log."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    full = (summary.get("metrics") or {}).get("full") or {}
    privacy = summary.get("privacy") or {}
    eps = (privacy.get("epsilon") or {}).get("reported")
    if no_privacy(privacy.get("mode", "none")):
        eps_text = "no DP"
    elif capability(privacy.get("mode"), "paper_heuristic"):  # noise without an accountant
        heuristic = (privacy.get("paper_heuristic") or {}).get("epsilon_summed_worst_client")
        eps_text = (f"paper's Laplace {privacy.get('noise_scale', float('nan')):g}, heuristic "
                    f"eps {float('nan') if heuristic is None else float(heuristic):.3g} "
                    f"(no DP guarantee)")
    elif eps is None or float(eps) == float("inf"):
        eps_text = "eps ∞ (no noise)"
    else:
        eps_text = f"eps {float(eps):.3g}"
    text = (f"HR@10 {full['hr@10']:.4f}, " if "hr@10" in full else "") + eps_text
    clip = summary.get("clipping") or {}
    if clip.get("warning"):
        text += (f"; {clip['frac_clipped_mean']:.0%} of {clip.get('clipped', 'uploads')} "
                 f"clipped (see summary.json)")
    cold = summary.get("cold_items") or {}
    if cold.get("warning"):
        text += f"; {cold['test_share']:.0%} of test items cold (see summary.json)"
    short = summary.get("sampled_candidates") or {}
    if short.get("warning"):
        text += (f"; {short['users_short']} users with fewer than {short['asked']} sampled "
                 f"candidates: sampled metrics not comparable (see summary.json)")
    return text


def load_step(attacks: Sequence[str]) -> tuple[AttackStep | None, str | None]:
    """The attack step when attacks are wanted, else None; plus why it is missing."""
    if not attacks:
        return None, None
    step = attack_step.load()
    return (None, step) if isinstance(step, str) else (step, None)


# -------------------------------------------------------------------- worker processes
_STOP: Any = None  # a multiprocessing Event shared with the parent
_BUSY = False


def _on_sigint(signum: int, frame: Any) -> None:
    """In a worker: remember to stop; interrupt the run in progress, once."""
    global _BUSY
    if _STOP is not None:
        _STOP.set()
    if _BUSY:
        _BUSY = False
        raise KeyboardInterrupt


def _init_worker(threads: int, stop: Any, interruptible: bool) -> None:
    """Worker setup: thread count, the shared stop flag, Ctrl-C as the parent takes it, and
    SIGTERM as Ctrl-C."""
    global _STOP
    _STOP = stop
    signal.signal(signal.SIGINT, _on_sigint if interruptible else signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigint)  # a deliberate stop, even in the background
    import torch

    torch.set_num_threads(threads)


def execute_point(point: GridPoint, root: Path, force: bool = False) -> Outcome:
    """Load the attack step ``point`` needs and bring the point to completion.

    The body of one unit of parallel work, in a pool process or a Ray task:
    failures come back as a ``failed`` :class:`Outcome`, and a KeyboardInterrupt
    (Ctrl-C, a cancelled Ray task) as ``cancelled`` once the point's temporary
    directory is gone.
    """
    from fedem_private.plugins import load_all

    try:
        load_all()  # other packages' parts: a spawned worker or a Ray task starts without them
        step, _ = load_step(point.attacks)
        return run_point(point, root, step, force)
    except KeyboardInterrupt:
        return Outcome(point.name, "cancelled")


def _work(point: GridPoint, root: Path, force: bool) -> Outcome:
    """Pool worker entry: run one point unless the sweep is stopping."""
    global _BUSY
    _BUSY = True  # before the check: a stop signalled in between interrupts, not lost
    try:
        if _STOP is not None and _STOP.is_set():
            return Outcome(point.name, "cancelled")
        return execute_point(point, root, force)
    except KeyboardInterrupt:  # arrived before execute_point could take it
        return Outcome(point.name, "cancelled")
    finally:
        _BUSY = False


# ------------------------------------------------------------------------- the sweep
def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _Progress:
    """A tqdm bar over grid points (or nothing)."""

    def __init__(self, enabled: bool, total: int, initial: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="sweep", unit="run",
                            file=sys.stderr, dynamic_ncols=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def done(self, outcome: Outcome) -> None:
        if self.bar is not None:
            self.bar.update(1)
        if outcome.status == "failed":
            self.write(f"FAILED {outcome.name}: {outcome.error}")
        elif outcome.status in ("ran", "attacked"):
            self.write(f"done {outcome.name}: {outcome.result or 'finished'} "
                       f"({outcome.seconds:.0f} s)")

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_serial(points: list[GridPoint], root: Path, force: bool, bar: _Progress,
                outcomes: list[Outcome]) -> None:
    step, _ = load_step(points[0].attacks if points else ())
    for point in points:
        bar.note(point.name)
        outcome = run_point(point, root, step, force)
        outcomes.append(outcome)
        bar.done(outcome)


def _run_parallel(points: list[GridPoint], root: Path, force: bool, jobs: int,
                  bar: _Progress, outcomes: list[Outcome]) -> None:
    try:  # workers forked from a clean server that imported the package once
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
    except ValueError:  # pragma: no cover - no forkserver on this platform
        ctx = mp.get_context("spawn")
    stop = ctx.Event()
    threads = max(1, _cores() // jobs)
    interruptible = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # e.g. nohup
    pool = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker,
                               initargs=(threads, stop, interruptible))
    try:
        futures = {pool.submit(_work, p, root, force): p.name for p in points}
        pending: set[Future[Outcome]] = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                try:
                    outcome = fut.result()
                except BrokenProcessPool:
                    outcome = Outcome(futures[fut], "failed", error="its worker process died "
                                      "(killed, e.g. out of memory?)")
                outcomes.append(outcome)
                if outcome.status != "cancelled":
                    bar.done(outcome)
    except BaseException:
        stop.set()
        for child in mp.active_children():  # reach workers the signal did not
            if child.pid is not None:
                try:  # SIGTERM: workers take it as Ctrl-C even where they ignore SIGINT
                    os.kill(child.pid, signal.SIGTERM)
                except OSError:
                    pass
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if any(o.status == "cancelled" for o in outcomes):  # workers were interrupted, not us
        raise KeyboardInterrupt


def _ray_work(point: GridPoint, root: Path, force: bool, cwd: str) -> Outcome:
    """Ray task entry: :func:`execute_point` in the driver's working directory.

    Relative paths in the sweep file (data directories) then mean what they
    mean for the pool, on every node where that directory exists.
    """
    if os.path.isdir(cwd):
        os.chdir(cwd)
    return execute_point(point, root, force)


def _code_dirs() -> list[str]:
    """The directories of this package and of ``attacks`` (when present), for Ray to ship."""
    dirs = [str(Path(__file__).resolve().parents[1])]
    spec = importlib.util.find_spec("attacks")
    if spec is not None and spec.submodule_search_locations:
        dirs.append(str(Path(next(iter(spec.submodule_search_locations))).resolve()))
    return dirs


def _run_ray(points: list[GridPoint], root: Path, force: bool, limit: int, bar: _Progress,
             outcomes: list[Outcome]) -> None:
    """Run ``points`` as Ray tasks (a :func:`~ray_tasks.ray_session` must be open)."""
    base = root.absolute()  # workers on other nodes do not share the driver's directory
    calls = [(p, base, force, os.getcwd()) for p in points]

    def on_result(i: int, outcome: Outcome | None, error: BaseException | None) -> None:
        if error is not None and ray_tasks.is_cancelled(error):  # e.g. by `ray job stop`
            outcome = Outcome(points[i].name, "cancelled")
        elif outcome is None:
            outcome = Outcome(points[i].name, "failed", error="its Ray task died (worker "
                              f"killed, e.g. out of memory, or node lost?): "
                              f"{type(error).__name__}", detail=str(error))
        outcomes.append(outcome)
        if outcome.status != "cancelled":
            bar.done(outcome)

    ray_tasks.run_tasks(_ray_work, calls, limit, on_result)
    if any(o.status == "cancelled" for o in outcomes):  # tasks were interrupted, not us
        raise KeyboardInterrupt


def _write_errors(root: Path, outcomes: list[Outcome], complete: bool) -> Path | None:
    """Describe this invocation's failures; a sweep that completed cleanly removes the file."""
    failed = [o for o in outcomes if o.status == "failed"]
    if not failed:
        if complete:
            (root / ERRORS_FILE).unlink(missing_ok=True)
        return None
    path = root / ERRORS_FILE
    text = "\n".join(f"{o.name}: {o.error}\n{o.detail or ''}" for o in failed)
    write_text_atomic(path, text)
    return path


def _check_data(todo: list[GridPoint], source: str) -> None:
    """Refuse to start when a dataset that points still to run need cannot be found, rather
    than fail each of those points (one line: the first problem and how many points)."""
    problems: dict[str, int] = {}
    for p in todo:
        problem = dataset_problem(p.config.data.dataset, p.config.data.data_dir)
        if problem is not None:
            problems[problem] = problems.get(problem, 0) + 1
    if problems:
        first, count = next(iter(problems.items()))
        more = f" (and {plural(len(problems) - 1, 'more problem')})" if len(problems) > 1 else ""
        raise UserError(f"{first}{more}: {plural(sum(problems.values()), 'run')} of {source} "
                        "need it; nothing was run (check [sweep.data_dirs]: relative paths "
                        "are read from the folder the sweep runs in)")


def _remove_old_report(root: Path) -> None:
    """``--force`` replaces runs: the report over the old ones (report.md, its plots) goes."""
    from fedem_private.experiments.report import report_files

    old = report_files(root, tables=False)
    for path in old:
        path.unlink(missing_ok=True)
    if old:
        print(f"sweep: --force: removed the old report ({', '.join(p.name for p in old[:3])}"
              f"{', ...' if len(old) > 3 else ''}); run `report` again once the sweep is done")


def run_sweep(spec_path: str | None, out_dir: str | None, jobs: int | None = None,
              force: bool = False, progress: bool = True, ray: str | None = None) -> int:
    """Run (or resume) a sweep; returns the exit code (0 when every point finished).

    ``spec_path`` None runs the built-in quick sweep; ``out_dir`` None writes
    under :func:`default_out`. Without ``ray``, ``jobs`` points run at once in
    worker processes (None: 1; 0: one per core; negative: refused). With ``ray``, points run
    as Ray tasks: ``"local"`` starts a local Ray instance with ``jobs`` CPUs
    (None or 0: every core); any other value is the address of a running
    cluster (``auto``, ``HOST:6379``, ``ray://HOST:10001``), whose workers must
    see ``out_dir`` at the same path; there ``jobs`` > 0 caps the points in
    flight. Writes ``results.csv`` over every run under ``out_dir`` when it
    stops, interrupted or not.
    """
    from fedem_private.experiments.results import write_results

    if jobs is not None and jobs < 0:
        raise UserError(f"jobs must be 0 (one per CPU core) or more, got {jobs}")
    if ray is not None:
        ray_tasks.import_ray()  # missing Ray fails before anything is written
    spec = load_spec(spec_path)
    root = Path(out_dir or default_out(spec_path)).expanduser()
    points = grid(spec)
    step, why_not = load_step(spec.attacks)
    recording = step is not None
    if force:
        todo = points
    else:
        changed = changed_points(points, root, recording)
        if changed:
            kinds = sorted({c for cs in changed.values() for c in cs})
            shown = "; ".join(kinds[:4]) + (f"; and {len(kinds) - 4} more" if len(kinds) > 4
                                             else "")
            raise UserError(f"{plural(len(changed), 'finished run')} in {root} "
                            f"{'was' if len(changed) == 1 else 'were'} made with a different "
                            f"config ({shown}); nothing was run: pass --force to replace "
                            f"{'it' if len(changed) == 1 else 'them'}, or give another --out")
        todo = [p for p in points if point_state(
            root / p.name, p.digest(recording and bool(p.attacks)),
            p.attacks if recording else ()) != "done"]
    if ray is None or ray == ray_tasks.LOCAL:  # a cluster's workers may hold data we lack
        _check_data(todo, spec.source)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create sweep directory {root}: {exc.strerror}") from None
    text = QUICK_SPEC if spec_path is None else Path(spec_path).read_text(encoding="utf-8")
    write_text_atomic(root / SPEC_FILE, text)
    if force:
        _remove_old_report(root)
    stale = remove_stale(root)  # left by a sweep killed outright (SIGKILL, out of memory)
    if stale:
        print(f"sweep: removed {plural(len(stale), 'temporary folder')} left by a sweep that "
              f"was killed")
    session = contextlib.ExitStack()  # a Ray session, closed when the sweep stops
    if ray is None:
        jobs = min(1 if jobs is None else _cores() if jobs <= 0 else jobs, max(len(todo), 1))
        how = plural(jobs, "job")
    else:
        limit = jobs if jobs is not None and jobs > 0 else 0
        local = ray == ray_tasks.LOCAL
        how = "Ray"
        if todo:  # a finished sweep needs no Ray
            how = session.enter_context(ray_tasks.ray_session(
                ray, num_cpus=(limit or None) if local else None, ship=_code_dirs()))
            if limit and not local:
                how += f", at most {plural(limit, 'run')} at once"
    print(f"sweep: {spec.source}: {plural(len(points), 'run')}, {len(points) - len(todo)} "
          f"already done, {len(todo)} to run in {root} ({how})")
    if spec.attacks and why_not:
        print(f"sweep: attacks skipped ({why_not}); runs are trained without recording")
    bar = _Progress(progress, len(points), len(points) - len(todo))
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    interrupted = completed = False
    try:
        if ray is not None:
            _run_ray(todo, root, force, limit, bar, outcomes)
        elif jobs > 1:
            _run_parallel(todo, root, force, jobs, bar, outcomes)
        else:
            _run_serial(todo, root, force, bar, outcomes)
        completed = True
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        session.close()
        bar.close()
        errors = _write_errors(root, outcomes, complete=completed)
        finished = sum(o.status in ("ran", "attacked") for o in outcomes)
        failed = sum(o.status == "failed" for o in outcomes)
        results = write_results(root) if any(root.rglob("summary.json")) else None
        line = (f"sweep: {finished} ran, {len(points) - len(todo)} already done, {failed} "
                f"failed in {time.perf_counter() - t0:.0f} s")
        if interrupted:
            line += f"; interrupted: {len(todo) - finished - failed} not run (run the same "\
                    "command again to resume)"
        print(line)
        if failed and failed == len(todo):
            print(f"sweep: every run to do failed ({failed} of {len(todo)}): nothing new was "
                  f"written")
        if errors is not None:
            print(f"sweep: failures are described in {errors}")
        if results is not None:
            print(f"results: {results}\nreport: fedem-private report {root}")
    return 1 if failed else 0
