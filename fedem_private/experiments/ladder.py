"""``fedem-private ladder``: the accuracy ladder on any dataset (docs/baselines.md).

A ladder is a list of rungs on one split, protocol and evaluation: chance, MostPop, the
private floor (DP-MostPop under an architecture), the centralised ceilings and the
federated methods, each with or without privacy. Rungs are named on the command line by
kind, each kind with its own options (:func:`kinds`)::

    fedem-private ladder --dataset csv --data-dir ratings.csv --out runs/ladder \\
        --rungs chance mostpop dp-mostpop:central ease fedmf fedmf:cdp-gaussian \\
        --tuned fedmf-best.toml --epsilons 1 4 16

``KIND:WORD,KEY=VALUE,...``: the words choose a privacy mode (federated kinds: ``none``,
``cdp-gaussian``, ...; one rung each) or DP-MostPop's architectures; a key is a short
option of the kind (``ease:lambda=200``, ``fedmf:lr=0.05``) or any dotted config key. Only
the rungs named run: nothing is added.

Settings of a federated or ceiling rung are, in order: its preset's, the ladder's fixed
private settings for ``cdp-gaussian`` and ``ldp-dpsgd`` (:data:`PRIVATE_FIXED`, the
architectures' headline settings), a tuned config of the same method and privacy mode when
one is given, then the rung's own options. A tuned config comes either from ``--tuned
FILE`` (a ``fedem-private tune`` best.toml, say tuned on ML-100K: its whole ``[data]``
section is replaced by the command's, so it applies to another dataset unedited; tuning
on other users costs these none) or from ``--tune FILE`` (a tuning file run here, on these
users, by :func:`~fedem_private.experiments.tune.run_tuning`, resumable in
``<out>/tune/<name>``). A private ``--tune`` must be accounted: its file needs
``[tune.private]``, and its rung runs at the search's own eps and is plotted at the eps
of the search and the run together (``privacy.json``).

Before anything runs the plan is printed: each rung, its runs and an estimated time, from
this ladder's finished runs of the same method where there are some (measured) or from
:data:`ROUGH_RULE` (stated; for a federated run the time model of :func:`federated_seconds`:
participants, local work and, under noise, the catalogue). Runs are directories
``<out>/runs/<name>``: a finished one is not run again (one of another config stops the
ladder unless ``--force``, which redoes every run). A federated run expected to take more
than ``--checkpoint-minutes`` keeps one checkpoint file, ``<run>.checkpoint``, rewritten at
about that interval and removed once the run is finished. The headline round (``--round``:
the last, or the one chosen on validation) is the same for every rung and stated in the
table's header. The outputs: ``ladder.md`` (the table, the settings beside the figure, the
other panels), ``ladder.csv``, ``results.csv`` (one row per run, as ``fedem-private report``
reads it), ``headline.png`` and ``panels.png``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedem_private.errors import UserError
from fedem_private.experiments.display import METHOD_NAMES
from fedem_private.privacy.registry import no_privacy

DISPLAY = METHOD_NAMES  # a federated kind's name in tables (experiments/display.py)
# the private federated settings fixed in advance (never tuned on these users): the
# architectures' headline settings (benchmarks/specs/privacy/cdp_curve.toml, dpsgd.toml)
PRIVATE_FIXED: dict[str, dict[str, Any]] = {
    "cdp-gaussian": {"train": {"rounds": 40},
                     "privacy": {"mode": "cdp-gaussian", "delta": 1e-5, "sample_rate": 0.2,
                                 "clip": 50.0}},
    "ldp-dpsgd": {"train": {"rounds": 20}, "privacy": {"mode": "ldp-dpsgd", "delta": 1e-5}},
}
DEFAULT_ROUNDS = 100  # a federated rung's rounds when neither its settings nor --rounds say
DEFAULT_RUNGS = ("chance", "mostpop", "dp-mostpop:central", "centralised", "ease", "fedmf",
                 "fedmf:cdp-gaussian", "pfedrec", "pfedrec:cdp-gaussian")
ROUNDS = {"last": "last", "best-val": "best-val"}  # --round -> train.select_round
# the stated rough rule of the plan's estimates, where no run of the method finished here:
# seconds per client and round (federated, one CPU core), or per run (baselines) at
# ML-100K's size, scaled as written
ROUGH_RULE = ("federated: the time model (a round: 36 us a participant, 0.41 us a trained "
              "example, i.e. local epochs x positives x (1 + negatives), and under noise 16 ns "
              "a participant x item x dim; an evaluation: 64 ns a user x item x dim; "
              "BENCHMARKS.md); centralised MF 0.5 ms per user per epoch; EASE 1 s x "
              "(items / 1682)^3; MostPop, DP-MostPop, ALS 1 s")
FED_ALIASES = {"rounds": "train.rounds", "lr": "train.lr", "dim": "train.dim",
               "epochs": "train.local_epochs", "negatives": "train.num_negatives",
               "clip": "privacy.clip", "q": "privacy.sample_rate",
               "server_lr": "federation.server_lr"}


@dataclass(frozen=True)
class RungKind:
    """A kind of rung: its method, its name in tables, its role on the figure
    (:data:`~fedem_private.experiments.ladder_plots.ROLES`), the words it takes (privacy
    modes or architectures; one rung each) and its short options (-> dotted config keys)."""

    name: str
    method: str
    display: str
    role: str
    words: tuple[str, ...] = ()
    default_words: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # config beyond the preset


def kinds() -> dict[str, RungKind]:
    """The registry of rung kinds, by name."""
    from fedem_private.privacy.registry import names
    from fedem_private.simulation.sections import DP_MOSTPOP_ARCHITECTURES, FEDERATED_METHODS

    modes = tuple(names())
    out = {
        "chance": RungKind("chance", "", "chance", "chance"),
        "mostpop": RungKind("mostpop", "mostpop", "MostPop", "popularity"),
        "dp-mostpop": RungKind("dp-mostpop", "dp-mostpop", "DP-MostPop", "floor",
                               DP_MOSTPOP_ARCHITECTURES, ("central",),
                               {"k": "baseline.k", "delta": "baseline.delta"}),
        "centralised": RungKind("centralised", "centralised", "Centralised MF", "ceiling",
                                aliases={"lr": "train.lr", "epochs": "baseline.epochs",
                                         "dim": "train.dim"}),
        "ease": RungKind("ease", "ease", "EASE", "ceiling",
                         aliases={"lambda": "baseline.ease_lambda"}),
        "als": RungKind("als", "als", "ALS", "ceiling",
                        aliases={"factors": "baseline.als_factors",
                                 "reg": "baseline.als_regularization",
                                 "alpha": "baseline.als_alpha",
                                 "iterations": "baseline.als_iterations"}),
    }
    for method in FEDERATED_METHODS:
        out[method] = RungKind(method, method, DISPLAY.get(method, method), "federated",
                               modes, ("none",), FED_ALIASES)
    out["pfedrec-em"] = RungKind("pfedrec-em", "pfedrec", "PFedRec+EM", "federated", modes,
                                 ("none",), FED_ALIASES, {"federation": {"merge": "em"}})
    return out


@dataclass(frozen=True)
class RungSpec:
    """One ``--rungs`` entry, parsed: its kind, words and dotted settings."""

    kind: RungKind
    words: tuple[str, ...]
    settings: Mapping[str, Any]


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_rung(text: str, known: Mapping[str, RungKind]) -> RungSpec:
    """``KIND[:WORD|KEY=VALUE,...]`` as a :class:`RungSpec`; a user error names what is
    unknown and what is known."""
    name, _, rest = text.partition(":")
    kind = known.get(name)
    if kind is None:
        raise UserError(f"--rungs {text}: unknown rung kind {name!r}; known: "
                        f"{', '.join(known)}")
    words, settings = [], {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            if part not in kind.words:
                raise UserError(f"--rungs {text}: {name} takes "
                                f"{', '.join(kind.words) or 'no words'}, not {part!r}")
            words.append(part)
        elif key in kind.aliases or "." in key:
            settings[kind.aliases.get(key, key)] = _value(value)
        else:
            raise UserError(f"--rungs {text}: {name} has no option {key!r} (its options: "
                            f"{', '.join(kind.aliases) or 'none'}, or a dotted config key)")
    return RungSpec(kind, tuple(words or kind.default_words), settings)


@dataclass(frozen=True)
class Tuned:
    """A tuned config for rungs of one kind and privacy mode: the file's config with the
    ladder's data section, where it came from, and an accounted search's eps."""

    kind: str
    mode: str
    config: Mapping[str, Any]
    origin: str  # "tuned on ml-100k (FILE)" or "tuned here (DIR)"
    accounted: Mapping[str, Any] | None = None  # privacy.json's observer view


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(a))
    for k, v in b.items():
        out[k] = (_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict)
                  else copy.deepcopy(v))
    return out


def kind_of(config: Mapping[str, Any]) -> tuple[str, str]:
    """(rung kind, privacy mode) a tuned config stands for."""
    fed, privacy = config.get("federation") or {}, config.get("privacy") or {}
    method = fed.get("method", "fedmf")
    kind = "pfedrec-em" if method == "pfedrec" and fed.get("merge") == "em" else method
    return kind, str(privacy.get("mode", "none"))


def transferred(path: str | Path, data: Mapping[str, Any]) -> Tuned:
    """A ``--tuned`` best.toml with its ``[data]`` replaced by the ladder's ``data``: a file
    tuned on another dataset applies here without edits."""
    from fedem_private.simulation.config import read_toml

    cfg = read_toml(str(path), "tuned config")
    source = (cfg.get("data") or {}).get("dataset", "?")
    cfg["data"] = dict(data)
    kind, mode = kind_of(cfg)
    return Tuned(kind, mode, cfg, f"tuned on {source} ({Path(path).name})")


def tuned_here(spec: str | Path, data: Mapping[str, Any], root: Path) -> Tuned:
    """Run (or resume) the tuning file ``spec`` on the ladder's data into
    ``root/<its name>``; its best config. A private search must be accounted
    (``[tune.private]``): its privacy.json's observer view comes with it."""
    from fedem_private.experiments.tune import load_private, run_tuning
    from fedem_private.simulation.config import read_toml, to_toml

    spec_cfg = read_toml(str(spec), "tuning file")
    base = spec_cfg.setdefault("base", {})
    base["data"] = dict(data)
    mode = str((base.get("privacy") or {}).get("mode", "none"))
    if not no_privacy(mode) and load_private(spec) is None:
        raise UserError(f"--tune {spec}: a private search on these users must be accounted; "
                        f"add [tune.private] (fedem_private.experiments.tune), or tune on "
                        f"other data and pass its best.toml with --tuned")
    out = root / Path(spec).stem
    out.mkdir(parents=True, exist_ok=True)
    written = out / "tune.toml"  # the file as run: the ladder's data section
    space = (spec_cfg.get("tune") or {}).pop("space", {})
    text = to_toml(spec_cfg) + "\n[tune.space]\n" + "".join(
        f"{json.dumps(key)} = {_inline(value)}\n" for key, value in space.items())
    if not written.is_file() or written.read_text() != text:
        written.write_text(text)
    run_tuning(written, out)
    best = read_toml(str(out / "best.toml"), "tuned config")
    kind, mode = kind_of(best)
    accounted = None
    if (out / "privacy.json").is_file():
        accounted = json.loads((out / "privacy.json").read_text())["views"]["observer"]
    return Tuned(kind, mode, best, f"tuned here ({out})", accounted)


def _inline(value: Any) -> str:
    """``value`` as a TOML inline value (a search space's entry)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else repr(value)


@dataclass(frozen=True)
class Run:
    """One run of a rung: its directory name, seed, target eps and config."""

    name: str
    seed: int
    eps: float | None
    config: Mapping[str, Any]


@dataclass(frozen=True)
class Rung:
    """A line of the ladder: its runs over seeds (and epsilons)."""

    name: str
    label: str  # the table's and the figure's short label ("FedMF, tuned")
    kind: RungKind
    mode: str  # privacy mode, DP-MostPop's architecture, or "none"
    settings: str  # where its settings come from, and those set here
    runs: tuple[Run, ...]
    accounted: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class LadderOptions:
    """What the command asks, beyond the rungs."""

    data: Mapping[str, Any]
    seeds: tuple[int, ...] = (0, 1, 2)
    epsilons: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0)
    rounds: int | None = None
    round_rule: str = "last"


def _settings_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v:g}" if isinstance(v, float) else
                     f"{k.split('.')[-1]}={v}" for k, v in settings.items())


def _federated(spec: RungSpec, mode: str, tuned: Tuned | None, opts: LadderOptions,
               seed: int, eps: float | None) -> dict[str, Any]:
    kind = spec.kind
    base = {"data": dict(opts.data), "federation": {"method": kind.method}}
    if tuned is not None:
        cfg = _merge(tuned.config, {"data": dict(opts.data)})
    else:
        cfg = _merge(_merge(base, kind.extra), {"train": {"rounds": DEFAULT_ROUNDS}})
        if not no_privacy(mode):
            cfg = _merge(cfg, PRIVATE_FIXED.get(mode, {"privacy": {"mode": mode,
                                                                    "delta": 1e-5}}))
    cfg = _merge(cfg, _nest(spec.settings))
    train = cfg.setdefault("train", {})
    train["seed"] = seed
    if opts.rounds is not None:
        train["rounds"] = opts.rounds
    rounds = int(train.get("rounds", DEFAULT_ROUNDS))
    train["select_round"] = ROUNDS[opts.round_rule]
    if opts.round_rule == "last":
        train["eval_every"] = rounds
    else:
        train["eval_every"] = min(int(train.get("eval_every") or max(1, rounds // 10)), rounds)
    if eps is not None:
        cfg["privacy"]["epsilon"] = eps
        cfg["privacy"].pop("noise_multiplier", None)
    return cfg


def _baseline(spec: RungSpec, word: str | None, tuned: Tuned | None, opts: LadderOptions,
              seed: int, eps: float | None) -> dict[str, Any]:
    kind = spec.kind
    cfg = {"data": dict(opts.data), "federation": {"method": kind.method}}
    if tuned is not None:
        cfg = _merge(tuned.config, {"data": dict(opts.data)})
    cfg = _merge(cfg, _nest(spec.settings))
    cfg.setdefault("train", {})["seed"] = seed
    if kind.name == "dp-mostpop":
        cfg = _merge(cfg, {"baseline": {"architecture": word, "epsilon": eps}})
    return cfg


# the settings a rung's row of the settings table shows (where the resolved config has them)
SHOWN = {"federated": ("train.rounds", "train.lr", "train.local_epochs", "train.num_negatives",
                       "train.dim", "federation.server_lr", "privacy.clip",
                       "privacy.sample_rate", "privacy.delta"),
         "ceiling": ("train.lr", "baseline.epochs", "train.dim", "baseline.ease_lambda",
                     "baseline.als_factors", "baseline.als_regularization", "baseline.als_alpha"),
         "floor": ("baseline.k", "baseline.delta")}


def key_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The main settings of a run config, resolved (those of :data:`SHOWN` for its role)."""
    import dataclasses

    rc = resolved(cfg)
    method = rc.federation.resolved_method
    role = kinds().get(method, RungKind("", "", "", "federated")).role
    keys = SHOWN.get(role, ())
    if method == "ease":
        keys = ("baseline.ease_lambda",)
    elif method == "als":
        keys = tuple(k for k in keys if "als_" in k)
    elif method == "centralised":
        keys = ("train.lr", "baseline.epochs", "train.dim")
    out = {}
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(rc, section), name, None)
        if section == "privacy" and not rc.privacy.mechanism.perturbs:
            continue
        if value is not None and not dataclasses.is_dataclass(value):
            out[key] = float(f"{value:.3g}") if isinstance(value, float) else value
    return out


def _eps_tag(eps: float | None) -> str:
    return "" if eps is None else f"-eps{eps:g}"


def expand(spec: RungSpec, tuned: Mapping[tuple[str, str], Tuned],
           opts: LadderOptions) -> list[Rung]:
    """The rungs of one ``--rungs`` entry: one per word (privacy mode or architecture)."""
    kind = spec.kind
    if kind.name == "chance":
        return [Rung("chance", "chance", kind, "none", "expected, random order", ())]
    out = []
    for word in spec.words or (None,):
        mode = word or "none"
        source = tuned.get((kind.name, mode))
        private = not no_privacy(mode) and kind.role in ("federated", "floor")
        accounted = source.accounted if source is not None else None
        epsilons = (None,) if not private or accounted is not None else opts.epsilons
        how = source.origin if source is not None else (
            "fixed in advance" if private or kind.role == "federated" else "defaults")
        if kind.role == "federated":
            label = f"{kind.display}, {'tuned' if source is not None else 'fixed'}"
            label += f" ({mode})" if private else ""
            label += " search accounted" if accounted is not None else ""
        else:
            label = kind.display + (f", {mode}" if kind.name == "dp-mostpop" else "")
        stem = "-".join(filter(None, (kind.name, None if no_privacy(mode) else mode,
                                      "tuned" if source is not None else None)))
        runs = []
        for eps in epsilons:
            for seed in opts.seeds:
                if kind.role == "federated":
                    cfg = _federated(spec, mode, source, opts, seed, eps)
                else:
                    cfg = _baseline(spec, word, source, opts, seed, eps)
                runs.append(Run(f"{stem}{_eps_tag(eps)}-seed{seed}", seed, eps, cfg))
        shown = {**(key_settings(runs[0].config) if runs else {}), **spec.settings}
        if spec.settings:
            how += ", options set here"
        text = _settings_text(shown)
        out.append(Rung(stem, label, kind, mode, how + (f": {text}" if text else ""),
                        tuple(runs), accounted))
    return out


def build_rungs(texts: Sequence[str], tuned: Sequence[Tuned],
                opts: LadderOptions) -> list[Rung]:
    """Every rung of ``--rungs``, in order; each tuned config must serve a rung (a file that
    matches none is named, not silently dropped), and no rung may be named twice."""
    known = kinds()
    specs = [parse_rung(t, known) for t in texts]
    by_key: dict[tuple[str, str], Tuned] = {}
    for t in tuned:
        if (t.kind, t.mode) in by_key:
            raise UserError(f"two tuned configs for {t.kind} under {t.mode}: "
                            f"{by_key[(t.kind, t.mode)].origin} and {t.origin}")
        by_key[(t.kind, t.mode)] = t
    rungs = [r for s in specs for r in expand(s, by_key, opts)]
    names = [r.name for r in rungs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--rungs names {', '.join(twice)} twice")
    used = {(r.kind.name, r.mode) for r in rungs}
    for key, t in by_key.items():
        if key not in used:
            word = "" if no_privacy(key[1]) else f":{key[1]}"
            raise UserError(f"{t.origin} is a {key[0]} config under {key[1]}, but no rung "
                            f"{key[0]}{word} is in --rungs: add it, or drop the file")
    return rungs


def resolved(cfg: Mapping[str, Any]) -> Any:
    """The validated, resolved :class:`~fedem_private.simulation.config.RunConfig`."""
    from fedem_private.simulation.config import from_dict

    return from_dict(copy.deepcopy(dict(cfg))).validate().resolved()


def check(rungs: Sequence[Rung]) -> None:
    """Every run's config resolves, before anything runs (one line per reason)."""
    reasons: dict[str, list[str]] = {}
    for rung in rungs:
        for run in rung.runs:
            try:
                resolved(run.config)
            except UserError as err:
                reasons.setdefault(str(err), []).append(run.name)
    if reasons:
        reason, names = next(iter(reasons.items()))
        raise UserError(f"{len(names)} run(s) cannot run ({', '.join(names[:3])}): {reason}")


# --- the plan: runs and estimated times ----------------------------------------------------


def _clients_per_round(cfg: Any, users: int) -> float:
    """A round's expected participants: ``train.cohort_size`` K (at most the users), a
    sampling mechanism's rate q x users, else ``train.client_fraction`` x users."""
    cohort = int(getattr(cfg.train, "cohort_size", 0) or 0)
    if cohort:
        return float(min(cohort, users))
    q = getattr(cfg.privacy, "sample_rate", None)
    if q and "sample_rate" in cfg.privacy.mechanism.options:  # it samples its participants
        return users * float(q)
    return users * float(cfg.train.client_fraction)


#: the plan's time model of a federated run (BENCHMARKS.md, "The plan's time model", with
#: the runs it was calibrated and checked on, and :mod:`benchmarks.probes.plan_time`):
#: seconds per participant and round whatever its work ...
S_PER_CLIENT = 3.6e-5
#: ... per trained example (one positive or sampled negative of one client, one local
#: epoch) ...
S_PER_EXAMPLE = 4.1e-7
#: ... per participant x catalogue item x dimension under a mechanism that adds noise
#: (its upload is the whole table, clipped and noised; without noise a client moves only
#: the rows it trained, which the examples' cost covers) ...
S_PER_ITEM_DIM = 1.6e-8
#: ... and per evaluated user x item x dimension at each evaluation (scoring every item)
S_EVAL_ITEM_DIM = 6.4e-8


def federated_seconds(cfg: Any, users: int, items: int, positives: float) -> float:
    """Seconds a federated run of ``cfg`` takes by the time model: each round, every
    participant (:func:`_clients_per_round`) costs :data:`S_PER_CLIENT`, trains
    ``local_epochs`` x ``positives`` x (1 + ``num_negatives``) examples
    (:data:`S_PER_EXAMPLE`) and, under a mechanism that adds noise, clips its whole
    ``items`` x ``dim`` table (:data:`S_PER_ITEM_DIM`) unless the secure sum takes only
    its trained rows (:func:`_clips_whole_table`); each evaluation scores the
    evaluated users against every item (:data:`S_EVAL_ITEM_DIM`). ``positives``: the mean
    training items of a user."""
    tr = cfg.train
    examples = float(tr.local_epochs) * positives * (1.0 + float(tr.num_negatives))
    table = float(items) * float(tr.dim)
    dense = table if _clips_whole_table(cfg) else 0.0
    per_client = S_PER_CLIENT + S_PER_EXAMPLE * examples + S_PER_ITEM_DIM * dense
    rounds = float(tr.rounds)
    evaluations = math.ceil(rounds / max(int(tr.eval_every or rounds), 1))
    evaluated = min(int(tr.eval_users or users), users)
    return (rounds * _clients_per_round(cfg, users) * per_client
            + evaluations * evaluated * S_EVAL_ITEM_DIM * table)


def _clips_whole_table(cfg: Any) -> bool:
    """Whether each participant's noised or clipped upload costs its whole items x dim
    table: under a mechanism that adds noise, unless the secure sum is formed from the
    rows it trained (a central mechanism summed by ``SecureSum`` with the full codec and
    static replacement, docs/design.md section 18)."""
    mech = cfg.privacy.mechanism
    if not mech.perturbs:
        return False
    trained_rows = (mech.central and mech.name != "ddp-skellam"
                    and cfg.federation.codec == "full"
                    and cfg.federation.resolved_merge == "sr")
    return not trained_rows


def work_units(cfg: Any, users: int, items: int, positives: float = 0.0) -> float:
    """The size of a run the estimate scales with: the time model's seconds (federated,
    :func:`federated_seconds`), users x epochs (centralised MF), (items / 1682)^3 (EASE),
    1 (the others)."""
    method = cfg.federation.resolved_method
    if method == "centralised":
        return users * float(cfg.baseline.epochs)
    if method == "ease":
        return (items / 1682) ** 3
    if method in ("mostpop", "dp-mostpop", "als"):
        return 1.0
    return federated_seconds(cfg, users, items, positives)


ROUGH_S_PER_UNIT = {"centralised": 5e-4, "ease": 1.0, "mostpop": 1.0, "dp-mostpop": 1.0,
                    "als": 1.0}
FEDERATED_RATE = 1.0  # a federated run's work units are the time model's seconds


def rate_key(cfg: Any) -> tuple[str, bool]:
    """What a measured rate is kept by: the method, and whether its mechanism adds noise
    (a private run of a method costs another rate than its run without noise)."""
    return cfg.federation.resolved_method, bool(cfg.privacy.mechanism.perturbs)


def measured_rates(runs_dir: Path, positives: float = 0.0) -> dict[tuple[str, bool], float]:
    """Seconds per work unit (:func:`work_units`) by :func:`rate_key`, from the finished
    runs here (for a federated method: its measured seconds over the time model's, a
    correction for this machine and this method); ``positives``: the data's mean training
    items a user."""
    rates: dict[tuple[str, bool], list[float]] = {}
    for path in sorted(runs_dir.glob("*/summary.json")) if runs_dir.is_dir() else []:
        try:
            cfg = resolved(_toml(path.parent / "config.toml"))
            s = json.loads(path.read_text())
        except (UserError, OSError, ValueError):
            continue
        units = work_units(cfg, int(s.get("n_users") or 1), int(s.get("n_items") or 1),
                           positives)
        if units > 0 and s.get("seconds_total"):
            rates.setdefault(rate_key(cfg), []).append(float(s["seconds_total"]) / units)
    return {m: sum(v) / len(v) for m, v in rates.items()}


def _toml(path: Path) -> dict[str, Any]:
    from fedem_private.simulation.config import read_toml

    return read_toml(str(path), "run config")


def estimate(cfg: Any, users: int, items: int, rates: Mapping[tuple[str, bool], float],
             positives: float = 0.0) -> tuple[float, bool]:
    """(estimated seconds, measured?) of one run of ``cfg``: its work units
    (:func:`work_units`) at the rate measured here for its method with or without noise
    (:func:`rate_key`), else at the stated rough rate (for a federated run the time
    model's own seconds)."""
    method = cfg.federation.resolved_method
    units = work_units(cfg, users, items, positives)
    rate = rates.get(rate_key(cfg))
    if rate is not None:
        return rate * units, True
    return ROUGH_S_PER_UNIT.get(method, FEDERATED_RATE) * units, False


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Planned:
    """A run in the plan: whether it is finished here, and its estimated seconds."""

    run: Run
    done: bool
    seconds: float
    measured: bool


def plan(rungs: Sequence[Rung], runs_dir: Path, users: int, items: int,
         force: bool, positives: float = 0.0) -> list[tuple[Rung, list[Planned]]]:
    """Each rung with its runs: finished (skipped unless ``force``) or to run, estimated
    (``positives``: the data's mean training items a user, for the time model)."""
    rates = measured_rates(runs_dir, positives)
    out = []
    for rung in rungs:
        items_ = []
        for run in rung.runs:
            secs, measured = estimate(resolved(run.config), users, items, rates, positives)
            done = not force and (runs_dir / run.name / "summary.json").is_file()
            items_.append(Planned(run, done, secs, measured))
        out.append((rung, items_))
    return out


def plan_text(planned: Sequence[tuple[Rung, list[Planned]]]) -> str:
    """The plan as printed before anything runs."""
    lines, total, rough = [], 0.0, False
    for rung, runs in planned:
        todo = [p for p in runs if not p.done]
        secs = sum(p.seconds for p in todo)
        total += secs
        rough |= any(not p.measured for p in todo)
        how = "" if not todo else (" (measured rate)" if all(p.measured for p in todo)
                                   else " (rough rule)")
        state = f"{len(runs) - len(todo)} finished, {len(todo)} to run" if runs else "no run"
        lines.append(f"  {rung.label:<44} {len(runs):>3} run(s): {state}; about "
                     f"{_duration(secs)}{how}")
    lines.append(f"  total to run: about {_duration(total)}")
    if rough:
        lines.append(f"  rough rule: {ROUGH_RULE}")
    return "\n".join(lines)


# --- running -------------------------------------------------------------------------------


def checkpoint_every(rounds: int, estimated_s: float, minutes: float) -> int | None:
    """Rounds between a run's checkpoints: about every ``minutes`` of its estimated time,
    none for a run expected to finish sooner (or ``minutes`` 0)."""
    if minutes <= 0 or estimated_s <= minutes * 60 or rounds < 2:
        return None
    return max(1, math.ceil(rounds * minutes * 60 / estimated_s))


def _changed(path: Path, cfg: Any) -> list[str]:
    from fedem_private.experiments.results import config_columns
    from fedem_private.simulation.config import load_toml

    want, have = config_columns(cfg), config_columns(load_toml(path / "config.toml"))
    keys = {*want, *have} - {"config_id"}
    return sorted(k.removeprefix("cfg.") for k in keys if want.get(k) != have.get(k))


def execute_plan(planned: Sequence[tuple[Rung, list[Planned]]], runs_dir: Path,
                 force: bool, minutes: float) -> None:
    """Run every run not finished, in plan order; record each one's wall time. A finished
    run of another config stops the ladder before any run (unless ``force``)."""
    from fedem_private.experiments.checkpoint import Checkpointing, beside
    from fedem_private.experiments.runner import execute

    for _, runs in planned:
        for p in runs:
            if p.done:
                changed = _changed(runs_dir / p.run.name, resolved(p.run.config))
                if changed:
                    raise UserError(f"{runs_dir / p.run.name} was run with another config "
                                    f"({', '.join(changed[:5])}); pass --force to run it "
                                    f"again")
    walls = _read_walls(runs_dir)
    for rung, runs in planned:
        for p in runs:
            if p.done:
                continue
            cfg = resolved(p.run.config)
            out = runs_dir / p.run.name
            rounds = max(int(cfg.train.rounds), 1)
            every = checkpoint_every(rounds, p.seconds, minutes)
            # a checkpoint left by a killed ladder is resumed even where none is due now
            ck = (Checkpointing(beside(out), every or rounds)
                  if every or beside(out).exists() else None)
            print(f"ladder: {rung.label}: {p.run.name}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            execute(cfg, out, force=True, checkpoint=ck)
            walls[p.run.name] = time.perf_counter() - t0
            _write_walls(runs_dir, walls)


WALLS = "wall_seconds.json"  # run name -> wall seconds of its execution (data to summary)


def _read_walls(runs_dir: Path) -> dict[str, float]:
    path = runs_dir / WALLS
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_walls(runs_dir: Path, walls: Mapping[str, float]) -> None:
    runs_dir.mkdir(parents=True, exist_ok=True)
    tmp = runs_dir / f".{WALLS}.{os.getpid()}"
    tmp.write_text(json.dumps(dict(walls), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, runs_dir / WALLS)


# --- the table and the figures -------------------------------------------------------------

METRICS = ("hr10_full", "ndcg10_full", "hr10_sampled", "ndcg10_sampled")


def run_figures(path: Path, rule: str) -> dict[str, float] | None:
    """A finished run's metrics at the headline round, eps reported and training seconds."""
    if not (path / "summary.json").is_file():
        return None
    s = json.loads((path / "summary.json").read_text())
    last = metrics = s.get("metrics") or {}
    chosen = float(s.get("rounds") or math.nan)
    if rule != "last" and s.get("selected"):
        metrics = s["selected"]["metrics"]
        chosen = float(s["selected"].get("round") or math.nan)
    out = {m: float(metrics[m.split("_")[1]][m.split("_")[0].replace("10", "@10")])
           for m in METRICS}
    out["hr10_full_last"] = float(last["full"]["hr@10"]) if "full" in last else math.nan
    out["round"] = chosen
    eps = ((s.get("privacy") or {}).get("epsilon") or {}).get("reported")
    out["eps"] = math.nan if eps is None else float(eps)
    out["training_s"] = float(s.get("seconds_total") or math.nan)
    return out


def chance_figures(data: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, list[float]]:
    """Chance's metrics per seed: the exact expectation of a uniformly random order of each
    user's candidates (100 sampled, or every item outside its training set and validation
    item)."""
    import numpy as np

    from fedem_private.experiments.analysis import candidate_counts
    from fedem_private.experiments.baseline_run import load_split

    out: dict[str, list[float]] = {m: [] for m in METRICS}
    for seed in seeds:
        _, split = load_split(resolved({"data": dict(data), "train": {"seed": seed},
                                        "federation": {"method": "mostpop"}}))
        for kind, n in (("full", candidate_counts(split)), ("sampled", np.array([100]))):
            hr, ndcg = expected_random(n)
            out[f"hr10_{kind}"].append(hr)
            out[f"ndcg10_{kind}"].append(ndcg)
    return out


def expected_random(n_candidates: Any, k: int = 10) -> tuple[float, float]:
    """(HR@k, NDCG@k) averaged over users when the test item's rank is uniform over each
    user's n candidates: HR = min(k, n) / n, NDCG = sum_{r < min(k, n)} 1 / log2(r + 2) / n."""
    import numpy as np

    n = np.asarray(n_candidates, dtype=float)
    gains = np.cumsum(1.0 / np.log2(np.arange(k) + 2.0))
    hit = np.minimum(k, n) / n
    ndcg = gains[np.minimum(k, n).astype(int) - 1] / n
    return float(hit.mean()), float(ndcg.mean())


@dataclass(frozen=True)
class Row:
    """A line of the table: a rung at one eps, aggregated over its finished seeds."""

    rung: Rung
    eps: float | None  # the target (None: no privacy, or an accounted search's own)
    seeds: int
    values: dict[str, tuple[float, float]]
    eps_reported: float | None
    training_s: float
    wall_s: float

    @property
    def label(self) -> str:
        return self.rung.label + ("" if self.eps is None else f", eps {self.eps:g}")

    @property
    def plot_eps(self) -> float | None:
        """Where the row sits on the eps axis: its target, an accounted search's whole
        pipeline, or None (no privacy)."""
        if self.rung.accounted is not None:
            return float(_pipeline(self.rung.accounted)[1])
        return self.eps


def _pipeline(view: Mapping[str, Any]) -> tuple[str, float]:
    """(which view, eps) of an accounted search with its final run: only the choice seen
    where it holds, else every trial seen."""
    if "only_choice" in view:
        return "only the choice seen", float(view["only_choice"]["reported"])
    return "every trial seen", float(view["every_trial"]["reported"])


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    import numpy as np

    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def rows(rungs: Sequence[Rung], runs_dir: Path, rule: str,
         data: Mapping[str, Any], seeds: Sequence[int]) -> list[Row]:
    """The table's rows, from the finished runs (a rung with none is left out)."""
    walls = _read_walls(runs_dir)
    out = []
    for rung in rungs:
        if rung.kind.name == "chance":
            ch = chance_figures(data, seeds)
            out.append(Row(rung, None, len(seeds), {m: _mean_sd(v) for m, v in ch.items()},
                           None, math.nan, math.nan))
            continue
        for eps in dict.fromkeys(r.eps for r in rung.runs):
            runs = [r for r in rung.runs if r.eps == eps]
            done = [(r, f) for r in runs for f in [run_figures(runs_dir / r.name, rule)] if f]
            if not done:
                continue
            reported = [f["eps"] for _, f in done if math.isfinite(f["eps"])]
            wall = [walls[r.name] for r, _ in done if r.name in walls]
            out.append(Row(rung, eps, len(done),
                           {m: _mean_sd([f[m] for _, f in done])
                            for m in (*METRICS, "hr10_full_last", "round")},
                           max(reported) if reported else None,
                           _mean_sd([f["training_s"] for _, f in done])[0],
                           _mean_sd(wall)[0] if wall else math.nan))
    return out


def _cell(v: tuple[float, float], seeds: int) -> str:
    return f"{v[0]:.4f}" if seeds < 2 else f"{v[0]:.4f} ± {v[1]:.4f}"


def _seconds(s: float) -> str:
    return "-" if not math.isfinite(s) else f"{s:.1f}"


def _eps_cell(row: Row) -> str:
    if row.rung.accounted is not None:
        view, whole = _pipeline(row.rung.accounted)
        return f"{row.eps_reported:.3g} a run; {whole:.3g} with the search ({view})"
    return "-" if row.eps_reported is None else f"{row.eps_reported:.4g}"


ROUND_WORDS = {"last": "the last round",
               "best-val": "the round chosen on the validation item (sampled HR@10)"}


def markdown(rows_: Sequence[Row], title: str, rule: str, missing: Sequence[str],
             unfinished: Sequence[str] = (), stale: Sequence[str] = ()) -> str:
    """ladder.md: the table (headline round in its header), every rung not in it and why
    (:func:`not_in_table`: ``missing`` references not asked for, ``unfinished`` rungs asked
    for with no finished run, ``stale`` runs of rungs no longer asked for), the headline
    figure with the settings table beside it, and the other panels."""
    head = f"full HR@10 ({'last round' if rule == 'last' else 'val-selected round'})"
    lines = [f"# {title}", "",
             f"Headline round: {ROUND_WORDS[rule]}, for every federated rung (the "
             "baselines have no rounds). Mean ± sd over seeds. `training s`: the rounds' "
             "own time (summary.json's seconds_total); `wall s`: the run from start to its "
             "directory written (data, evaluation and writing included).", "",
             f"| rung | eps (reported) | seeds | {head} | full NDCG@10 | sampled HR@10 | "
             "sampled NDCG@10 | training s | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    if rule != "last":  # the round a user would deploy, and the last one beside it
        lines[-2] = lines[-2].replace(" | training s", " | round chosen | full HR@10 (last "
                                      "round) | training s")
        lines[-1] += "---|---|"
        lines[2] += (" A private rung's round is chosen on its users' validation item "
                     "outside the accounting: that choice is not private.")
    for r in rows_:
        extra = ""
        if rule != "last":
            rnd = r.values.get("round", (math.nan, 0.0))[0]
            last = r.values.get("hr10_full_last", (math.nan, 0.0))
            extra = (f" | {'-' if not math.isfinite(rnd) else f'{rnd:.0f}'} | "
                     f"{'-' if not math.isfinite(last[0]) else _cell(last, r.seeds)}")
        lines.append(f"| {r.label} | {_eps_cell(r)} | {r.seeds} | "
                     + " | ".join(_cell(r.values[m], r.seeds) for m in METRICS)
                     + f"{extra} | {_seconds(r.training_s)} | {_seconds(r.wall_s)} |")
    lines += not_in_table(missing, unfinished, stale)
    seen = dict.fromkeys((r.rung.label, r.rung.settings) for r in rows_)
    lines += ["", "![headline](headline.png)", "",
              "Settings of each rung (the figure's legend carries the short labels only):",
              "", "| rung | settings |", "|---|---|"]
    lines += [f"| {label} | {settings} |" for label, settings in seen]
    lines += ["", "Other panels:", "", "![panels](panels.png)", ""]
    return "\n".join(lines)


def not_in_table(missing: Sequence[str], unfinished: Sequence[str],
                 stale: Sequence[str]) -> list[str]:
    """ladder.md's lines on every rung the table lacks, each kind with its reason: the
    references not asked for, the rungs asked for with no finished run, and the runs under
    ``runs/`` of rungs this call did not ask for (a ladder whose rungs changed in one
    ``--out``), which the table, ladder.csv and results.csv leave out."""
    if not (missing or unfinished or stale):
        return []
    lines = ["", "Not in this table:", ""]
    if missing:
        lines.append("- not asked for (an accuracy reads against chance, MostPop, DP-MostPop "
                     f"at the same eps and a centralised model): {', '.join(missing)}")
    if unfinished:
        lines.append(f"- asked for, no run finished: {', '.join(unfinished)}")
    if stale:
        lines.append("- run into this folder before, not in this call's --rungs (kept under "
                     f"runs/, left out of ladder.csv and results.csv): {', '.join(stale)}")
    return lines


def unfinished_rungs(rungs: Sequence[Rung], rows_: Sequence[Row]) -> list[str]:
    """The labels of the rungs asked for that have no row (no run of theirs finished)."""
    shown = {r.rung.name for r in rows_}
    return [r.label for r in rungs if r.name not in shown]


def stale_runs(rungs: Sequence[Rung], runs_dir: Path) -> list[str]:
    """The finished runs under ``runs_dir`` that no rung of this ladder has (sorted)."""
    ours = {run.name for rung in rungs for run in rung.runs}
    if not runs_dir.is_dir():
        return []
    return sorted(p.parent.name for p in runs_dir.glob("*/summary.json")
                  if p.parent.name not in ours)


def missing_references(rungs: Sequence[Rung]) -> list[str]:
    """The references an accuracy stands beside that this ladder lacks."""
    have = {r.kind.role for r in rungs}
    need = {"chance": "chance", "popularity": "MostPop", "floor": "DP-MostPop",
            "ceiling": "a centralised model"}
    return [word for role, word in need.items() if role not in have]


def points(rows_: Sequence[Row]) -> list[Any]:
    """The figure's :class:`~fedem_private.experiments.ladder_plots.Point` of each row."""
    from fedem_private.experiments.ladder_plots import Point

    return [Point(r.rung.label, r.rung.kind.role, r.rung.mode, r.plot_eps, r.values)
            for r in rows_]


def write_csv(rows_: Sequence[Row], path: Path) -> None:
    """ladder.csv: one line per table row."""
    import csv

    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["rung", "label", "kind", "mode", "eps_target", "eps_reported",
                    "eps_with_search", "seeds",
                    *(f"{m}_{s}" for m in METRICS for s in ("mean", "sd")),
                    "training_s", "wall_s", "settings"])
        for r in rows_:
            whole = _pipeline(r.rung.accounted)[1] if r.rung.accounted is not None else ""
            w.writerow([r.rung.name, r.label, r.rung.kind.name, r.rung.mode,
                        "" if r.eps is None else r.eps,
                        "" if r.eps_reported is None else r.eps_reported, whole, r.seeds,
                        *(x for m in METRICS for x in r.values[m]),
                        r.training_s, r.wall_s, r.rung.settings])


def write_outputs(rungs: Sequence[Rung], out: Path, opts: LadderOptions,
                  title: str) -> list[Path]:
    """ladder.md, ladder.csv, results.csv (this ladder's runs only), headline.png and
    panels.png under ``out``."""
    from fedem_private.experiments import ladder_plots
    from fedem_private.experiments.results import collect

    runs_dir = out / "runs"
    table = rows(rungs, runs_dir, opts.round_rule, opts.data, opts.seeds)
    stale = stale_runs(rungs, runs_dir)
    (out / "ladder.md").write_text(markdown(table, title, opts.round_rule,
                                            missing_references(rungs),
                                            unfinished_rungs(rungs, table), stale))
    write_csv(table, out / "ladder.csv")
    written = [out / "ladder.md", out / "ladder.csv"]
    ours = {run.name for rung in rungs for run in rung.runs}
    if any((runs_dir / name / "summary.json").is_file() for name in ours):
        frame = collect(runs_dir)
        frame[frame["run"].isin(ours)].to_csv(out / "results.csv", index=False)
        written.append(out / "results.csv")
    elif (out / "results.csv").is_file():  # an earlier call's, of other rungs
        (out / "results.csv").unlink()
    pts = points(table)
    ladder_plots.headline(pts, out / "headline.png", title)
    ladder_plots.panels(pts, out / "panels.png", title)
    return [*written, out / "headline.png", out / "panels.png"]


def data_shape(data: Mapping[str, Any], seed: int) -> tuple[str, int, int, float]:
    """(dataset name, users, items, mean training items a user) of the ladder's split."""
    from fedem_private.experiments.baseline_run import load_split

    name, split = load_split(resolved({"data": dict(data), "train": {"seed": seed},
                                       "federation": {"method": "mostpop"}}))
    users = int(split.n_users)
    return name, users, int(split.n_items), float(split.train_items.size) / max(users, 1)


def run_ladder(rung_texts: Sequence[str], out: str | Path, opts: LadderOptions, *,
               tuned_files: Sequence[str] = (), tune_files: Sequence[str] = (),
               force: bool = False, checkpoint_minutes: float = 10.0,
               dry_run: bool = False, say: Any = print) -> list[Path]:
    """Plan, print the plan, run what is not finished and write the outputs; returns the
    paths written (none on a dry run)."""
    root = Path(out)
    if opts.round_rule not in ROUNDS:
        raise UserError(f"--round must be one of {', '.join(ROUNDS)}, got {opts.round_rule!r}")
    if not opts.seeds:
        raise UserError("--seeds: give at least one seed")
    data_path = opts.data.get("data_dir")
    if data_path is not None and not Path(str(data_path)).expanduser().exists():
        raise UserError(f"dataset {opts.data.get('dataset')}: not found: {data_path}")
    known = kinds()
    for t in rung_texts:
        parse_rung(t, known)  # a typo is named before any tuning runs
    tuned = [transferred(p, opts.data) for p in tuned_files]
    if tune_files and not dry_run:
        tuned += [tuned_here(p, opts.data, root / "tune") for p in tune_files]
    elif tune_files:
        say(f"dry run: the tuning files ({', '.join(tune_files)}) are not run")
    rungs = build_rungs(rung_texts, tuned, opts)
    if opts.round_rule != "last" and any(r.accounted for r in rungs):
        raise UserError("--round best-val: an accounted search's final run reports its last "
                        "round (choosing one on validation would be a release no eps covers)")
    check(rungs)
    name, users, items, positives = data_shape(opts.data, opts.seeds[0])
    planned = plan(rungs, root / "runs", users, items, force, positives)
    title = f"Ladder: {name} ({users} users, {items} items)"
    say(f"{title}; headline round: {opts.round_rule}\nplan:\n{plan_text(planned)}")
    if dry_run:
        return []
    execute_plan(planned, root / "runs", force, checkpoint_minutes)
    return write_outputs(rungs, root, opts, title)
