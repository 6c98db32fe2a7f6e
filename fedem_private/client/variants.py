"""The tensor code of two variants of elastic merging (issue 69; options and equations in
:mod:`fedem_private.client.variant_options`, docs/design.md section 4).

- :func:`seen_mask` and :func:`merge_seen_rows`: equation 10 with rho' (rho on the client's
  training items I_u, 1 elsewhere), applied to a chunk's merged start tables;
- :class:`ProxRows` (:func:`prox_rows`): local training's item rows with the gradient of
  (mu / 2) ||Q_l - Q_g||^2 added at every step, over the rows the client trains in the
  round.

Their slow per-client references are :mod:`fedem_private.reference.variants`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedem_private.models.base import Compact, CompactRows, LocalTrainConfig, Plan, RowsFactory


def seen_mask(clients: np.ndarray, train_indptr: np.ndarray, train_items: np.ndarray,
              n_items: int, device: torch.device | str = "cpu") -> Tensor:
    """(k, m) bool: row j marks the training positives I_u of client u = clients[j].

    ``train_indptr`` / ``train_items``: the split's CSR of every client's training items.
    """
    clients = np.asarray(clients, dtype=np.int64)
    lo, hi = train_indptr[clients], train_indptr[clients + 1]
    counts = (hi - lo).astype(np.int64)
    owner = np.repeat(np.arange(clients.shape[0]), counts)
    pos = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist(),
                                                           strict=True)]
                         ) if clients.size else np.zeros(0, dtype=np.int64)
    mask = torch.zeros((clients.shape[0], n_items), dtype=torch.bool)
    if pos.size:
        mask[torch.from_numpy(owner), torch.from_numpy(train_items[pos].astype(np.int64))] = True
    return mask.to(device)


def merge_seen_rows(start: Tensor, sent: Tensor, seen: Tensor) -> Tensor:
    """Equation 10 with rho'_ui = rho_ui on i in I_u and 1 elsewhere, from the merged tables.

    ``start`` (k, m, d): Q_l + rho (.) (Q_g - Q_l) (equation 10, :meth:`Merge.start`);
    ``sent`` (k, m, d): Q_g; ``seen`` (k, m) bool: I_u (:func:`seen_mask`). Equation 10 is
    exact at rho = 1 (``torch.lerp``, :func:`~fedem_private.client.merging.merge_tables`),
    so taking Q_g itself outside I_u is equation 10 with rho' there.
    """
    return torch.where(seen.to(start.device).unsqueeze(-1), start, sent)


class ProxRows(CompactRows):
    """The touched item rows trained with Adam on BCE + (mu / 2) ||Q_l - Q_g||^2 (Ditto /
    FedProx style; :mod:`fedem_private.client.variant_options`).

    At every step, before the Adam step, each client still training adds mu (Q_l[i] -
    Q_g[i]) to the gradient of every row i of its compact table (the rows it trains in
    the round: its positives and sampled negatives), Q_g the table it received
    (``anchor`` (k, m, d)); the rows it never trains keep their start value, as without
    the term. Otherwise as :class:`~fedem_private.models.base.CompactRows`.
    """

    def __init__(self, q_start: Tensor, plan: Plan, anchor: Tensor, mu: float) -> None:
        super().__init__(q_start, plan)
        self.mu = float(mu)
        self.anchor = Compact.of(anchor.to(q_start.dtype), plan).table
        self.real = self.compact.valid.unsqueeze(-1).to(self.table.dtype)  # padding: no pull

    def step(self, a: int, flat: Tensor, s: int, cfg: LocalTrainConfig) -> None:
        pull = (self.table[:a] - self.anchor[:a]) * self.real[:a]
        self.grad[:a].add_(pull, alpha=self.mu)
        super().step(a, flat, s, cfg)
        self.grad[:a].zero_()  # the pull wrote rows outside the batch too


def prox_rows(anchor: Tensor, mu: float) -> RowsFactory:
    """The :class:`ProxRows` factory of a chunk whose received tables are ``anchor``."""
    def build(q_start: Tensor, plan: Plan) -> ProxRows:
        return ProxRows(q_start, plan, anchor, mu)
    return build
