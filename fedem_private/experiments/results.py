"""One tidy table over every run directory under a folder (``results.csv``).

One row per run: what ran (dataset, method variant, protocol, privacy mode,
target epsilon, seed), the epsilon spent by each accountant bound, HR@10 /
NDCG@10 under sampled and full ranking, chance's and MostPop's full HR@10 on the run's own
evaluated users (``chance_hr10_full`` with its standard error ``chance_hr10_full_se``,
``mostpop_hr10_full``; empty for runs written before), the attack scores of the last
recorded round (``<attack>_<metric>``, e.g. ``projection_auc``), the audit
verdict and timings. ``guarantee`` is true only for a finite reported
epsilon (a clip-only run, eps = inf, guarantees nothing). Works for sweep
run directories and for single ``fedem-private run`` outputs alike.

Each row also carries the run's resolved config: ``config_id`` (a digest of
the whole resolved config, seed included; recording left out) and one
``cfg.<section>.<key>`` column per setting not already named by the identity
columns (``cfg.train.rounds``, ``cfg.privacy.clip``, ``cfg.data.synthetic.n_users``,
...). Rows are the same run only when their ``config_id`` is the same; the
report separates runs whose settings differ instead of averaging them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from fedem_private.errors import UserError
from fedem_private.experiments.attack_step import ATTACKS_FILE, read_records
from fedem_private.experiments.rundir import write_text_atomic
from fedem_private.experiments.sweep_spec import variant_label
from fedem_private.privacy.registry import no_privacy
from fedem_private.simulation.config import flatten, identity_dict, load_toml, protocol_label

RESULTS_FILE = "results.csv"
PRIMARY_RELATION = "positive_vs_sampled"
SECONDARY_METRICS = ("auc", "tpr@1%fpr", "advantage")
BOUNDS = ("basic", "advanced", "rdp", "pld", "reported")
ID_COLUMNS = ["run", "dataset", "method", "variant", "backbone", "aggregation", "merge",
              "protocol", "mode",
              "eps_target", "seed"]
METRIC_COLUMNS = ["hr10_full", "ndcg10_full", "hr10_sampled", "ndcg10_sampled"]
EPS_COLUMNS = [f"eps_{b}" for b in BOUNDS]
CONFIG_PREFIX = "cfg."
# config keys the identity columns already name (dataset, protocol, variant, mode, eps, seed)
NAMED_KEYS = {"data.dataset", "data.protocol", "federation.method", "federation.aggregation",
              "federation.merge", "privacy.mode", "privacy.epsilon", "train.seed"}
# rows of tables without config columns (results.csv of version 0.1.0) match on these
LEGACY_KEYS = ["dataset", "method", "variant", "aggregation", "merge", "protocol", "mode",
               "eps_target", "seed", "rounds", "clip", "n_users", "n_items"]
TAIL_COLUMNS = ["codec", "bytes_up", "bytes_down", "bytes_up_last", "bytes_total",
                "guarantee", "eps_paper_heuristic", "clip",
                "noise_scale", "noise_to_signal", "frac_clipped",
                "mean_pre_clip_norm", "pre_clip_norm_growth", "rho_mean", "rounds", "n_users",
                "n_items",
                "cold_test_share", "audit",
                "neighbouring", "trust_model", "amplification", "seconds_per_round",
                "seconds_total"]


def find_runs(root: str | Path) -> list[Path]:
    """Run directories (holding ``summary.json``) under ``root``; hidden folders are skipped."""
    base = Path(root)
    if not base.is_dir():
        raise UserError(f"not a directory: {base}")
    runs = []
    for summary in sorted(base.rglob("summary.json")):
        rel = summary.parent.relative_to(base)
        if not any(part.startswith(".") for part in rel.parts):
            runs.append(summary.parent)
    return runs


def _number(value: Any) -> float:
    """Summary JSON numbers, including the strings "inf"/"nan" json_safe writes."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _first_and_last_rows(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return {}, {}
    return (rows[0], rows[-1]) if rows else ({}, {})


def norm_growth(first: dict[str, str], last: dict[str, str]) -> float:
    """The last evaluated round's mean pre-clip norm over the first's (NaN without both)."""
    start, end = _number(first.get("mean_pre_clip_norm")), _number(last.get("mean_pre_clip_norm"))
    return end / start if start > 0 and math.isfinite(end) else math.nan


def _column(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z@%.]+", "_", str(text)).strip("_").lower()


def _scalars(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict | list) or (value is None and key == "round"):
            continue
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, str) and value in ("inf", "-inf", "nan"):
            value = _number(value)
        out[f"{prefix}_{_column(key)}"] = math.nan if value is None else value
    return out


def _primary(relations: dict[str, Any]) -> str:
    """The relation a record's headline columns come from (PRIMARY_RELATION, or the only
    one there is)."""
    return PRIMARY_RELATION if PRIMARY_RELATION in relations else next(iter(relations))


def attack_columns(records: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Flatten the last recorded round of each attack; plus the audit verdict.

    A record's scalar fields become ``<attack>_<field>``. Metrics nested per
    membership relation (``relations``) are flattened from the primary relation
    (``positive_vs_sampled``, IMIA's convention, or the only one there is) as
    ``<attack>_<metric>``, and from any other as ``<attack>_<relation>_<metric>``
    for AUC, TPR at 1% FPR and advantage; a central run's control (the clients
    who sat the round out, ``relations_control``) as ``<attack>_control_<metric>``
    for the same three, from the primary relation. Verdict: ``pass`` when every record
    with an ``audit_ok`` verdict has it true, ``FAIL`` when any is false, empty
    when none has one (nothing to audit, e.g. mode ``none``).
    """
    last: dict[str, dict[str, Any]] = {}
    for rec in records:
        name = str(rec.get("attack", "attack"))
        if name not in last or _number(rec.get("round")) >= _number(last[name].get("round")):
            last[name] = rec
    out: dict[str, Any] = {}
    for name, rec in last.items():
        prefix = _column(name)
        out.update(_scalars(prefix, {k: v for k, v in rec.items() if k != "attack"}))
        relations = rec.get("relations")
        if isinstance(relations, dict) and relations:
            primary = _primary(relations)
            for relation, metrics in relations.items():
                if not isinstance(metrics, dict):
                    continue
                if relation == primary:
                    out.update(_scalars(prefix, metrics))
                else:
                    short = _column(relation.removeprefix("positive_"))
                    out.update(_scalars(f"{prefix}_{short}", {
                        k: metrics.get(k) for k in SECONDARY_METRICS if k in metrics}))
        control = rec.get("relations_control")  # a central run's released aggregate
        if isinstance(control, dict) and control:
            primary = _primary(control)
            if isinstance(control[primary], dict):
                out.update(_scalars(f"{prefix}_control", {
                    k: control[primary].get(k) for k in SECONDARY_METRICS
                    if k in control[primary]}))
    oks = [rec["audit_ok"] for rec in records if rec.get("audit_ok") is not None]
    verdict = "" if not oks else ("pass" if all(bool(v) for v in oks) else "FAIL")
    return out, verdict


def config_columns(cfg: Any) -> dict[str, Any]:
    """``config_id`` and the ``cfg.*`` setting columns of a resolved config."""
    values = identity_dict(cfg)
    blob = json.dumps(values, sort_keys=True, default=str)
    out: dict[str, Any] = {"config_id": hashlib.sha256(blob.encode()).hexdigest()[:16]}
    for key, value in sorted(flatten(values).items()):
        if key not in NAMED_KEYS:
            out[CONFIG_PREFIX + key] = value
    return out


def run_row(run: Path, root: Path) -> dict[str, Any]:
    """One results row for the run directory ``run``."""
    summary = json.loads((run / "summary.json").read_text())
    cfg = load_toml(run / "config.toml") if (run / "config.toml").is_file() else None
    privacy = summary.get("privacy") or {}
    mode = privacy.get("mode", cfg.privacy.mode if cfg else "none")
    eps_target = math.nan
    if cfg is not None and cfg.privacy.epsilon is not None:
        eps_target = cfg.privacy.epsilon
    elif cfg is not None and cfg.federation.resolved_method == "dp-mostpop":
        eps_target = cfg.baseline.epsilon  # a baseline's budget (docs/design.md section 14)
    elif no_privacy(mode):
        eps_target = math.inf
    metrics = summary.get("metrics") or {}
    row: dict[str, Any] = {
        "run": run.relative_to(root).as_posix() if run != root else run.name,
        "dataset": summary.get("dataset"),
        "method": summary.get("method"),
        "variant": variant_label(cfg.federation) if cfg else summary.get("method"),
        "backbone": summary.get("backbone") or "mf",
        "aggregation": summary.get("aggregation"),
        "merge": summary.get("merge"),
        # the protocol and the docs/design.md 2a options it ran with, e.g. paper+min10+sharedneg
        "protocol": protocol_label(cfg) if cfg else summary.get("protocol"),
        "mode": mode,
        "eps_target": eps_target,
        "seed": summary.get("seed"),
    }
    for kind in ("full", "sampled"):
        values = metrics.get(kind) or {}
        row[f"hr10_{kind}"] = _number(values.get("hr@10"))
        row[f"ndcg10_{kind}"] = _number(values.get("ndcg@10"))
    refs = summary.get("references") or {}  # on the run's own evaluated users
    chance = (refs.get("chance") or {}).get("full") or {}
    row["chance_hr10_full"] = _number(chance.get("hr@10"))
    row["chance_hr10_full_se"] = _number(chance.get("hr@10_se"))
    row["mostpop_hr10_full"] = _number(((refs.get("mostpop") or {}).get("full") or {}).get(
        "hr@10"))
    selected = summary.get("selected")
    if isinstance(selected, dict):  # docs/design.md 2a, option 4: the selected round
        row["selected_rule"] = selected.get("rule")
        row["selected_round"] = selected.get("round")
        for kind in ("full", "sampled", "val", "val_full"):
            values = (selected.get("metrics") or {}).get(kind) or {}
            if values:
                row[f"hr10_{kind}_selected"] = _number(values.get("hr@10"))
                row[f"ndcg10_{kind}_selected"] = _number(values.get("ndcg@10"))
    eps = privacy.get("epsilon") if isinstance(privacy.get("epsilon"), dict) else {}
    no_noise = no_privacy(mode) or _number(privacy.get("noise_scale")) == 0
    for bound in BOUNDS:
        value = _number(eps.get(bound))
        # without noise there is no finite guarantee, whatever the summary writes (null)
        row[f"eps_{bound}"] = math.inf if no_noise and math.isnan(value) else value
    if isinstance(privacy.get("epsilon_aggregator"), dict):
        # cdp-gaussian: eps_* above are against observers of the released models (amplified
        # by sampling); this is against the aggregator (no amplification, worst client)
        agg = _number(privacy["epsilon_aggregator"].get("reported"))
        row["eps_aggregator"] = math.inf if no_noise and math.isnan(agg) else agg
        row["sample_rate"] = _number(privacy.get("sample_rate"))
        adaptive = privacy.get("adaptive_clip") or {}
        # adaptive clipping: the target quantile and the clip the last round ended on
        row["clip_quantile"] = _number(adaptive.get("quantile"))
        row["clip_final"] = _number(adaptive.get("final_clip"))
        canary = privacy.get("canary_audit") or {}
        if canary:
            # the one-shot canary audit: each view's estimate, and whether a view was flagged
            views = canary.get("views") or {}
            for view in ("aggregator", "observer"):
                row[f"canary_eps_hat_{view}"] = _number((views.get(view) or {}).get("eps_hat"))
            row["canary_ok"] = bool(canary.get("ok"))
    first, last = _first_and_last_rows(run / "metrics.csv")
    attacks, verdict = attack_columns(read_records(run / ATTACKS_FILE) or [])
    comm = summary.get("communication") or {}
    row.update({
        "codec": summary.get("codec") or "full",
        # mean bytes per client per round, up and down; all bytes moved, setup included
        "bytes_up": _number(comm.get("bytes_up_per_client_round")),
        "bytes_down": _number(comm.get("bytes_down_per_client_round")),
        "bytes_up_last": _number(comm.get("bytes_up_last_round")),
        "bytes_total": (_number(comm.get("bytes_up_total")) + _number(comm.get("bytes_down_total"))
                        + _number(comm.get("bytes_setup_total"))),
        "guarantee": bool(privacy.get("guarantee", False))
        and math.isfinite(row["eps_reported"]),
        "clip": _number(privacy.get("clip")),
        "noise_scale": _number(privacy.get("noise_scale")),
        "noise_to_signal": _number((privacy.get("noise_to_signal") or {}).get("mean_over_rounds")),
        "frac_clipped": _number(last.get("frac_clipped")),
        "mean_pre_clip_norm": _number(last.get("mean_pre_clip_norm")),
        # how many times the pre-clip norm grew from the first evaluated round to the last
        "pre_clip_norm_growth": norm_growth(first, last),
        # mode paper: the FedEM paper's own eps (worst client, summed), NOT a guarantee
        "eps_paper_heuristic": _number((privacy.get("paper_heuristic") or {}).get(
            "epsilon_summed_worst_client")),
        "rho_mean": _number(summary.get("merge_rho_mean")),
        "rounds": summary.get("rounds"),
        "n_users": summary.get("n_users"),
        "n_items": summary.get("n_items"),
        # users whose test item no training positive has (empty for runs written before)
        "cold_test_share": _number((summary.get("cold_items") or {}).get("test_share")),
        "audit": verdict,
        "neighbouring": privacy.get("neighbouring"),
        "trust_model": privacy.get("trust_model"),
        "amplification": privacy.get("amplification"),
        "seconds_per_round": _number(summary.get("seconds_per_round")),
        "seconds_total": _number(summary.get("seconds_total")),
    })
    if cfg is not None:
        row.update(config_columns(cfg))
    row.update(attacks)
    return row


def collect(root: str | Path) -> pd.DataFrame:
    """All runs under ``root`` as one DataFrame (columns: see the module docstring)."""
    base = Path(root)
    rows = []
    for run in find_runs(base):
        try:
            rows.append(run_row(run, base))
        except (OSError, ValueError, KeyError, UserError) as exc:
            raise UserError(f"cannot read run directory {run}: {exc}") from None
    return _ordered(pd.DataFrame(rows))


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """The standard column order: identity, metrics, epsilon, tail, then the rest sorted."""
    columns = ID_COLUMNS + METRIC_COLUMNS + EPS_COLUMNS + TAIL_COLUMNS
    extra = sorted(c for c in frame.columns if c not in columns)
    return frame.reindex(columns=columns + extra)


def read_results(path: str | Path) -> pd.DataFrame:
    """A ``results.csv`` written earlier by ``sweep`` or ``report``, as :func:`collect` gives it.

    Lets a report combine runs whose directories are elsewhere (another
    machine, a deleted scratch folder) with fresh ones. Raises
    :class:`UserError` when the file is missing, unreadable or lacks the
    identity columns (``run``, ``dataset``, ..., ``seed``).
    """
    file = Path(path)
    try:
        frame = pd.read_csv(file)
    except FileNotFoundError:
        raise UserError(f"no such file or directory: {file}") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {file} as a results table: {exc}") from None
    if "backbone" not in frame.columns and "method" in frame.columns:
        # tables written before backbones were a part (version 0.1.0): every method then
        # was an MF method, so its backbone is the method's own
        from fedem_private.simulation.config import METHOD_BACKBONE

        frame.insert(frame.columns.get_loc("variant") + 1 if "variant" in frame.columns
                     else len(frame.columns), "backbone",
                     frame["method"].map(lambda m: METHOD_BACKBONE.get(m, "mf")))
    missing = [c for c in ID_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{file} is not a fedem-private results.csv (no column "
                        f"{', '.join(missing)})")
    if frame.empty:
        raise UserError(f"{file} holds no runs")
    return _ordered(frame)


def same_run_key(frame: pd.DataFrame) -> pd.Series:
    """Per row, what identifies its run: its ``config_id``, or (a row of an older table
    without one) its :data:`LEGACY_KEYS` and every ``cfg.*`` setting it records.

    Never the ``run`` path: two sweeps may use the same relative paths for
    different configs. The settings keep apart runs that differ only in them (a
    baseline with fixed and with tuned settings), which the legacy keys alone merge.
    """
    legacy = [c for c in LEGACY_KEYS if c in frame.columns]
    legacy += sorted(c for c in frame.columns if c.startswith(CONFIG_PREFIX))
    described = (frame[legacy].apply(lambda column: column.map(str)).agg("|".join, axis=1)
                 if legacy else pd.Series("", index=frame.index))
    if "config_id" not in frame.columns:
        return "legacy:" + described
    ids = frame["config_id"]
    return ("id:" + ids.astype(str)).where(ids.notna(), "legacy:" + described)


def combine(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, int]:
    """Stack results tables; the same run (same resolved config) found twice keeps its last row.

    Returns the combined table and how many rows were replaced by a later
    table's row for the same run (see :func:`same_run_key`).
    """
    parts = [f for f in frames if not f.empty]
    if not parts:
        return _ordered(pd.DataFrame(columns=ID_COLUMNS)), 0
    stacked = pd.concat(parts, ignore_index=True)
    kept = stacked.loc[~same_run_key(stacked).duplicated(keep="last")]
    kept = kept.reset_index(drop=True)
    return _ordered(kept), len(stacked) - len(kept)


def write_results(root: str | Path, out: str | Path | None = None) -> Path:
    """Write ``results.csv`` (into ``root`` unless ``out`` names a folder); returns its path."""
    frame = collect(root)
    path = Path(out or root) / RESULTS_FILE
    write_text_atomic(path, frame.to_csv(index=False))
    return path
