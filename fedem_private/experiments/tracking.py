"""Experiment tracking with MLflow (``--mlflow [URI]`` on ``run``, ``sweep`` and ``tune``).

Logging reads what a finished run directory holds, after the run: ``config.toml``
(the resolved config, one parameter per ``section.key``), ``metrics.csv`` (one metric
history per column, ``step`` = the round; HR@K and NDCG@K are named as ``results.csv``
names them, ``hr10_full``, ``ndcg10_sampled``, ``hr10_val``), ``summary.json`` (the
privacy block as ``privacy.*`` tags: mechanism, epsilon, delta, neighbouring relation,
trust model, amplification) and every file of the directory as an artifact. Nothing
runs inside a training loop, so a run is the same with or without tracking.

A sweep or a tuning study is one parent MLflow run (its folder's own files, e.g.
``results.csv``, ``report.md``, ``trials.csv``, as artifacts) with one nested child per
finished grid point or trial. Each MLflow run is tagged with a key hashed from its
directory's absolute path and, for a run directory, its ``summary.json``: a resumed
sweep logs only the points it had not logged (a point replaced with ``--force`` is
logged anew), and a parent is reused.

MLflow is an optional extra (``pip install 'fedem-private[mlflow]'``), imported only
here and only when logging. Without a URI the store is SQLite beside the runs:
``sqlite:///<folder>/mlflow.db`` with artifacts in ``<folder>/mlartifacts``, where
``<folder>`` holds the run directory, sweep or study (MLflow 3 refuses new plain-file
stores). The experiment is ``$MLFLOW_EXPERIMENT_NAME``, else ``fedem-private``.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedem_private.errors import UserError
from fedem_private.privacy.registry import no_privacy

DEFAULT = "beside"  # ``--mlflow`` without a URI: the SQLite store beside the runs
MISSING = ("--mlflow needs MLflow, which is not installed: pip install "
           "'fedem-private[mlflow]' (or pip install mlflow)")
EXPERIMENT = "fedem-private"
DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
KEY_TAG = "fedem.key"  # what a later logging looks a run up by
DIR_TAG = "fedem.run_dir"
KIND_TAG = "fedem.kind"  # run, sweep, sweep point, tune, trial, ladder, rung
PARENT_TAG = "mlflow.parentRunId"
# the summary's privacy entries logged as tags (privacy.<name>), text as written
PRIVACY_TAGS = ("mode", "description", "guarantee", "delta", "neighbouring", "trust_model",
                "amplification", "epsilon_view", "sample_rate", "noise_multiplier", "clip",
                "sizes")
BATCH = 100  # MLflow's most params or tags in one call
METRIC_BATCH = 1000
_RANKING = re.compile(r"^(?P<kind>\w+?)_(?P<metric>hr|ndcg)@(?P<k>\d+)$")


def installed() -> bool:
    """Whether MLflow can be imported (without importing it)."""
    return importlib.util.find_spec("mlflow") is not None


def check_uri(uri: str | None) -> None:
    """Refuse ``--mlflow`` before anything runs: MLflow missing, or a URI that is a run or
    sweep file (a positional argument taken as the URI)."""
    if uri is None:
        return
    if uri.endswith(".toml"):
        raise UserError(f"--mlflow {uri}: that is a TOML file, not a tracking URI; put the "
                        "file before --mlflow, or give --mlflow a URI")
    if not installed():
        raise UserError(MISSING)


# --------------------------------------------------------------- what a directory holds
@dataclass(frozen=True)
class Record:
    """What one finished run directory gives MLflow."""

    path: Path  # the run directory (absolute)
    name: str  # the MLflow run name
    params: dict[str, str]
    metrics: list[tuple[str, float, int]]  # (name, value, step)
    tags: dict[str, str]
    key: str  # :data:`KEY_TAG`: the directory's path and its summary.json's digest
    start_ms: int
    end_ms: int


def metric_name(column: str) -> str:
    """A ``metrics.csv`` column as an MLflow metric name: ``full_hr@10`` -> ``hr10_full``
    (the names of ``results.csv``), ``val_full_ndcg@20`` -> ``ndcg20_val_full``; other
    characters MLflow refuses become ``_``."""
    match = _RANKING.match(column)
    if match:
        return f"{match['metric']}{match['k']}_{match['kind']}"
    return re.sub(r"[^\w.\- /]", "_", column)


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _text(value: Any) -> str:
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)
    return str(value)


def read_metrics(path: Path, summary: dict[str, Any]) -> list[tuple[str, float, int]]:
    """Per-round metrics from ``metrics.csv`` (step = round; non-numeric and non-finite
    cells left out); a run without rounds (a baseline) logs its summary's metrics at
    step 0."""
    out: list[tuple[str, float, int]] = []
    if (path / "metrics.csv").is_file():
        with (path / "metrics.csv").open(newline="") as fh:
            for row in csv.DictReader(fh):
                step = _number(row.get("round"))
                for column, cell in row.items():
                    value = _number(cell)
                    if column != "round" and value is not None and step is not None:
                        out.append((metric_name(column), value, int(step)))
    if not out:
        for kind, values in (summary.get("metrics") or {}).items():
            for name, cell in (values or {}).items():
                value = _number(cell)
                if value is not None:
                    out.append((metric_name(f"{kind}_{name}"), value, 0))
    eps = _number(((summary.get("privacy") or {}).get("epsilon") or {}).get("reported"))
    if eps is not None:  # the total spent; per-round spending is metrics.csv's eps_spent
        out.append(("eps_reported", eps, int(summary.get("rounds") or 0)))
    return out


def privacy_tags(summary: dict[str, Any]) -> dict[str, str]:
    """The summary's privacy block as ``privacy.*`` tags: the mechanism (``mode`` and
    ``description``), the reported epsilon (``inf`` without noise, ``none`` without a
    mechanism), delta, the neighbouring relation, the trust model and amplification."""
    privacy = summary.get("privacy") or {}
    tags = {f"privacy.{k}": _text(privacy[k]) for k in PRIVACY_TAGS
            if privacy.get(k) is not None}
    tags["privacy.mechanism"] = _text(privacy.get("mode", "none"))  # by its registered name
    eps = (privacy.get("epsilon") or {}).get("reported")
    if eps is None:
        eps = "none" if no_privacy(privacy.get("mode", "none")) else "inf"
    tags["privacy.epsilon"] = _text(eps)
    agg = (privacy.get("epsilon_aggregator") or {}).get("reported")
    if agg is not None:
        tags["privacy.epsilon_aggregator"] = _text(agg)
    return tags


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def read_run(path: str | Path, name: str | None = None,
             kind: str = "run") -> Record:
    """What the finished run directory ``path`` gives MLflow (no MLflow needed)."""
    from fedem_private.simulation.config import flatten, read_toml

    run = Path(path).absolute()
    summary_file = run / "summary.json"
    if not summary_file.is_file():
        raise UserError(f"{run} is not a finished run directory (no summary.json)")
    raw = summary_file.read_bytes()
    summary = json.loads(raw)
    params = {}
    if (run / "config.toml").is_file():
        params = {k: _text(v) for k, v in
                  flatten(read_toml(run / "config.toml", "run config")).items()}
    tags = {KIND_TAG: kind, DIR_TAG: str(run), **privacy_tags(summary)}
    for key in ("dataset", "method", "backbone", "aggregation", "merge", "protocol", "version"):
        if summary.get(key) is not None:
            tags[f"fedem.{key}"] = _text(summary[key])
    end = int(summary_file.stat().st_mtime * 1000)
    seconds = _number(summary.get("seconds_total")) or 0.0
    return Record(run, name or run.name, params, read_metrics(run, summary), tags,
                  _key(str(run), hashlib.sha256(raw).hexdigest()), end - int(seconds * 1000),
                  end)


# ------------------------------------------------------------------------- the store
@dataclass(frozen=True)
class Store:
    """Where MLflow runs go: a tracking URI, the artifact folder of an experiment it
    creates (None: the server's default) and the experiment's name."""

    uri: str
    artifacts: str | None
    experiment: str = field(default_factory=lambda: os.environ.get(
        "MLFLOW_EXPERIMENT_NAME") or EXPERIMENT)


def store_for(uri: str | None, beside: str | Path) -> Store:
    """The store of ``--mlflow [URI]``: without a URI (or :data:`DEFAULT`), SQLite in the
    folder ``beside`` (``mlflow.db``, artifacts in ``mlartifacts``); a ``sqlite:///`` URI
    keeps its artifacts beside its database file; any other URI (a tracking server)
    chooses its own."""
    if uri is None or uri == DEFAULT:
        folder = Path(beside).absolute()
        return Store(f"sqlite:///{folder / DB_FILE}", (folder / ARTIFACT_DIR).as_uri())
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///")).absolute()
        return Store(f"sqlite:///{db}", (db.parent / ARTIFACT_DIR).as_uri())
    return Store(uri, None)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """MLflow's and Alembic's INFO lines (creating the database's tables) kept off the
    terminal while logging."""
    if installed():
        import mlflow  # noqa: F401  (its import sets its loggers' levels: set ours after)

    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


class Tracker:
    """An open MLflow client on one experiment (:func:`tracker`)."""

    def __init__(self, store: Store) -> None:
        if not installed():
            raise UserError(MISSING)
        from mlflow.tracking import MlflowClient

        self.store = store
        self.client = MlflowClient(store.uri)
        found = self.client.get_experiment_by_name(store.experiment)
        self.experiment_id = (found.experiment_id if found is not None else
                              self.client.create_experiment(store.experiment,
                                                            artifact_location=store.artifacts))

    def find(self, key: str) -> str | None:
        """The id of the run tagged with ``key``, if one was logged."""
        runs = self.client.search_runs([self.experiment_id],
                                       f"tags.`{KEY_TAG}` = '{key}'", max_results=1)
        return runs[0].info.run_id if runs else None

    def log(self, record: Record, parent: str | None = None) -> tuple[str, bool]:
        """Log ``record`` (nested under ``parent``) unless its key is there; returns the
        run's id and whether it was logged now."""
        from mlflow.entities import Metric, Param

        found = self.find(record.key)
        if found is not None:
            return found, False
        tags = {**record.tags, KEY_TAG: record.key}
        if parent is not None:
            tags[PARENT_TAG] = parent
        run = self.client.create_run(self.experiment_id, start_time=record.start_ms,
                                     tags=tags, run_name=record.name)
        run_id = run.info.run_id
        params = [Param(k, v) for k, v in record.params.items()]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(run_id, params=params[i:i + BATCH])
        metrics = [Metric(k, v, record.end_ms, step) for k, v, step in record.metrics]
        for i in range(0, len(metrics), METRIC_BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + METRIC_BATCH])
        self.client.log_artifacts(run_id, str(record.path))
        self.client.set_terminated(run_id, "FINISHED", end_time=record.end_ms)
        return run_id, True

    def parent(self, folder: Path, kind: str, tags: dict[str, str]) -> str:
        """The parent run of the sweep or study in ``folder`` (made once, then reused);
        its folder's own files (not subfolders, not databases) logged again as artifacts."""
        from mlflow.entities import RunTag

        key = _key(kind, str(folder))
        run_id = self.find(key)
        if run_id is None:
            run_id = self.client.create_run(self.experiment_id, run_name=folder.name, tags={
                KIND_TAG: kind, DIR_TAG: str(folder), KEY_TAG: key}).info.run_id
        batch = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(batch), BATCH):
            self.client.log_batch(run_id, tags=batch[i:i + BATCH])
        for file in sorted(folder.iterdir()):
            if file.is_file() and not file.name.startswith(".") and file.suffix != ".db":
                self.client.log_artifact(run_id, str(file))
        self.client.set_terminated(run_id, "FINISHED")
        return run_id


@dataclass(frozen=True)
class Logged:
    """What one logging did: the store, the parent run (None for a single run), the runs
    logged now and those found already logged."""

    store: Store
    parent: str | None
    logged: tuple[str, ...]
    skipped: tuple[str, ...]

    def line(self) -> str:
        """One line for the terminal."""
        parent = "" if self.parent is None else f" under parent run {self.parent}"
        return (f"mlflow: logged {len(self.logged)} run{'' if len(self.logged) == 1 else 's'}"
                f" ({len(self.skipped)} already logged){parent} to {self.store.uri}, "
                f"experiment {self.store.experiment} (mlflow ui --backend-store-uri "
                f"{self.store.uri})")


# a tracking server out of reach fails in seconds, not after MLflow's default retries
# (minutes); the user's own settings of these variables stand
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


@contextlib.contextmanager
def _patience() -> Iterator[None]:
    """:data:`HTTP_DEFAULTS` where the environment sets nothing, while logging."""
    added = [name for name in HTTP_DEFAULTS if name not in os.environ]
    os.environ.update({name: HTTP_DEFAULTS[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _failures(uri: str) -> Iterator[None]:
    """MLflow's errors (a store it cannot open, a server it cannot reach) as one line."""
    with _quiet(), _patience():
        try:
            yield
        except UserError:
            raise
        except Exception as exc:  # MlflowException, OSError, requests' errors, ...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"--mlflow {uri}: could not log ({first}); the run directories "
                            "are written and intact") from None


def log_run(run_dir: str | Path, uri: str | None = None) -> Logged:
    """Log one finished run directory (``fedem-private run --mlflow``); a run already
    logged (same directory, same summary.json) is not logged again."""
    record = read_run(run_dir)
    store = store_for(uri, record.path.parent)
    with _failures(store.uri):
        run_id, new = Tracker(store).log(record)
    return Logged(store, None, (run_id,) if new else (), () if new else (run_id,))


def log_group(folder: str | Path, runs: Sequence[str | Path], kind: str,
              uri: str | None = None, child_kind: str = "run",
              tags: dict[str, str] | None = None,
              extra: dict[Path, dict[str, Any]] | None = None) -> Logged:
    """Log the finished run directories ``runs`` as nested children of one parent run for
    ``folder`` (a sweep, a study, the ladder's runs), each child named by its path under
    ``folder``; children logged before are skipped. ``tags``: the parent's own;
    ``extra``: per run directory, more tags (text) and metrics (numbers) of its child.
    The default store is beside ``folder``."""
    base = Path(folder).absolute()
    store = store_for(uri, base.parent)
    logged: list[str] = []
    skipped: list[str] = []
    with _failures(store.uri):
        tracker = Tracker(store)
        parent = tracker.parent(base, kind, tags or {})
        for run in runs:
            path = Path(run).absolute()
            name = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.name
            record = read_run(path, name, child_kind)
            more = (extra or {}).get(Path(run), {})
            numbers = [(k, float(v), 0) for k, v in more.items()
                       if isinstance(v, int | float) and math.isfinite(v)]
            texts = {k: str(v) for k, v in more.items() if isinstance(v, str)}
            record = Record(record.path, record.name, record.params,
                            record.metrics + numbers, {**record.tags, **texts}, record.key,
                            record.start_ms, record.end_ms)
            run_id, new = tracker.log(record, parent)
            (logged if new else skipped).append(run_id)
    return Logged(store, parent, tuple(logged), tuple(skipped))


def log_sweep(root: str | Path, uri: str | None = None) -> Logged:
    """Log a sweep (``fedem-private sweep --mlflow``): a parent run for ``root`` with
    ``sweep.toml``, ``results.csv`` (and a report, if written) as artifacts, and one child
    per finished point (a run directory holding summary.json)."""
    from fedem_private.experiments.results import find_runs

    base = Path(root)
    return log_group(base, find_runs(base), "sweep", uri, child_kind="sweep point")


def log_study(root: str | Path, uri: str | None = None) -> Logged:
    """Log a tuning study (``fedem-private tune --mlflow``): a parent run for ``root`` with
    ``trials.csv``, ``best.toml`` and, for a private search, ``privacy.json`` as artifacts,
    and one child per finished trial (``trials/NNNN``), tagged ``tune.trial`` and, where
    ``trials.csv`` scores it, with its objective as the metric ``objective``."""
    base = Path(root)
    trials = base / "trials"
    runs = sorted(p for p in trials.iterdir() if (p / "summary.json").is_file()) \
        if trials.is_dir() else []
    scores = _trial_scores(base / "trials.csv")
    extra: dict[Path, dict[str, Any]] = {}
    for run in runs:
        more: dict[str, Any] = {"tune.trial": str(int(run.name)) if run.name.isdigit()
                                else run.name}
        if run.name.isdigit() and int(run.name) in scores:
            more["objective"] = scores[int(run.name)]
        extra[run] = more
    tags: dict[str, str] = {}
    if (base / "privacy.json").is_file():  # a private search: what it cost, per observer
        tags.update(_search_tags(json.loads((base / "privacy.json").read_text())))
    return log_group(base, runs, "tune", uri, child_kind="trial", tags=tags, extra=extra)


def _trial_scores(path: Path) -> dict[int, float]:
    """trials.csv's objective per completed trial (a private study's file has none)."""
    if not path.is_file():
        return {}
    out = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            score = next((_number(v) for k, v in row.items() if k.startswith("val_")), None)
            if score is not None and row.get("status") == "complete":
                out[int(row["trial"])] = score
    return out


def _search_tags(acc: dict[str, Any]) -> dict[str, str]:
    """A private search's eps (privacy.json) as ``search.*`` tags, observer view."""
    tags = {"search.delta": _text(acc.get("delta"))}
    view = (acc.get("views") or {}).get("observer") or {}
    for name, bound in view.items():
        if isinstance(bound, dict) and "reported" in bound:
            tags[f"search.eps_{name}"] = _text(bound["reported"])
    return tags


def log_ladder(out: str | Path, uri: str | None = None) -> Logged:
    """Log a ladder (``fedem-private ladder --mlflow``): a parent run for ``out`` with
    ``ladder.md``, ``ladder.csv``, ``results.csv`` and the figures as artifacts, and one
    child per finished run under ``out/runs`` (named ``runs/<rung run>``)."""
    from fedem_private.experiments.results import find_runs

    base = Path(out)
    runs = find_runs(base / "runs") if (base / "runs").is_dir() else []
    return log_group(base, runs, "ladder", uri, child_kind="rung")
