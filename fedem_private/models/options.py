"""A part's own options (docs/design.md sections 9 and 15), and the backbones' options.

Each part with settings of its own (a backbone, a merge, an aggregator, a codec) declares
them as a frozen :class:`PartOptions` dataclass: the fields with their defaults, the
``[federation]`` key each is read from (TOML and command line keep their flat names) and
:meth:`PartOptions.check`, which refuses a bad value with one line. The part names its
options class (``Options``) and builds from an instance of it; the configuration checks
every registered options class (:data:`OPTIONS`, filled by :func:`part_options`) once,
without knowing which part it belongs to.

Importing this module is light (no torch): the configuration reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from fedem_private.errors import UserError

T = TypeVar("T", bound="PartOptions")

#: every part's options class, in the order they were registered (:func:`part_options`)
OPTIONS: list[type[PartOptions]] = []


def part_options(cls: type[T]) -> type[T]:
    """Register ``cls`` so the configuration checks it (a class decorator)."""
    OPTIONS.append(cls)
    return cls


@dataclass(frozen=True)
class PartOptions:
    """A part's options; a part with none uses this empty class."""

    #: a field's ``[federation]`` key, where it is not the field's own name
    keys: ClassVar[dict[str, str]] = {}

    @classmethod
    def key(cls, name: str) -> str:
        """The ``[federation]`` key of field ``name``."""
        return cls.keys.get(name, name)

    @classmethod
    def from_config(cls: type[T], config: Any) -> T:
        """The options as ``config`` (a ``FederationConfig``, or anything with its keys) sets
        them; read, not checked (the configuration checked them once, :meth:`check`)."""
        return cls(**{f.name: getattr(config, cls.key(f.name)) for f in fields(cls)})

    def check(self) -> None:
        """Refuse a bad value with one line naming its key; nothing to check here."""


def require(ok: bool, message: str) -> None:
    """Raise :class:`~fedem_private.errors.UserError` with ``message`` unless ``ok``."""
    if not ok:
        raise UserError(message)


def non_negative(key: str, value: float) -> None:
    """Refuse a value of ``federation.<key>`` that is not a finite number >= 0."""
    require(math.isfinite(value) and value >= 0,
            f"federation.{key} must be a number >= 0, got {value}")


@part_options
@dataclass(frozen=True)
class GPFedRecOptions(PartOptions):
    """GPFedRec (docs/design.md section 10): the weight of the MSE toward the personalised
    table (``gpfedrec_reg``)."""

    reg: float = 1.0
    keys: ClassVar[dict[str, str]] = {"reg": "gpfedrec_reg"}

    def check(self) -> None:
        non_negative("gpfedrec_reg", self.reg)


@part_options
@dataclass(frozen=True)
class FedRAPOptions(PartOptions):
    """FedRAP (docs/design.md section 10): the weight of -MSE(personal, common)
    (``fedrap_lambda``) and of the L1 sparsity of the common table (``fedrap_mu``)."""

    lambda_: float = 0.1
    mu: float = 0.1
    keys: ClassVar[dict[str, str]] = {"lambda_": "fedrap_lambda", "mu": "fedrap_mu"}

    def check(self) -> None:
        non_negative("fedrap_lambda", self.lambda_)
        non_negative("fedrap_mu", self.mu)
