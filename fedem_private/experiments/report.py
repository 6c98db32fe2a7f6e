"""``fedem-private report DIR``: Markdown tables and PNG plots over every run under DIR.

Several sources may be combined: folders of run directories and
``results.csv`` files kept from earlier sweeps (a run named twice keeps
the last source's row). Writes into the output folder (DIR unless told
otherwise; required when combining): ``results.csv``
(one row per run, :mod:`fedem_private.experiments.results`), ``report.md`` (mean ± std
over seeds per dataset, protocol, method variant, privacy mode and epsilon,
plus the accounting table) and, per dataset, ``<dataset>-hr10_vs_eps.png``,
``<dataset>-auc_vs_eps.png`` and ``<dataset>-frontier.png`` (the last two
only when attacks were scored).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from fedem_private.errors import UserError
from fedem_private.experiments import floors as ladder
from fedem_private.experiments.naming import check_report_sources, plural
from fedem_private.experiments.results import (
    BOUNDS,
    CONFIG_PREFIX,
    RESULTS_FILE,
    collect,
    combine,
    read_results,
)
from fedem_private.experiments.rundir import write_text_atomic
from fedem_private.privacy.registry import capability, no_privacy
from fedem_private.simulation.config_io import LATER_FIELDS

ERRORS_FILE = "sweep_errors.log"  # written by fedem_private.experiments.sweep
KEYS = ["dataset", "protocol", "variant", "mode", "eps_target"]
REPORT_FILE = "report.md"
# the plots a report writes per dataset: <dataset><suffix>
PLOT_SUFFIXES = ("-hr10_vs_eps.png", "-auc_vs_eps.png", "-frontier.png", "-hr10_vs_bytes.png")
NONE_MARK = "\0none"  # a setting left at None (its default) in a run's resolved config


def attack_names(frame: pd.DataFrame) -> list[str]:
    """Attacks with an AUC column, e.g. ``projection`` from ``projection_auc``."""
    names = []
    for c in frame.columns:
        name = c[: -len("_auc")]
        # <attack>_vs_any_auc is the same attack under a secondary membership relation
        if c.endswith("_auc") and not re.search(r"_vs_[a-z]+$", name) \
                and pd.api.types.is_numeric_dtype(frame[c]) and frame[c].notna().any():
            names.append(name)
    return names


def _audit(values: pd.Series) -> str:
    vals = [v for v in values if isinstance(v, str) and v]
    if not vals:
        return ""
    return "FAIL" if "FAIL" in vals else "pass"


def _short(column: str) -> str:
    return column.removeprefix(CONFIG_PREFIX).rsplit(".", 1)[-1]


def _setting_text(value: object, column: str = "") -> str:
    """A setting's value in a row label. A value missing from a known config is either a
    field left out of the run's identity while at its default (``LATER_FIELDS``: its value
    is that default) or None (shown as "default": the method or mechanism chooses)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "?"  # a row of an older results.csv, whose config is not known
    if value == NONE_MARK:
        value = _LATER_DEFAULTS.get(column.removeprefix(CONFIG_PREFIX))
        if value is None:
            return "default"
    return f"{value:g}" if isinstance(value, float) else str(value)


# the defaults of the fields a run's identity leaves out while they hold them
_LATER_DEFAULTS = {".".join(path): default for path, default in LATER_FIELDS.items()}


def split_settings(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Keep runs of different settings apart: the ``cfg.*`` columns that differ between
    rows which would otherwise be averaged together.

    Returns the frame with those settings appended to ``variant`` (e.g.
    ``fedmf [rounds=12]``), so every table row and plot line is one setting,
    and the names of the columns that differ. A row's label names only the
    settings that differ among its method variant's runs (FedMF's rounds, not
    the clip that differs only between FedEM's runs). Raises
    :class:`UserError` when two rows of one setting share a seed (they would be
    averaged as two seeds).
    """
    known = frame["config_id"].notna() if "config_id" in frame.columns else None
    candidates = [c for c in frame.columns if c.startswith(CONFIG_PREFIX)]
    work = frame.copy()
    for c in candidates:
        if known is not None:
            # a row with a config_id and no value here had None (the default) in its config
            work[c] = work[c].astype(object).where(work[c].notna() | ~known, NONE_MARK)
    groups = work.groupby(KEYS, dropna=False, sort=False)
    split = [c for c in candidates if groups[c].nunique(dropna=True).max() > 1]
    out = frame.copy()
    if split:
        # per row: the settings that vary among its variant's runs (all modes and budgets,
        # so that a variant's lines keep one label, its no-DP points included)
        by_variant = work.groupby(["dataset", "protocol", "variant"], dropna=False, sort=False)
        varies = by_variant[split].transform("nunique") > 1
        labels = [" [" + ", ".join(f"{_short(c)}={_setting_text(v, c)}" for c, v, keep in
                                   zip(split, values, flags, strict=True) if keep) + "]"
                  for values, flags in zip(work[split].itertuples(index=False),
                                           varies.itertuples(index=False), strict=True)]
        labels = [label if label != " []" else "" for label in labels]
        out["variant"] = out["variant"].astype(str) + pd.Series(labels, index=out.index)
    twice = out.groupby(KEYS, dropna=False)["seed"].apply(lambda s: s.duplicated().any())
    if twice.any():
        where = twice[twice].index[0]
        raise UserError(f"report: two runs of {' / '.join(str(k) for k in where)} share a seed "
                        "and are not told apart by their config (an older results.csv?); "
                        "report them separately")
    return out, split


def aggregate(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds of every numeric column, per KEYS; plus n_seeds and audit."""
    from fedem_private.experiments.report_plots import x_key

    numeric = [c for c in frame.columns if c not in KEYS and c not in ("seed", "rounds")
               and not c.startswith(CONFIG_PREFIX)
               and pd.api.types.is_numeric_dtype(frame[c])
               and not pd.api.types.is_bool_dtype(frame[c])]
    groups = frame.groupby(KEYS, dropna=False, sort=True)
    mean = groups[numeric].mean().add_suffix("_mean")
    std = groups[numeric].std(ddof=1).add_suffix("_std")
    out = pd.concat([mean, std], axis=1)
    out["n_seeds"] = groups["seed"].nunique()
    out["rounds"] = groups["rounds"].max()
    out["audit"] = groups["audit"].agg(_audit)
    if "codec" in frame.columns:
        out["codec"] = groups["codec"].agg(lambda c: c.fillna("full").iloc[0])
    out = out.reset_index()
    out["x_key"] = [x_key(m, e, r) for m, e, r in zip(
        out["mode"], out["eps_target"], out["eps_reported_mean"], strict=True)]
    return out


# ------------------------------------------------------------------------- formatting
def _num(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    fixed = value == 0 or 1e-3 <= abs(value) < 100
    return f"{value:.{digits}f}" if fixed else f"{value:.{digits}g}"


def _pm(row: pd.Series, column: str, digits: int = 3) -> str:
    mean, std = row.get(f"{column}_mean"), row.get(f"{column}_std")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if std is None or math.isnan(std) or row["n_seeds"] < 2 or math.isinf(mean):
        return _num(mean, digits)
    fixed = 1e-3 <= abs(mean) < 100 or mean == 0  # same decimals for the spread as the mean
    return f"{_num(mean, digits)} ± {f'{std:.{digits}f}' if fixed else _num(std, digits)}"


def _eps_label(row: pd.Series) -> str:
    if no_privacy(row["mode"]):
        return "– (no DP)"
    eps = row["eps_target"]
    if isinstance(eps, float) and math.isnan(eps):
        return "–"
    return "∞ (clip only)" if math.isinf(eps) else f"{eps:g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return "\n".join(lines)


def _sort(agg: pd.DataFrame) -> pd.DataFrame:
    none = agg["mode"].map(no_privacy).astype(bool)
    order = agg["eps_target"].fillna(-1.0).where(~none, math.inf)
    return agg.assign(_o=order, _none=none).sort_values(
        ["dataset", "protocol", "variant", "_none", "mode", "_o"], ascending=[
            True, True, True, True, True, False]).drop(columns=["_o", "_none"])


def results_table(agg: pd.DataFrame, attacks: list[str], chance_full: float | None = None,
                  floors: pd.DataFrame | None = None, chance_se: float = 0.0) -> str:
    """Utility, privacy and attack success per (variant, mode, eps) of one dataset/protocol;
    a private model's full HR@10 is judged against DP-MostPop of its relation at its
    epsilon (:func:`~fedem_private.experiments.floors.verdict`) when there is one
    (``floors``: the dataset's DP-MostPop rows; default: this table's), and against chance
    (its runs' own where their summaries give it, else ``chance_full`` ± ``chance_se``)."""
    floors = ladder.part(agg, "floors") if floors is None else floors
    models = ladder.part(agg, "models")
    judged = not floors.empty and bool(models["mode"].map(ladder.floor_mode).notna().any())
    header = ["method", "privacy", "ε target", "seeds", "HR@10 full", "NDCG@10 full",
              "HR@10 sampled", "NDCG@10 sampled", "ε spent (reported)"]
    if judged:
        header.append("full HR@10 vs DP-MostPop, same ε and relation")
    for a in attacks:
        header += [f"{a} AUC", f"{a} TPR@1%FPR", f"{a} ε lower bound"]
    header += ["audit", "s / round"]
    sizes = "bytes_up_last_mean" in agg and bool(agg["bytes_up_last_mean"].notna().any())
    if sizes:
        header.append("KB up / client / round (last)")
    rows = []
    for _, r in _sort(agg).iterrows():
        cells = [r["variant"], r["mode"], _eps_label(r), str(int(r["n_seeds"])),
                 _pm(r, "hr10_full"), _pm(r, "ndcg10_full"), _pm(r, "hr10_sampled"),
                 _pm(r, "ndcg10_sampled"), _eps_spent(r)]
        if judged:
            cells.append(ladder.verdict(r, floors, chance=chance_full, chance_se=chance_se)
                         if r.name in models.index else "")
        for a in attacks:
            cells += [_pm(r, f"{a}_auc"), _pm(r, f"{a}_tpr@1%fpr"),
                      _pm(r, f"{a}_eps_lower_bound", 2)]
        cells += [r["audit"] or "–", _num(r["seconds_per_round_mean"], 2)]
        if sizes:
            kb = r["bytes_up_last_mean"] / 1000.0
            cells.append("–" if math.isnan(kb) else f"{kb:,.1f}")
        rows.append(cells)
    return _table(header, rows)


def _binomial_se(p: float, users: float) -> float:
    """Chance's standard error over ``users`` evaluated users when each hits with
    probability ``p`` (runs whose summaries predate their own chance figure); 0 when
    unknown."""
    if not (0 < p < 1) or not users or not math.isfinite(users) or users < 1:
        return 0.0
    return math.sqrt(p * (1 - p) / users)


def _gap(a: pd.Series, b: pd.Series, column: str = "hr10_full") -> str:
    """How far row ``a``'s mean is above ``b``'s, and whether beyond seed noise
    (:data:`~fedem_private.experiments.floors.NOISE_SE` standard errors of the difference)."""
    diff = a[f"{column}_mean"] - b[f"{column}_mean"]
    var = sum(r[f"{column}_std"] ** 2 / r["n_seeds"] for r in (a, b))
    if not math.isfinite(var) or min(a["n_seeds"], b["n_seeds"]) < 2:
        return f"{diff:+.3f} (one seed: seed noise unknown)"
    se = math.sqrt(var)
    if se == 0:
        return f"{diff:+.3f}"
    beyond = abs(diff) > ladder.NOISE_SE * se
    return (f"{diff:+.3f}, {'beyond' if beyond else 'within'} seed noise "
            f"({abs(diff) / se:.1f} standard errors)")


def _name(r: pd.Series) -> str:
    """A row's method for people, with its privacy and budget (``FedMF under cdp-gaussian
    at ε 8``)."""
    from fedem_private.experiments.display import variant_display

    text = variant_display(str(r["variant"]))
    if no_privacy(r["mode"]):
        return text
    return f"{text} under {r['mode']} at ε {_eps_label(r)}"


def _mostpop_of(rows: pd.DataFrame, refs: pd.DataFrame) -> float | None:
    """MostPop's full HR@10 beside ``rows``: its reference run's, else the mean of the
    figure every run's summary gives on its own users (``mostpop_hr10_full``)."""
    pop = refs[refs["variant"].map(ladder.method_of) == "mostpop"]
    if not pop.empty:
        return float(pop["hr10_full_mean"].iloc[0])
    if "mostpop_hr10_full_mean" in rows.columns and rows["mostpop_hr10_full_mean"].notna().any():
        return float(rows["mostpop_hr10_full_mean"].mean())
    return None


def verdict_paragraph(agg: pd.DataFrame, chance: dict[str, tuple[float | None, float]]
                      ) -> str:
    """report.md's opening paragraph: per dataset and protocol, the best model without
    privacy and by how much it leads the next method (beyond seed noise or not), the best
    private model and how it stands against DP-MostPop of its relation at its budget
    (:func:`~fedem_private.experiments.floors.verdict`), and each against chance and
    MostPop. ``chance``: per dataset, (chance's full HR@10, its standard error), used where
    a row has no chance figure of its own. Empty when no federated model ran."""
    sentences = []
    for (dataset, protocol), sub in agg.groupby(["dataset", "protocol"], sort=True):
        models = ladder.part(sub, "models")
        models = models[models["hr10_full_mean"].notna()]
        if models.empty:
            continue
        near = agg[(agg["dataset"] == dataset) & (agg["protocol"].map(ladder.comparable)
                                                  == ladder.comparable(protocol))]
        refs, floors = ladder.part(near, "references"), ladder.part(near, "floors")
        fallback, fallback_se = chance.get(dataset, (None, 0.0))
        pop = _mostpop_of(models, refs)
        where = f"{dataset}, protocol `{protocol}`"
        plain = models[models["mode"].map(no_privacy).astype(bool)]
        private = models[~models["mode"].map(no_privacy).astype(bool)
                         & models["eps_target"].map(lambda e: isinstance(e, float)
                                                    and math.isfinite(e))]
        parts = []
        for kind, rows in (("without privacy", plain), ("under privacy", private)):
            if rows.empty:
                continue
            ranked = rows.sort_values("hr10_full_mean", ascending=False)
            best = ranked.iloc[0]
            text = (f"{kind} the best is {_name(best)} at {_pm(best, 'hr10_full')}")
            others = ranked[ranked["variant"] != best["variant"]]
            if not others.empty:
                text += f", {_gap(best, others.iloc[0])} against {_name(others.iloc[0])}"
            c, c_se = ladder.chance_of(best, "hr10_full", fallback, fallback_se)
            refs_text = []
            if c is not None:
                own = best["hr10_full_std"] / math.sqrt(best["n_seeds"]) \
                    if best["n_seeds"] > 1 and math.isfinite(best["hr10_full_std"]) else 0.0
                at = best["hr10_full_mean"] - c <= ladder.NOISE_SE * math.hypot(own, c_se)
                refs_text.append(f"{'at' if at else 'above'} chance ({c:.3f})")
            if pop is not None:
                refs_text.append(f"{best['hr10_full_mean'] - pop:+.3f} against MostPop "
                                 f"({pop:.3f})")
            if kind == "under privacy":
                judged = ladder.verdict(best, floors, chance=fallback, chance_se=fallback_se)
                if not judged.startswith("–"):
                    refs_text.append(f"against DP-MostPop of its relation at that ε: {judged}")
            if refs_text:
                text += "; " + ", ".join(refs_text)
            parts.append(text)
        sentences.append(f"On {where}: " + "; ".join(parts) + ".")
    if not sentences:
        return ""
    return ("**Verdict** (full HR@10, mean ± std over seeds; a difference is beyond seed "
            f"noise past {ladder.NOISE_SE:g} standard errors, and a model within that of a "
            "random ranking is at chance). " + " ".join(sentences))


def _eps_spent(r: pd.Series) -> str:
    """The reported eps; for mode ``paper`` (no accountant) the paper's heuristic, so
    labelled."""
    heuristic = r.get("eps_paper_heuristic_mean")
    if (capability(r["mode"], "paper_heuristic") and heuristic is not None
            and not math.isnan(heuristic)):
        return f"{_num(heuristic)} (paper's heuristic)"
    return _num(r["eps_reported_mean"])


def accounting_table(agg: pd.DataFrame) -> str:
    """Epsilon by each accountant bound per privacy setting (identical across methods)."""
    cols = [f"eps_{b}_mean" for b in BOUNDS]
    sub = _sort(agg).drop_duplicates(["dataset", "mode", "eps_target", "rounds"])
    header = ["dataset", "privacy", "ε target", "rounds", "basic", "advanced", "RDP", "PLD",
              "reported"]
    rows = [[r["dataset"], r["mode"], _eps_label(r), str(int(r["rounds"]))]
            + [_num(r[c]) for c in cols] for _, r in sub.iterrows()]
    return _table(header, rows)


def attack_assumption_notes(frame: pd.DataFrame, attacks: list[str]) -> list[str]:
    """Markdown lines for attacks scored on runs whose backbone they do not model: the runs
    whose ``attacks.json`` record carries an ``assumption`` note (``<attack>_assumption``)."""
    out = []
    for attack in attacks:
        column = f"{attack}_assumption"
        if column not in frame.columns or "backbone" not in frame.columns:
            continue
        noted = frame[frame[column].fillna("").astype(str).str.len() > 0]
        if noted.empty:
            continue
        backbones = ", ".join(sorted(set(noted["backbone"].dropna().astype(str))))
        note = str(noted[column].iloc[0])
        out += [f"**`{attack}` is a heuristic on backbone {backbones}**: {note} (see "
                "`attacks.json`, field `assumption`); its AUC there is an empirical finding, "
                "not a property.", ""]
    return out


def diverged_notes(agg: pd.DataFrame) -> list[str]:
    """Noisy settings whose pre-clip norm grew by orders of magnitude over the rounds (mean over
    seeds): the model diverged under the noise; their clipping is a symptom, not a setting."""
    from fedem_private.experiments.runner import DIVERGED_GROWTH, MOSTLY_CLIPPED

    if "pre_clip_norm_growth_mean" not in agg.columns:
        return []
    notes = []
    for _, r in _sort(agg).iterrows():
        growth, noise = r["pre_clip_norm_growth_mean"], r.get("noise_scale_mean", math.nan)
        if noise > 0 and growth > DIVERGED_GROWTH and r["frac_clipped_mean"] > MOSTLY_CLIPPED:
            notes.append(f"{r['dataset']} / {r['protocol']} / {r['variant']} / {r['mode']} ε "
                         f"{_eps_label(r)}: pre-clip norm grew {growth:.3g}-fold to "
                         f"{_num(r.get('mean_pre_clip_norm_mean', math.nan))} (clip "
                         f"{_num(r['clip_mean'])}), so {r['frac_clipped_mean']:.0%} of uploads "
                         "were clipped")
    return notes


def _diverged(r: pd.Series) -> bool:
    from fedem_private.experiments.runner import DIVERGED_GROWTH

    return (r.get("noise_scale_mean", math.nan) > 0
            and r.get("pre_clip_norm_growth_mean", math.nan) > DIVERGED_GROWTH)


def clipping_notes(agg: pd.DataFrame) -> list[str]:
    """Settings where most uploads were clipped (and the model did not diverge: see
    :func:`diverged_notes`), or almost none while noise is scaled to the clip (last round,
    mean over seeds); thresholds as the runner's warning."""
    from fedem_private.experiments.runner import MOSTLY_CLIPPED, RARELY_CLIPPED

    if "frac_clipped_mean" not in agg.columns:
        return []
    notes = []
    for _, r in _sort(agg).iterrows():
        frac, noise = r["frac_clipped_mean"], r.get("noise_scale_mean", math.nan)
        if isinstance(frac, float) and math.isnan(frac):
            continue
        what = f"{r['dataset']} / {r['protocol']} / {r['variant']} / {r['mode']} ε {_eps_label(r)}"
        norm = _num(r.get("mean_pre_clip_norm_mean", math.nan))
        # ldp-dpsgd clips each sampled positive's gradient, not the upload
        unit = "positives' gradients" if capability(r["mode"], "in_training") else "uploads"
        if frac > MOSTLY_CLIPPED and not _diverged(r):
            notes.append(f"{what}: {frac:.0%} of {unit} clipped (pre-clip norm {norm}, clip "
                         f"{_num(r['clip_mean'])}): clipping discards most of each update")
        elif noise > 0 and frac < RARELY_CLIPPED:
            notes.append(f"{what}: only {frac:.0%} of {unit} clipped (pre-clip norm {norm}, "
                         f"clip {_num(r['clip_mean'])}): the noise, scaled to the clip, is "
                         "larger than the updates need")
    return notes


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


# ---------------------------------------------------------------------------- entry
def load_sources(sources: Sequence[str]) -> tuple[pd.DataFrame, list[Path], int]:
    """Every run named by ``sources``: run-directory folders and ``results.csv`` files.

    Returns the combined table (a run found in several sources keeps the
    last source's row), the folders among the sources (whose
    ``sweep_errors.log`` the report mentions) and the number of rows replaced.
    """
    frames, folders = [], []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_file():
            frames.append(read_results(path))
            continue
        frame = collect(path)
        if frame.empty:
            raise UserError(f"no run directories (with summary.json) under {path}")
        frames.append(frame)
        folders.append(path)
    frame, replaced = combine(frames)
    return frame, folders, replaced


def report_files(folder: Path, tables: bool = True) -> list[Path]:
    """The files an earlier report wrote into ``folder``: report.md, results.csv (unless not
    ``tables``) and its plots (the PNGs report.md shows, and any named like a report's plot)."""
    if not folder.is_dir():
        return []
    names = {REPORT_FILE, *([RESULTS_FILE] if tables else [])}
    if (folder / REPORT_FILE).is_file():
        text = (folder / REPORT_FILE).read_text(encoding="utf-8", errors="replace")
        names.update(n for n in re.findall(r"!\[[^\]]*\]\(([^)/\\]+\.png)\)", text))
    names.update(p.name for p in folder.glob("*.png") if p.name.endswith(PLOT_SUFFIXES))
    return sorted(p for p in (folder / n for n in names) if p.is_file())


def _check_out(out: Path, folders: list[Path], force: bool) -> None:
    """Refuse to write over a report in a folder that is not one of the sources (a source
    folder's own report is derived from its runs and rewritten), unless ``force``."""
    if force or any(out.resolve() == f.resolve() for f in folders):
        return
    old = report_files(out)
    if old:
        raise UserError(f"{out} already holds a report ({', '.join(p.name for p in old[:3])}"
                        f"{', ...' if len(old) > 3 else ''}); pass --force to replace it, or "
                        "give another --out")


def write_report(sources: str | Sequence[str], out_dir: str | None = None,
                 variants: Sequence[str] | None = None, force: bool = False,
                 described_as: Sequence[str] | None = None) -> list[Path]:
    """Write results.csv, report.md and the PNG plots; returns the paths written.

    ``sources`` is a folder of run directories, or several folders and
    ``results.csv`` files to combine (then ``out_dir`` is required). The
    output defaults to the single source folder, whose report is rewritten; a
    report in another folder is replaced only with ``force``. Files of the
    replaced report that the new one does not write (a dataset's plots) are
    removed. ``variants`` keeps only the runs of those method variants (e.g.
    ``["fedmf", "fedem-em"]``). ``described_as`` names the sources in
    report.md's first line in place of their paths (a caller that combines
    frames through temporary files names where the frames came from).
    """
    from fedem_private.experiments import report_plots as rp

    names = [str(n) for n in ([sources] if isinstance(sources, str | Path) else sources)]
    check_report_sources(names, out_dir)
    frame, folders, replaced = load_sources(names)
    if variants:
        unknown = sorted(set(variants) - set(frame["variant"]))
        if unknown:
            raise UserError(f"--variants: no run of {', '.join(unknown)} in the sources (they "
                            f"hold {', '.join(sorted(set(frame['variant'])))})")
        frame = frame[frame["variant"].isin(list(variants))].reset_index(drop=True)
    out = Path(out_dir if out_dir else names[0]).expanduser()
    _check_out(out, folders, force)
    old = report_files(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create report directory {out}: {exc.strerror}") from None
    if replaced:
        print(f"report: {plural(replaced, 'run')} found in several sources; kept the row "
              "from the last source naming each")
    table, (frame, split) = frame, split_settings(frame)  # refuse before writing anything
    results = out / RESULTS_FILE
    write_text_atomic(results, table.to_csv(index=False))
    written = [results]
    if split:
        print(f"report: runs differ in {', '.join(_short(c) for c in split)}; each setting is "
              "its own row and line (shown after the method)")
    agg = aggregate(frame)
    attacks = attack_names(frame)
    seeds = frame.groupby(KEYS, dropna=False)["seed"].nunique()
    n_seeds = str(seeds.min()) if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    shown = list(described_as) if described_as else [f"`{n}`" for n in names]
    md = ["# fedem-private report", "",
          f"{plural(len(frame), 'run')} from {', '.join(shown)}; values are "
          "mean ± std over seeds "
          f"({n_seeds} per setting). HR@10 / NDCG@10 of each client's own model on its "
          "held-out item; *full* ranks it against every item the client did not train on, "
          "*sampled* against 99 sampled negatives.", ""]
    chances = {}
    for dataset in frame["dataset"].unique():
        rows = frame[frame["dataset"] == dataset]
        items, users = rows["n_items"].mean(), (rows["n_users"].mean() if "n_users" in rows
                                                else math.nan)
        p = 10.0 / items if items > 10 else None
        chances[dataset] = (p, _binomial_se(p, users) if p is not None else 0.0)
    opening = verdict_paragraph(agg, chances)
    if opening:
        md[2:2] = [opening, ""]  # the report opens with its verdict
    if split:
        md += ["Runs differ in " + ", ".join(f"`{c.removeprefix(CONFIG_PREFIX)}`" for c in split)
               + ": they are not averaged together; each setting is its own row and line, "
               "labelled after the method (e.g. `[rounds=12]`).", ""]
    for folder in folders:
        if (folder / ERRORS_FILE).is_file():
            md += [f"**Some grid points failed in the last sweep** and are missing below; "
                   f"see `{(folder / ERRORS_FILE).as_posix()}`.", ""]
    notes = clipping_notes(agg)
    if notes:
        print(f"report: warning: clipping looks mis-set in {plural(len(notes), 'setting')} "
              f"(see {REPORT_FILE})", file=sys.stderr)
        md += ["**Clipping looks mis-set** (last round, mean over seeds; choosing the clip "
               "from these private norms is not itself private):", ""]
        md += [f"- {n}" for n in notes] + [""]
    diverged = diverged_notes(agg)
    if diverged:
        md += ["**Diverged under the noise**: the pre-clip norm of the uploads grew by orders of "
               "magnitude over the rounds (first to last evaluated round, mean over seeds), "
               "so most were clipped whatever the clip; a larger clip would not help:", ""]
        md += [f"- {n}" for n in diverged] + [""]
    md += attack_assumption_notes(frame, attacks)
    if not attacks:
        md += ["No attack scores found (no `attacks.json` in the run directories), so the "
               "attack plots are left out.", ""]
    for dataset in sorted(frame["dataset"].unique()):
        sub = agg[agg["dataset"] == dataset]
        n_items = frame.loc[frame["dataset"] == dataset, "n_items"].mean()
        n_users = (frame.loc[frame["dataset"] == dataset, "n_users"].mean()
                   if "n_users" in frame.columns else math.nan)
        slug = _slug(dataset)
        plots = [rp.utility_figure(sub, dataset, out / f"{slug}-hr10_vs_eps.png",
                                   10.0 / n_items if n_items > 10 else 0.0, n_seeds)]
        ds_attacks = [a for a in attacks if sub[f"{a}_auc_mean"].notna().any()]
        attacked = ladder.part(sub, "models")
        if ds_attacks:
            plots.append(rp.attack_figure(attacked, dataset, ds_attacks,
                                          out / f"{slug}-auc_vs_eps.png", n_seeds))
            plots.append(rp.frontier_figure(attacked, dataset, ds_attacks,
                                            out / f"{slug}-frontier.png", n_seeds,
                                            ladder.part(sub, "references"),
                                            10.0 / n_items if n_items > 10 else 0.0))
        codecs = sub["codec"].nunique() if "codec" in sub else 1
        if codecs > 1 and sub["bytes_up_last_mean"].notna().any():
            plots.append(rp.bytes_figure(sub, dataset, out / f"{slug}-hr10_vs_bytes.png",
                                         n_seeds))
        written += plots
        md += [f"## {dataset}", ""]
        for protocol in sorted(sub["protocol"].unique()):
            rows = sub[sub["protocol"] == protocol]
            md += [f"Protocol `{protocol}`:", "",
                   results_table(rows, ds_attacks, 10.0 / n_items if n_items > 10 else None,
                                 ladder.part(sub, "floors"),
                                 _binomial_se(10.0 / n_items, n_users)),
                   ""]
            if not ladder.part(rows, "references").empty:
                near = sub[sub["protocol"].map(ladder.comparable) == ladder.comparable(protocol)]
                md += ["The ladder without privacy (mean over seeds; with the runs whose "
                       "round was chosen on validation):", "",
                       _table(["rung", "HR@10 full", "HR@10 sampled"],
                              ladder.ladder_table(near, 10.0 / n_items)), ""]
        md += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    md += ["## Privacy accounting", "",
           "Epsilon spent by the worst-off client under each bound; *reported* is the "
           "smallest valid one. ∞: no noise (clip only, or mode `none`), so no guarantee.",
           "", accounting_table(agg), "",
           "## Reading the table", "",
           "- `ε target`: the total budget the noise was calibrated to; `∞ (clip only)` clips "
           "the upload but adds no noise; mode `none` neither clips nor adds noise.",
           "- Mode `paper` reports the FedEM paper's heuristic ε, not a DP guarantee; "
           "`ldp-touched-rows` is INSECURE at any ε.",
           "- `vs DP-MostPop`: a private model's full HR@10 against popularity released under "
           "the same neighbouring relation and trust model at the same target ε "
           "(cdp-gaussian: central; ldp-laplace and ldp-gaussian: local; ldp-dpsgd: "
           "interaction-local; docs/baselines.md). `beats` / `below`: the difference of the "
           f"means exceeds {ladder.NOISE_SE:g} standard errors over seeds; otherwise `within "
           "noise`; `at chance` when the model is within that many standard errors (the "
           "seeds' and, over the evaluated users, chance's own) of a random ranking's HR@10 "
           "on the same users, whatever the floor. The plots draw the non-private baselines as "
           "horizontal lines and DP-MostPop as a dashed grey curve per architecture.",
           "- `ε spent (reported)` is the total over all rounds; the attacks see one upload, "
           "so their empirical ε lower bound is compared with the per-round ε accounted for "
           "it.",
           "- Attack AUC 0.5 is a random guess. An AUC well below 0.5 is leakage too: the "
           "score ranks members below non-members, and a server that knows the sign flips "
           "it (the frontier plot uses max(AUC, 1 - AUC)). Scores are for the last "
           "recorded round, under "
           "the `positive_vs_sampled` membership relation (positives vs the negatives the "
           "client sampled; `results.csv` also has `<attack>_vs_any_auc`).",
           "- `audit`: `pass` when no empirical ε lower bound exceeds the accounted per-round "
           "ε, `FAIL` when one does (a privacy-layer bug to investigate; bounds on natural "
           "data are estimates, the `canary` audit is the certified one), `–` when the mode "
           "claims no guarantee (nothing to audit).", ""]
    if any("_control_auc" in str(c) for c in agg.columns):
        md[-1:] = ["- `<attack>_control`: under `cdp-gaussian` the attacks see the released "
                   "aggregate, the same for every client, so each is also scored on the "
                   "recorded clients who sat the round out; participants' AUC minus the "
                   "control's is what taking part revealed, the rest is the population's "
                   "signal. No ε bound is judged on an aggregate (the `canary` audit is "
                   "that mechanism's).", ""]
    report = out / REPORT_FILE
    write_text_atomic(report, "\n".join(md))
    for path in set(old) - {report, *written}:  # the old report's, not rewritten
        path.unlink(missing_ok=True)
    return [report, *written]
