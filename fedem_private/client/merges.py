"""The merges as classes (docs/design.md sections 4 and 15): how a client forms its start table.

A client starts a round from Q_m = Q_l + rho (.) (Q_g - Q_l) (equation 10). A merge says
what rho is (:meth:`Merge.weights`) and, when it learns rho with an adapter (equation 9),
how the adapter's rho enters the training loss of equation 11
(:meth:`AdapterMerge.batch_weights`). :class:`~fedem_private.client.merging.Merger` and the
functions of :mod:`fedem_private.client.merging` call this interface and never ask for a
merge's name. A class declares its capabilities as class variables, read by the
configuration (:mod:`fedem_private.client.strategies`, where each is registered by one line).

This module imports no torch: the configuration and the listing read the capabilities from
these classes, and the methods load the tensor code (:mod:`fedem_private.client.adapter`)
when a merge runs. It imports neither the registry nor the merge step
(:mod:`fedem_private.client.merging`), which import it: a merge sees the run's options
through :class:`MergeSettings` (docs/design.md section 1: no import circles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Protocol

from fedem_private.models.options import PartOptions, part_options, require

if TYPE_CHECKING:
    from torch import Tensor

    from fedem_private.client.adapter import MergeState


#: what the adapter trains on (equation 11): the round's training samples (as published), or
#: a rotating fold withheld from local training (:mod:`fedem_private.client.holdout`)
ADAPTER_OBJECTIVES = ("train", "holdout")


@part_options
@dataclass(frozen=True)
class StaticOptions(PartOptions):
    """SM's fixed merge weight ``rho`` in [0, 1]."""

    rho: float = 0.5

    def check(self) -> None:
        require(0 <= self.rho <= 1, f"federation.rho must be in [0, 1], got {self.rho}")


@part_options
@dataclass(frozen=True)
class AdapterOptions(PartOptions):
    """The merge adapter's training (equation 11; DM and EM): Adam's rate, epochs per
    round, what it trains on, and the folds of the ``holdout`` objective."""

    lr: float = 0.1
    epochs: int = 1
    objective: str = "train"
    folds: int = 5
    keys: ClassVar[dict[str, str]] = {"lr": "adapter_lr", "epochs": "adapter_epochs",
                                      "objective": "adapter_objective",
                                      "folds": "adapter_folds"}

    def check(self) -> None:
        require(math.isfinite(self.lr) and self.lr > 0,
                f"federation.adapter_lr must be positive, got {self.lr}")
        require(self.epochs >= 1, "federation.adapter_epochs must be a positive integer")
        require(self.objective in ADAPTER_OBJECTIVES,
                f"unknown adapter objective {self.objective!r}; choose one of "
                f"{', '.join(ADAPTER_OBJECTIVES)}")
        require(self.folds >= 2, f"--adapter-folds (federation.adapter_folds) must be an "
                                 f"integer >= 2, got {self.folds}")


class MergeSettings(Protocol):
    """What a merge reads of the run's merge options
    (:class:`~fedem_private.client.merging.MergeConfig`)."""

    @property
    def strategy(self) -> str: ...

    @property
    def rho(self) -> float: ...


def _tensors() -> ModuleType:
    """:mod:`fedem_private.client.adapter`, the tensor code, loaded on first use."""
    from fedem_private.client import adapter

    return adapter


class Merge:
    """A merge: the start table from the client's own table Q_l and the sent one Q_g.

    Built from the run's merge options (:class:`MergeSettings`, a
    :class:`~fedem_private.client.merging.MergeConfig`).
    """

    name: ClassVar[str]
    #: whether the start table mixes the client's own table into the sent one (not SR)
    merges: ClassVar[bool] = True
    #: whether an adapter is trained to choose the mix (equations 9 and 11)
    learned: ClassVar[bool] = False
    #: whether it can merge on every local batch (the FedEM code, ``--merge-every-batch``)
    batch_merge: ClassVar[bool] = False
    #: whether ldp-dpsgd can train its adapter by DP-SGD (:mod:`fedem_private.privacy.dpsgd`)
    dpsgd_adapter: ClassVar[bool] = False
    #: whether rho is one value per client pooled over every row, so a row's merge depends
    #: on the others (the start's mean rho is rho itself); otherwise rho on a row depends on
    #: that row of Q_l and Q_g alone (``--client-tables sparse`` replays a merge from the
    #: adapter, or from the pooled rho, accordingly: simulation/sparse_tables.py)
    pooled: ClassVar[bool] = False
    #: its own options (read from the ``[federation]`` keys, docs/design.md section 15)
    Options: ClassVar[type[PartOptions]] = PartOptions

    def __init__(self, cfg: MergeSettings) -> None:
        self.cfg = cfg

    def weights(self, state: MergeState | None, q_local: Tensor, q_global: Tensor) -> Tensor:
        """The merge weights rho, detached: a 0-d tensor, (k, 1) or (k, m)."""
        raise NotImplementedError(f"merge {self.name!r} has no weights")

    def start(self, state: MergeState | None, q_local: Tensor,
              q_global: Tensor) -> tuple[Tensor, Tensor]:
        """The start tables (k, m, d) (equation 10) and each client's mean rho (k,)."""
        mg = _tensors()
        rho = self.weights(state, q_local, q_global)
        return mg.merge_tables(q_local, q_global, rho), mg.mean_rho(rho, q_local.shape[0])


class StaticReplacement(Merge):
    """SR: the client starts from the sent table itself (rho = 1; FedMF, FedSim)."""

    name = "sr"
    merges = False

    def weights(self, state: MergeState | None, q_local: Tensor, q_global: Tensor) -> Tensor:
        return q_local.new_ones(())

    def start(self, state: MergeState | None, q_local: Tensor,
              q_global: Tensor) -> tuple[Tensor, Tensor]:
        return q_global.clone(), _tensors().took_all(q_global)


class StaticMerge(Merge):
    """SM: one fixed rho for every client and item, the configuration's ``rho``."""

    name = "sm"
    Options = StaticOptions

    def weights(self, state: MergeState | None, q_local: Tensor, q_global: Tensor) -> Tensor:
        return q_local.new_tensor(self.cfg.rho)


class AdapterMerge(Merge):
    """A merge whose rho comes from each client's adapter (equation 9), trained by
    equation 11 with p_u, Q_l and Q_g frozen."""

    learned = True
    Options = AdapterOptions

    def pool(self, rho: Tensor) -> Tensor:
        """The merge weights from the adapter's per-item rho (k, m)."""
        raise NotImplementedError(f"merge {self.name!r} has no pool")

    def weights(self, state: MergeState | None, q_local: Tensor, q_global: Tensor) -> Tensor:
        return self.pool(_tensors().adapter_rho(self.cfg.strategy, state, q_local, q_global))

    def batch_weights(self, weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                      tables: tuple[Tensor, Tensor], rows: Tensor,
                      items: tuple[Tensor, Tensor]) -> Tensor:
        """rho for a training batch, with gradient, broadcastable against (a, B, d).

        ``tables``: the chunk's (Q_l, Q_g) (k, m, d); ``rows`` (a,) the batch's clients;
        ``items``: their (Q_l, Q_g) rows at the batch's items (a, B, d).
        """
        raise NotImplementedError(f"merge {self.name!r} has no batch_weights")


class DynamicMerge(AdapterMerge):
    """DM: one learned rho per client, the adapter's outputs averaged over all items."""

    name = "dm"
    pooled = True

    def pool(self, rho: Tensor) -> Tensor:
        return rho.mean(dim=1, keepdim=True)

    def batch_weights(self, weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                      tables: tuple[Tensor, Tensor], rows: Tensor,
                      items: tuple[Tensor, Tensor]) -> Tensor:
        mg = _tensors()
        ql_rows, qg_rows = (t.index_select(0, rows) for t in tables)
        rho = mg.adapter_forward(weights, biases, mg.adapter_input(ql_rows, qg_rows))
        return rho.mean(dim=1)[:, None, None]


class ElasticMerge(AdapterMerge):
    """EM: one learned rho per item per client (FedEM)."""

    name = "em"
    batch_merge = True
    dpsgd_adapter = True

    def pool(self, rho: Tensor) -> Tensor:
        return rho

    def batch_weights(self, weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                      tables: tuple[Tensor, Tensor], rows: Tensor,
                      items: tuple[Tensor, Tensor]) -> Tensor:
        mg = _tensors()
        return mg.adapter_forward(weights, biases, mg.adapter_input(*items)).unsqueeze(-1)
