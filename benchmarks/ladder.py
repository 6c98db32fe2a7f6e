"""The accuracy ladder (issue 42, docs/design.md section 14): chance, the popularity floor, the
private floor (DP-MostPop per architecture), the centralised ceilings and the federated
models, on one split, protocol (``strict``) and evaluation.

    python -m benchmarks.ladder --dataset ml-100k --seeds 0 1 2 \\
        --out benchmarks/results/ladder

Every rung is a run directory under ``runs/ladder/<dataset>/`` written through the
public API (:func:`fedem_private.run`), so it is resumable: a rung whose
``summary.json`` exists is not run again (if its config differs from the rung's, say a
tuned file changed since, the ladder stops and names the keys), and a rung killed part way
resumes from its checkpoint (every 10 rounds). The run directories are not committed, but
``<out>/<dataset>/results.csv`` is: a rung with no run directory here and a row there (a
run finished in an earlier checkout) is read from its row and not run again, unless the
row was run with another setting than the rung's (a tuned file that changed since: the row
is dropped and the rung runs again), and a run directory here supersedes its row.
Writes ``<out>/<dataset>.md`` (the table),
``<out>/<dataset>-tuning.md`` (the validation grids) and ``<out>/<dataset>/results.csv``
(one row per run, as ``fedem-private report`` reads it).

Settings. FedMF and FedEM run their presets' defaults for ``--rounds`` rounds (100:
the paper's), evaluated at the last round. The baselines run twice: with fixed settings
(the federated defaults for centralised MF; EASE lambda 500; ALS 64 factors) and with
settings chosen on the validation item of seed 0 (sampled validation HR@10 over a small
grid; never on test), then run on every seed. DP-MostPop uses k = 50, delta = 1e-5,
fixed in advance, at eps 0.1 to 64 under each architecture (central, local, interaction,
interaction-local). The private FedMF rungs (``--only private``) run under ``cdp-gaussian``
and ``ldp-dpsgd`` at eps 1, 4, 16, 64 with settings fixed in advance
(:data:`PRIVATE_FIXED`: the architectures' headline settings) and, with ``--tuned
MODE=best.toml``, with the settings ``fedem-private tune`` chose on validation (a private
tuning at one eps, reused at every eps; its cost is not accounted). ``--accounted DIR``
runs the choice of a private search whose cost is accounted (``[tune.private]``) at its
own eps, labelled with the whole pipeline's eps from its ``privacy.json``.
``--report DATASET ...`` writes the combined
report (``<out>/report``). "chance" is the exact expectation of a uniformly random order of each
user's candidates (100 sampled, or every item outside the user's training set and
validation item).
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fedem_private.api import UserError
from fedem_private.experiments import tracking
from fedem_private.experiments.sweep_cli import add_mlflow_argument

# a federated rung's name -> (display name, its config beyond the method's preset)
FEDERATED_RUNGS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedmf": ("FedMF", {}), "fedem": ("FedEM", {}), "pfedrec": ("PFedRec", {}),
    "pfedrec-em": ("PFedRec+EM", {"federation": {"method": "pfedrec", "merge": "em"}}),
}
FEDERATED = tuple(FEDERATED_RUNGS)
# the issue's 0.1, 1, 10 per architecture, and the private federated points' 1, 4, 16, 64
DP_EPSILONS = (0.1, 1.0, 4.0, 10.0, 16.0, 64.0)
ARCHITECTURES = ("central", "local", "interaction", "interaction-local")
PRIVATE_EPSILONS = (1.0, 4.0, 16.0, 64.0)
# the private FedMF points with settings fixed in advance (never tuned on these users):
# benchmarks/specs/privacy/cdp_curve.toml's and benchmarks/specs/privacy/dpsgd.toml's, the
# architectures' headline
PRIVATE_FIXED: dict[str, dict[str, Any]] = {
    "cdp-gaussian": {"train": {"rounds": 40, "eval_every": 10},
                     "privacy": {"mode": "cdp-gaussian", "delta": 1e-5, "sample_rate": 0.2,
                                 "clip": 50.0}},
    "ldp-dpsgd": {"train": {"rounds": 20, "eval_every": 20},
                  "privacy": {"mode": "ldp-dpsgd", "delta": 1e-5}},
}
# validation grids, {method: {setting: values}} (settings of [baseline] or [train])
GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "ease": {"baseline.ease_lambda": (10.0, 50.0, 200.0, 500.0, 1000.0, 3000.0)},
    "als": {"baseline.als_factors": (32, 64, 128), "baseline.als_regularization": (0.01, 1.0),
            "baseline.als_alpha": (1.0, 10.0)},
    "centralised": {"train.lr": (0.1, 0.01, 0.001), "baseline.epochs": (5, 20, 50)},
}
METRICS = ("hr10_sampled", "ndcg10_sampled", "hr10_full", "ndcg10_full")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in a.items()}
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def base_config(dataset: str, data_dir: str, seed: int, method: str) -> dict[str, Any]:
    return {"data": {"dataset": dataset, "data_dir": data_dir, "protocol": "strict"},
            "train": {"seed": seed}, "federation": {"method": method}}


CHECKPOINT_EVERY = 10  # rounds between a rung's checkpoints (a killed ladder resumes)


def changed_keys(path: Path, cfg: dict[str, Any]) -> list[str]:
    """The dotted keys where the finished run in ``path`` differs from ``cfg`` (resolved;
    both as a run's identity, recording aside)."""
    from fedem_private.api import resolve_config
    from fedem_private.experiments.results import config_columns

    want = config_columns(resolve_config(cfg))
    have = config_columns(resolve_config(path / "config.toml"))
    keys = {*want, *have} - {"config_id"}
    return sorted(k.removeprefix("cfg.") for k in keys if want.get(k) != have.get(k))


def ensure(path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run ``cfg`` into ``path`` unless it is finished there; its summary. A run killed
    part way resumes from its checkpoint, ``<path>.checkpoint``, when the ladder is run
    again. A finished run of another config (a tuned file that changed since) stops the
    ladder with the keys that differ: neither reused nor silently replaced."""
    import fedem_private as fp

    if (path / "summary.json").is_file():
        changed = changed_keys(path, cfg)
        if changed:
            raise SystemExit(f"ladder: {path} was run with another config ({', '.join(changed[:5])}"
                             f"); remove it to run this rung again")
    else:
        print(f"ladder: {path}", file=sys.stderr, flush=True)
        fp.run(cfg, out=path, force=True, checkpoint_every=CHECKPOINT_EVERY)
    return json.loads((path / "summary.json").read_text())


def recorded(out: Path, dataset: str) -> dict[str, dict[str, Any]]:
    """The rows of ``<out>/<dataset>/results.csv`` by run name (empty without the file):
    the rungs finished in an earlier checkout, whose run directories are gone."""
    import pandas as pd

    path = out / dataset / "results.csv"
    if not path.is_file():
        return {}
    frame = pd.read_csv(path)
    return {str(row["run"]): row for row in frame.to_dict("records")}


def recorded_tuning(rows: dict[str, dict[str, Any]], seed: int) -> dict[str, dict[str, Any]]:
    """The baselines' validation choices (:func:`tune`'s settings) of an earlier checkout,
    read back from its recorded ``<method>-tuned-seed<seed>`` rows, so that a table
    written without the grids' run directories (``--no-tune``, or ``--only table`` on a
    fresh checkout) keeps their rungs. A grid value equal to the config's default is not
    a column of the row: it reads as the default."""
    import dataclasses

    from fedem_private.api import resolve_config

    sections = dataclasses.asdict(resolve_config())  # the defaults, section by section
    defaults = {f"{name}.{key}": value for name, fields in sections.items()
                if isinstance(fields, dict) for key, value in fields.items()}
    out = {}
    for method, grid in GRIDS.items():
        row = rows.get(f"{method}-tuned-seed{seed}")
        if row is None:
            continue
        setting = {}
        for key, values in grid.items():
            value = row.get(f"cfg.{key}")
            if value is None or (isinstance(value, float) and math.isnan(value)):
                value = defaults[key]
            setting[key] = next((v for v in values if v == value), value)
        out[method] = setting
    return out


def stale_tuned_rows_dropped(rows: dict[str, dict[str, Any]],
                             recorded: dict[str, dict[str, Any]],
                             chosen: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``rows`` without the recorded ``<method>-tuned-seed*`` rows of a baseline whose grid
    ran here and chose another setting than the recorded one: those rows measured the old
    choice, so its rungs run again rather than standing under the new label."""
    changed = {m for m, setting in chosen.items() if m in recorded and recorded[m] != setting}
    return {name: row for name, row in rows.items()
            if not any(name.startswith(f"{m}-tuned-seed") for m in changed)}


def unrunnable(todo: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per reason a rung in ``todo`` would be refused by the config's own checks
    (say FedEM's preset, similarity aggregation, under a central mechanism), naming the
    rungs it stops; empty when every rung resolves. Checked before any rung runs, so a
    ladder never stops part way on a setting it could have refused at the start."""
    from fedem_private.api import UserError, resolve_config

    reasons: dict[str, list[str]] = {}
    for name, cfg in todo:
        try:
            resolve_config(cfg)
        except UserError as err:
            reasons.setdefault(str(err), []).append(name)
    return [f"{len(names)} rung(s) cannot run ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}): {reason}"
            for reason, names in reasons.items()]


def recorded_changes(row: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """The dotted keys where a recorded ``results.csv`` row was run with another setting
    than its rung's ``cfg`` (resolved), say a tuned file that changed since the row was
    written. Only the keys the row has a value for are compared: a column that did not
    exist when the row was written (empty there) is not a difference."""
    from fedem_private.api import resolve_config
    from fedem_private.experiments.results import config_columns

    out = []
    for column, want in config_columns(resolve_config(cfg)).items():
        have = row.get(column)
        if column == "config_id" or have is None or (isinstance(have, float) and math.isnan(have)):
            continue
        if isinstance(want, bool) or isinstance(have, bool):
            same = str(want).lower() == str(have).lower()
        elif isinstance(want, (int, float)) and isinstance(have, (int, float)):
            same = math.isclose(float(want), float(have), rel_tol=1e-12, abs_tol=0.0)
        else:
            same = str(want) == str(have)
        if not same:
            out.append(column.removeprefix("cfg."))
    return out


def stale_recorded_rows_dropped(rows: dict[str, dict[str, Any]],
                                plan: list[tuple[str, str, dict[str, Any]]]
                                ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``rows`` without the recorded rows of rungs whose setting changed since (see
    :func:`recorded_changes`), and one ``name (keys)`` line per dropped row: a row
    measured the old setting, so it never stands under the rung's label; the rung runs
    again (or, under ``--only table``, is left out of the table until it does)."""
    kept, stale = dict(rows), []
    for _, name, cfg in plan:
        if name not in rows:
            continue
        changed = recorded_changes(rows[name], cfg)
        if changed:
            del kept[name]
            stale.append(f"{name} ({', '.join(changed[:5])})")
    return kept, stale


def _finished(runs: Path, name: str, rows: dict[str, dict[str, Any]]
              ) -> dict[str, Any] | None:
    """A rung's figures, {METRICS..., "eps", "seconds"}: from its run directory here, else
    from its recorded row; None if neither has it."""
    path = runs / name / "summary.json"
    if path.is_file():
        s = json.loads(path.read_text())
        out = {m: s["metrics"][m.split("_")[1]][m.split("_")[0].replace("10", "@10")]
               for m in METRICS}
        eps = ((s.get("privacy") or {}).get("epsilon") or {}).get("reported")
        return {**out, "eps": eps, "seconds": s.get("seconds_total") or math.nan}
    row = rows.get(name)
    if row is None:
        return None
    eps = row.get("eps_reported")
    return {**{m: float(row[m]) for m in METRICS},
            "eps": None if eps is None or not np.isfinite(eps) else float(eps),
            "seconds": float(row.get("seconds_total", math.nan))}


def _label(setting: dict[str, Any]) -> str:
    return ",".join(f"{k.split('.')[-1]}={v:g}" for k, v in setting.items())


SELECT_BY = {"sampled": "val", "full": "val_full"}  # --select-by: the summary's metrics key


def tune(runs: Path, dataset: str, data_dir: str, method: str, seed: int,
         by: str = "sampled") -> tuple[dict[str, Any], list[tuple[str, float, float, float]]]:
    """The grid's setting with the best validation HR@10 on ``seed``, its validation item
    ranked among 100 sampled candidates (``by="sampled"``) or among every item
    (``"full"``); ties: the first in grid order. Also every (setting, sampled validation
    HR@10, sampled validation NDCG@10, full validation HR@10)."""
    grid = GRIDS[method]
    rows, best, best_hr = [], {}, -1.0
    for values in itertools.product(*grid.values()):
        setting = dict(zip(grid, values, strict=True))
        over = _nest({**setting, "train.select_round": "best-val"})  # ranks the val item
        cfg = _merge(base_config(dataset, data_dir, seed, method), over)
        s = ensure(runs / "tune" / f"{method}-{_label(setting)}-seed{seed}", cfg)
        val, full = s["metrics"]["val"], s["metrics"].get("val_full") or {}
        rows.append((_label(setting), val["hr@10"], val["ndcg@10"],
                     full.get("hr@10", math.nan)))
        hr = s["metrics"][SELECT_BY[by]]["hr@10"]
        if hr > best_hr:
            best, best_hr = setting, hr
    return best, rows


def write_tuning(path: Path, sections: list[str]) -> None:
    """Write the grids' sections (each starting ``### <method> ``) into ``path``, keeping
    the sections of the grids that did not run here (``--grids``), in :data:`GRIDS` order."""
    def method(section: str) -> str:
        return section.split(maxsplit=2)[1]

    kept = {}
    if path.is_file():
        for part in path.read_text().split("### ")[1:]:
            kept[method("### " + part)] = ("### " + part).rstrip("\n") + "\n"
    kept.update({method(sec): sec for sec in sections})
    path.write_text("\n".join(kept[m] for m in GRIDS if m in kept))


def tuned_config(path: str, seed: int) -> dict[str, Any]:
    """A ``fedem-private tune`` best.toml as a run config for ``seed`` (its round still
    chosen on validation)."""
    from fedem_private.experiments.analysis import read_toml

    cfg = read_toml(path, "tuned config")
    cfg.setdefault("train", {})["seed"] = seed
    return cfg


DISPLAY = {"fedmf": "FedMF", "fedem": "FedEM", "pfedrec": "PFedRec", "fedncf": "FedNCF"}


def tuned_label(cfg: dict[str, Any]) -> tuple[str, str]:
    """(display name, run-name stem) of a tuned config: its method, and its merge and
    aggregation where the tuning chose other than the method's defaults ("FedEM [dm,
    fedavg]", ``fedem-dm-fedavg``), and a per-client state narrower than float32 ("FedMF
    (bfloat16 state)", ``fedmf-bfloat16``)."""
    from fedem_private.experiments.analysis import METHOD_DEFAULTS

    fed = cfg.get("federation", {})
    method = fed["method"]
    defaults = dict(zip(("aggregation", "merge"), METHOD_DEFAULTS[method], strict=True))
    chosen = [fed[k] for k in ("merge", "aggregation") if fed.get(k, defaults[k]) != defaults[k]]
    name = DISPLAY.get(method, method)
    label, stem = (f"{name} [{', '.join(chosen)}]", "-".join((method, *chosen))) if chosen \
        else (name, method)
    state = cfg.get("train", {}).get("state_dtype", "float32")
    if state != "float32":  # a study searched with narrow per-client state (memory)
        return f"{label} ({state} state)", f"{stem}-{state}"
    return label, stem


def accounted_label(study: str) -> str:
    """The rung name of a private search's chosen config (``fedem-private tune`` with
    ``[tune.private]``): its eps per run and the whole pipeline's, from privacy.json."""
    acc = json.loads((Path(study) / "privacy.json").read_text())["views"]["observer"]
    cfg = tuned_config(str(Path(study) / "best.toml"), 0)
    name, _ = tuned_label(cfg)
    whole = [f"every trial seen {acc['every_trial']['reported']:.2f}"]
    if "only_choice" in acc:
        whole.insert(0, f"only the choice seen {acc['only_choice']['reported']:.2f}")
    return (f"{name} {cfg['privacy']['mode']} eps {acc['one_run']['reported']:.2f} a run, "
            f"search accounted (search + this run: eps {', '.join(whole)})")


def private_rungs(dataset: str, data_dir: str, seeds: list[int],
                  tuned_files: list[tuple[str, str]], modes: list[str] | None = None,
                  accounted: list[str] | None = None, methods: tuple[str, ...] = ("fedmf",),
                  epsilons: tuple[float, ...] = PRIVATE_EPSILONS
                  ) -> list[tuple[str, str, dict[str, Any]]]:
    """Each of ``methods`` (FEDERATED_RUNGS names) under cdp-gaussian and ldp-dpsgd at
    PRIVATE_EPSILONS with settings fixed in advance, then every tuned config
    (``tuned_files``: (``none`` or a mode, best.toml); ``mode:tag`` names the rungs of a
    second study of the same method and mode apart, e.g. ``cdp-gaussian:stage2``),
    whatever its method: without
    privacy once, a private one at every eps; then the chosen config of every accounted
    private search (``accounted``: its output folder) at its own eps. ``epsilons``: the
    budgets of the fixed-in-advance and the tuned private rungs (a subset of
    PRIVATE_EPSILONS where a grid is long, e.g. eps 4 first)."""
    from fedem_private.experiments.analysis import no_privacy

    out = []
    for seed in seeds:
        for method in methods:
            name, own = FEDERATED_RUNGS[method]
            for mode, extra in PRIVATE_FIXED.items():
                if modes is not None and mode not in modes:
                    continue
                for eps in epsilons:
                    cfg = _merge(_merge(base_config(dataset, data_dir, seed, method), own),
                                 _merge(extra, {"privacy": {"epsilon": eps}}))
                    out.append((f"{name} {mode} eps {eps:g} (fixed in advance)",
                                f"{method}-{mode}-eps{eps:g}-seed{seed}", cfg))
        for spec, path in tuned_files:
            mode, _, tag = spec.partition(":")
            cfg = tuned_config(path, seed)
            name, stem = tuned_label(cfg)
            by, stem = (f", {tag}", f"{stem}-{tag}") if tag else ("", stem)
            if no_privacy(mode):
                out.append((f"{name} (val-tuned{by}, no privacy)", f"{stem}-tuned-seed{seed}",
                            cfg))
                continue
            tuned_at = cfg["privacy"]["epsilon"]
            for eps in epsilons:
                out.append((f"{name} {mode} eps {eps:g} (val-tuned at eps {tuned_at:g}{by})",
                            f"{stem}-{mode}-tuned-eps{eps:g}-seed{seed}",
                            _merge(cfg, {"privacy": {"epsilon": eps}})))
        for study in accounted or []:
            cfg = tuned_config(str(Path(study) / "best.toml"), seed)
            out.append((accounted_label(study),
                        f"{Path(study).name}-accounted-seed{seed}", cfg))
    return out


def rungs(dataset: str, data_dir: str, seeds: list[int], rounds: int,
          tuned: dict[str, dict[str, Any]], federated: tuple[str, ...] = FEDERATED,
          bfloat16: tuple[str, ...] = ()) -> list[tuple[str, str, dict[str, Any]]]:
    """(rung label, run name, config) of every run, in ladder order; ``federated``: the
    federated methods run with their presets' defaults; those also in ``bfloat16`` keep
    their per-client state in bfloat16 between rounds (train.state_dtype, named in the
    rung's label and run name)."""
    out = []
    for seed in seeds:
        def add(label: str, name: str, method: str, extra: dict[str, Any] | None = None,
                seed: int = seed) -> None:
            cfg = _merge(base_config(dataset, data_dir, seed, method), extra or {})
            out.append((label, f"{name}-seed{seed}", cfg))

        add("MostPop", "mostpop", "mostpop")
        add("MostPop, k-clipped (central, no noise)", "dp-mostpop-central-epsinf", "dp-mostpop",
            {"baseline": {"architecture": "central", "epsilon": math.inf}})
        for arch in ARCHITECTURES:
            for eps in DP_EPSILONS:
                add(f"DP-MostPop {arch} eps {eps:g}", f"dp-mostpop-{arch}-eps{eps:g}",
                    "dp-mostpop", {"baseline": {"architecture": arch, "epsilon": eps}})
        add("Centralised MF (federated settings)", "centralised", "centralised")
        add("EASE (lambda 500)", "ease", "ease")
        add("ALS (64 factors)", "als", "als")
        for method, setting in tuned.items():
            name = {"centralised": "Centralised MF", "ease": "EASE", "als": "ALS"}[method]
            add(f"{name} (val-tuned: {_label(setting)})", f"{method}-tuned", method,
                _nest(setting))
        for method in federated:
            name, own = FEDERATED_RUNGS[method]
            narrow = method in bfloat16
            add(f"{name} ({rounds} rounds{', bfloat16 state' if narrow else ''})",
                f"{method}-bfloat16" if narrow else method, method,
                _merge(own, {"train": {"rounds": rounds, "eval_every": rounds,
                                       "state_dtype": "bfloat16" if narrow else "float32"}}))
    return out


def chance(dataset: str, data_dir: str, seed: int) -> dict[str, float]:
    """Expected HR@10 / NDCG@10 of a uniformly random order of each user's candidates."""
    from fedem_private.api import resolve_config
    from fedem_private.experiments.analysis import candidate_counts
    from fedem_private.experiments.baseline_run import load_split

    _, split = load_split(resolve_config(base_config(dataset, data_dir, seed, "mostpop")))
    cands = candidate_counts(split)
    hs, ns = expected_random(np.array([100]))
    hf, nf = expected_random(cands)
    return {"hr10_sampled": hs, "ndcg10_sampled": ns, "hr10_full": hf, "ndcg10_full": nf}


def expected_random(n_candidates: np.ndarray, k: int = 10) -> tuple[float, float]:
    """(HR@k, NDCG@k) of a uniformly random order: the package's
    (:func:`fedem_private.experiments.ladder.expected_random`, ``fedem-private ladder``)."""
    from fedem_private.experiments.ladder import expected_random as package_rule

    return package_rule(n_candidates, k)


# the README's headline figure (--headline): (family on the figure, its role, privacy mode,
# the run-name stems of its points; a stem ending in -eps* stands for every eps)
HEADLINE = (
    ("FedMF, fixed (cdp-gaussian)", "federated", "cdp-gaussian",
     ("fedmf-cdp-gaussian-eps*", "fedmf")),
    ("FedMF, tuned (cdp-gaussian)", "federated", "cdp-gaussian",
     ("fedmf-cdp-gaussian-tuned-eps*", "fedmf-tuned")),
    ("PFedRec, tuned (cdp-gaussian)", "federated", "cdp-gaussian",
     ("pfedrec-stage2-cdp-gaussian-tuned-eps*", "pfedrec-tuned")),
    ("FedMF, tuned (ldp-dpsgd)", "federated", "ldp-dpsgd", ("fedmf-ldp-dpsgd-tuned-eps*",)),
    ("FedMF, tuning accounted (cdp)", "federated", "cdp-gaussian",
     ("fedmf-cdp-private-ml-100k-accounted",)),
    ("DP-MostPop, central", "floor", "central", ("dp-mostpop-central-eps*",)),
    ("DP-MostPop, interaction-local", "floor", "interaction-local",
     ("dp-mostpop-interaction-local-eps*",)),
    ("MostPop", "popularity", "none", ("mostpop",)),
    ("EASE", "ceiling", "none", ("ease-tuned",)),
    ("Centralised MF, tuned", "ceiling", "none", ("centralised-tuned",)),
)
# where an accounted search's point sits: the eps of the search and its final run together
# (only the choice seen; benchmarks/results/ladder/tuning/*-privacy.json)
ACCOUNTED_EPS = {"fedmf-cdp-private-ml-100k-accounted":
                 "benchmarks/results/ladder/tuning/fedmf-cdp-private-ml-100k-privacy.json"}


def headline_points(results: Path, epsilons: tuple[float, ...] = PRIVATE_EPSILONS) -> list:
    """The headline figure's points from a ladder's recorded ``results.csv`` (finished runs
    only; nothing is run): mean and standard deviation over seeds per :data:`HEADLINE` stem,
    the private ones at ``epsilons``."""
    import pandas as pd

    from fedem_private.experiments.ladder_plots import Point

    frame = pd.read_csv(results)
    frame["stem"] = frame["run"].astype(str).str.replace(r"-seed\d+$", "", regex=True)
    metrics = ("hr10_full", "ndcg10_full", "hr10_sampled", "ndcg10_sampled")
    out = []
    for family, role, mode, stems in HEADLINE:
        for stem in stems:
            wanted = ([stem.replace("*", f"{e:g}") for e in epsilons] if stem.endswith("*")
                      else [stem])
            for name in wanted:
                runs = frame[frame["stem"] == name]
                if runs.empty:
                    continue
                eps = float(name.rsplit("-eps", 1)[1]) if stem.endswith("*") else None
                if name in ACCOUNTED_EPS:
                    view = json.loads(Path(ACCOUNTED_EPS[name]).read_text())["views"]["observer"]
                    eps = float(view["only_choice"]["reported"])
                values = {m: (float(runs[m].mean()), float(runs[m].std(ddof=1)))
                          for m in metrics}
                out.append(Point(family, role, mode if eps is not None else "none", eps,
                                 values))
    return out


def chance_point(dataset: str, data_dir: str, seeds: list[int]) -> list:
    """Chance on the figure (computed from the split, as the ladder's table computes it);
    none where the dataset is not here."""
    from fedem_private.experiments.ladder_plots import Point

    if not Path(data_dir).exists():
        return []
    ch = [chance(dataset, data_dir, s) for s in seeds]
    return [Point("chance", "chance", "none", None,
                  {m: (float(np.mean([c[m] for c in ch])), float(np.std([c[m] for c in ch],
                                                                         ddof=1)))
                   for m in METRICS})]


def write_headline(out: Path, dataset: str) -> list[Path]:
    """``<out>/report/<dataset>-headline.png`` (and the other panels) from the recorded
    results of ``<out>/<dataset>/results.csv``."""
    from fedem_private.experiments.ladder_plots import headline, panels

    points = chance_point(dataset, str(Path("../shared/datasets") / dataset), [0, 1, 2])
    points += headline_points(out / dataset / "results.csv")
    title = f"{dataset}: full HR@10 against total eps (strict, mean ± sd over 3 seeds)"
    png = out / "report" / f"{dataset}-headline.png"
    entries = headline(points, png, title)
    more = out / "report" / f"{dataset}-headline-panels.png"
    panels(points, more, f"{dataset}: the other metrics")
    print(f"{png}: {entries} legend entries", file=sys.stderr)
    return [png, more]


def _cell(values: list[float]) -> str:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return "-"
    if a.size == 1:
        return f"{a[0]:.4f}"
    return f"{a.mean():.4f} ± {a.std(ddof=1):.4f}"


def table(dataset: str, data_dir: str, runs: Path, seeds: list[int],
          plan: list[tuple[str, str, dict[str, Any]]],
          rows: dict[str, dict[str, Any]] | None = None) -> str:
    """The Markdown ladder: mean ± std over the seeds that finished, per rung (``rows``:
    :func:`recorded`, for rungs with no run directory here)."""
    labels = list(dict.fromkeys(label for label, _, _ in plan))
    lines = ["| rung | eps (reported) | seeds | sampled HR@10 | sampled NDCG@10 | "
             "full HR@10 | full NDCG@10 | seconds |", "|---|---|---|---|---|---|---|---|"]
    ch = [chance(dataset, data_dir, s) for s in seeds]
    lines.append("| chance (expected, random order) | - | " + str(len(seeds)) + " | "
                 + " | ".join(_cell([c[m] for c in ch]) for m in METRICS) + " | - |")
    for label in labels:
        done = [f for lab, name, _ in plan if lab == label
                for f in [_finished(runs, name, rows or {})] if f is not None]
        if not done:
            continue
        vals = {m: [f[m] for f in done] for m in METRICS}
        eps = [f["eps"] for f in done]
        eps_text = "inf" if all(e is None for e in eps) else f"{max(e for e in eps if e):.4g}"
        secs = [f["seconds"] for f in done]
        lines.append(f"| {label} | {eps_text} | {len(done)} | "
                     + " | ".join(_cell(vals[m]) for m in METRICS)
                     + f" | {np.nanmean(secs):.1f} |")
    return "\n".join(lines) + "\n"


def combined_report(out: Path, datasets: list[str], headline: Path) -> list[Path]:
    """The ladder's report: every dataset's ladder results.csv, plus the headline grid's
    PFedRec, FedEM and their EM variants under the three architectures (its FedMF rows are
    left out: the ladder reruns FedMF). Written by ``fedem-private report``."""
    import tempfile

    import pandas as pd

    from fedem_private.experiments.report import write_report

    frames, described = [], []
    for d in datasets:  # run names repeat across datasets: keep them apart
        if (out / d / "results.csv").is_file():
            frame = pd.read_csv(out / d / "results.csv")
            # an accounted search's runs would plot at their per-run eps, below what the
            # search and the run cost together; their table (<dataset>.md) gives both
            frame = frame[~frame["run"].astype(str).str.contains("-accounted-")]
            frames.append(frame.assign(run=d + "/" + frame["run"].astype(str)))
            described.append(f"`{(out / d / 'results.csv').as_posix()}`")
    if headline.is_file():
        h = pd.read_csv(headline)
        frames.append(h[h["dataset"].isin(datasets) & (h["method"] != "fedmf")])
        described.append(f"`{headline.as_posix()}` (its runs other than FedMF)")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, frame in enumerate(frames):
            paths.append(str(Path(tmp) / f"part{i}.csv"))
            frame.to_csv(paths[-1], index=False)
        return write_report(paths, str(out / "report"), force=True, described_as=described)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--data-dir", default=None,
                        help="default: ../shared/datasets/<dataset>")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--runs", default="runs/ladder")
    parser.add_argument("--out", default="benchmarks/results/ladder")
    parser.add_argument("--only", choices=("federated", "baselines", "private", "accounted",
                                           "table"),
                        default=None,
                        help="run only the federated rungs, only the baselines (and their "
                        "tuning), only the private rungs, only the accounted searches' "
                        "rungs (--accounted), or only write the table from finished runs")
    parser.add_argument("--rerun", nargs="+", default=[], metavar="PATTERN",
                        help="run the rungs whose names match these shell patterns even where "
                        "a recorded row stands (a change the recorded settings do not show, "
                        "e.g. the split's keys in issue 65)")
    parser.add_argument("--modes", nargs="+", default=None, choices=tuple(PRIVATE_FIXED),
                        help="the private modes of the fixed-in-advance rungs "
                        "(default: all)")
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(PRIVATE_EPSILONS),
                        help="the total eps of the private rungs, fixed in advance and tuned "
                        "(default: 1 4 16 64; the table lists only these)")
    parser.add_argument("--private-methods", nargs="+", default=["fedmf"], choices=FEDERATED,
                        help="the federated methods run under each private mode with "
                        "settings fixed in advance (default: fedmf)")
    parser.add_argument("--tuned", nargs="*", default=[], metavar="MODE[:TAG]=FILE",
                        help="`fedem-private tune` best.toml files, each with its privacy mode "
                        "(`none` for no privacy), of any federated method; run on every seed "
                        "(private ones at every eps of --epsilons)")
    parser.add_argument("--accounted", nargs="*", default=[], metavar="DIR",
                        help="`fedem-private tune` outputs of private searches "
                        "([tune.private]): the chosen config, on every seed, at its own eps")
    parser.add_argument("--federated", nargs="+", default=list(FEDERATED), choices=FEDERATED,
                        help="the federated methods run with their defaults (default: all; "
                        "LastFM-2K's FedEM takes about a minute a round on this CPU)")
    parser.add_argument("--bfloat16-state", nargs="+", default=[], choices=FEDERATED,
                        metavar="METHOD",
                        help="federated rungs whose per-client state is kept in bfloat16 "
                        "between rounds (their own rung and run; LastFM-2K's FedEM)")
    parser.add_argument("--no-tune", action="store_true", help="skip the validation grids")
    parser.add_argument("--grids", nargs="+", default=list(GRIDS), choices=tuple(GRIDS),
                        help="the baselines whose validation grids run (default: all); the "
                        "others keep an earlier checkout's recorded choice, if any")
    parser.add_argument("--select-by", choices=tuple(SELECT_BY), default="sampled",
                        help="rank the validation item among 100 sampled candidates "
                        "(default) or every item when choosing a grid's setting")
    parser.add_argument("--headline", metavar="DATASET", default=None,
                        help="only draw the README's headline figure of this dataset from its "
                        "recorded results (<out>/<dataset>/results.csv; nothing runs)")
    parser.add_argument("--report", nargs="+", metavar="DATASET", default=None,
                        help="only write the combined report of these datasets' ladders "
                        "(and the headline grid's other methods) into <out>/report")
    add_mlflow_argument(parser, "log the finished rungs' runs to MLflow at the end: a parent "
                        "run for <runs>/<dataset>, one nested run per run directory; needs "
                        "pip install 'fedem-private[mlflow]'")
    args = parser.parse_args(argv)
    try:
        tracking.check_uri(args.mlflow)
    except UserError as err:
        print(f"ladder: error: {err}", file=sys.stderr)
        return 2
    if args.headline:
        for path in write_headline(Path(args.out), args.headline):
            print(f"wrote {path}")
        return 0
    if args.report:
        for path in combined_report(Path(args.out), args.report,
                                    Path("benchmarks/results/privacy/headline2/results.csv")):
            print(f"wrote {path}")
        return 0
    data_dir = args.data_dir or str(Path("../shared/datasets") / args.dataset)
    runs = Path(args.runs) / args.dataset
    out = Path(args.out)
    tuned: dict[str, dict[str, Any]] = {}
    tuning_md = []
    rows = recorded(out, args.dataset)
    if not args.no_tune and args.only != "federated":
        for method in args.grids:
            if args.only == "table" and not (runs / "tune").is_dir():
                break
            setting, grid_rows = tune(runs, args.dataset, data_dir, method, args.seeds[0],
                                      args.select_by)
            tuned[method] = setting
            tuning_md.append(
                f"### {method} (seed {args.seeds[0]}; chosen by {args.select_by} validation "
                f"HR@10: {_label(setting)})\n\n| setting | val HR@10 (sampled) | "
                "val NDCG@10 (sampled) | val HR@10 (full) |\n|---|---|---|---|\n" + "".join(
                    f"| {lab} | {hr:.4f} | {nd:.4f} | {full:.4f} |\n"
                    for lab, hr, nd, full in grid_rows))
    # the grids that did not run here: an earlier checkout's choices stand
    before = recorded_tuning(rows, args.seeds[0])
    rows = stale_tuned_rows_dropped(rows, before, tuned)
    tuned = {**before, **tuned}
    tuned_files = [tuple(t.split("=", 1)) for t in args.tuned]
    private = private_rungs(args.dataset, data_dir, args.seeds, tuned_files, args.modes,
                            args.accounted, tuple(args.private_methods), tuple(args.epsilons))
    plan = rungs(args.dataset, data_dir, args.seeds, args.rounds, tuned,
                 tuple(args.federated), tuple(args.bfloat16_state)) + private
    rows, stale = stale_recorded_rows_dropped(rows, plan)
    for line in stale:
        print(f"ladder: the recorded row {line} was run with another setting; it does not "
              "stand and its rung runs again", file=sys.stderr)
    if args.only != "table":
        private_names = {name for _, name, _ in private}
        todo = []
        for _, name, cfg in plan:
            rerun = any(fnmatch.fnmatch(name, pattern) for pattern in args.rerun)
            if name in rows and not (runs / name).is_dir() and not rerun:
                continue  # finished in an earlier checkout: its recorded row stands
            federated = cfg["federation"]["method"] not in {*GRIDS, "mostpop", "dp-mostpop"}
            kind = "private" if name in private_names else (
                "federated" if federated else "baselines")
            if kind == "private" and name.endswith(
                    tuple(f"-accounted-seed{seed}" for seed in args.seeds)):
                kind = "accounted"
            if args.only is None or args.only == kind or (
                    args.only == "private" and kind == "accounted"):
                todo.append((name, cfg))
        refused = unrunnable(todo)
        if refused:
            for line in refused:
                print(f"ladder: {line}", file=sys.stderr)
            return 2
        for name, cfg in todo:
            ensure(runs / name, cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.dataset}.md").write_text(table(args.dataset, data_dir, runs, args.seeds,
                                                  plan, rows))
    if tuning_md:
        write_tuning(out / f"{args.dataset}-tuning.md", tuning_md)
    import fedem_private as fp

    finished = [runs / name for _, name, _ in plan if (runs / name / "summary.json").is_file()]
    if finished:
        import pandas as pd

        frame = fp.load_results(runs)
        frame = frame[~frame["run"].str.startswith("tune/")]
        here = set(frame["run"])
        kept = [r for name, r in rows.items() if name not in here]
        if kept:  # earlier checkouts' rows stay beside this one's runs
            frame = pd.concat([pd.DataFrame(kept), frame], ignore_index=True)
            frame = frame.sort_values("run", kind="stable").reset_index(drop=True)
        (out / args.dataset).mkdir(exist_ok=True)
        frame.to_csv(out / args.dataset / "results.csv", index=False)
    print((out / f"{args.dataset}.md").read_text())
    if args.mlflow is not None and finished:
        try:
            print(tracking.log_group(runs, finished, "ladder", args.mlflow,
                                     child_kind="rung").line())
        except UserError as err:
            print(f"ladder: error: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
