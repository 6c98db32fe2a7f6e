"""Parts from other packages: Python entry points read once (docs/design.md section 15,
"Plugins").

A package adds a backbone, merge, aggregator, upload codec, privacy mechanism or attack
by naming, in its own ``pyproject.toml``, a function without arguments under one of the entry-point
groups of :data:`GROUPS`::

    [project.entry-points."fedem_private.mechanisms"]
    my-mechanism = "my_package.mechanism:register"

The function registers the package's part through the room's public register function
(``fedem_private.privacy.registry.register``, ``attacks.registry.register``,
``fedem_private.models.register``, ``fedem_private.client.strategies.register``,
``fedem_private.server.registry.register``,
``fedem_private.client.codec_kinds.register``); from then on the part is a built-in like
any other. This module only finds and calls those functions: it imports no room (it is a
leaf, below every room in pyproject.toml's layers), so any room may ask it to load its
group.

When loading happens: :func:`load_all` once before the command line is parsed
(``fedem_private.cli``), at the start of each public API call (``fedem_private.api``) and
before each sweep point (a worker process or a Ray task); the privacy and attack
registries also load their own group on their first look-up, so code that reaches them
directly sees the plugins as well. Each group is loaded at most once per process. A
plugin that fails to import or to register raises :class:`PluginError`, a
:class:`~fedem_private.errors.UserError` naming the plugin and its error in one line (the
command prints it and exits 2), every time its group is asked for again, so a broken
plugin is never silently missing.

Trust: a plugin is code the user installed and runs with the user's rights; loading one is
no more a privacy or security check than importing it. A plugin mechanism's guarantee is
what its own class claims, and the neighbour-world harness
(:mod:`fedem_private.experiments.neighbours`) is how such a claim is tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from fedem_private.errors import UserError

MECHANISMS = "fedem_private.mechanisms"
BACKBONES = "fedem_private.backbones"
MERGES = "fedem_private.merges"
AGGREGATORS = "fedem_private.aggregators"
ATTACKS = "fedem_private.attacks"
CODECS = "fedem_private.codecs"

#: the entry-point groups read, in loading order
GROUPS: tuple[str, ...] = (MECHANISMS, BACKBONES, MERGES, AGGREGATORS, CODECS, ATTACKS)


class PluginError(UserError):
    """A plugin could not be loaded: one line naming it, its package and its error."""


@dataclass(frozen=True)
class Loaded:
    """One plugin loaded: its group, entry-point name, target and distribution."""

    group: str
    name: str
    value: str
    distribution: str


# group -> the plugins it loaded, or the error its loading raised (raised again on asking)
_done: dict[str, tuple[Loaded, ...] | PluginError] = {}


def _distribution(entry: metadata.EntryPoint) -> str:
    dist = entry.dist
    if dist is None:
        return "an unknown distribution"
    return f"{dist.metadata['Name']} {dist.version}"


def _load_one(group: str, entry: metadata.EntryPoint) -> Loaded:
    """Import ``entry``'s target and call it; PluginError (one line) on any failure."""
    where = f"plugin {entry.name!r} ({group} = {entry.value!r}, from {_distribution(entry)})"
    try:
        hook = entry.load()
        if not callable(hook):
            raise TypeError(f"{entry.value!r} is not a function (a plugin names a function "
                            f"without arguments that registers its part)")
        hook()
    except Exception as exc:  # any error of foreign code becomes one line
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PluginError(f"{where} failed to load: {type(exc).__name__}"
                          + (f": {detail}" if detail else "")) from exc
    return Loaded(group, entry.name, entry.value, _distribution(entry))


def load(group: str) -> tuple[Loaded, ...]:
    """Load every plugin of the entry-point ``group`` (once per process) and return them.

    Entry points are taken in name order, so registration order does not depend on the
    file system. A group asked for again while it is loading (a plugin that looks up its
    own registry) returns nothing rather than recurse. Raises :class:`PluginError`.
    """
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; known: {', '.join(GROUPS)}")
    done = _done.get(group)
    if isinstance(done, PluginError):
        raise done
    if done is not None:
        return done
    _done[group] = ()  # loading: a re-entrant call sees no plugins yet
    try:
        entries = sorted(metadata.entry_points(group=group), key=lambda e: e.name)
        loaded = tuple(_load_one(group, e) for e in entries)
    except PluginError as exc:
        _done[group] = exc
        raise
    _done[group] = loaded
    return loaded


def load_all() -> tuple[Loaded, ...]:
    """Load the plugins of every group of :data:`GROUPS` (each once); PluginError on the
    first that fails."""
    return tuple(p for group in GROUPS for p in load(group))


def forget() -> None:
    """Forget what was loaded, so the next :func:`load` reads the entry points again (tests
    that install a plugin mid-process; the parts already registered stay registered)."""
    _done.clear()
