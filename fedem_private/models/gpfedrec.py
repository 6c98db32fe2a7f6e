"""GPFedRec's backbone (Zhang et al., "GPFedRec: graph-guided personalization for federated
recommendation", KDD 2024).

The client model is FedNCF's, score = MLP over [p_u, q_i] with layers
[32, 16, 8, 1] (docs/design.md section 10), but, as in the authors' code, the MLP is
private: every client starts from the same initial MLP and keeps its own,
with p_u, across rounds; only the item table is uploaded. The client starts
each round from the table the server sends (the graph aggregator's global
table) and adds a regulariser toward its personalised table Q_g[u] (the
aggregator's *anchor*):

    BCE + reg * mean_{i, k} (Q[i, k] - Q_g[u][i, k])^2      (reg = 1 by default)

the published MSE over the whole m x d table. That term moves every row, so
training runs on the full table (no compact touched-row table) and the whole
table changes in every upload. With an aggregator that sends no anchor (any
but ``graph``) the regulariser is off and only trained rows move.

``--optimizer sgd`` trains as the published code's ``engine.py`` does: plain
SGD with three rates, the MLP at ``lr_head``, p_u at ``lr_user`` and the item
table at ``lr`` (that code sets them from one rate: lr, lr / sample ratio x
eta - lr and lr x m x eta - lr).

Its reference in :mod:`fedem_private.reference.models` is the obvious
counterpart (``nn.Sequential``, ``F.mse_loss``, ``torch.optim.Adam``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedem_private.models.base import (
    ClientParams,
    ClientSamples,
    Compact,
    LocalOptimizer,
    LocalTrainConfig,
    RowsFactory,
    ScoreFn,
    clip_rows_l2,
    make_plan,
)
from fedem_private.models.ncf import NCFBackbone
from fedem_private.models.options import GPFedRecOptions, PartOptions


class GPFedRecBackbone(NCFBackbone):
    """GPFedRec: NCF's score with a private MLP; regulariser toward the server's anchor."""

    name = "gpfedrec"
    trains_item_rows = False
    dot_product = False
    optimizers = ("adam", "sgd")  # sgd: the published code's (module docstring)
    user_embedding = True
    own_select_round = "best-val"
    Options = GPFedRecOptions

    def __init__(self, n_items: int, dim: int, seed: int, init_std: float,
                 reg: float = 1.0) -> None:
        super().__init__(n_items, dim, seed, init_std)
        self.reg = float(reg)

    @classmethod
    def from_options(cls, n_items: int, dim: int, seed: int, init_std: float,
                     options: PartOptions) -> GPFedRecBackbone:
        """Its option (:class:`GPFedRecOptions`): the regulariser's weight toward the anchor."""
        assert isinstance(options, GPFedRecOptions)
        return cls(n_items, dim, seed, init_std, reg=options.reg)

    # the attack's MF shadow by default: on ML-100K (seed 0) this shadow, whose MLP is a
    # start draw, scored per-client AUC 0.621 at round 50 against the MF shadow's 0.829
    # (docs/attacks.md); it is built on request (experiments.shadow, ``generic``)
    shadow_builtin = True

    def shadow_logits(self, params: dict[str, Tensor], q_rows: Tensor) -> Tensor:
        """FedNCF's score with the client's own MLP (a private group here), for the IMIA
        shadow. The server never sees a client's MLP or p_u: the shadow draws both as the
        client does at the start (:meth:`init_private`). The regulariser toward the anchor
        is left out: the recording does not hold the personalised table the server sent,
        and its gradient, 2 reg (Q - anchor) / (m d), is small beside the BCE's on the
        trained rows (docs/design.md section 10; docs/attacks.md)."""
        return self._logits({n: params[n] for n in self.names}, params["p"], q_rows)

    def init_dense(self) -> dict[str, Tensor]:
        return {}  # nothing but the item table is shared

    def init_private(self, clients: np.ndarray) -> dict[str, Tensor]:
        """p_u keyed by client; every client's MLP a copy of one initial MLP."""
        out = super().init_private(clients)
        k = len(clients)
        for name, value in NCFBackbone.init_dense(self).items():
            out[name] = value.expand(k, *value.shape).clone()
        return out

    def memory_per_client(self) -> int:
        return super().memory_per_client() + 4 * 4 * self.n_items * self.dim

    @staticmethod
    def _mlp(params: ClientParams) -> dict[str, Tensor]:
        return {n: t for n, t in params.private.items() if n != "p"}

    def train_chunk(self, start: ClientParams, clients: np.ndarray, samples: ClientSamples,
                    cfg: LocalTrainConfig, round_: int,
                    rows: RowsFactory | None = None) -> tuple[ClientParams, Tensor]:
        if rows is not None:  # its loss regularises whole tables; see trains_item_rows
            raise ValueError(f"{self.name} trains its item table itself (no ItemRows)")
        q_start = start.items
        k, m, d = q_start.shape
        plan = make_plan(self.seed, round_, clients, samples, cfg, q_start.dtype, n_items=m,
                         device=q_start.device)
        compact = Compact.of(q_start, plan)
        q = compact.table
        anchor = start.anchor if self.reg > 0 else None
        scale = 2.0 * self.reg / (m * d)  # d/dQ of reg * mean((Q - anchor)^2)
        pc = start.private["p"].clone().contiguous()
        mlp = {n: start.private[n].clone().contiguous() for n in self.names}
        params = [q, pc, *(mlp[n] for n in self.names)]
        opt = LocalOptimizer(params, ["items", "user"] + ["head"] * len(self.names), cfg,
                             round_, int(plan.steps.max(initial=0)))
        grads = opt.grads
        gq = grads[0]
        qflat, gflat = q.view(-1, d), gq.view(-1, d)
        for s, a, flat, y, w in plan.schedule():
            gq[:a].zero_()
            self._mlp_step(params, grads, qflat, gflat, a, flat, y, w)
            if anchor is not None:
                gq[:a].add_(q[:a] - anchor[:a], alpha=scale)
            if cfg.grad_clip is not None:
                clip_rows_l2(gq[:a], cfg.grad_clip)
            opt.step(a, s)
        q_local, touched = compact.scatter(q_start)
        if anchor is None and not (opt.sgd and cfg.weight_decay > 0):  # only trained rows moved
            rows = np.zeros((k, m), dtype=bool)
            for j in range(k):
                items, _ = samples.of(j)
                rows[j, items] = True
            touched = torch.from_numpy(rows).to(q_start.device)
        return ClientParams(q_local, {}, {"p": pc, **mlp}), touched

    def scores(self, params: ClientParams) -> Tensor:
        return super().scores(ClientParams(params.items, self._mlp(params), params.private))

    def adapter_score(self, params: ClientParams) -> tuple[Tensor, ScoreFn]:
        return super().adapter_score(ClientParams(params.items, self._mlp(params),
                                                  params.private))
