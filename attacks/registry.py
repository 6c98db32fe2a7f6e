"""Attacks by name (docs/design.md, sections 6 and 15): the one place an attack is listed.

:data:`REGISTRY` maps a name to its class as ``"module:Class"`` (or the class itself),
imported on first use, so the experiments layer, the listing and a sweep file's check
read the names without loading torch or scikit-learn. A class (:class:`Attack`)
declares, as class variables, its options (a frozen dataclass of its knobs, whose
defaults are the attack's published settings) and its :class:`Capabilities`: what it
scores, what of the server's view it reads, whether it computes on the device and
whether it takes the backbone's shadow. A new attack is its class and one line here;
nothing else lists its name.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import numpy as np

    from .observations import Observation, PublicKnowledge
    from .shadow import ShadowModel

#: what an attack scores: one value per (client, item), per client, or a mechanism's audit
Kind = Literal["item", "client", "mechanism"]
#: what of the server's view an attack reads
VIEWS = ("uploads", "released-aggregate", "side-knowledge", "release-function")


@dataclass(frozen=True)
class Capabilities:
    """What an attack observes and how it runs (read by :mod:`attacks.run` and the listing).

    ``kind``: ``item`` (a score per recorded client and item, scored as membership),
    ``client`` (one value per client, e.g. an attribute) or ``mechanism`` (an audit of
    the run's release function). ``observes``: among :data:`VIEWS`. ``device``: computes
    on torch tensors and takes a ``device``. ``shadow``: takes the backbone's
    :class:`~attacks.shadow.ShadowModel`. ``default``: run when no attack is named.
    ``exact_for``: the backbones for which its model of the upload is exact (None: any).
    """

    kind: Kind
    observes: tuple[str, ...]
    device: bool = False
    shadow: bool = False
    default: bool = True
    exact_for: str | None = None

    def __post_init__(self) -> None:
        unknown = [v for v in self.observes if v not in VIEWS]
        if unknown:
            raise ValueError(f"unknown view {unknown[0]!r}; known: {', '.join(VIEWS)}")


@dataclass(frozen=True)
class NoOptions:
    """The options of an attack without knobs."""


class Attack:
    """An attack's registration: its options, capabilities and, for an item attack, its
    pure scoring function ``function(obs, public, **options) -> (k, m) scores``
    (:class:`attacks.base.ItemAttack`)."""

    options: ClassVar[type] = NoOptions
    capabilities: ClassVar[Capabilities]
    function: ClassVar[Callable[..., Any] | None] = None

    @classmethod
    def scores(cls, obs: Observation, public: PublicKnowledge, options: Any = None, *,
               device: str = "cpu", shadow: ShadowModel | None = None) -> np.ndarray:
        """(k, m) item scores: ``function`` with ``options`` (default: the class's), the
        ``device`` where the capabilities say it computes, and ``shadow`` where it takes one."""
        if cls.function is None:
            raise TypeError(f"{cls.__name__} scores no items")
        opts = options if options is not None else cls.options()
        extra: dict[str, Any] = {"device": device} if cls.capabilities.device else {}
        if cls.capabilities.shadow and shadow is not None:
            extra["shadow"] = shadow
        return cls.function(obs, public, **_as_kwargs(opts), **extra)

    @classmethod
    def assumption(cls, public: PublicKnowledge, shadow: ShadowModel | None = None,
                   options: Any = None) -> str | None:
        """A note on what the scores assume for this run under ``options`` (the attack's
        options dataclass, None: its defaults); None: nothing to note."""
        del public, shadow, options
        return None


REGISTRY: dict[str, str | type[Attack]] = {
    "support": "attacks.support:SupportAttack",
    "projection": "attacks.projection:ProjectionAttack",
    "imia": "attacks.imia:ImiaAttack",
    "attribute": "attacks.attribute:AttributeAttack",
    "canary": "attacks.canary:CanaryAudit",
    "poplabel": "attacks.poplabel:PopLabelAttack",
}


def register(name: str, target: str | type[Attack]) -> None:
    """Make the attack ``target`` (its class, or ``"module:Class"`` imported on first use)
    known as ``name``: a test's or a plugin's one line (:mod:`fedem_private.plugins`).
    ValueError when ``name`` already names another attack."""
    known = REGISTRY.get(name)
    if known is not None and known is not target and known != target:
        raise ValueError(f"attack {name!r} is already registered")
    REGISTRY[name] = target


def _with_plugins() -> dict[str, str | type[Attack]]:
    """:data:`REGISTRY` after the attack plugins' first loading (fedem_private.plugins:
    once per process; a broken plugin raises its one-line PluginError)."""
    from fedem_private.plugins import ATTACKS, load

    load(ATTACKS)
    return REGISTRY


def names() -> tuple[str, ...]:
    """Every registered attack, in registration order (no attack module is imported)."""
    return tuple(_with_plugins())


def attack_class(name: str) -> type[Attack]:
    """The class registered as ``name`` (ValueError when there is none)."""
    _with_plugins()
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown attack {name!r}; known: {', '.join(REGISTRY)}") from None
    if isinstance(target, str):
        module, cls = target.split(":")
        return getattr(importlib.import_module(module), cls)
    return target


def capabilities(name: str) -> Capabilities:
    """The capabilities of the attack ``name``."""
    return attack_class(name).capabilities


def names_where(**wanted: object) -> tuple[str, ...]:
    """Registered attacks whose capabilities have every field of ``wanted`` at its value,
    e.g. ``names_where(kind="item")``."""
    return tuple(n for n in _with_plugins()
                 if all(getattr(capabilities(n), k) == v for k, v in wanted.items()))


def default_attacks() -> tuple[str, ...]:
    """What ``fedem-private attack`` runs when no attack is named."""
    return names_where(default=True)


def default_options(name: str) -> Any:
    """The options of ``name`` at their defaults."""
    return attack_class(name).options()


_PARSE: Mapping[str, Callable[[str], Any]] = {
    "int": int, "float": float, "str": str,
    "bool": lambda s: {"true": True, "1": True, "false": False, "0": False}[s.lower()],
}


def options_with(name: str, values: Mapping[str, str]) -> Any:
    """The options of ``name`` with ``values`` (text, e.g. from ``--attack-option``)
    converted by each field's declared type; unknown fields and bad values: ValueError."""
    cls = attack_class(name).options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    converted: dict[str, Any] = {}
    for key, text in values.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ValueError(f"attack {name!r} has no option {key!r}; options: {known}")
        kind = str(fields[key].type).replace(" | None", "")
        try:
            converted[key] = _PARSE.get(kind, str)(text)
        except (KeyError, ValueError):
            raise ValueError(f"attack {name!r}: option {key}={text!r} is not a {kind}") from None
    return cls(**converted)


def _as_kwargs(options: Any) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
