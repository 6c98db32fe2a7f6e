"""One run end to end: load data, simulate, write the run directory."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedem_private._version import __version__
from fedem_private.data import leave_one_out, load_dataset, population_record
from fedem_private.data.attributes import item_attributes
from fedem_private.data.split import Split, cold_share, set_aside
from fedem_private.errors import Diverged, UserError
from fedem_private.evaluation.metrics import eval_sample, sampled_note
from fedem_private.experiments import checkpoint as checkpoints
from fedem_private.experiments.checkpoint import Checkpointing
from fedem_private.experiments.outcome import outcome_warnings, references
from fedem_private.experiments.rundir import NOT_PRIVATE, RunDir
from fedem_private.hostmem import release_between_runs
from fedem_private.simulation.config import (
    BASELINE_METHODS,
    RunConfig,
    protocol_label,
    protocol_options,
    to_dict,
    to_toml,
)
from fedem_private.simulation.loop import RoundStats, Simulation
from fedem_private.simulation.view import RunView


def load_data(cfg: RunConfig) -> tuple[str, Split, dict[str, np.ndarray],
                                        np.ndarray | None]:
    """The resolved config's data: its name, split, the split users' demographics and the
    item attributes (None unless FedPEFT pre-trains on them)."""
    if cfg.data.calibrate_to is not None:  # no demographics nor item attributes; kept split
        from fedem_private.experiments.baseline_run import load_split

        name, split = load_split(cfg)
        return name, split, {}, None
    data = load_dataset(cfg.data.dataset, cfg.data.data_dir, seed=cfg.train.seed,
                        synthetic=cfg.data.synthetic, min_rating=cfg.data.min_rating,
                        calibrate_to=cfg.data.calibrate_to, users=cfg.data.users,
                        taste=cfg.data.population_taste)
    split = leave_one_out(data, cfg.train.seed, cfg.data.min_user_ratings,
                          first_seen=cfg.data.first_seen_order)
    demographics = {k: v[split.users] for k, v in data.demographics.items()}
    features = (item_attributes(cfg.data.dataset, cfg.data.data_dir, data.item_ids)
                if cfg.federation.peft_pretrain == "attributes" else None)
    return data.name, split, demographics, features


def prepare(cfg: RunConfig) -> Simulation:
    """Validate the config, load and split the data, build the simulation."""
    cfg = cfg.validate().resolved()
    name, split, demographics, features = load_data(cfg)
    return Simulation(cfg, split, dataset_name=name, demographics=demographics,
                      item_features=features)


def recording_hook(cfg: RunConfig) -> Callable[[Simulation, Path], None] | None:
    """A ``setup`` for :func:`execute` recording what ``cfg.record`` asks for, or None."""
    rounds = cfg.record.parsed_rounds()
    if not rounds:
        return None
    from fedem_private.experiments.recording import RecordSpec, recording_setup
    from fedem_private.simulation.config import DEFAULT_RECORD_CLIENTS

    return recording_setup(RecordSpec(rounds, cfg.record.clients or DEFAULT_RECORD_CLIENTS))


def last_merge_rho(history: list[RoundStats]) -> float | None:
    """Mean weight on Q_g in the last round that merged (eq. 10); None without merging."""
    return next((h.merge["rho_mean"] for h in reversed(history) if h.merge), None)


# clip warnings: most uploads clipped, or (with noise scaled to the clip) almost none
MOSTLY_CLIPPED = 0.9
RARELY_CLIPPED = 0.05
# a noisy run whose pre-clip norm grew this many times over the rounds diverged: its
# uploads are clipped because the noise blew the model up, not because C is mis-set
DIVERGED_GROWTH = 100.0


def clipping_summary(history: list[RoundStats], what: str = "uploads"
                     ) -> dict[str, Any] | None:
    """Mean fraction of uploads clipped and mean pre-clip norm over the rounds, plus a
    warning when most uploads were clipped or (noise being scaled to the clip) almost none.
    None for modes that do not clip. ``what`` names what was clipped (ldp-dpsgd: each
    sampled positive's gradient)."""
    rounds = [h.privacy for h in history if h.privacy.get("frac_clipped") is not None]
    if not rounds:
        return None
    frac = sum(r["frac_clipped"] for r in rounds) / len(rounds)
    norms = [r["mean_pre_clip_norm"] for r in rounds if r.get("mean_pre_clip_norm") is not None]
    norm = sum(norms) / len(norms) if norms else float("nan")
    clip = rounds[-1].get("clip")
    noisy = any(r.get("noise_scale", 0) > 0 for r in rounds)
    warning = None
    firsts = [r["mean_pre_clip_norm"] for r in rounds[:1] if r.get("mean_pre_clip_norm")]
    growth = (rounds[-1].get("mean_pre_clip_norm") or 0.0) / firsts[0] if firsts else 0.0
    if frac > MOSTLY_CLIPPED and noisy and growth > DIVERGED_GROWTH:
        warning = (f"{frac:.0%} of {what} were clipped, but not for want of a larger clip: "
                   f"the mean pre-clip norm grew {growth:.3g}-fold over the rounds (to "
                   f"{rounds[-1]['mean_pre_clip_norm']:.4g}, clip {clip:g}): the model diverged "
                   f"under the noise")
    elif frac > MOSTLY_CLIPPED:
        warning = (f"{frac:.0%} of {what} were clipped (mean pre-clip norm {norm:.4g}, clip "
                   f"{clip:g}): clipping discarded most of each update; a clip near the "
                   f"pre-clip norm keeps more of it (tuning it on these private norms is not "
                   f"itself private)")
    elif noisy and frac < RARELY_CLIPPED:
        warning = (f"only {frac:.0%} of {what} were clipped (mean pre-clip norm {norm:.4g}, "
                   f"clip {clip:g}): the noise is scaled to the clip, so a smaller clip "
                   f"would give the same guarantee with less noise (tuning it on these private "
                   f"norms is not itself private)")
    return {"frac_clipped_mean": frac, "mean_pre_clip_norm": norm, "clip": clip,
            "clipped": what, "warning": warning}


# cold test items: above this share of users, the run's summary carries a warning
MANY_COLD = 0.25


def cold_items_summary(view: RunView) -> dict[str, Any]:
    """The share of users whose test (and validation) item no training positive contains
    (:func:`~fedem_private.data.split.cold_share`), with a warning above :data:`MANY_COLD`:
    their hits can only come from an item the model was never trained towards."""
    test = cold_share(view.split)
    out: dict[str, Any] = {"test_share": test,
                           "val_share": cold_share(view.split, view.split.val_items),
                           "warning": None}
    if test > MANY_COLD:
        why = (" (first-seen order: a user's last items are often ones only that user has)"
               if view.cfg.data.first_seen_order else "")
        out["warning"] = (f"{test:.0%} of the users' test items appear in no training "
                          f"interaction{why}; training meets them only as negatives, so "
                          f"HR@10 mostly measures the other users")
    return out


# select_round -> (metric kind, metric) whose best value picks the reported round
SELECTION_KEYS = {"best-test": ("sampled", "hr@10"), "best-val": ("val", "hr@10"),
                  "best-val-full": ("val_full", "hr@10")}


def selected_round(history: list[RoundStats], rule: str) -> dict[str, Any] | None:
    """The evaluated round a ``select_round`` rule picks (docs/design.md 2a, option 4), or None.

    ``best-test``: the highest sampled test HR@10 (the FedEM and FedRAP code);
    ``best-val``: the highest validation HR@10 (PFedRec, GPFedRec);
    ``best-val-full``: the highest validation HR@10 in full ranking. Ties go to
    the earliest round. Returns ``{"rule", "round", "metrics"}``; the last round
    stays the run's headline (``summary["metrics"]``).
    """
    if rule not in SELECTION_KEYS:
        return None
    kind, name = SELECTION_KEYS[rule]
    best: RoundStats | None = None
    for h in history:
        if h.metrics is None or kind not in h.metrics:
            continue
        if best is None or h.metrics[kind][name] > best.metrics[kind][name]:  # type: ignore
            best = h
    if best is None:
        return None
    return {"rule": rule, "round": best.round, "metrics": best.metrics}


def summarise(view: RunView, history: list[RoundStats], wall: float) -> dict[str, Any]:
    """The summary.json content, from the run's read-only view and its round stats."""
    cfg = view.cfg
    last = next((h.metrics for h in reversed(history) if h.metrics), None)
    seconds = [h.seconds for h in history]
    rho = last_merge_rho(history)
    out = {
        "dataset": view.dataset_name,
        "method": cfg.federation.method,
        "backbone": cfg.federation.backbone,
        "codec": cfg.federation.codec,
        "aggregation": cfg.federation.resolved_aggregation,
        "merge": cfg.federation.resolved_merge,
        # mean weight on Q_g in the last round's merge (eq. 10); None without merging
        "merge_rho_mean": rho,
        # the aggregator's figures of the last round (FedMerge: weight entropy, fit MSE)
        "server_stats": next((h.server for h in reversed(history) if h.server), None),
        "protocol": cfg.data.protocol,
        "rounds": view.round,
        "seed": cfg.train.seed,
        "nonce": cfg.train.nonce,
        "n_users": view.n_users,
        "n_items": view.n_items,
        "dropped_users": view.split.dropped_users,
        "seconds_per_round": sum(seconds) / max(len(seconds), 1),
        "seconds_total": wall,
        "metrics": last,
        "privacy": view.privacy_summary(),
        "clipping": clipping_summary(history, "sampled positives' gradients"
                                     if view.dpsgd else "uploads"),
        "communication": communication_summary(history),
        "cold_items": cold_items_summary(view),
        "sampled_candidates": sampled_note(view.split),
        "data": set_aside(view.split, cfg.data.min_user_ratings),
        "version": __version__,
        "not_private": NOT_PRIVATE,
    }
    # chance and MostPop on the users this run evaluated (experiments/outcome.py)
    out["references"] = references(cfg, view.split)
    out["warnings"] = outcome_warnings(view.split, last, out["privacy"],
                                       _evaluated(cfg, view.split))
    if cfg.data.calibrate_to is not None:
        out["population"] = population_record(cfg.data.calibrate_to, cfg.data.data_dir,
                                              cfg.data.users,
                                              taste=cfg.data.population_taste)
    options = protocol_options(cfg)
    if options:  # docs/design.md 2a: the authors' code's options this run used
        out["protocol_label"] = protocol_label(cfg)
        out["protocol_options"] = options
    selected = selected_round(history, cfg.train.select_round)
    if selected is not None:
        if cfg.privacy.mechanism.perturbs:
            selected.update(private=False, note=SELECTION_NOT_PRIVATE)
        out["selected"] = selected
    return out


def _evaluated(cfg: RunConfig, split: Split) -> np.ndarray:
    """The users a run of ``cfg`` evaluates (``train.eval_users``'s sample, or everyone)."""
    return eval_sample(split.n_users, cfg.train.eval_users, cfg.train.seed)


# what summary.json says beside a round selected under a mechanism (issue 65)
SELECTION_NOT_PRIVATE = (
    "not private: the round was chosen by exact (un-noised) validation or test metrics, a "
    "function of every user's held-out item that no mechanism covers; this run's eps holds "
    "for the last round's model, not for the choice of this one")


def communication_summary(history: list[RoundStats]) -> dict[str, float]:
    """Bytes moved (docs/design.md section 11), from each round's counts of the tensors sent.

    ``*_per_client_round``: mean over rounds of the mean per participant (a
    codec's warm-up rounds included); ``*_last_round``: the last round's;
    ``*_total``: over all participants and rounds; ``setup_total``: one-time
    downloads (a FedPEFT codec's E0, codes and hash functions, to every client).
    """
    rounds = [h for h in history if h.comm]
    n = max(len(rounds), 1)
    up = [h.comm["bytes_up"] for h in rounds]
    down = [h.comm["bytes_down"] for h in rounds]
    setup = sum(h.comm.get("bytes_setup", 0.0) for h in rounds)
    return {
        "bytes_up_per_client_round": sum(up) / n,
        "bytes_down_per_client_round": sum(down) / n,
        # the last round's: a FedPEFT codec's steady state, after its warm-up
        "bytes_up_last_round": up[-1] if up else 0.0,
        "bytes_down_last_round": down[-1] if down else 0.0,
        "bytes_up_total": sum(u * h.participants for u, h in zip(up, rounds, strict=True)),
        "bytes_down_total": sum(d * h.participants for d, h in zip(down, rounds, strict=True)),
        "bytes_setup_total": setup,
    }


def execute(cfg: RunConfig, out: str | Path,
            force: bool = False,
            on_round: Callable[[RoundStats], None] | None = None,
            setup: Callable[[Simulation, Path], None] | None = None,
            on_start: Callable[[Simulation], None] | None = None,
            checkpoint: Checkpointing | None = None,
            shards: dict[str, Any] | None = None, live: bool = False) -> dict[str, Any]:
    """Run ``cfg`` and write ``out`` atomically; returns the summary.

    ``setup`` may attach observers (e.g. recording) and write into the run
    directory before the first round. A baseline method (docs/design.md section 14) has no
    rounds: it is fitted and evaluated by
    :func:`~fedem_private.experiments.baseline_run.execute_baseline` (the hooks do not
    apply). ``checkpoint``: the run's state is saved every few rounds and, when a
    checkpoint of this config is there already, the run resumes from it (``on_round`` then
    sees the remaining rounds only; one of another config is refused, or removed with
    ``force``; :mod:`fedem_private.experiments.checkpoint`); it is
    removed once the run directory is written, or once the run diverges (a resumption
    would diverge again). A ``setup`` that attaches observers
    (recording what the server saw) cannot resume one: they would miss the rounds before.
    ``shards``: compute each round's clients in shards on Ray
    (:func:`~fedem_private.experiments.ray_shards.ray_shards`'s keyword arguments,
    ``shards`` and ``address``); the results are the same bits. ``live``: while the rounds
    run, ``metrics.csv`` (rewritten at each evaluation) and ``progress.json`` (the round
    reached, seconds a round, ETA; every round) are kept under ``out``
    (:meth:`~fedem_private.experiments.rundir.RunDir.write_live`).
    """
    if cfg.federation.resolved_method in BASELINE_METHODS:
        if shards is not None:
            raise UserError("--ray-shards shards a federated run's rounds; a baseline has none")
        from fedem_private.experiments.baseline_run import execute_baseline

        return execute_baseline(cfg, out, force=force)
    with RunDir(out, force=force) as writer:  # the temporary folder is made by the with
        resolved = cfg.validate().resolved()
        config = to_toml(to_dict(resolved))
        resumed = (checkpoints.load(checkpoint, config, force) if checkpoint is not None
                   else None)
        if resumed is not None:  # its data is read again, not kept in the checkpoint
            sim = resumed.sim
            sim.attach_split(load_data(resolved)[1])
        else:
            sim = prepare(resolved)
        if setup is not None:
            setup(sim, writer.path)
        if resumed is not None and (sim.observers or sim.aggregate_observers):
            raise UserError(f"{checkpoint.path}: a resumed run cannot record what the server "
                            f"saw (the recording would miss rounds 1-{resumed.round}); "
                            f"remove the checkpoint to run afresh")
        writer.write_text("config.toml", to_toml(to_dict(sim.config)))
        if on_start is not None:
            on_start(sim)
        try:
            with _sharded(sim, shards):
                history, wall, resumes = _rounds(sim, on_round, checkpoint, config, resumed,
                                                 _live_progress(writer) if live else None)
        except Diverged:  # resuming would diverge again, round for round
            if checkpoint is not None:
                checkpoints.discard(checkpoint)
            raise
        rows = [h.row() for h in history if h.metrics is not None]
        writer.write_csv("metrics.csv", rows)
        summary = summarise(sim.view, history, wall)
        resumption = checkpoints.summary(resumes)
        if resumption is not None:
            summary["checkpoint"] = resumption
        writer.write_json("summary.json", summary)
        writer.write_json("privacy_ledger.json", sim.view.privacy_ledger())
        if sim.cfg.train.eval_users and sim.last_ranks is not None:
            # each sampled user's ranks at the last evaluation, for paired comparisons
            writer.write_csv("ranks.csv", sim.last_ranks.per_user(sim.split.source_users))
        moved = writer.commit_or_moved()
    if checkpoint is not None:
        checkpoints.discard(checkpoint)
    del sim, resumed  # they sit in reference cycles: collect them now, not some runs later
    release_between_runs()
    if moved is not None:  # finished and kept, beside the folder another run took
        raise moved
    return summary



def _sharded(sim: Simulation, shards: dict[str, Any] | None
             ) -> contextlib.AbstractContextManager[object]:
    """The context the rounds run in: Ray shards computing the rounds' clients
    (:mod:`fedem_private.experiments.ray_shards`), or nothing."""
    if shards is None:
        return contextlib.nullcontext()
    from fedem_private.experiments.ray_shards import ray_shards

    return ray_shards(sim, **shards)


def _live_progress(writer: RunDir) -> Callable[[list[RoundStats], int, float], None]:
    """What :func:`_rounds` calls after each round to keep the run's progress under its
    folder: ``progress.json`` every round, ``metrics.csv`` too after an evaluation."""

    def write(history: list[RoundStats], rounds: int, seconds: float) -> None:
        last = history[-1]
        evaluated = next((h.round for h in reversed(history) if h.metrics is not None), None)
        per_round = seconds / max(last.round, 1)
        writer.write_live({"state": "running", "round": last.round, "rounds": rounds,
                           "evaluated_round": evaluated, "seconds": seconds,
                           "seconds_per_round": per_round,
                           "eta_seconds": per_round * (rounds - last.round)},
                          [h.row() for h in history if h.metrics is not None]
                          if last.metrics is not None else None)

    return write


def _rounds(sim: Simulation, on_round: Callable[[RoundStats], None] | None,
            checkpoint: Checkpointing | None, config: str,
            resumed: checkpoints.Resumed | None,
            live: Callable[[list[RoundStats], int, float], None] | None = None
            ) -> tuple[list[RoundStats], float, list[dict[str, Any]]]:
    """The run's remaining rounds: every round's stats (those before a resumption
    included), the seconds they took (writing checkpoints and progress not counted) and the
    resumptions; a checkpoint written when due, and ``live`` called after each round with
    the stats so far, the rounds planned and the seconds so far."""
    history = [] if resumed is None else resumed.history
    before = 0.0 if resumed is None else resumed.seconds
    resumes = [] if resumed is None else resumed.resumes
    rounds = sim.cfg.train.rounds
    t0, saving = time.perf_counter(), 0.0  # the seconds spent writing checkpoints, progress

    def wall() -> float:
        return before + time.perf_counter() - t0 - saving

    while sim.state.round < rounds:
        stats = sim.step()
        history.append(stats)
        if live is not None:
            t_live = time.perf_counter()
            live(history, rounds, wall())
            saving += time.perf_counter() - t_live
        if on_round is not None:
            on_round(stats)
        if checkpoint is not None and checkpoint.due(stats.round, rounds):
            t_save = time.perf_counter()
            checkpoints.save(checkpoint, config, sim, history, wall(), resumes)
            saving += time.perf_counter() - t_save
    return history, wall(), resumes
