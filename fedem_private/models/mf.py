"""FedMF's backbone: matrix-factorisation clients trained in lock-step over a chunk.

Each client u scores item i as sigmoid(p_u . q_i) (FedEM paper, equation 2)
and minimises the mean binary cross-entropy over batches of its positives and
sampled negatives with Adam (equation 12), for E local epochs. All clients of
a chunk train together as batched tensors: step s advances every client that
still has a batch at step s, so ragged batch counts cost nothing extra.

Shared: the item table. Private: the user vector p_u. Only the touched rows
are trained, in a compact table (see :class:`~fedem_private.models.base.Plan`);
:func:`fedem_private.reference.models.mf_train_client` runs ``torch.optim.Adam``
on the full table, one client at a time, and the tests check both give the
same tables.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedem_private import rng
from fedem_private.models.base import (
    Backbone,
    ClientParams,
    ClientSamples,
    CompactRows,
    LocalTrainConfig,
    RowsFactory,
    ScoreFn,
    draw_samples,
    epoch_orders,
    fused_adam,
    make_plan,
    num_steps,
    stops_early,
)

__all__ = ["MFBackbone", "ClientSamples", "LocalTrainConfig", "draw_samples", "epoch_orders",
           "num_steps", "train_chunk", "dot_scores"]


def train_chunk(q_start: torch.Tensor, p: torch.Tensor, clients: np.ndarray,
                samples: ClientSamples, cfg: LocalTrainConfig, seed: int, round_: int,
                rows: RowsFactory | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train a chunk of clients; return (q_local (k,m,d), p_new (k,d), touched (k,m) bool).

    ``clients`` must be sorted by number of steps, descending (see
    :func:`num_steps`), so the clients still training at any step are a
    prefix of the chunk. ``q_start`` is each client's starting item table (the
    server's table under static replacement, the merged table under FedEM).
    Gradients are written by hand: d BCE / d logit = (sigmoid - y) / B, times
    p_u for q_i and q_i for p_u (equation 12). The item vectors are trained
    through ``rows`` (:class:`~fedem_private.models.base.ItemRows`; default the
    table's own touched rows).
    """
    k, m, d = q_start.shape
    if k == 0:
        return q_start.clone(), p.clone(), torch.zeros((0, m), dtype=torch.bool,
                                                        device=q_start.device)
    plan = make_plan(seed, round_, clients, samples, cfg, q_start.dtype, device=q_start.device)
    items = (rows or CompactRows)(q_start, plan)
    pc = p.clone().contiguous()
    gp, mp, vp = torch.zeros_like(pc), torch.zeros_like(pc), torch.zeros_like(pc)
    stop = _EarlyStop(plan, samples, cfg, items, pc) if cfg.early_stop_tol > 0 else None
    for s, a, flat, y, w in plan.schedule():
        pa = pc[:a]
        if items.pre_steps:  # the rows' own parameters step first on this batch
            q_rows = items.gather(flat).view(a, -1, d)
            dlogit = (torch.sigmoid(torch.bmm(q_rows, pa[:, :, None]).squeeze(2)) - y) * w
            items.pre_step(a, flat, (dlogit[:, :, None] * pa[:, None, :]).reshape(-1, d), s)
        q_rows = items.gather(flat).view(a, -1, d)
        logits = torch.bmm(q_rows, pa[:, :, None]).squeeze(2)
        dlogit = (torch.sigmoid(logits) - y) * w  # d(mean BCE over the batch)/d logit
        items.add_grad(flat, (dlogit[:, :, None] * pa[:, None, :]).reshape(-1, d))
        gp[:a] = torch.bmm(dlogit[:, None, :], q_rows).squeeze(1)
        items.step(a, flat, s, cfg)
        fused_adam([pc[:a]], [gp[:a]], [mp[:a]], [vp[:a]], s + 1, cfg)
        if stop is not None:
            stop.after_step(s, a, logits, y, w)
    if stop is not None:
        stop.restore()
    q_local, touched = items.close()
    return q_local, pc, touched


class _EarlyStop:
    """The FedEM code's early stop (docs/design.md 2a) inside lock-step training, exactly.

    A client's epoch loss is the sum of its batch losses (the mean BCE of each
    batch, before that batch's step). After an epoch e >= 1 whose loss changed
    by less than ``early_stop_tol`` relative to epoch e - 1's, the client's
    parameters at that moment (its item rows, with anything the rows train
    themselves, and p_u) are kept; it goes on stepping in lock-step with the
    others, but those later steps are discarded by :meth:`restore`. Nothing it
    does afterwards touches another client, so the result is each client's own
    early-stopped training.
    """

    def __init__(self, plan, samples: ClientSamples, cfg: LocalTrainConfig, items, p):
        if not isinstance(items, CompactRows):
            raise ValueError("early stopping trains the item table's own rows (codec full)")
        self.cfg, self.items, self.p = cfg, items, p
        k = p.shape[0]
        self.nb = np.maximum(-(-np.diff(samples.indptr) // cfg.batch_size), 1)
        self.loss = np.zeros((k, cfg.epochs), dtype=np.float64)
        self.stopped = np.zeros(k, dtype=bool)
        self.saved: dict[int, tuple[object, torch.Tensor]] = {}

    def after_step(self, s: int, a: int, logits, y, w) -> None:
        nb = self.nb[:a]
        batch = (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * w).sum(1)
        self.loss[np.arange(a), s // nb] += batch.detach().double().cpu().numpy()
        ends = ((s + 1) % nb == 0) & (s // nb >= 1) & ~self.stopped[:a]
        for j in np.flatnonzero(ends).tolist():
            e = s // int(nb[j])
            if stops_early(self.loss[j, e - 1], self.loss[j, e], self.cfg.early_stop_tol):
                self.stopped[j] = True
                self.saved[j] = (self.items.save(j), self.p[j].clone())

    def restore(self) -> None:
        """Each stopped client's parameters back to where it stopped."""
        for j, (rows, p) in self.saved.items():
            self.items.load(j, rows)
            self.p[j] = p


def dot_scores(rows: torch.Tensor, p_rows: torch.Tensor, q_items: torch.Tensor,
               items: torch.Tensor | None = None) -> torch.Tensor:
    """MF logits p_u . q_i: p_rows (a, d), q_items (a, B, d) -> (a, B)."""
    del rows, items  # MF needs no per-client score head
    return torch.einsum("ad,abd->ab", p_rows, q_items)


class MFBackbone(Backbone):
    """FedMF (docs/design.md §10): score sigmoid(p_u . q_i); shared item table, private p_u."""

    name = "mf"
    dot_product = True
    trains_item_rows = True
    early_stop = True
    batch_merge = True

    shadow_builtin = True  # imia's own MF shadow is this client's training

    def shadow_logits(self, params: dict[str, torch.Tensor], q_rows: torch.Tensor
                      ) -> torch.Tensor:
        return torch.bmm(q_rows, params["p"][:, :, None]).squeeze(2)

    def init_private(self, clients: np.ndarray) -> dict[str, torch.Tensor]:
        p = torch.empty((len(clients), self.dim))
        for j, u in enumerate(np.asarray(clients).tolist()):
            g = rng.generator(self.seed, rng.Stream.INIT, 0, u)
            p[j] = torch.randn(self.dim, generator=g) * self.init_std
        return {"p": p}

    def train_chunk(self, start: ClientParams, clients: np.ndarray, samples: ClientSamples,
                    cfg: LocalTrainConfig, round_: int,
                    rows: RowsFactory | None = None) -> tuple[ClientParams, torch.Tensor]:
        q, p, touched = train_chunk(start.items, start.private["p"], clients, samples, cfg,
                                    self.seed, round_, rows)
        return ClientParams(q, {}, {"p": p}), touched

    def scores(self, params: ClientParams) -> torch.Tensor:
        return torch.bmm(params.items, params.private["p"][:, :, None]).squeeze(2)

    def adapter_score(self, params: ClientParams) -> tuple[torch.Tensor, ScoreFn]:
        return params.private["p"], dot_scores

    per_example_grads = True

    def example_grads(self, private: dict[str, torch.Tensor], rows: torch.Tensor,
                      items: torch.Tensor, labels: torch.Tensor
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Equation 12 per example: with e = sigmoid(p_u . q_i) - y, d loss / d q_i = e p_u
        and d loss / d p_u = e q_i."""
        del items  # MF's score needs no item id
        p = private["p"]
        err = torch.sigmoid(torch.einsum("abd,ad->ab", rows, p)) - labels
        return err[:, :, None] * p[:, None, :], {"p": err[:, :, None] * rows}
