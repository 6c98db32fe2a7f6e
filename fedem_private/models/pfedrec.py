"""PFedRec's backbone (Zhang et al., "Dual personalization on federated recommendation").

IJCAI 2023.

No user vector: each client scores item i as sigmoid(w_u . q_i + b_u) with a
private score head Linear(d -> 1) (w_u, b_u), kept across rounds and never
uploaded. Shared: the item table. Each batch takes two steps (docs/design.md
section 10): first the head, with the item table frozen; then the item
table, with the (just updated) head frozen; both on the batch's mean BCE.
Each step has its own Adam state, fresh every round (our engine's local
optimiser, docs/design.md section 3; the published code's choice of optimiser is not
part of the method). The client is evaluated with its own fine-tuned table
and head.

``--optimizer sgd`` trains as the published code's ``engine.py`` does: the same
two steps per batch, each by plain SGD without momentum, the head at
``lr_head`` and the item table at ``lr`` (that code sets the head's rate to lr
and the table's to lr x m x eta, eta = 80 by default; L2 weight decay 0 by
default), the table through :class:`~fedem_private.models.base.SGDRows`.

Gradients are linear in the head and written by hand: for logit z = w . q + b,
dz/dw = q, dz/db = 1, dz/dq = w. Its reference in :mod:`fedem_private.reference.models`
runs the same two steps with ``nn.Linear`` and two ``torch.optim.Adam`` (or two
``torch.optim.SGD``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedem_private import rng
from fedem_private.models.base import (
    Backbone,
    ClientParams,
    ClientSamples,
    CompactRows,
    LocalOptimizer,
    LocalTrainConfig,
    RowsFactory,
    ScoreFn,
    SGDRows,
    linear_init,
    make_plan,
    sgd_rates,
)


class PFedRecBackbone(Backbone):
    """PFedRec: private head (w_u, b_u) over q_i; shared item table; no user vector."""

    name = "pfedrec"
    dot_product = True  # logit = w_u . q_i + b_u: a dot product with w_u, plus a constant
    trains_item_rows = True
    optimizers = ("adam", "sgd")  # sgd: the published code's (module docstring)
    own_select_round = "best-val"

    def init_private(self, clients: np.ndarray) -> dict[str, Tensor]:
        """Each client's head, nn.Linear(d, 1)'s init keyed by (seed, client)."""
        w = torch.empty((len(clients), self.dim))
        b = torch.empty(len(clients))
        for j, u in enumerate(np.asarray(clients).tolist()):
            wj, bj = linear_init(self.dim, 1, rng.generator(self.seed, rng.Stream.MODEL_INIT,
                                                            0, u))
            w[j], b[j] = wj[:, 0], bj[0]
        return {"w": w, "b": b}

    def memory_per_client(self) -> int:
        return 4 * 4 * (self.dim + 1)

    def train_chunk(self, start: ClientParams, clients: np.ndarray, samples: ClientSamples,
                    cfg: LocalTrainConfig, round_: int,
                    rows: RowsFactory | None = None) -> tuple[ClientParams, Tensor]:
        q_start = start.items
        k, m, d = q_start.shape
        plan = make_plan(self.seed, round_, clients, samples, cfg, q_start.dtype,
                         device=q_start.device)
        steps = int(plan.steps.max(initial=0))
        if cfg.optimizer == "sgd":
            if rows is not None:
                raise ValueError("--optimizer sgd trains the item table itself (codec full)")
            rates = sgd_rates(cfg, round_, steps)["items"]
            items = SGDRows(q_start, plan, rates, cfg.weight_decay)
        else:
            items = (rows or CompactRows)(q_start, plan)
        w = start.private["w"].clone().contiguous()
        b = start.private["b"].clone().contiguous()
        head = LocalOptimizer([w, b], ["head", "head"], cfg, round_, steps)
        gw, gb = head.grads
        for s, a, flat, y, wgt in plan.schedule():
            q_rows = items.gather(flat).view(a, -1, d)
            # 1. head step, item table frozen
            logits = torch.bmm(q_rows, w[:a, :, None]).squeeze(2) + b[:a, None]
            dlogit = (torch.sigmoid(logits) - y) * wgt
            gw[:a] = torch.bmm(dlogit[:, None, :], q_rows).squeeze(1)
            gb[:a] = dlogit.sum(dim=1)
            head.step(a, s)
            # 2. item-table step with the updated head frozen
            logits = torch.bmm(q_rows, w[:a, :, None]).squeeze(2) + b[:a, None]
            dlogit = (torch.sigmoid(logits) - y) * wgt
            items.add_grad(flat, (dlogit[:, :, None] * w[:a, None, :]).reshape(-1, d))
            items.step(a, flat, s, cfg)
        q_local, touched = items.close()
        return ClientParams(q_local, {}, {"w": w, "b": b}), touched

    shadow_alternating = True  # the head's step, then the table's, on every batch

    def shadow_logits(self, params: dict[str, Tensor], q_rows: Tensor) -> Tensor:
        return torch.bmm(q_rows, params["w"][:, :, None]).squeeze(2) + params["b"][:, None]

    def scores(self, params: ClientParams) -> Tensor:
        w, b = params.private["w"], params.private["b"]
        return torch.bmm(params.items, w[:, :, None]).squeeze(2) + b[:, None]

    def adapter_score(self, params: ClientParams) -> tuple[Tensor, ScoreFn]:
        bias = params.private["b"]

        def score(rows: Tensor, w_rows: Tensor, q_items: Tensor, items: Tensor) -> Tensor:
            return torch.einsum("ad,abd->ab", w_rows, q_items) + bias.index_select(0, rows)[:, None]

        return params.private["w"], score

    per_example_grads = True

    def example_grads(self, private: dict[str, Tensor], rows: Tensor, items: Tensor,
                      labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Per example, with e = sigmoid(w_u . q_i + b_u) - y: d loss / d q_i = e w_u,
        d loss / d w_u = e q_i, d loss / d b_u = e (local DP-SGD steps all three at once, not
        PFedRec's alternating head and table steps)."""
        del items
        w, b = private["w"], private["b"]
        err = torch.sigmoid(torch.einsum("abd,ad->ab", rows, w) + b[:, None]) - labels
        return err[:, :, None] * w[:, None, :], {"b": err, "w": err[:, :, None] * rows}
