"""The registry of privacy mechanisms: ``--privacy`` name -> mechanism class.

docs/design.md sections 5 and 15. The built-in mechanisms live one per module in
:mod:`fedem_private.privacy.mech` and are imported on the first look-up, in the
fixed order of :data:`BUILTIN` (the order of ``--privacy``'s choices); a new
mechanism is one class and one :func:`register` call (or decorator), in this package or
in another one's plugin (:mod:`fedem_private.plugins`, loaded on the first look-up). This
module is the only place that maps a mode's name to its mechanism: everything else asks
the mechanism (:func:`mechanism_for`) for its capabilities and hooks.
"""

from __future__ import annotations

import importlib
from typing import TypeVar

from fedem_private import plugins
from fedem_private.errors import UserError
from fedem_private.privacy.mech.base import Mechanism

# the built-in mechanisms, in --privacy's order: name -> module under privacy.mech
BUILTIN: dict[str, str] = {
    "none": "none",
    "ldp-laplace": "ldp_laplace",
    "ldp-gaussian": "ldp_gaussian",
    "paper": "paper",
    "ldp-touched-rows": "touched_rows",
    "cdp-gaussian": "cdp_gaussian",
    "ldp-dpsgd": "ldp_dpsgd",
    "dp-ftrl": "dp_ftrl",
    "ddp-skellam": "ddp_skellam",
}

_REGISTRY: dict[str, type[Mechanism]] = {}
_loaded = False

M = TypeVar("M", bound=type[Mechanism])


def register(cls: M) -> M:
    """Make ``cls`` known under ``cls.name`` (usable as a class decorator).

    A name already taken by another class is refused (ValueError).
    """
    name = cls.name
    if not name:
        raise ValueError(f"{cls.__qualname__} has no name")
    known = _REGISTRY.get(name)
    if known is not None and known is not cls:
        raise ValueError(f"privacy mechanism {name!r} is already registered")
    _REGISTRY[name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget the mechanism ``name`` (tests' toy mechanisms); built-ins stay."""
    if name not in BUILTIN:
        _REGISTRY.pop(name, None)


def _load_builtins() -> None:
    """Import the built-in mechanisms, then the plugins' (fedem_private.plugins: once per
    process; a broken plugin raises its one-line PluginError on every look-up)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN.values():
            importlib.import_module(f"fedem_private.privacy.mech.{module}")
    plugins.load(plugins.MECHANISMS)


def names() -> tuple[str, ...]:
    """Every registered mechanism's name: the built-ins in order, then the others."""
    _load_builtins()
    extra = tuple(n for n in _REGISTRY if n not in BUILTIN)
    return tuple(BUILTIN) + extra


def lookup(name: object) -> type[Mechanism] | None:
    """The mechanism registered as ``name``; None if there is none."""
    _load_builtins()
    return _REGISTRY.get(name) if isinstance(name, str) else None


def mechanism_for(name: str) -> type[Mechanism]:
    """The mechanism registered as ``name``; UserError (one line) if there is none."""
    cls = lookup(name)
    if cls is None:
        raise UserError(f"unknown privacy mode {name!r} (choose one of {', '.join(names())})")
    return cls


def capability(name: object, flag: str) -> bool:
    """The capability ``flag`` of the mechanism ``name``; False for an unknown name
    (e.g. a results row written by another version)."""
    cls = lookup(name)
    return bool(getattr(cls, flag)) if cls is not None else False


def no_privacy(name: object) -> bool:
    """Whether ``name`` is the mechanism that changes nothing (no clip, no noise)."""
    cls = lookup(name)
    return cls is not None and not cls.perturbs


def names_with(flag: str) -> tuple[str, ...]:
    """The registered names whose mechanism has the capability ``flag``, in order."""
    return tuple(n for n in names() if capability(n, flag))
