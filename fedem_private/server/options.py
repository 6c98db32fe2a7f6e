"""The aggregators' own options (docs/design.md sections 12 and 15; :mod:`fedem_private.models.
options` for the pattern): each a frozen dataclass read from its ``[federation]`` keys, with
its own one-line checks. An aggregator builds from the one it names
(:class:`~fedem_private.server.aggregators.AggregatorOptions` carries them).

Importing this module is light (no torch): the configuration reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from fedem_private.models.options import PartOptions, non_negative, part_options, require

#: the similarity aggregation's two weight rules: the paper's equation 13, or the authors'
#: code's 1-D PCA of each table (docs/design.md 2a, option 6)
SIMILARITIES = ("eq13", "pca")


@part_options
@dataclass(frozen=True)
class GraphOptions(PartOptions):
    """GPFedRec's graph (``graph``): neighbours above ``threshold`` times the mean similarity,
    or the ``topk`` most similar users (0: threshold mode), propagated ``layers`` steps."""

    threshold: float = 1.0
    topk: int = 0
    layers: int = 1
    keys: ClassVar[dict[str, str]] = {"threshold": "graph_threshold", "topk": "graph_topk",
                                      "layers": "graph_layers"}

    def check(self) -> None:
        non_negative("graph_threshold", self.threshold)
        require(self.topk >= 0 and self.layers >= 1,
                "federation.graph_topk must be >= 0 and graph_layers >= 1")


@part_options
@dataclass(frozen=True)
class FedMergeOptions(PartOptions):
    """FedMerge (``fedmerge``, docs/design.md section 12): K global tables, and the server
    fit's gradient steps per round and step (in units of 1/L)."""

    k: int = 4
    steps: int = 10
    lr: float = 1.0
    keys: ClassVar[dict[str, str]] = {"k": "merge_k", "steps": "fedmerge_steps",
                                      "lr": "fedmerge_lr"}

    def check(self) -> None:
        require(self.k >= 1, f"--merge-k (federation.merge_k) must be a positive integer, "
                             f"got {self.k}")
        require(self.steps >= 1, f"--fedmerge-steps (federation.fedmerge_steps) must be a "
                                 f"positive integer, got {self.steps}")
        require(math.isfinite(self.lr) and 0 < self.lr <= 1,
                f"--fedmerge-lr (federation.fedmerge_lr) must be in (0, 1] (the step in units "
                f"of 1/L), got {self.lr}")


@part_options
@dataclass(frozen=True)
class ServerStepOptions(PartOptions):
    """The sum aggregators' step on the aggregate: G += lr * m, m = momentum m + (aggregate
    - G) (FedAvgM; ``--server-lr``, ``--server-momentum``)."""

    lr: float = 1.0
    momentum: float = 0.0
    keys: ClassVar[dict[str, str]] = {"lr": "server_lr", "momentum": "server_momentum"}

    def check(self) -> None:
        require(math.isfinite(self.lr) and self.lr > 0,
                f"--server-lr (federation.server_lr) must be a positive number, got {self.lr}")
        require(0 <= self.momentum < 1,
                f"--server-momentum (federation.server_momentum) must be in [0, 1), "
                f"got {self.momentum}")


@part_options
@dataclass(frozen=True)
class SimilarityOptions(PartOptions):
    """The similarity aggregation (FedEM, equation 13): the self weight ``alpha`` and the
    weight rule (``similarity``: eq13 or pca)."""

    alpha: float = 0.9
    similarity: str = "eq13"

    def check(self) -> None:
        require(math.isfinite(self.alpha) and self.alpha >= 0,
                f"federation.alpha must be >= 0, got {self.alpha}")
        require(self.similarity in SIMILARITIES,
                f"unknown --similarity (federation.similarity) {self.similarity!r}; choose one "
                f"of {', '.join(SIMILARITIES)}")
