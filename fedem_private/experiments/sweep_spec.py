"""Sweep specifications: a grid of runs described by one TOML file.

A sweep file has two tables::

    [sweep]                       # the grid axes; an axis left out takes [base]'s value
    datasets = ["synthetic", "ml-100k"]
    methods = ["fedmf", "fedsim", "fedem"]
    privacy = ["none", "ldp-laplace"]
    epsilons = [inf, 8, 1]        # total target per ldp mode; inf = clip only, no noise
    seeds = [0, 1, 2]
    protocols = ["strict"]
    attacks = ["projection"]      # run on recorded uploads after training
    record_rounds = [1, "last"]   # rounds recorded for the attacks (default ["last"])
    record_clients = 100          # the first N client ids are recorded (default 100)
    [sweep.data_dirs]             # optional: where each real dataset lives
    ml-100k = "../shared/datasets/ml-100k"

    [base]                        # a normal run config applied to every run
    train.rounds = 10
    privacy.clip = 5.0

Two more axes cross with ``methods``: ``merges`` (sr, sm, dm, em) and
``aggregations`` (fedavg, uniform, similarity, none), each also accepting
``"default"`` (the method's own); e.g. ``methods = ["fedem"]`` with
``merges = ["sr", "sm", "dm", "em"]`` gives the four FedEM merge variants.
``codecs = ["full", "lora", "hash", "rqvae", "c-lora"]`` crosses the upload
codecs (docs/design.md section 11) with every method.

To run chosen method / merge pairs instead of the full cross product, list
them as ``variants = ["fedmf", "fedsim", "fedem-sm", "fedem-dm", "fedem-em"]``
(``method`` or ``method-merge``); ``variants`` replaces ``methods`` and
``merges``.

Privacy modes without a budget (``none``, ``paper``) give one grid point each,
whatever ``epsilons`` says; a sweep whose only modes have no budget may still say
``epsilons = [inf]`` (no noise, which is what they do), but a finite epsilon there
is refused, as no run would spend it.

``[base.data] data_dir`` is used only for ``[base.data] dataset``; the data of the
``datasets`` axis go in ``[sweep.data_dirs]`` (a ``data_dir`` no point would read is
refused).

``protocols`` takes ``strict``, ``paper``, ``paper-code`` (the preset of docs/design.md
section 2a) and ``paper`` with named options of the authors' code, e.g.
``"paper+min10"``, ``"paper+agg10+pcasim"`` (tokens: min10, firstseen,
sharedneg, besttest, bestval, bestauto, agg10, pcasim, earlystop). An option
that does not apply to a point's dataset or method (agg10 and pcasim without
similarity aggregation, firstseen on a dataset with timestamps, earlystop on
a backbone without it) gives no point for it, as a budget gives none to a mode
without one; the preset turns on only the options that apply. ``paper-code`` with
options (``"paper-code+agg10"``) is the preset and options it leaves off here, asked
for: a point where one cannot be built is refused, not dropped (``agg10`` on PFedRec's
FedAvg: the FedEM code's 10% share put on another aggregation).

``references = ["mostpop", "dp-mostpop", "ease"]`` adds the accuracy ladder's
baselines beside the grid (docs/design.md section 14): each non-private one once per
seed, dataset and protocol, and ``dp-mostpop`` at every private mode's matched
architecture (its mechanism's ``floor``) and finite
epsilon, named ``<dataset>/dp-mostpop/<architecture>-eps<eps>/<protocol>/seed<seed>``.

Each grid point gets a readable directory name,
``<dataset>/<variant>/<privacy>/<protocol>/seed<seed>`` (e.g.
``synthetic/fedem-em/ldp-laplace-eps8/strict/seed0``), and a digest of its
fully resolved config: a run directory whose digest differs is re-run.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from typing import Any

from fedem_private.client.codec_kinds import REGISTRY as CODEC_REGISTRY
from fedem_private.client.strategies import REGISTRY as MERGE_REGISTRY
from fedem_private.client.strategies import merge_class
from fedem_private.data import DATASETS, PROTOCOLS
from fedem_private.errors import UserError
from fedem_private.experiments.checkpoint import check_every
from fedem_private.privacy import registry
from fedem_private.privacy.config import DDP_FIELDS, DPSGD_FIELDS, PrivacyConfig
from fedem_private.server.registry import REGISTRY as AGGREGATOR_REGISTRY
from fedem_private.simulation.config import (
    METHOD_BACKBONE,
    METHOD_DEFAULTS,
    METHODS,
    PAPER_CODE_OPTIONS,
    FederationConfig,
    RunConfig,
    from_dict,
    identity_dict,
    option_applies,
    parse_protocol_label,
    to_dict,
    with_overrides,
)


def _takes_budget(mode: str) -> bool:
    """Whether privacy ``mode`` takes a budget (epsilon): the sweep's epsilons axis applies."""
    return registry.mechanism_for(mode).takes_budget


AXES = ("datasets", "methods", "merges", "variants", "aggregations", "codecs", "privacy",
        "epsilons", "seeds", "protocols", "attacks")
SPEC_KEYS = (*AXES, "data_dirs", "record_rounds", "record_clients", "references",
             "checkpoint_every")
# the ladder's rungs a sweep may add (docs/design.md section 14): non-private references,
# and dp-mostpop, the private floor of each private mode at each of its epsilons
REFERENCES = ("mostpop", "dp-mostpop", "centralised", "ease", "als")
DEFAULT = "default"  # merges / aggregations: the method's own choice

QUICK_SPEC = """\
# The built-in quick sweep (issue 67): FedMF vs FedEM under user-level central DP
# (cdp-gaussian: DP-FedAvg, Poisson-sampled cohorts of 800 expected clients of 4,000,
# clipped deltas summed under secure aggregation, Gaussian noise on the sum) at
# eps in {inf, 8, 1} (inf: sampled and clipped, no noise), 3 seeds, the projection
# attack on the last round's release; beside them the accuracy ladder's references:
# MostPop, EASE, centralised MF and DP-MostPop released centrally (Gaussian) at eps 8
# and 1, the private floor the cdp-gaussian points are judged against.
# Data: the built-in generator with enough users for a central mechanism to pay
# (4,000 users, 300 items, 8 taste clusters strong enough that popularity is far below
# a personalised model). FedEM runs with FedAvg aggregation: its own (similarity)
# aggregation needs each client's upload, which a central mechanism does not give.
[sweep]
datasets = ["synthetic"]
methods = ["fedmf", "fedem"]
aggregations = ["fedavg"]
privacy = ["cdp-gaussian"]
epsilons = [inf, 8, 1]
seeds = [0, 1, 2]
protocols = ["strict"]
attacks = ["projection"]
record_rounds = ["last"]
record_clients = 100
references = ["mostpop", "dp-mostpop", "ease", "centralised"]

[base.data.synthetic]
n_users = 4000
n_items = 300
n_clusters = 8
taste_strength = 6.0
mean_activity = 20.0

[base.train]
rounds = 25
local_epochs = 3
cohort_size = 800        # Poisson rate 800 / 4,000 = 0.2: a user takes part ~5 times
eval_users = 1000        # a keyed sample, the same for every run of a seed

[base.federation]
# FedAvg's mean delta spreads each item's update over every sampled client; a server
# step of 10, picked by hand on seed 0's test HR@10 without noise and an unbinding clip
# (full HR@10 0.24 at a step of 1 with 2, 5 or 10 local epochs; 0.36 at a step of 3 and
# 0.42 at 10 with 3): a demo's setting, not a tuned benchmark
server_lr = 10.0

[base.privacy]
# L2 clip of a client's table delta: below its typical pre-clip norm (~8 in FedMF's
# clip-free runs, mean_pre_clip_norm in metrics.csv), so most deltas are clipped
clip = 6.0
"""


@dataclass(frozen=True)
class SweepSpec:
    """The grid axes plus the base config every run starts from."""

    base: RunConfig
    datasets: tuple[str, ...]
    methods: tuple[str, ...]
    merges: tuple[str | None, ...]
    aggregations: tuple[str | None, ...]
    privacy: tuple[str, ...]
    epsilons: tuple[float | None, ...]
    seeds: tuple[int, ...]
    protocols: tuple[str, ...]
    attacks: tuple[str, ...]
    data_dirs: tuple[tuple[str, str], ...] = ()
    record_rounds: tuple[int | str, ...] = ("last",)
    record_clients: int = 100
    source: str = "built-in quick sweep"
    variants: tuple[tuple[str, str | None], ...] = ()  # (method, merge) pairs; () = product
    codecs: tuple[str, ...] = ("full",)  # upload codecs (docs/design.md section 11)
    references: tuple[str, ...] = ()  # the ladder's baselines run beside the grid
    # rounds between a point's checkpoints (experiments/checkpoint.py); None: none
    checkpoint_every: int | None = None

    def method_merges(self) -> list[tuple[str, str | None]]:
        """The (method, merge) pairs of the grid: ``variants``, else methods x merges."""
        return list(self.variants) or list(product(self.methods, self.merges))


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep: where it goes, what it runs, and its identity."""

    name: str  # relative run directory, e.g. synthetic/fedmf/ldp-laplace-eps8/strict/seed0
    config: RunConfig  # validated and resolved
    attacks: tuple[str, ...]
    variant: str  # method label with non-default merge / aggregation, e.g. fedem-em
    record_rounds: tuple[int | str, ...] = ("last",)
    record_clients: int = 100
    # how the point runs, not what: outside its digest
    checkpoint_every: int | None = None

    def digest(self, recording: bool) -> str:
        """SHA-256 over the resolved config and what is recorded (nothing, or which rounds)."""
        record = [list(self.record_rounds), self.record_clients] if recording else None
        blob = json.dumps({"config": identity_dict(self.config), "recording": record},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------- parsing
def _as_list(axis: str, value: Any) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"[sweep] {axis} must not be empty")
    out: list[Any] = []
    for v in items:
        if v not in out:
            out.append(v)
    return out


def _choice(axis: str, values: list[Any], allowed: Sequence[str]) -> tuple[str, ...]:
    for v in values:
        if not isinstance(v, str) or v not in allowed:
            raise UserError(f"[sweep] {axis}: unknown value {v!r}; choose from "
                            f"{', '.join(allowed)}")
    return tuple(values)


def _epsilons(values: list[Any]) -> tuple[float, ...]:
    out = []
    for v in values:
        if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
            v = math.inf
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise UserError(f"[sweep] epsilons: {v!r} is not a number > 0 (inf means no noise)")
        out.append(float(v))
    return tuple(out)


def _seeds(values: list[Any]) -> tuple[int, ...]:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UserError(f"[sweep] seeds: {v!r} is not a non-negative integer")
    return tuple(values)


def _optional_choice(axis: str, values: list[Any], allowed: Sequence[str]
                     ) -> tuple[str | None, ...]:
    _choice(axis, values, (*allowed, DEFAULT))
    return tuple(None if v == DEFAULT else v for v in values)


def _variants(values: list[Any]) -> tuple[tuple[str, str | None], ...]:
    out = []
    for v in values:
        method, _, merge = v.partition("-") if isinstance(v, str) else ("", "", "")
        if isinstance(v, str) and v in METHODS:  # a method whose name has a dash: dp-mostpop
            method, merge = v, ""
        if method not in METHODS or (merge and merge not in MERGE_REGISTRY):
            raise UserError(f"[sweep] variants: unknown variant {v!r}; write a method "
                            f"({', '.join(METHODS)}) or method-merge (merge one of "
                            f"{', '.join(MERGE_REGISTRY)}), e.g. \"fedem-sm\"")
        out.append((method, merge or None))
    return tuple(out)


def _protocols(values: list[Any]) -> tuple[str, ...]:
    """Protocol labels: strict, paper, paper-code, paper+<option>+... or
    paper-code+<option>+... (docs/design.md 2a)."""
    for v in values:
        if not isinstance(v, str):
            raise UserError(f"[sweep] protocols: unknown value {v!r}; choose from "
                            f"{', '.join(PROTOCOLS)}, paper-code or paper+<option>")
        try:
            parse_protocol_label(v)
        except UserError as exc:
            raise UserError(f"[sweep] protocols: {exc}") from None
    return tuple(values)


# dotted config key -> its option token (the applicability of a protocol label's options)
_OPTION_TOKEN = {f"{section}.{name}": token for token, section, name, _, _ in PAPER_CODE_OPTIONS}


def _data_dirs(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise UserError("[sweep.data_dirs] must be a table of dataset = \"directory\"")
    for name, path in value.items():
        if name not in DATASETS:
            raise UserError(f"[sweep.data_dirs]: unknown dataset {name!r}")
        if not isinstance(path, str):
            raise UserError(f"[sweep.data_dirs] {name} must be a string path")
    return tuple(sorted(value.items()))


def _record_rounds(value: Any) -> tuple[int | str, ...]:
    out: list[int | str] = []
    for v in _as_list("record_rounds", value):
        if v == "last" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            out.append(v)
        else:
            raise UserError(f"[sweep] record_rounds: {v!r} is not a round number >= 1 or "
                            f"\"last\"")
    return tuple(out)


def _record_clients(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"[sweep] record_clients: {value!r} is not a positive integer")
    return value


def parse_spec(data: dict[str, Any], source: str) -> SweepSpec:
    """Build a :class:`SweepSpec` from a parsed TOML document; bad input is a UserError."""
    unknown = sorted(set(data) - {"sweep", "base"})
    if unknown:
        raise UserError(f"{source}: unknown table [{unknown[0]}]; a sweep file has [sweep] "
                        f"and [base]")
    sweep = data.get("sweep", {})
    if not isinstance(sweep, dict):
        raise UserError(f"{source}: [sweep] must be a table")
    bad = sorted(set(sweep) - set(SPEC_KEYS))
    if bad:
        raise UserError(f"{source}: unknown axis {bad[0]!r} in [sweep]; known: "
                        f"{', '.join(SPEC_KEYS)}")
    base_table = data.get("base", {})
    if not isinstance(base_table, dict):
        raise UserError(f"{source}: [base] must be a table")
    try:
        base = from_dict(base_table)
    except UserError as exc:
        raise UserError(f"{source}: [base]: {exc}") from None
    from fedem_private.experiments.attack_step import known_attacks

    def axis(name: str, default: Any) -> list[Any]:
        return _as_list(name, sweep[name]) if name in sweep else [default]

    attack_names = known_attacks()
    attacks = _as_list("attacks", sweep["attacks"]) if "attacks" in sweep else []
    attacks_t = (_choice("attacks", attacks, attack_names) if attack_names is not None
                 else _choice("attacks", attacks, [a for a in attacks if isinstance(a, str)]))
    privacy = _choice("privacy", axis("privacy", base.privacy.mode), registry.names())
    epsilons: tuple[float | None, ...] = (None,)
    if "epsilons" in sweep:
        epsilons = _epsilons(_as_list("epsilons", sweep["epsilons"]))
        if not any(_takes_budget(m) for m in privacy):
            if not all(math.isinf(e) for e in epsilons if e is not None):
                raise UserError(f"{source}: [sweep] epsilons needs an ldp privacy mode or a "
                                f"central one ({', '.join(registry.names_with('takes_budget'))}) "
                                f"in privacy")
            epsilons = (None,)  # inf (no noise) is what a mode without a budget does anyway
    if "variants" in sweep and ("methods" in sweep or "merges" in sweep):
        raise UserError(f"{source}: [sweep] variants replaces methods and merges; give "
                        f"either variants or methods/merges")
    variants = _variants(_as_list("variants", sweep["variants"])) if "variants" in sweep else ()
    spec = SweepSpec(
        base=base,
        datasets=_choice("datasets", axis("datasets", base.data.dataset), DATASETS),
        methods=_choice("methods", axis("methods", base.federation.resolved_method), METHODS),
        # the registries read now (not the tuples taken at import): plugins' parts too
        merges=_optional_choice("merges", axis("merges", base.federation.merge or DEFAULT),
                                tuple(MERGE_REGISTRY)),
        aggregations=_optional_choice(
            "aggregations", axis("aggregations", base.federation.aggregation or DEFAULT),
            tuple(AGGREGATOR_REGISTRY)),
        privacy=privacy,
        epsilons=epsilons,
        seeds=_seeds(axis("seeds", base.train.seed)),
        protocols=_protocols(axis("protocols", base.data.protocol)),
        attacks=attacks_t,
        data_dirs=_data_dirs(sweep.get("data_dirs", {})),
        record_rounds=_record_rounds(sweep.get("record_rounds", ["last"])),
        record_clients=_record_clients(sweep.get("record_clients", 100)),
        source=source,
        variants=variants,
        codecs=_choice("codecs", axis("codecs", base.federation.codec),
                       tuple(CODEC_REGISTRY)),
        references=_choice("references", _as_list("references", sweep["references"]),
                           REFERENCES) if "references" in sweep else (),
        checkpoint_every=check_every(sweep.get("checkpoint_every"), "[sweep] checkpoint_every"),
    )
    _check_base_data_dir(spec)
    grid(spec)  # every point must be a valid config
    return spec


def _check_base_data_dir(spec: SweepSpec) -> None:
    """Refuse a ``[base.data] data_dir`` that no point would use: it belongs to ``[base.data]
    dataset`` alone, and the sweep's datasets leave that one out."""
    data = spec.base.data
    if data.data_dir is None or data.dataset in spec.datasets:
        return
    real = [d for d in spec.datasets if d != "synthetic"] or list(spec.datasets)
    raise UserError(f"{spec.source}: [base.data] data_dir {data.data_dir!r} belongs to [base.data] "
                    f"dataset ({data.dataset}), which is not among the sweep's datasets "
                    f"({', '.join(spec.datasets)}), so no run would read it; give "
                    f"[sweep.data_dirs] instead, e.g. {real[0]} = {data.data_dir!r}")


def load_spec(path: str | Path | None) -> SweepSpec:
    """Read a sweep file, or the built-in quick sweep when ``path`` is None."""
    if path is None:
        return parse_spec(tomllib.loads(QUICK_SPEC), "built-in quick sweep")
    from fedem_private.simulation.config import read_toml

    return parse_spec(read_toml(path, "sweep file"), str(path))


# ------------------------------------------------------------------------------- grid
def fmt_number(x: float) -> str:
    """Short path-safe number: 8.0 -> 8, 0.5 -> 0.5, inf -> inf."""
    return "inf" if math.isinf(x) else f"{x:g}"


def variant_label(fed: FederationConfig) -> str:
    """fedmf, fedsim, fedem-em, fedncf-em, fedmf-uniform, fedem-em+ncf: method and what differs.

    A backbone other than the preset's own is appended after ``+``; a codec
    other than ``full`` after ``~``; FedMerge's K, when not the default 4,
    after ``-k`` (``fedmerge-k8``, ``fedmerge-em-k2``); the adapter's ``holdout``
    objective after ``-holdout``, with its folds when not the default 5
    (``fedem-em-holdout``, ``fedem-em-holdout-f3``); the hash codec's SENet ratio after
    ``-senet`` (``fedmf~hash-senet16``).
    """
    method = fed.resolved_method
    default_agg, default_merge = METHOD_DEFAULTS[method]
    label = method
    if method == "fedem" or fed.resolved_merge != default_merge:
        label += f"-{fed.resolved_merge}"
    if fed.resolved_aggregation != default_agg:
        label += f"-{fed.resolved_aggregation}"
    if fed.resolved_aggregation == "fedmerge" and fed.merge_k != FederationConfig.merge_k:
        label += f"-k{fed.merge_k}"
    if fed.adapter_objective != FederationConfig.adapter_objective:
        label += f"-{fed.adapter_objective}"
        if fed.adapter_folds != FederationConfig.adapter_folds:
            label += f"-f{fed.adapter_folds}"
    if fed.resolved_backbone != METHOD_BACKBONE[method]:
        label += f"+{fed.resolved_backbone}"
    if fed.codec != FederationConfig.codec:
        label += f"~{fed.codec}"
    if fed.hash_senet:
        label += f"-senet{fed.hash_senet}"
    return label


def privacy_label(p: PrivacyConfig, cohort: int = 0) -> str:
    """none, ldp-laplace-eps8, ldp-laplace-epsinf, ldp-gaussian-z1.5, paper-lambda0.1, ...;
    a central mode's rate is ``q<rate>``, or ``k<K>`` when ``train.cohort_size`` K sets it
    (K / n at run time: the rate field still reads 1 here)."""
    mech = p.mechanism
    if not mech.perturbs:
        return p.mode
    if mech.fixed_noise:  # noise set by the paper's lambda, no budget
        return f"{p.mode}-lambda{fmt_number(p.paper_lambda)}"
    if mech.central:
        budget = (f"eps{fmt_number(p.epsilon)}" if p.epsilon is not None
                  else f"z{fmt_number(p.noise_multiplier or 0.0)}")
        rate = f"k{cohort}" if cohort else f"q{fmt_number(p.sample_rate)}"
        return f"{p.mode}-{rate}-{budget}"
    if p.epsilon is not None:
        return f"{p.mode}-eps{fmt_number(p.epsilon)}"
    if p.epsilon_round is not None:
        return f"{p.mode}-epsround{fmt_number(p.epsilon_round)}"
    return f"{p.mode}-z{fmt_number(p.noise_multiplier or 0.0)}"


def _privacy(base: PrivacyConfig, mode: str, eps: float | None) -> PrivacyConfig:
    mech = registry.mechanism_for(mode)
    if not mech.accepts("sample_rate"):  # the Poisson rate is cdp-gaussian's alone
        base = replace(base, sample_rate=1.0)
    if not mech.in_training:  # and the local DP-SGD settings ldp-dpsgd's
        defaults = PrivacyConfig.__dataclass_fields__
        base = replace(base, **{n: defaults[n].default for n in DPSGD_FIELDS})
    if not mech.accepts("ddp_bits"):  # and the secure-sum settings ddp-skellam's
        defaults = PrivacyConfig.__dataclass_fields__
        base = replace(base, **{n: defaults[n].default for n in DDP_FIELDS})
    if not mech.takes_budget:
        return replace(base, mode=mode, epsilon=None, epsilon_round=None, noise_multiplier=None)
    if eps is None:  # keep the base budget (an ldp base mode always has one)
        if base.mechanism.takes_budget:
            return replace(base, mode=mode)
        raise UserError(f"privacy mode {mode!r} needs a budget: give [sweep] epsilons or "
                        f"[base.privacy] epsilon")
    return replace(base, mode=mode, epsilon=eps, epsilon_round=None, noise_multiplier=None)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def _data_dir(spec: SweepSpec, dataset: str) -> str | None:
    """The folder of ``dataset``: ``[sweep.data_dirs]``, else ``[base.data] data_dir`` for
    the base's own dataset."""
    base = spec.base.data
    return dict(spec.data_dirs).get(dataset, base.data_dir if dataset == base.dataset else None)


def grid(spec: SweepSpec) -> list[GridPoint]:
    """All grid points in a fixed order (seed outermost, so a first pass covers the grid)."""
    points: dict[str, GridPoint] = {}
    for seed, dataset, protocol, (method, merge), agg, codec, mode in product(
            spec.seeds, spec.datasets, spec.protocols, spec.method_merges(),
            spec.aggregations, spec.codecs, spec.privacy):
        for eps in (spec.epsilons if _takes_budget(mode) else (None,)):
            base = spec.base
            data_dir = _data_dir(spec, dataset)
            proto, options = parse_protocol_label(protocol)
            try:
                cfg = RunConfig(
                    data=replace(base.data, dataset=dataset, protocol=proto,
                                 data_dir=data_dir),
                    train=replace(base.train, seed=seed),
                    federation=replace(base.federation, method=method, merge=merge,
                                       aggregation=agg, codec=codec),
                    privacy=_privacy(base.privacy, mode, eps),
                )
                if (cfg.privacy.mechanism.in_training and cfg.privacy.dpsgd_adapter_steps
                        and not merge_class(cfg.federation.resolved_merge).dpsgd_adapter):
                    # the DP-SGD adapter's steps are em's alone (other merges train none)
                    cfg = replace(cfg, privacy=replace(cfg.privacy, dpsgd_adapter_steps=0))
                if proto == "paper" and not all(
                        option_applies(_OPTION_TOKEN[key], cfg.data, cfg.federation)
                        for key in options):
                    continue  # an option of the label that means nothing here: no point
                # paper-code+<option>: the preset and more, asked for; refused where unbuilt
                if options:
                    cfg = with_overrides(cfg, options)
                cfg = cfg.validate().resolved()
            except UserError as exc:
                raise UserError(f"{spec.source}: {dataset}/{method}/{mode}: {exc}") from None
            late = [r for r in spec.record_rounds if r != "last" and int(r) > cfg.train.rounds]
            if spec.attacks and late:
                raise UserError(f"{spec.source}: [sweep] record_rounds: round {late[0]} is "
                                f"beyond the {cfg.train.rounds} rounds of the runs")
            variant = variant_label(cfg.federation)
            name = "/".join(_safe(part) for part in (
                dataset, variant, privacy_label(cfg.privacy, cfg.train.cohort_size), protocol,
                f"seed{seed}"))
            point = GridPoint(name, cfg, spec.attacks, variant, spec.record_rounds,
                              spec.record_clients, spec.checkpoint_every)
            if name in points and to_dict(points[name].config) != to_dict(cfg):
                raise UserError(f"{spec.source}: two different configs map to {name}")
            points.setdefault(name, point)
    for point in reference_points(spec):
        points.setdefault(point.name, point)
    return list(points.values())


def _floor_budgets(spec: SweepSpec) -> list[tuple[str, float]]:
    """(dp-mostpop architecture, epsilon) of every private mode of the grid that has a
    matched floor (:func:`~fedem_private.experiments.floors.architecture_of`), at each finite
    epsilon of the grid."""
    from fedem_private.experiments.floors import architecture_of

    out = []
    for mode in spec.privacy:
        arch = architecture_of(mode)
        for eps in spec.epsilons:
            if arch and eps is not None and math.isfinite(eps) and (arch, eps) not in out:
                out.append((arch, eps))
    return out


def reference_points(spec: SweepSpec) -> list[GridPoint]:
    """The ladder's baselines of ``[sweep] references``, per seed, dataset and protocol:
    each non-private reference once, and ``dp-mostpop`` at every (architecture, epsilon)
    of :func:`_floor_budgets`. They upload nothing and are never attacked."""
    from fedem_private.simulation.config import PrivacyConfig

    out = []
    for seed, dataset, protocol, ref in product(spec.seeds, spec.datasets, spec.protocols,
                                                spec.references):
        base = spec.base
        data_dir = _data_dir(spec, dataset)
        budgets = _floor_budgets(spec) if ref == "dp-mostpop" else [(None, None)]
        for arch, eps in budgets:
            baseline = base.baseline if arch is None else replace(
                base.baseline, architecture=arch, epsilon=eps)
            proto, options = parse_protocol_label(protocol)
            try:
                cfg = RunConfig(
                    data=replace(base.data, dataset=dataset, protocol=proto,
                                 data_dir=data_dir),
                    train=replace(base.train, seed=seed),
                    federation=FederationConfig(method=ref), privacy=PrivacyConfig(),
                    baseline=baseline)
                applies = {k: v for k, v in options.items()
                           if option_applies(_OPTION_TOKEN[k], cfg.data, cfg.federation)}
                cfg = with_overrides(cfg, applies).validate().resolved()
            except UserError as exc:
                raise UserError(f"{spec.source}: references {ref}: {exc}") from None
            label = "none" if arch is None else f"{arch}-eps{fmt_number(eps)}"
            name = "/".join(_safe(part) for part in (dataset, ref, label, protocol,
                                                     f"seed{seed}"))
            out.append(GridPoint(name, cfg, (), ref))
    return out
