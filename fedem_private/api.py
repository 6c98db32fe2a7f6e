"""The Python API, for notebooks and scripts; the ``fedem-private`` command is a thin layer over it.

::

    import fedem_private as fp

    res = fp.run({"train": {"rounds": 5}, "federation": {"method": "fedem"}}, out="runs/nb")
    res.metrics            # pandas DataFrame, one row per evaluated round
    res.summary["metrics"]["full"]["hr@10"], res.ledger
    fp.attack("runs/nb")   # needs a recorded run: {"record": {"rounds": "last"}}
    table = fp.sweep("my-sweep.toml", out="runs/my-sweep", jobs=2)
    fp.load_results("runs/my-sweep")    # or a results.csv

Bad input raises :class:`fedem_private.errors.UserError` with the one-line
message the command prints. Everything heavy (torch, pandas, ...) is imported
inside the functions, so ``import fedem_private`` stays light.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedem_private.errors import ResultsElsewhere, UserError
from fedem_private.plugins import load_all
from fedem_private.simulation.config import RunConfig, from_dict, load_toml, with_overrides

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Result", "RunWarning", "attack", "load_results", "load_run", "resolve_config",
           "run", "sweep"]


class RunWarning(UserWarning):
    """A finished run that looks mis-set (most uploads clipped, most test items cold) or
    learned nothing (HR@10 at chance, noise swamping the uploads)."""


@dataclass(frozen=True)
class Result:
    """A finished run: its directory, resolved config, per-round metrics, summary and ledger."""

    run_dir: Path
    config: RunConfig
    metrics: pd.DataFrame  # metrics.csv: one row per evaluated round
    summary: dict[str, Any]  # summary.json
    ledger: dict[str, Any] | None  # privacy_ledger.json (None when the run wrote none)

    @property
    def hr10(self) -> float | None:
        """Final HR@10 under full ranking (None when the run never evaluated)."""
        full = (self.summary.get("metrics") or {}).get("full") or {}
        return full.get("hr@10")


def resolve_config(config: RunConfig | Mapping[str, Any] | str | Path | None = None,
                   overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """A validated, resolved config from a :class:`RunConfig`, a nested dict (the TOML
    layout), a TOML file path or None (the defaults), plus ``{"train.rounds": 5}`` overrides.
    Other packages' parts (:mod:`fedem_private.plugins`) are loaded first."""
    load_all()
    if config is None:
        cfg = RunConfig()
    elif isinstance(config, RunConfig):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = from_dict(dict(config))
    elif isinstance(config, str | Path):
        cfg = load_toml(config)
    else:
        raise UserError(f"config must be a RunConfig, a dict or a TOML path, got "
                        f"{type(config).__name__}")
    return with_overrides(cfg, dict(overrides or {})).validate().resolved()


def default_out(cfg: RunConfig) -> Path:
    """``runs/<dataset>-<method>-<time>``: where a run goes without ``out``."""
    return Path("runs") / (f"{cfg.data.dataset}-{cfg.federation.method}-"
                           f"{_dt.datetime.now():%Y%m%d-%H%M%S}")


def reserve_default_out(cfg: RunConfig) -> tuple[Path, list[Path]]:
    """Make an empty, new run directory for ``cfg``: :func:`default_out`, or with a ``-2``,
    ``-3``, ... suffix when another run (one started in the same second) has it. Returns it
    and the folders made above it (``runs/``), innermost first, to remove if the run fails."""
    base = default_out(cfg)
    made: list[Path] = []
    try:
        for folder in reversed([d for d in (base.parent, *base.parent.parents) if not d.exists()]):
            folder.mkdir()
            made.insert(0, folder)
        for n in range(1, 10_000):
            path = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                path.mkdir()  # atomic: only one run gets each name
            except FileExistsError:
                continue
            return path, made
    except OSError as exc:
        raise UserError(f"cannot create run directory under {base.parent}: "
                        f"{exc.strerror}") from None
    raise UserError(f"every run directory name {base}-N is taken")  # pragma: no cover


# the progress bar's names of cdp-gaussian's two epsilons (docs/design.md section 5), and
# the line that says what they are, written above the bar where they first appear
EPS_OBSERVER = "eps (observers)"
EPS_AGGREGATOR = "eps vs aggregator (unamplified)"
EPS_LEGEND = (f"{EPS_OBSERVER}: spent against anyone who sees the released models (amplified "
              f"by Poisson sampling; --epsilon is its target). {EPS_AGGREGATOR}: spent "
              f"against the aggregator, who sees each round's sum before it is released (no "
              f"amplification: it climbs past --epsilon, as it should)")


def _progress_hooks(cfg: RunConfig) -> tuple[Callable, Callable, Callable]:
    """on_start, on_round and close of a tqdm bar over the rounds (HR, NDCG, eps spent;
    under a central mechanism both epsilons, named and explained by :data:`EPS_LEGEND` the
    first time they show)."""
    bar = None
    explained = False

    def on_start(sim: Any) -> None:
        nonlocal bar
        from tqdm import tqdm

        bar = tqdm(total=cfg.train.rounds, initial=sim.state.round,  # resumed: not 0
                   desc=f"{cfg.federation.method} rounds",
                   unit="round", file=sys.stderr, dynamic_ncols=True)

    def on_round(stats: Any) -> None:
        nonlocal explained
        if bar is None:
            return
        post = {}
        if stats.metrics:
            post["HR@10"] = f"{stats.metrics['full']['hr@10']:.4f}"
            post["NDCG@10"] = f"{stats.metrics['full']['ndcg@10']:.4f}"
        if stats.privacy.get("eps_spent_observer") is not None:  # cdp-gaussian: both views
            post[EPS_OBSERVER] = f"{stats.privacy['eps_spent_observer']:.3g}"
            post[EPS_AGGREGATOR] = f"{stats.privacy['eps_spent']:.3g}"
            if not explained:
                bar.write(EPS_LEGEND, file=sys.stderr)
                explained = True
        elif stats.privacy.get("eps_spent") is not None:
            post["eps"] = f"{stats.privacy['eps_spent']:.3g}"
        bar.set_postfix(post, refresh=False)
        bar.update(1)

    def close() -> None:
        if bar is not None:
            bar.close()

    return on_start, on_round, close


def duration(seconds: float) -> str:
    """``3725`` -> ``1h02m``, ``185`` -> ``3m05s``, ``12.3`` -> ``12s``."""
    s = max(int(round(seconds)), 0)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


# plain progress lines (progress="lines"): every evaluated round, the first round and each
# tenth of the rounds
LINE_SHARES = 10


def _line_hooks(cfg: RunConfig) -> tuple[Callable, Callable, Callable]:
    """on_start, on_round and close printing one plain line on stderr at each evaluated
    round, the first round and each tenth of the rounds: the round, seconds a round (mean
    of this process's rounds) and the ETA, for logs where a bar does not draw."""
    rounds, seen = cfg.train.rounds, []
    marks = {max(1, rounds * k // LINE_SHARES) for k in range(1, LINE_SHARES + 1)}

    def on_start(sim: Any) -> None:
        seen.clear()

    def on_round(stats: Any) -> None:
        seen.append(stats.seconds)
        if stats.metrics is None and len(seen) > 1 and stats.round not in marks:
            return
        per_round = sum(seen) / len(seen)
        text = (f"{cfg.federation.method} round {stats.round}/{rounds}: {per_round:.3g} s a "
                f"round, ETA {duration(per_round * (rounds - stats.round))}")
        if stats.metrics and "full" in stats.metrics:
            text += f"; full HR@10 {stats.metrics['full']['hr@10']:.4f}"
        print(text, file=sys.stderr, flush=True)

    return on_start, on_round, lambda: None


def run(config: RunConfig | Mapping[str, Any] | str | Path | None = None,
        out: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None,
        force: bool = False, progress: bool | str = False, warn: bool = True,
        checkpoint_every: int | None = None, ray: str | None = None,
        ray_shards: int | None = None) -> Result:
    """Train one configuration and write its run directory; returns the :class:`Result`.

    ``config``: see :func:`resolve_config` (``{"record": {"rounds": "last"}}``
    records what the server saw, so the run can be attacked). ``out``: the run
    directory (default ``runs/<dataset>-<method>-<time>``, ``-2`` added when taken); an existing
    non-empty one is replaced only with ``force``. When another run finished into ``out``
    while this one ran, this run's results go beside it (``-2``, ...): the returned
    :class:`Result`'s ``run_dir`` says where (and, with ``warn``, a :class:`RunWarning`).
    While the rounds run, ``out`` holds ``metrics.csv`` so far (rewritten at each
    evaluation) and ``progress.json`` (the round reached, seconds a round, ETA); the
    finished run directory replaces them.
    ``progress``: True (or "bar") a bar on stderr, "lines" a plain line on stderr at each
    evaluation (and each tenth of the rounds), False nothing.
    ``warn``: the run's warnings (mis-set clipping, many cold test items, HR@10 at chance,
    noise swamping the uploads) are issued as :class:`RunWarning` (the command prints them
    itself). ``checkpoint_every``: save
    the run's state every that many rounds to ``<out>.checkpoint``; calling again with the
    same config and ``out`` resumes a killed run from it
    (:mod:`fedem_private.experiments.checkpoint`; needs ``out``, not with recording).
    ``ray_shards`` K: each round's clients are computed in K shards on Ray, a local Ray
    with K CPUs or the running cluster at ``ray`` (``auto``, ``HOST:6379``); central
    mechanisms with ``--client-tables global`` only, the same results bit for bit
    (:mod:`fedem_private.experiments.ray_shards`).
    """
    cfg = resolve_config(config, overrides)
    if cfg.data.data_dir is not None and not Path(cfg.data.data_dir).expanduser().exists():
        what = "file" if cfg.data.dataset == "csv" else "directory"
        raise UserError(f"dataset {cfg.data.dataset}: {what} not found: {cfg.data.data_dir}")
    from fedem_private.experiments.ray_shards import shard_options
    from fedem_private.experiments.runner import execute, recording_hook
    from fedem_private.simulation.config import BASELINE_METHODS

    shards = shard_options(ray, ray_shards)

    baseline = cfg.federation.resolved_method in BASELINE_METHODS  # no rounds, no hooks
    checkpoint = None
    if checkpoint_every is not None and not baseline:
        from fedem_private.experiments.checkpoint import Checkpointing

        if out is None:
            raise UserError("--checkpoint-every needs --out: a killed run resumes by its "
                            "directory's name")
        if cfg.record.parsed_rounds():
            raise UserError("--checkpoint-every does not combine with --record-rounds (the "
                            "recording would miss the rounds before a resumption)")
        checkpoint = Checkpointing(checkpoint_path(out), checkpoint_every)
    path, made = (Path(out), []) if out is not None else reserve_default_out(cfg)
    if progress not in (True, False, "bar", "lines"):
        raise UserError(f"progress must be True, False, 'bar' or 'lines', got {progress!r}")
    on_start, on_round, close = ((None, None, lambda: None) if baseline or not progress
                                 else _line_hooks(cfg) if progress == "lines"
                                 else _progress_hooks(cfg))
    moved = None
    try:
        execute(cfg, path, force=force, setup=None if baseline else recording_hook(cfg),
                on_start=on_start, on_round=on_round, checkpoint=checkpoint,
                shards=shards, live=True)
    except ResultsElsewhere as exc:  # finished, kept beside the folder another run took
        moved, path = str(exc), Path(exc.path)
    except BaseException:
        if out is None:  # free the name reserved for this run (and runs/ if made for it)
            with contextlib.suppress(OSError):
                for folder in (path, *made):
                    folder.rmdir()
        raise
    finally:
        close()
    result = load_run(path)
    if warn and moved is not None:
        warnings.warn(moved, RunWarning, stacklevel=2)
    if warn:
        for part in ("clipping", "cold_items", "sampled_candidates"):
            text = (result.summary.get(part) or {}).get("warning")
            if text:
                warnings.warn(f"{path}: {text}", RunWarning, stacklevel=2)
        for text in result.summary.get("warnings") or ():
            warnings.warn(f"{path}: {text}", RunWarning, stacklevel=2)
    return result


def checkpoint_path(out: str | Path) -> Path:
    """Where :func:`run` keeps the checkpoint of the run going into ``out``: beside it,
    ``<out>.checkpoint``."""
    from fedem_private.experiments.checkpoint import beside

    return beside(out)


def load_run(run_dir: str | Path) -> Result:
    """The :class:`Result` of a finished run directory."""
    import pandas as pd

    path = Path(run_dir).expanduser()
    if not (path / "summary.json").is_file():
        raise UserError(f"not a run directory: {path} (no summary.json)")
    ledger_file = path / "privacy_ledger.json"
    metrics_file = path / "metrics.csv"
    return Result(
        run_dir=path,
        config=load_toml(path / "config.toml"),
        metrics=pd.read_csv(metrics_file) if metrics_file.is_file() else pd.DataFrame(),
        summary=json.loads((path / "summary.json").read_text()),
        ledger=json.loads(ledger_file.read_text()) if ledger_file.is_file() else None,
    )


def sweep(spec: str | Path | None = None, out: str | Path | None = None, *,
          jobs: int | None = None, force: bool = False, progress: bool = False,
          ray: str | None = None) -> pd.DataFrame:
    """Run (or resume) a sweep file (None: the built-in quick sweep); returns its results table.

    Same rules as ``fedem-private sweep``: finished points are skipped, a
    finished run whose config changed is replaced only with ``force``. Failed
    points are listed in ``<out>/sweep_errors.log`` and missing from the table.
    ``ray`` runs the points as Ray tasks, like ``--ray``: ``"local"`` (a local
    instance, or the one this process already started) or a cluster address.
    """
    from fedem_private.experiments.naming import default_out as sweep_out
    from fedem_private.experiments.sweep_spec import load_spec

    load_all()
    load_spec(None if spec is None else str(spec))
    from fedem_private.experiments.sweep import run_sweep

    root = Path(out) if out is not None else Path(sweep_out(None if spec is None else str(spec)))
    run_sweep(None if spec is None else str(spec), str(root), jobs=jobs, force=force,
              progress=progress, ray=ray)
    return load_results(root)


def attack(run_dir: str | Path, attacks: Sequence[str] | None = None, *, seed: int = 0,
           rounds: Sequence[int] | None = None, known_fraction: float = 0.5,
           device: str = "cpu", options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run, score and audit the attacks on a recorded run; writes and returns ``attacks.json``.

    ``attacks``: registered names (default: the registry's default attacks: support,
    projection, imia, attribute, canary). ``options``: per attack name, its options
    dataclass or a mapping field -> text (``--attack-option``).
    ``device``: cpu, cuda or auto, where the attacks' linear algebra and IMIA's
    shadow training run (cuda without a GPU is a UserError).
    """
    from fedem_private.device import resolve as resolve_device
    from fedem_private.experiments.attack_step import known_attacks

    load_all()
    path = Path(run_dir).expanduser()
    if not path.exists():
        raise UserError(f"run directory not found: {path}")
    if not path.is_dir() or not (path / "summary.json").is_file():
        raise UserError(f"not a run directory: {path} (no summary.json; attack a directory "
                        "written by `fedem-private run --record-rounds ...`)")
    names = tuple(attacks) if attacks is not None else None
    if names is not None:
        if not names:
            raise UserError("--attacks: no attack named")
        known = known_attacks() or ()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UserError(f"unknown attack {unknown[0]!r}; known: {', '.join(known)}")
    if not 0.0 < known_fraction < 1.0:
        raise UserError(f"--known-fraction must be in (0, 1), got {known_fraction}")
    dev = resolve_device(device, "--device")
    from fedem_private.experiments.rundir import check_recorded

    # the files the attacks read, whole, before their import and work (seconds): one line
    check_recorded(path, None if rounds is None else list(rounds))
    from attacks.run import run_attacks
    from fedem_private.experiments.shadow import shadow_model

    return run_attacks(path, names, seed=seed,
                       rounds=None if rounds is None else list(rounds),
                       known_fraction=known_fraction, device=dev, shadow=shadow_model,
                       options=options)


def load_results(path: str | Path) -> pd.DataFrame:
    """One row per run: a ``results.csv``, or every run directory under a folder."""
    from fedem_private.experiments.results import collect, read_results

    p = Path(path).expanduser()
    if p.is_file():
        return read_results(p)
    if not p.is_dir():
        raise UserError(f"no such file or directory: {p}")
    return collect(p)
