"""The merge strategies by name (docs/design.md sections 4 and 15): the one place a merge is listed.

:data:`REGISTRY` maps a name to its class as ``"module:Class"``, imported on first use. A
class (:class:`~fedem_private.client.merges.Merge`) declares its capabilities as class
variables (``merges``, ``learned``, ``batch_merge``, ``dpsgd_adapter``) and forms the start
table itself; a new merge is its class and one line here.

- ``sr``: static replacement, the client starts from the sent table;
- ``sm``: static merging, a fixed rho between its own table and the sent one;
- ``dm``: dynamic merging, one learned rho per client (equation 9);
- ``em``: elastic merging, a learned rho per item (equation 11).

Importing this module is light (no torch), and so is reading a merge's capabilities
(:mod:`fedem_private.client.merges` loads the tensor code only when a merge runs): the
configuration and the listing check names and capabilities here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.lazy import add, resolve

if TYPE_CHECKING:
    from fedem_private.client.merges import Merge

REGISTRY: dict[str, str] = {
    "sr": "fedem_private.client.merges:StaticReplacement",
    "sm": "fedem_private.client.merges:StaticMerge",
    "dm": "fedem_private.client.merges:DynamicMerge",
    "em": "fedem_private.client.merges:ElasticMerge",
}


def register(name: str, target: str) -> None:
    """Make the merge class ``target`` (``"module:Class"``) known as ``name``: a test's or a
    plugin's one line (:mod:`fedem_private.plugins`); ValueError if ``name`` is taken."""
    add(REGISTRY, name, target, "merge")


def merge_class(name: str) -> type[Merge]:
    """The class registered as ``name`` (ValueError when there is none)."""
    return resolve(REGISTRY, name, "merge")


def strategies_where(capability: str, value: object = True) -> tuple[str, ...]:
    """The registered merges whose class variable ``capability`` is ``value``, in order."""
    return tuple(n for n in REGISTRY if getattr(merge_class(n), capability) == value)
