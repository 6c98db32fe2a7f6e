"""A baseline's run directory (docs/design.md section 14): the same files as a federated run.

``config.toml`` (the resolved config), ``metrics.csv`` (one row, round 0: a
baseline has no rounds) and ``summary.json`` with the keys a federated run's
summary has, so :mod:`fedem_private.experiments.results` and the report read
it as any other run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fedem_private._version import __version__
from fedem_private.data import (
    calibrated_population,
    leave_one_out,
    load_dataset,
    population_record,
)
from fedem_private.data.split import Split, cold_share, set_aside
from fedem_private.evaluation.metrics import eval_sample, sampled_note
from fedem_private.experiments.outcome import outcome_warnings, references
from fedem_private.experiments.rundir import NOT_PRIVATE, RunDir
from fedem_private.simulation.config import RunConfig, to_dict, to_toml

# issue 66: the last calibrated population's (name, split), kept for the next run of the same
# population in this process: a study runs many cells on one population of up to 10^6 users
# (10^8 interactions), whose draw and split take minutes each time
_LAST_POPULATION: dict[tuple[Any, ...], tuple[str, Split]] = {}


def load_split(cfg: RunConfig) -> tuple[str, Split]:
    """The dataset's name and the leave-one-out split a federated run of ``cfg`` uses.

    A calibrated population's split is kept for the next call with the same
    population, seed and split options, so the cells of a study share one draw; any other
    dataset is loaded each time."""
    key = _population_key(cfg)
    if key is not None and key in _LAST_POPULATION:
        return _LAST_POPULATION[key]
    data = load_dataset(cfg.data.dataset, cfg.data.data_dir, seed=cfg.train.seed,
                        synthetic=cfg.data.synthetic, min_rating=cfg.data.min_rating,
                        calibrate_to=cfg.data.calibrate_to, users=cfg.data.users,
                        taste=cfg.data.population_taste)
    out = data.name, leave_one_out(data, cfg.train.seed, cfg.data.min_user_ratings,
                                   first_seen=cfg.data.first_seen_order)
    if key is not None:  # nothing writes into a split (its arrays are only read)
        _LAST_POPULATION.clear()
        _LAST_POPULATION[key] = out
    return out


def _population_key(cfg: RunConfig) -> tuple[Any, ...] | None:
    """What a calibrated population's split depends on; None for any other dataset."""
    d = cfg.data
    if d.dataset != "synthetic" or d.calibrate_to is None:
        return None
    model = calibrated_population(d.calibrate_to, d.data_dir,  # this process's cache
                                  taste=d.population_taste)
    return (model.sha256, d.users, cfg.train.seed, d.min_user_ratings, d.first_seen_order,
            d.min_rating)


def baseline_summary(cfg: RunConfig, dataset: str, split: Split, model: str,
                     metrics: dict[str, dict[str, float]], privacy: dict[str, Any],
                     info: dict[str, Any], wall: float,
                     clipping: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json of a baseline, keyed as :func:`~fedem_private.experiments.runner.summarise`
    (rounds 0, no communication). ``clipping``: the clip's simulator-only diagnostics
    (dp-mostpop's users clipped at k, labelled not released), kept out of the released
    ``privacy`` block as a federated run keeps its pre-clip norms; None without a clip."""
    zero = {k: 0.0 for k in ("bytes_up_per_client_round", "bytes_down_per_client_round",
                             "bytes_up_last_round", "bytes_down_last_round", "bytes_up_total",
                             "bytes_down_total", "bytes_setup_total")}
    return {
        "dataset": dataset, "method": cfg.federation.resolved_method, "backbone": model,
        "codec": "full", "aggregation": "none", "merge": "none", "merge_rho_mean": None,
        "server_stats": None, "protocol": cfg.data.protocol, "rounds": 0,
        "seed": cfg.train.seed, "nonce": cfg.train.nonce, "n_users": split.n_users,
        "n_items": split.n_items,
        "dropped_users": split.dropped_users, "seconds_per_round": None,
        "seconds_total": wall, "metrics": metrics, "privacy": privacy, "clipping": clipping,
        "communication": zero,
        "data": set_aside(split, cfg.data.min_user_ratings),
        "cold_items": {"test_share": cold_share(split),
                       "val_share": cold_share(split, split.val_items), "warning": None},
        "sampled_candidates": sampled_note(split),
        "baseline": info,
        # chance and MostPop on the users this run evaluated (experiments/outcome.py)
        "references": references(cfg, split),
        "warnings": outcome_warnings(split, metrics, privacy,
                                     eval_sample(split.n_users, cfg.train.eval_users,
                                                 cfg.train.seed)),
        "version": __version__, "not_private": NOT_PRIVATE,
    }


def execute_baseline(cfg: RunConfig, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Fit and evaluate the baseline ``cfg`` names; write ``out`` atomically; the summary."""
    from fedem_private import baselines

    cfg = cfg.validate().resolved()
    with RunDir(out, force=force) as writer:  # the temporary folder is made by the with
        dataset, split = load_split(cfg)
        writer.write_text("config.toml", to_toml(to_dict(cfg)))
        t0 = time.perf_counter()
        fitted = baselines.fit(cfg, split)
        kept: list = []
        metrics = baselines.evaluate(cfg, split, fitted.scores, keep=kept)
        wall = time.perf_counter() - t0
        row: dict[str, Any] = {"round": 0, "seconds": wall, "participants": 0}
        for kind, values in metrics.items():
            for name, value in values.items():
                row[f"{kind}_{name}"] = value
        writer.write_csv("metrics.csv", [row])
        if cfg.train.eval_users:  # each sampled user's ranks, for paired comparisons
            writer.write_csv("ranks.csv", kept[0].per_user(split.source_users))
        summary = baseline_summary(cfg, dataset, split, fitted.model, metrics,
                                   fitted.privacy, fitted.info, wall, fitted.clipping)
        if cfg.data.calibrate_to is not None:  # docs/design.md section 17
            summary["population"] = population_record(cfg.data.calibrate_to,
                                                      cfg.data.data_dir, cfg.data.users,
                                                      taste=cfg.data.population_taste)
        writer.write_json("summary.json", summary)
        moved = writer.commit_or_moved()
    if moved is not None:  # finished and kept, beside the folder another run took
        raise moved
    return summary
