"""Aggregators by name (docs/design.md section 15): the one place an aggregation is listed.

:data:`REGISTRY` maps a name to its class as ``"module:Class"``, imported on first use,
so the configuration can list and check names without loading torch. A class declares
its capabilities as class variables (:class:`~fedem_private.server.aggregators.Aggregator`:
``needs_each_upload``, ``takes_aggregate``, ``sends_table``, ``sampled``, ``one_table``,
``takes_uploads``, ``equal_weights``, ``similarity_weights``) and builds itself from the
run's options (``from_options``, called by :func:`build`); a new aggregator is its class
and one line here.

This module imports the aggregators, never the reverse (docs/design.md section 1: no
import circles): the classes know nothing of the names they are registered under.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.lazy import add, resolve

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from fedem_private.server.aggregators import Aggregator, ServerOptConfig
    from fedem_private.server.options import FedMergeOptions, GraphOptions, SimilarityOptions

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


def build(name: str, sizes: Tensor, q0: Tensor, *, alpha: float,
          alias: Tensor | None = None, graph: GraphOptions | None = None,
          fedmerge: FedMergeOptions | None = None, seed: int = 0,
          server: ServerOptConfig | None = None, similarity: SimilarityOptions | None = None,
          agg_ratio: float = 1.0, store: torch.dtype | None = None) -> Aggregator:
    """The aggregator registered as ``name``, built by its class from the options
    (:class:`~fedem_private.server.aggregators.AggregatorOptions`)."""
    from fedem_private.server.aggregators import AggregatorOptions

    cls = aggregator_class(name)
    if float(agg_ratio) < 1.0 and not cls.sampled:
        raise ValueError(f"aggregation {name!r} cannot aggregate a share of the uploads")
    opts = AggregatorOptions(alpha=alpha, alias=alias, graph=graph, fedmerge=fedmerge,
                             seed=seed, server=server, similarity=similarity,
                             agg_ratio=agg_ratio, store=store)
    return cls.from_options(sizes, q0, opts)
