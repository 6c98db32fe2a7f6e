"""Registries of parts named as ``"module:Class"``, imported on first use (docs/design.md
section 15). Importing this module is light: the registries that use it (merges,
aggregators, backbones) stay readable without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def resolve(registry: Mapping[str, str], name: str, kind: str) -> Any:
    """The class ``registry[name]`` names, imported now; ValueError ``unknown KIND 'NAME'``
    when ``name`` is not registered."""
    try:
        module, cls = registry[name].split(":")
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}") from None
    return getattr(importlib.import_module(module), cls)


def add(registry: dict[str, str], name: str, target: str, kind: str) -> None:
    """Put ``name -> target`` (``"module:Class"``) into ``registry``: a part's one line, from
    a test or a plugin (:mod:`fedem_private.plugins`). ValueError when ``target`` is not
    ``"module:Class"`` or ``name`` already names another class."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"{kind} {name!r}: the target must be 'module:Class', got {target!r}")
    known = registry.get(name)
    if known is not None and known != target:
        raise ValueError(f"{kind} {name!r} is already registered (as {known})")
    registry[name] = target
