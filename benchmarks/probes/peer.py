"""The published FedEM code against ours, round for round on the same CPU (issue 43).

    python -m benchmarks.probes.peer --peer-dir DIR [--rounds 2] [--threads 1] [--out FILE]
                              [--data-dir ML100K_DIR]

``DIR`` is a checkout of https://github.com/jundongchen13/FedEM that you provide (this
repository holds none of its code). It runs unchanged: its own ``train.py`` with its own
defaults (``--dataset ml-100k``: d=16, 10 local epochs, batch 256, 4 negatives, Adam at
0.1, ``agg_clients_ratio`` 0.1, ``agg_mode`` both: one cvxpy QP per aggregated client),
on the CPU, through a shim in its subprocess that before importing it

- makes ``torch.Tensor.cuda`` and ``torch.nn.Module.cuda`` return the object itself (the
  code calls ``.cuda()`` unconditionally in its aggregation, so a CPU run needs this);
- restores three things its pinned Python 3.8 / numpy 1.24 / pandas 2.0 had and this
  environment lacks, all in its data preparation, none in a timed round:
  ``random.sample`` of a set (removed in Python 3.11: the set becomes a tuple, as 3.8
  did), ``numpy.in1d`` (removed in numpy 2: ``numpy.isin``), ``DataFrameGroupBy.apply``
  with ``group_keys=False`` handing the function the grouping column (pandas 3 drops it);
- stubs ``coloredlogs`` (log colours) when it is not installed;
- converts our ML-100K ``u.data`` (tab separated) into the
  ``datasets/ml-100k/ratings.dat`` (comma separated) its ``utils.loadData`` reads, in a
  temporary working directory (with the ``logs/`` folder its ``train.py`` writes to);
- wraps ``Engine.federatedTrainOneRound``, the call ``train.py`` itself times as a
  round's "Time consuming", to wait for the parent before each round and report its
  seconds (and, inside it, the seconds of ``updateMatrix`` and ``aggregateByMatrix``,
  the server's aggregation).

Ours runs FedEM on the same data in two configurations, each in its own subprocess via
``prepare(config)`` and ``Simulation.step()`` (no evaluation in the rounds): ``--protocol
paper-code`` (the authors' semantics: adapter step every batch, 10% aggregation, PCA
similarity, early stop, users with >= 10 ratings) and the default (``--method fedem
--protocol strict``); d, epochs, batch, negatives and the learning rate are the peer's.

The three subprocesses live across rounds and take turns, one round at a time, while
the other two wait on a pipe: round 1 of each is a warm-up, then rounds 2 .. 1+R run
peer, paper-code, default, peer, ... Between its rounds the peer's ``train.py`` also
evaluates and draws the next round's negatives (untimed); the next code starts only
once the peer is back waiting. Every subprocess has ``OMP_NUM_THREADS`` and
``torch.set_num_threads`` set to ``--threads``.

Prints per-round seconds and the ratios peer / ours, and writes a JSON (default
``benchmarks/results/speed/peer/peer_<date>.json``) with the machine's facts. Without a usable
``--peer-dir`` it prints one line saying what it needs and exits 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

PEER_REPO = "jundongchen13/FedEM"
NEEDS = (f"benchmarks.probes.peer needs a checkout of {PEER_REPO}: pass --peer-dir DIR "
         f"(git clone https://github.com/{PEER_REPO} DIR)")
# the files the shim imports or runs; a checkout without them is not the peer
PEER_FILES = ("train.py", "model/engine.py", "model/model.py", "model/tools.py",
              "utils/data.py", "utils/utils.py")
# our configurations: name -> config overrides (FedEM, the peer's d/E/B/negatives/lr)
OURS = {
    "paper-code": {"federation.method": "fedem", "data.protocol": "paper-code"},
    "default": {"federation.method": "fedem", "data.protocol": "strict"},
    # the same with per-client tables stored in bfloat16 (float32 arithmetic; the
    # similarity mix on the CPU's bfloat16 matrix units where it has them, docs/speed.md)
    "paper-code-bf16": {"federation.method": "fedem", "data.protocol": "paper-code",
                        "train.state_dtype": "bfloat16"},
    "default-bf16": {"federation.method": "fedem", "data.protocol": "strict",
                     "train.state_dtype": "bfloat16"},
}
# the peer's train.py defaults that ours must match (checked against its argparse)
SHARED_SETTINGS = {"train.dim": 16, "train.local_epochs": 10, "train.batch_size": 256,
                   "train.num_negatives": 4, "train.lr": 0.1}


def peer_problem(peer_dir: str | None) -> str | None:
    """Why ``peer_dir`` cannot be run (None when it can)."""
    from benchmarks.common import checkout_problem  # lazily: the peer's child imports us bare

    return checkout_problem(peer_dir, NEEDS, PEER_FILES)


def write_peer_ml100k(src_dir: str | Path, root: str | Path) -> Path:
    """Write ML-100K's ``u.data`` (user, item, rating, timestamp; tab separated) as
    ``root/datasets/ml-100k/ratings.dat`` (the same four fields comma separated, no
    header: what the peer's ``utils.loadData`` reads for ml-100k). Returns the file."""
    dest = Path(root) / "datasets" / "ml-100k" / "ratings.dat"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(src_dir) / "u.data") as src, open(dest, "w") as out:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 4:
                raise ValueError(f"u.data line {n}: expected 4 fields, got {len(fields)}")
            out.write(",".join(fields) + "\n")
    return dest


def _peer_version(peer_dir: str) -> dict[str, Any]:
    """The checkout's commit (when it is a git work tree) and a hash of its run files."""
    h = hashlib.sha256()
    for f in PEER_FILES:
        h.update((Path(peer_dir) / f).read_bytes())
    out: dict[str, Any] = {"files_sha256": h.hexdigest()[:16]}
    try:
        out["commit"] = subprocess.run(["git", "-C", peer_dir, "rev-parse", "HEAD"],
                                       capture_output=True, text=True, timeout=10,
                                       check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out


# ------------------------------------------------------------------ the children
class _Turns:
    """A child's side of the turn-taking: protocol lines on the original stdout, every
    other print on stderr; ``wait()`` blocks until the parent says go (False: stop)."""

    def __init__(self) -> None:
        self.out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **msg: Any) -> None:
        self.out.write(json.dumps(msg) + "\n")
        self.out.flush()

    def wait(self) -> bool:
        self.send(event="ready")
        return sys.stdin.readline().strip() == "go"


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _compat_shims() -> list[str]:
    """Restore what the peer's pinned versions had (module docstring); returns what was
    patched."""
    import random
    import types

    import numpy as np
    import pandas as pd
    from pandas.core.groupby.generic import DataFrameGroupBy

    done = []
    if not hasattr(np, "in1d"):
        np.in1d = np.isin  # type: ignore[attr-defined]
        done.append("numpy.in1d = numpy.isin")
    if int(pd.__version__.split(".")[0]) >= 3:
        original_apply = DataFrameGroupBy.apply

        def apply(self, func, *args, **kwargs):  # pandas 2: groups keep the key column
            if not self.group_keys and callable(func) and "include_groups" not in kwargs:
                parts = [func(group, *args, **kwargs) for _, group in self]
                return pd.concat(parts) if parts else self.obj.iloc[:0]
            return original_apply(self, func, *args, **kwargs)

        DataFrameGroupBy.apply = apply
        done.append("DataFrameGroupBy.apply(group_keys=False) with the grouping column")
    original_sample = random.sample  # Python 3.11 refuses a set (3.8 made it a tuple)

    def sample(population, k, **kwargs):
        if isinstance(population, set | frozenset):
            population = tuple(population)
        return original_sample(population, k, **kwargs)

    random.sample = sample
    done.append("random.sample of a set")
    try:
        import coloredlogs  # noqa: F401
    except ImportError:
        sys.modules["coloredlogs"] = types.SimpleNamespace(install=lambda *a, **k: None)
        done.append("coloredlogs stubbed")
    return done


def run_peer_child(peer_dir: str, data_dir: str, threads: int) -> None:
    """Run the peer's train.py unchanged (``--dataset ml-100k``), one round per turn."""
    import runpy

    from ..common import cuda_calls_on_cpu

    turns = _Turns()
    _set_threads(threads)
    cuda_calls_on_cpu()
    shims = _compat_shims()
    peer_dir = str(Path(peer_dir).resolve())
    work = tempfile.mkdtemp(prefix="fedem_peer_")
    write_peer_ml100k(data_dir, work)
    (Path(work) / "logs").mkdir()
    os.chdir(work)
    sys.path.insert(0, peer_dir)

    from model import engine as peer_engine  # the peer's own modules, from peer_dir

    inner = {"updateMatrix": 0.0, "aggregateByMatrix": 0.0}

    def timed(name):
        fn = getattr(peer_engine, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                inner[name] += time.perf_counter() - t0
        return wrapper

    for name in inner:  # engine.py imported them by name: patch its references
        setattr(peer_engine, name, timed(name))
    one_round = peer_engine.Engine.federatedTrainOneRound
    last_end = [None]

    def round_in_turn(self, train_data, item_embeddings, mlp_weights, iteration):
        between = None if last_end[0] is None else time.perf_counter() - last_end[0]
        if not turns.wait():
            turns.out.close()
            os._exit(0)
        for name in inner:
            inner[name] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        losses = one_round(self, train_data, item_embeddings, mlp_weights, iteration)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        turns.send(event="round", round=iteration + 1, seconds=seconds, cpu_s=cpu,
                   aggregation_s=inner["updateMatrix"] + inner["aggregateByMatrix"],
                   similarity_qp_s=inner["updateMatrix"], between_s=between,
                   clients=len(losses))
        last_end[0] = time.perf_counter()
        return losses

    peer_engine.Engine.federatedTrainOneRound = round_in_turn
    turns.send(event="start", shims=shims, workdir=work)
    sys.argv = ["train.py", "--dataset", "ml-100k"]
    runpy.run_path(str(Path(peer_dir) / "train.py"), run_name="__main__")
    turns.send(event="finished")


def run_ours_child(name: str, data_dir: str, threads: int) -> None:
    """Our FedEM (configuration ``name`` of OURS) on ML-100K, one round per turn."""
    turns = _Turns()
    _set_threads(threads)
    from fedem_private.experiments.runner import prepare
    from fedem_private.simulation.config import RunConfig, with_overrides

    over = {"data.dataset": "ml-100k", "data.data_dir": data_dir, "train.rounds": 10_000,
            "train.eval_every": 10_000, "train.device": "cpu", **SHARED_SETTINGS,
            **OURS[name]}
    sim = prepare(with_overrides(RunConfig(), over))
    fed = sim.view.cfg.federation
    turns.send(event="start", config={"protocol": sim.view.cfg.data.protocol,
                                      "aggregation": fed.aggregation, "merge": fed.merge,
                                      "agg_clients_ratio": fed.agg_clients_ratio,
                                      "similarity": fed.similarity,
                                      "merge_every_batch": fed.merge_every_batch,
                                      "early_stop_tol": sim.view.cfg.train.early_stop_tol,
                                      "clients": int(sim.view.split.n_users),
                                      "items": int(sim.view.split.n_items)})
    while turns.wait():
        t0, c0 = time.perf_counter(), time.process_time()
        stats = sim.step()
        turns.send(event="round", round=stats.round, seconds=time.perf_counter() - t0,
                   cpu_s=time.process_time() - c0, step_seconds=stats.seconds,
                   clients=stats.participants)
    turns.out.close()


# ------------------------------------------------------------------ the parent
class _Child:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self.err = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.probes.peer", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, bufsize=1, env=env,
                                     cwd=str(Path(__file__).resolve().parents[2]))
        self.info: dict[str, Any] = {}

    def read(self, event: str) -> dict[str, Any]:
        """The next protocol message, which must be ``event``."""
        while True:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                tail = self.log.read_text()[-3000:]
                raise RuntimeError(f"{self.name} exited (rc {self.proc.returncode}) waiting "
                                   f"for {event!r}; the end of {self.log}:\n{tail}")
            msg = json.loads(line)
            if msg["event"] == "start":
                self.info = msg
                continue
            if msg["event"] != event:
                raise RuntimeError(f"{self.name}: expected {event!r}, got {msg}")
            return msg

    def round(self) -> dict[str, Any]:
        """Let it run one round (it must be waiting); return its report once it waits
        again (so nothing of it runs while the next child's round does)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        msg = self.read("round")
        self.read("ready")
        return msg

    def stop(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts(threads: int) -> dict[str, Any]:
    import torch

    return {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "cpu": _cpu_model(), "python": platform.python_version(),
            "torch": torch.__version__, "threads": threads,
            "loadavg_start": list(os.getloadavg())}


def _our_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10,
                              cwd=str(Path(__file__).resolve().parent)).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def summarise(rounds: dict[str, list[float]]) -> dict[str, Any]:
    """Mean seconds per round of each code, and peer / ours per round and of the means."""
    mean = {k: sum(v) / len(v) for k, v in rounds.items()}
    out: dict[str, Any] = {"mean_s": mean, "ratio": {}, "ratio_per_round": {}}
    for name in (k for k in rounds if k != "peer"):  # ours: the OURS timed in this run
        out["ratio"][name] = mean["peer"] / mean[name]
        out["ratio_per_round"][name] = [p / o for p, o in zip(rounds["peer"], rounds[name],
                                                              strict=True)]
    return out


def run(peer_dir: str, data_dir: str, rounds: int, threads: int, logs: Path
        ) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    common = ["--data-dir", data_dir, "--threads", str(threads)]
    children = {"peer": _Child("peer", ["--child", "peer", "--peer-dir", peer_dir, *common],
                               env, logs / "peer.log")}
    for name in OURS:
        children[name] = _Child(name, ["--child", name, *common], env, logs / f"{name}.log")
    reports: dict[str, list[dict[str, Any]]] = {k: [] for k in children}
    try:
        for name, child in children.items():  # round 1 of each: the warm-up
            child.read("ready")
            warm = child.round()
            print(f"warm-up round 1 {name}: {warm['seconds']:.2f} s", flush=True)
        for r in range(2, rounds + 2):
            for name, child in children.items():
                rep = child.round()
                reports[name].append(rep)
                print(f"round {r} {name:10s}: {rep['seconds']:7.2f} s", flush=True)
    finally:
        for child in children.values():
            child.stop()
    seconds = {k: [rep["seconds"] for rep in v] for k, v in reports.items()}
    cpu = {k: [rep["cpu_s"] for rep in v] for k, v in reports.items()}
    # the CPU seconds of each round (its process's, user and system): on a shared machine
    # less moved by the other jobs than the wall clock
    return {"rounds": seconds, "cpu_rounds": cpu, "reports": reports,
            "children": {k: c.info for k, c in children.items()}, **summarise(seconds),
            "cpu": summarise(cpu)}


def _print_table(title: str, secs: dict[str, list[float]], summary: dict[str, Any],
                 rounds: int) -> None:
    print(f"\n{title}\n{'':16s}" + "".join(f"{'round ' + str(r + 2):>10s}"
                                            for r in range(rounds)) + f"{'mean':>10s}")
    for name, values in secs.items():
        print(f"{name + ' s':16s}" + "".join(f"{v:10.2f}" for v in values)
              + f"{summary['mean_s'][name]:10.2f}")
    for name in OURS:
        print(f"{'peer/' + name:16s}" + "".join(f"{q:10.1f}" for q in
                                                 summary["ratio_per_round"][name])
              + f"{summary['ratio'][name]:10.1f}")


def _default_out() -> Path:
    return (Path(__file__).resolve().parents[1] / "results" / "speed" / "peer"
            / f"peer_{dt.date.today():%Y%m%d}.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes.peer",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-dir", help=f"a checkout of {PEER_REPO}")
    ap.add_argument("--rounds", type=int, default=2,
                    help="timed rounds per code after the warm-up round 1 (default 2)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads and OMP_NUM_THREADS of every code (default 1)")
    ap.add_argument("--data-dir", help="the ML-100K folder (u.data); default: the shared "
                                       "datasets folder or FEDEM_DATA_ROOT")
    ap.add_argument("--out", help="the JSON to write (default "
                                  "benchmarks/results/speed/peer/peer_<date>.json)")
    ap.add_argument("--child", choices=("peer", *OURS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    problem = peer_problem(args.peer_dir) if args.child in (None, "peer") else None
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.child == "peer":
        run_peer_child(args.peer_dir, args.data_dir, args.threads)
        return 0
    if args.child:
        run_ours_child(args.child, args.data_dir, args.threads)
        return 0
    if args.rounds < 1 or args.threads < 1:
        print("benchmarks.probes.peer: --rounds and --threads must be >= 1", file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from ..common import data_dir

    ml100k = args.data_dir or data_dir("ml-100k")
    if not (Path(ml100k) / "u.data").is_file():
        print(f"benchmarks.probes.peer: no u.data in {ml100k} (ML-100K)", file=sys.stderr)
        return 2
    _set_threads(args.threads)
    facts = machine_facts(args.threads)
    out = Path(args.out) if args.out else _default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="peer_bench_logs_"))
    command = " ".join(["python -m benchmarks.probes.peer", *(argv if argv is not None
                                                        else sys.argv[1:])])
    print(f"peer {args.peer_dir} vs ours, {args.threads} thread(s), warm-up round 1 then "
          f"{args.rounds} timed round(s) each; children's logs in {logs}", flush=True)
    t0 = time.perf_counter()
    try:
        res = run(str(Path(args.peer_dir).resolve()), str(Path(ml100k).resolve()),
                  args.rounds, args.threads, logs)
    except RuntimeError as err:
        print(f"benchmarks.probes.peer: {err}", file=sys.stderr)
        return 1
    facts["loadavg_end"] = list(os.getloadavg())
    record = {"benchmark": "peer", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "command": command, "machine": facts, "peer": _peer_version(args.peer_dir),
              "ours_commit": _our_commit(), "ours_configs": OURS, "shared": SHARED_SETTINGS,
              "timed": "peer: Engine.federatedTrainOneRound (train.py's own round timer); "
                       "ours: Simulation.step() without evaluation",
              "wall_s": time.perf_counter() - t0, **res}
    out.write_text(json.dumps(record, indent=1, default=str))
    _print_table("wall-clock seconds per round", res["rounds"], res, args.rounds)
    _print_table("CPU seconds per round (the process's own)", res["cpu_rounds"], res["cpu"],
                 args.rounds)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
