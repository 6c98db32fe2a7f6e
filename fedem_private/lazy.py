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
