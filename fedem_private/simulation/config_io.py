"""Reading, writing and the identity of a run's configuration: TOML in and out, nested dicts,
dotted overrides, and the digest-stable identity of a resolved config (docs/design.md §8).
It imports :class:`~fedem_private.simulation.run_config.RunConfig`, which never imports it
back (docs/design.md section 1: no import circles). Importing this module is light (no
torch or pandas).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

from fedem_private.errors import UserError
from fedem_private.simulation.run_config import RunConfig
from fedem_private.simulation.sections import (
    BaselineConfig,
    RecordConfig,
)

# Fields added after version 0.1.0: they enter a config's identity only when set, so run
# directories written before they existed keep their identity (see identity_dict).
LATER_FIELDS: dict[tuple[str, ...], Any] = {
    ("data", "min_rating"): None,
    ("train", "nonce"): 0,
    ("train", "cohort_size"): 0,
    ("train", "eval_users"): 0,
    ("train", "client_tables"): "kept",
    ("train", "eval_finetune"): 0,
    ("privacy", "clip_auto"): False,
    ("privacy", "clip_auto_epsilon"): None,
    ("privacy", "clip_auto_min"): 0.1,
    ("privacy", "clip_auto_max"): 1e5,
    ("privacy", "sample_rate"): 1.0,
    ("privacy", "clip_quantile"): None,
    ("privacy", "clip_lr"): 0.2,
    ("privacy", "clip_count_noise"): None,
    ("privacy", "select_rows"): 0,
    ("privacy", "select_share"): 0.1,
    ("privacy", "select_prior"): True,
    ("privacy", "select_blend"): 0.0,
    ("privacy", "canaries"): 0,
    ("privacy", "dpsgd_rate"): 0.1,
    ("privacy", "dpsgd_steps"): 20,
    ("privacy", "dpsgd_negatives"): 64,
    ("privacy", "dpsgd_lr"): 4.0,
    ("privacy", "dpsgd_adapter_steps"): 0,
    ("privacy", "ddp_bits"): 16,
    ("privacy", "ddp_scale"): None,
    ("privacy", "ddp_tolerance"): 0.1,
    ("privacy", "dropout"): 0.0,
    ("privacy", "client_secret_seed"): None,
    ("privacy", "public_population"): None,
    ("privacy", "ftrl_strategy"): "tree",
    ("privacy", "ftrl_bands"): 0,
    ("privacy", "ftrl_buffers"): 0,
    ("privacy", "ftrl_sampling"): "cyclic",
    ("privacy", "max_uploads"): 0,
    ("federation", "backbone"): "mf",
    ("federation", "codec"): "full",
    ("federation", "graph_threshold"): 1.0,
    ("federation", "graph_topk"): 0,
    ("federation", "graph_layers"): 1,
    ("federation", "gpfedrec_reg"): 1.0,
    ("federation", "fedrap_lambda"): 0.1,
    ("federation", "fedrap_mu"): 0.1,
    ("federation", "merge_k"): 4,
    ("federation", "fedmerge_steps"): 10,
    ("federation", "fedmerge_lr"): 1.0,
    ("federation", "server_lr"): 1.0,
    ("federation", "server_momentum"): 0.0,
    ("federation", "peft_warmup"): 2,
    ("federation", "peft_pretrain"): "none",
    ("federation", "lora_rank"): 4,
    ("federation", "hash_size"): 512,
    ("federation", "hash_functions"): 2,
    ("federation", "hash_senet"): 0,
    ("federation", "rq_levels"): 3,
    ("federation", "rq_codebook"): 128,
    ("federation", "peft_init"): "normal",
    ("federation", "adapter_objective"): "train",
    ("federation", "adapter_folds"): 5,
    ("train", "device"): "cpu",
    ("data", "min_user_ratings"): 3,
    ("data", "first_seen_order"): False,
    ("data", "shared_eval_negatives"): False,
    ("train", "select_round"): "last",
    ("train", "early_stop_tol"): 0.0,
    ("federation", "agg_clients_ratio"): 1.0,
    ("federation", "similarity"): "eq13",
    ("federation", "merge_every_batch"): False,
    ("federation", "merge_rows"): "all",
    ("federation", "prox_mu"): 0.0,
    ("federation", "merge_every"): 1,
    ("train", "optimizer"): "adam",
    ("train", "lr_head"): None,
    ("train", "lr_user"): None,
    ("train", "weight_decay"): 0.0,
    ("train", "lr_batch_decay"): 1.0,
    ("train", "lr_round_decay"): 1.0,
    ("train", "state_dtype"): "float32",
    ("data", "calibrate_to"): None,
    ("data", "users"): None,
    ("data", "population_taste"): "bilinear",
    **{("baseline", f.name): f.default for f in fields(BaselineConfig)},
}


def identity_dict(cfg: RunConfig) -> dict:
    """What makes two runs the same: the resolved config without ``[record]``.

    Recording does not change what is trained (it only writes what the server
    saw); sweeps fold it into a point's identity themselves. Fields of
    :data:`LATER_FIELDS` are left out while they hold their default, and
    ``privacy.sizes`` without a mechanism.
    """
    values = to_dict(cfg)
    values.pop("record", None)
    if not cfg.privacy.mechanism.perturbs:
        # the sizes setting changes nothing without a mechanism; under one it does (the
        # server's weights became uniform by default), so points from before it do not resume
        values["privacy"].pop("sizes", None)
    for path, default in LATER_FIELDS.items():
        node = values
        for part in path[:-1]:
            node = node[part]
        if node.get(path[-1], default) == default:
            node.pop(path[-1], None)
    if not values.get("baseline"):  # every baseline setting at its default
        values.pop("baseline", None)
    return values


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check/convert a TOML or CLI value to the annotated type."""
    text = str(typ)
    optional = "None" in text
    if value is None or (isinstance(value, str) and value.lower() == "none" and optional):
        if optional:
            return None
        raise UserError(f"{where} must not be empty")
    if "float" in text and "int" not in text.replace("float", ""):
        if isinstance(value, bool):
            raise UserError(f"{where} must be a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be a number, got {value!r}") from None
        if math.isnan(out):
            raise UserError(f"{where} must be a number, got NaN")
        return out
    if "int" in text and "str" not in text:
        if isinstance(value, bool):
            raise UserError(f"{where} must be an integer, got {value!r}")
        if isinstance(value, int):  # exact: a float holds only 53 bits (seeds, nonces)
            return value
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be an integer, got {value!r}") from None
        if not f.is_integer():
            raise UserError(f"{where} must be an integer, got {value!r}")
        return int(f)
    if "bool" in text:
        if isinstance(value, bool):
            return value
        if str(value).lower() in {"true", "1", "yes"}:
            return True
        if str(value).lower() in {"false", "0", "no"}:
            return False
        raise UserError(f"{where} must be true or false, got {value!r}")
    if "str" in text:
        if not isinstance(value, str | int | float):
            raise UserError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, values: dict, where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise UserError(f"unknown key {key!r} in [{where}]; known keys: "
                            f"{', '.join(sorted(known))}")
        hint = hints[key]
        if cls is RecordConfig and key == "rounds" and isinstance(value, list):
            value = ",".join(str(v) for v in value)  # [1, "last"] -> "1,last"
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"[{where}.{key}] must be a table")
            kwargs[key] = _build(hint, value, f"{where}.{key}")
        else:
            kwargs[key] = _coerce(value, hint, f"{where}.{key}")
    return cls(**kwargs)


def from_dict(values: dict) -> RunConfig:
    """Build a config from nested dicts (a parsed TOML file); unknown keys are errors."""
    sections = {f.name: f for f in fields(RunConfig)}
    hints = get_type_hints(RunConfig)
    kwargs = {}
    for name, table in values.items():
        if name not in sections:
            raise UserError(f"unknown section [{name}]; known sections: "
                            f"{', '.join(sections)}")
        if not isinstance(table, dict):
            raise UserError(f"[{name}] must be a table")
        kwargs[name] = _build(hints[name], table, name)
    return RunConfig(**kwargs)


def read_toml(path: str | Path, what: str = "config file") -> dict:
    """Parse a TOML file; a missing or invalid file is a one-line UserError naming ``what``."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{what} {p} is a directory; name a TOML file")
    if not p.is_file():
        raise UserError(f"{what} not found: {p}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} {p} is not valid TOML: {exc}") from None


def load_toml(path: str | Path) -> RunConfig:
    """Read a TOML config file."""
    return from_dict(read_toml(path))


def to_dict(cfg: Any) -> dict:
    """Nested plain dict of a config dataclass."""
    return dataclasses.asdict(cfg)


def flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level with dotted keys: ``{"train": {"rounds": 5}}`` ->
    ``{"train.rounds": 5}``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def with_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """Apply ``{"train.rounds": 5, "data.synthetic.n_users": 100}``-style overrides (a new,
    unchecked config; ``cfg`` itself when there is nothing to apply)."""
    if all(value is None for value in overrides.values()):
        return cfg
    values = to_dict(cfg)
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = values
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return from_dict(values)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def to_toml(values: dict, prefix: str = "") -> str:
    """Write nested dicts as TOML; None values are left out (they mean "default")."""
    lines: list[str] = []
    scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in values.items() if isinstance(v, dict)}
    if prefix and any(v is not None for v in scalars.values()):
        lines.append(f"[{prefix}]")
    for key, value in scalars.items():
        if value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    if scalars:
        lines.append("")
    for key, table in tables.items():
        lines.append(to_toml(table, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines).rstrip() + "\n"

