"""FedNCF's backbone (Perifanis and Efraimidis 2022; the FedEM authors' variant).

Client u scores item i as sigmoid(MLP([p_u, q_i])) with layers [32, 16, 8, 1]
and ReLU between them (docs/design.md section 10). Shared: the item table (by the
chosen aggregator, and the group a merge acts on) and the MLP weights (a dense
group, always averaged with FedAvg weights). Private: p_u. Local training is
mean BCE with Adam, E epochs, as for MF (FedEM paper, equation 12).

The vectorised path trains a chunk of clients in lock-step with one batched
MLP per client (weights (k, fan_in, fan_out)); gradients come from autograd on
the active clients' batch rows only, and the item-table gradient is scattered
into a compact table of touched rows (exact: see
:class:`~fedem_private.models.base.Plan`). Its reference in
:mod:`fedem_private.reference.models` is the obvious counterpart: one client,
``nn.Sequential``, ``torch.optim.Adam``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedem_private import rng
from fedem_private.models.base import (
    SERVER,
    Backbone,
    ClientParams,
    ClientSamples,
    CompactRows,
    LocalTrainConfig,
    RowsFactory,
    ScoreFn,
    adam_buffers,
    dense_names,
    fused_adam,
    linear_init,
    make_plan,
    mlp_forward,
)

LAYERS = (32, 16, 8, 1)


class NCFBackbone(Backbone):
    """FedNCF: score = MLP over [p_u, q_i]; shared item table and MLP, private p_u."""

    name = "ncf"
    dot_product = False
    trains_item_rows = True

    def __init__(self, n_items: int, dim: int, seed: int, init_std: float,
                 layers: tuple[int, ...] = LAYERS) -> None:
        super().__init__(n_items, dim, seed, init_std)
        self.layers = tuple(layers)
        fans = (2 * dim, *self.layers)
        self.shapes = list(zip(fans[:-1], fans[1:], strict=True))
        self.names = dense_names(len(self.shapes))

    def init_dense(self) -> dict[str, Tensor]:
        """The server's initial MLP (nn.Linear's init), keyed by the server alone."""
        g = rng.generator(self.seed, rng.Stream.MODEL_INIT, 0, SERVER)
        out: dict[str, Tensor] = {}
        for j, (fan_in, fan_out) in enumerate(self.shapes):
            out[f"w{j}"], out[f"b{j}"] = linear_init(fan_in, fan_out, g)
        return out

    def init_private(self, clients: np.ndarray) -> dict[str, Tensor]:
        p = torch.empty((len(clients), self.dim))
        for j, u in enumerate(np.asarray(clients).tolist()):
            g = rng.generator(self.seed, rng.Stream.INIT, 0, u)
            p[j] = torch.randn(self.dim, generator=g) * self.init_std
        return {"p": p}

    def memory_per_client(self) -> int:
        return 4 * 4 * sum(fi * fo + fo for fi, fo in self.shapes)  # params, grads, 2 moments

    def _logits(self, dense: dict[str, Tensor], p_rows: Tensor, q_items: Tensor) -> Tensor:
        x = torch.cat((p_rows[:, None, :].expand(-1, q_items.shape[1], -1), q_items), dim=-1)
        return mlp_forward(dense, x, len(self.shapes))

    def train_chunk(self, start: ClientParams, clients: np.ndarray, samples: ClientSamples,
                    cfg: LocalTrainConfig, round_: int,
                    rows: RowsFactory | None = None) -> tuple[ClientParams, Tensor]:
        q_start = start.items
        k, m, d = q_start.shape
        plan = make_plan(self.seed, round_, clients, samples, cfg, q_start.dtype,
                         device=q_start.device)
        items = (rows or CompactRows)(q_start, plan)
        pc = start.private["p"].clone().contiguous()
        dense = {n: start.dense[n].clone().contiguous() for n in self.names}
        params = [pc, *(dense[n] for n in self.names)]
        grads, m1, m2 = adam_buffers(params)
        for s, a, flat, y, w in plan.schedule():
            q_rows = items.gather(flat).view(a, -1, d)
            items.add_grad(flat, self._mlp_grads(params, grads, q_rows, a, y, w).reshape(-1, d))
            items.step(a, flat, s, cfg)
            fused_adam([t[:a] for t in params], [g[:a] for g in grads], [t[:a] for t in m1],
                       [t[:a] for t in m2], s + 1, cfg)
        q_local, touched = items.close()
        return ClientParams(q_local, dense, {"p": pc}), touched

    def _mlp_grads(self, params: list[Tensor], grads: list[Tensor], q_rows: Tensor, a: int,
                   y: Tensor, w: Tensor) -> Tensor:
        """The batch-mean BCE gradients of the first a clients: p_u's and the MLP's into
        ``grads`` (``params`` = [p, MLP]); returns the item rows' (a, B, d)."""
        q_rows = q_rows.detach().requires_grad_(True)
        leaves = [t[:a].detach().requires_grad_(True) for t in params]
        with torch.enable_grad():
            mlp = dict(zip(self.names, leaves[1:], strict=True))
            bce = F.binary_cross_entropy_with_logits(self._logits(mlp, leaves[0], q_rows), y,
                                                     reduction="none")
            # sum over clients of each client's batch mean
            g_all = torch.autograd.grad((bce * w).sum(), [q_rows, *leaves])
        for gbuf, g in zip(grads, g_all[1:], strict=True):
            gbuf[:a] = g
        return g_all[0]

    def _mlp_step(self, params: list[Tensor], grads: list[Tensor], qflat: Tensor, gflat: Tensor,
                  a: int, flat: Tensor, y: Tensor, w: Tensor) -> None:
        """:meth:`_mlp_grads` with ``params`` = [table, p, MLP]: the item rows' gradient
        scattered into ``gflat``, the others into ``grads[1:]``."""
        d = qflat.shape[1]
        q_rows = qflat.index_select(0, flat).view(a, -1, d)
        gflat.index_add_(0, flat, self._mlp_grads(params[1:], grads[1:], q_rows, a, y,
                                                  w).reshape(-1, d))

    def shadow_logits(self, params: dict[str, Tensor], q_rows: Tensor) -> Tensor:
        return self._logits({n: params[n] for n in self.names}, params["p"], q_rows)

    def scores(self, params: ClientParams) -> Tensor:
        k, m, _ = params.items.shape
        out = torch.empty((k, m), dtype=params.items.dtype, device=params.items.device)
        step = 4096
        for a in range(0, m, step):
            out[:, a:a + step] = self._logits(params.dense, params.private["p"],
                                              params.items[:, a:a + step])
        return out

    def adapter_score(self, params: ClientParams) -> tuple[Tensor, ScoreFn]:
        dense = params.dense

        def score(rows: Tensor, p_rows: Tensor, q_items: Tensor, items: Tensor) -> Tensor:
            return self._logits({n: t.index_select(0, rows) for n, t in dense.items()},
                                p_rows, q_items)

        return params.private["p"], score
