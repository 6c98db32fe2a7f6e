"""``fedem-private list``: the methods (presets) and the parts they compose, one line each."""

from __future__ import annotations

from fedem_private import models
from fedem_private.client import codec_kinds, strategies
from fedem_private.client.strategies import merge_class
from fedem_private.data import DATASETS
from fedem_private.experiments.attack_step import known_attacks
from fedem_private.privacy.registry import mechanism_for, names
from fedem_private.server import registry as aggregators
from fedem_private.simulation.config import (
    BACKBONE_METHOD,
    BASELINE_METHODS,
    BASELINES,
    METHOD_BACKBONE,
    METHOD_DEFAULTS,
    METHODS,
    PROTOCOLS_ALL,
)


def catalogue() -> list[tuple[str, str, str]]:
    """``(kind, name, note)`` for every method preset and part a run can name, read from the
    registries now, so parts registered since import (plugins) are listed too."""
    rows = [("method", m, f"preset: backbone {METHOD_BACKBONE[m]}, aggregation "
             f"{METHOD_DEFAULTS[m][0]}, merge {METHOD_DEFAULTS[m][1]}")
            for m in METHODS if m not in BASELINE_METHODS]
    rows += [("baseline", b, f"--method {b}, non-federated: {BASELINES[b]}")
             for b in BASELINE_METHODS]
    rows += [("backbone", b, "--backbone" + (f" (without --method: preset "
                                             f"{BACKBONE_METHOD[b]})" if b in BACKBONE_METHOD
                                             else " (with --method)"))
             for b in models.REGISTRY]
    rows += [("aggregation", a, "--aggregation") for a in aggregators.REGISTRY]
    rows += [("merge", m, "--merge" + (" (learned: an adapter)" if merge_class(m).learned
                                       else "")) for m in strategies.REGISTRY]
    rows += [("codec", c, "--codec (upload)") for c in codec_kinds.REGISTRY]
    rows += [("privacy", p, mechanism_for(p).description or "--privacy") for p in names()]
    rows += [row for p in names() for row in mechanism_for(p).listed()]
    rows += [("dataset", d, "--dataset") for d in DATASETS]
    rows += [("protocol", p, "--protocol") for p in PROTOCOLS_ALL]
    rows += [("attack", a, "attack --attacks") for a in known_attacks() or ()]
    return rows


def format_catalogue(rows: list[tuple[str, str, str]]) -> str:
    """One aligned line per row: ``kind  name  note``."""
    width = max(len(name) for _, name, _ in rows)
    kind_width = max(len(kind) for kind, _, _ in rows)
    return "\n".join(f"{kind:<{kind_width}}  {name:<{width}}  {note}" for kind, name, note in rows)
