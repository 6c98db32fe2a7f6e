"""Presets as data (docs/design.md section 2a): the ``paper-code`` protocol's named options
of the authors' code, protocol labels (``paper+agg10``) and the round each backbone's own
code reports. It reads a run's configuration through :class:`Sections` and imports no
:class:`~fedem_private.simulation.run_config.RunConfig`, which imports it (docs/design.md
section 1: no import circles). Importing this module is light (no torch or pandas).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from fedem_private.client.codec_kinds import codec_class
from fedem_private.client.strategies import merge_class
from fedem_private.errors import UserError
from fedem_private.models import backbone_class
from fedem_private.server.registry import aggregator_class
from fedem_private.simulation.sections import (
    PROTOCOLS_ALL,
    DataConfig,
    FederationConfig,
    TrainConfig,
)


class Sections(Protocol):
    """The sections of a run's configuration the presets read (a
    :class:`~fedem_private.simulation.run_config.RunConfig`)."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def train(self) -> TrainConfig: ...

    @property
    def federation(self) -> FederationConfig: ...


# ---------------------------------------------------------------- docs/design.md 2a: paper-code
# (label token, section, field, value in the paper-code preset, default): each fact of the
# authors' code (docs/design.md section 2a) as a named option, off by default
PAPER_CODE_OPTIONS: tuple[tuple[str, str, str, Any, Any], ...] = (
    ("min10", "data", "min_user_ratings", 10, 3),
    ("firstseen", "data", "first_seen_order", True, False),
    ("sharedneg", "data", "shared_eval_negatives", True, False),
    ("best", "train", "select_round", "auto", "last"),
    ("agg10", "federation", "agg_clients_ratio", 0.1, 1.0),
    ("pcasim", "federation", "similarity", "pca", "eq13"),
    ("batchmerge", "federation", "merge_every_batch", True, False),
    ("earlystop", "train", "early_stop_tol", 1e-4, 0.0),
)
# options not built yet: the preset leaves them off (and the sweep labels refuse them)
UNBUILT_OPTIONS: frozenset[str] = frozenset()
# datasets the preset's first-seen order applies to (no timestamps; csv: the file decides)
UNTIMED_DATASETS = ("filmtrust", "lastfm-2k")


def auto_select_round(backbone: str) -> str:
    """The reported round of the backbone's own code (docs/design.md 2a): best validation HR@10 for
    PFedRec and GPFedRec, best test HR@10 for FedEM (mf, ncf) and FedRAP."""
    return backbone_class(backbone).own_select_round


def option_applies(token: str, data: DataConfig, fed: FederationConfig) -> bool:
    """Whether the option ``token`` of :data:`PAPER_CODE_OPTIONS` means anything for this
    dataset and method (the preset turns on only those; explicitly they are refused)."""
    if token in UNBUILT_OPTIONS:
        return False
    if token == "firstseen":
        return data.dataset in UNTIMED_DATASETS
    if token in ("agg10", "pcasim"):  # facts of the FedEM code's similarity aggregation
        return aggregator_class(fed.resolved_aggregation).similarity_weights
    if token == "earlystop":
        return (backbone_class(fed.resolved_backbone).early_stop
                and not codec_class(fed.codec).peft)
    if token == "batchmerge":
        return (merge_class(fed.resolved_merge).batch_merge
                and backbone_class(fed.resolved_backbone).batch_merge
                and not codec_class(fed.codec).peft and fed.adapter_objective == "train")
    return True


def paper_code(data: DataConfig, train: TrainConfig, fed: FederationConfig
               ) -> tuple[DataConfig, TrainConfig, FederationConfig]:
    """The ``paper-code`` preset: the ``paper`` protocol with every option of docs/design.md 2a that
    applies to the dataset and method switched on (an option already set keeps its value)."""
    sections = {"data": replace(data, protocol="paper"), "train": train, "federation": fed}
    for token, section, name, value, default in PAPER_CODE_OPTIONS:
        if option_applies(token, data, fed) and getattr(sections[section], name) == default:
            sections[section] = replace(sections[section], **{name: value})
    return sections["data"], sections["train"], sections["federation"]  # type: ignore[return-value]


def protocol_options(cfg: Sections) -> dict[str, Any]:
    """The docs/design.md 2a options a config switches on, as ``{field: value}`` ({} for none)."""
    return _switched_on({"data": cfg.data, "train": cfg.train, "federation": cfg.federation})


def _switched_on(sections: dict[str, Any]) -> dict[str, Any]:
    """:func:`protocol_options` of the sections ``{"data": ..., "train": ...,
    "federation": ...}``."""
    out: dict[str, Any] = {}
    for _, section, name, _, default in PAPER_CODE_OPTIONS:
        value = getattr(sections[section], name)
        if value != default:
            out[name] = value
    return out


def _option_token(name: str, value: Any) -> str:
    if name == "min_user_ratings":
        return f"min{value}"
    if name == "select_round":
        return str(value).replace("-", "")
    if name == "agg_clients_ratio":
        return f"agg{value * 100:g}"
    if name == "early_stop_tol":
        return "earlystop" if value == 1e-4 else f"earlystop{value:g}"
    return {"first_seen_order": "firstseen", "shared_eval_negatives": "sharedneg",
            "similarity": f"{value}sim", "merge_every_batch": "batchmerge"}[name]


def protocol_label(cfg: Sections) -> str:
    """``strict``, ``paper``, ``paper-code`` (the preset exactly), ``paper-code+<option>``
    (the preset and options it does not switch on here, e.g. ``paper-code+agg10`` for a
    PFedRec+EM given the 10% share), or the protocol and its options, e.g.
    ``paper+min10+sharedneg`` (docs/design.md 2a)."""
    options = protocol_options(cfg)
    if not options:
        return cfg.data.protocol
    if cfg.data.protocol == "paper":
        plain = {"data": cfg.data, "train": cfg.train, "federation": cfg.federation}
        for _, section, name, _, dflt in PAPER_CODE_OPTIONS:
            plain[section] = replace(plain[section], **{name: dflt})
        d, t, f = paper_code(plain["data"], plain["train"], plain["federation"])  # type: ignore
        if t.select_round == "auto":
            t = replace(t, select_round=auto_select_round(f.resolved_backbone))
        preset = _switched_on({"data": d, "train": t, "federation": f})
        if preset == options:
            return "paper-code"
        if all(options.get(k, object()) == v for k, v in preset.items()):
            return "+".join(["paper-code"] + [_option_token(k, v) for k, v in options.items()
                                              if k not in preset])
    return "+".join([cfg.data.protocol] + [_option_token(k, v) for k, v in options.items()])


def parse_protocol_label(label: str) -> tuple[str, dict[str, Any]]:
    """A sweep's protocol label as (protocol, {dotted config key: value}): ``paper-code``,
    ``strict``, ``paper``, ``paper+<option>+...`` or ``paper-code+<option>+...`` (the
    preset and more) with options as :func:`protocol_label` writes them (min10, firstseen,
    sharedneg, besttest, bestval, bestauto, agg10, pcasim, batchmerge, earlystop)."""
    base, *tokens = str(label).split("+")
    if base not in PROTOCOLS_ALL or (tokens and base == "strict"):
        raise UserError(f"unknown protocol {label!r}; write strict, paper, paper-code, "
                        f"paper+<option>+... or paper-code+<option>+... (options: min10, "
                        f"firstseen, sharedneg, besttest, bestval, agg10, pcasim, batchmerge, "
                        f"earlystop)")
    out: dict[str, Any] = {}
    for token in tokens:
        key, value = _parse_token(token, label)
        out[key] = value
    return base, out


def _parse_token(token: str, label: str) -> tuple[str, Any]:
    import re

    fixed = {"firstseen": ("data.first_seen_order", True),
             "sharedneg": ("data.shared_eval_negatives", True),
             "besttest": ("train.select_round", "best-test"),
             "bestval": ("train.select_round", "best-val"),
             "bestvalfull": ("train.select_round", "best-val-full"),
             "bestauto": ("train.select_round", "auto"),
             "pcasim": ("federation.similarity", "pca"),
             "batchmerge": ("federation.merge_every_batch", True),
             "earlystop": ("train.early_stop_tol", 1e-4)}
    if token in UNBUILT_OPTIONS:
        raise UserError(f"protocol {label!r}: option {token} is not built yet")
    if token in fixed:
        return fixed[token]
    match = re.fullmatch(r"(min|agg)(\d+(?:\.\d+)?)", token)
    if match and match.group(1) == "min" and match.group(2).isdigit():
        return "data.min_user_ratings", int(match.group(2))
    if match and match.group(1) == "agg":
        return "federation.agg_clients_ratio", float(match.group(2)) / 100
    raise UserError(f"protocol {label!r}: unknown option {token!r}; options: min10, firstseen, "
                    f"sharedneg, besttest, bestval, bestauto, agg10, pcasim, batchmerge, "
                    f"earlystop")


