"""The merge strategies (docs/design.md section 4): the one place each is named, with what it
does, read by the configuration, the listing and the merger alike.

- ``sr``: static replacement, the client starts from the sent table;
- ``sm``: static merging, a fixed rho between its own table and the sent one;
- ``dm``: dynamic merging, one learned rho per client (equation 9);
- ``em``: elastic merging, a learned rho per item (equation 11).

Importing this module is light (no torch): the configuration checks names here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MergeStrategy:
    """A merge strategy and its capabilities."""

    name: str
    merges: bool  # the start table mixes the client's own table into the sent one
    learned: bool  # an adapter is trained to choose the mix (equations 9 and 11)


REGISTRY: dict[str, MergeStrategy] = {s.name: s for s in (
    MergeStrategy("sr", merges=False, learned=False),
    MergeStrategy("sm", merges=True, learned=False),
    MergeStrategy("dm", merges=True, learned=True),
    MergeStrategy("em", merges=True, learned=True),
)}


def strategies_where(capability: str) -> tuple[str, ...]:
    """The strategies whose ``capability`` is true, in registry order."""
    return tuple(n for n, s in REGISTRY.items() if getattr(s, capability))
