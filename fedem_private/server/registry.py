"""Aggregators by name (docs/design.md section 15): the one place an aggregation is listed.

:data:`REGISTRY` maps a name to its class as ``"module:Class"``, imported on first use,
so the configuration can list and check names without loading torch. A class declares
its capabilities as class variables (:class:`~fedem_private.server.aggregators.Aggregator`:
``needs_each_upload``, ``takes_aggregate``, ``sends_table``, ``sampled``, ``one_table``)
and builds itself from the run's options (``from_options``); a new aggregator is its
class and one line here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.lazy import add, resolve

if TYPE_CHECKING:
    from fedem_private.server.aggregators import Aggregator

REGISTRY: dict[str, str] = {
    "fedavg": "fedem_private.server.aggregators:FedAvgAggregator",
    "uniform": "fedem_private.server.aggregators:UniformAggregator",
    "similarity": "fedem_private.server.aggregators:SimilarityAggregator",
    "graph": "fedem_private.server.aggregators:GraphAggregator",
    "fedmerge": "fedem_private.server.aggregators:FedMergeAggregator",
    "none": "fedem_private.server.aggregators:NoAggregator",
}


def register(name: str, target: str) -> None:
    """Make the aggregator class ``target`` (``"module:Class"``) known as ``name``: a test's
    or a plugin's one line (:mod:`fedem_private.plugins`); ValueError if ``name`` is taken."""
    add(REGISTRY, name, target, "aggregation")


def aggregator_class(name: str) -> type[Aggregator]:
    """The class registered as ``name`` (ValueError when there is none)."""
    return resolve(REGISTRY, name, "aggregation")


def aggregators_where(capability: str, value: object = True) -> tuple[str, ...]:
    """The registered aggregations whose class variable ``capability`` is ``value``."""
    return tuple(n for n in REGISTRY if getattr(aggregator_class(n), capability) == value)
