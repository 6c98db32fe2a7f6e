"""FedRAP's backbone (Li, Long and Zhou, "Federated recommendation with additive
personalization", ICLR 2024).

Each client u represents item i as the sum of a private personal row P_u[i]
and a row C[i] of the shared common table, and scores it with a private head
(w_u, b_u): logit = w_u . (P_u[i] + C[i]) + b_u (docs/design.md section 10). Per
batch it minimises

    BCE - lambda * mean((P_u[i] - C[i])^2) + mu * mean(|C[i]|)

with the means over the batch's entries and the d dimensions (the published
code's MSE and L1 losses on the batch rows): the first regulariser pushes the
personal and common parts apart, the second makes C sparse. One Adam state
over head, P_u and C, fresh every round. Defaults lambda = mu = 0.1 as in the
authors' code (whose lambda/mu schedule is computed but never reaches the
loss, so the constants are what ran).

``--optimizer sgd`` trains as the published code does instead (its
``model/engine.py``): plain SGD without momentum, the head at its own rate
(``lr_head``) and P_u and C at ``lr``, L2 weight decay on all three (whole
tables: an embedding's dense gradient makes every row decay at every step),
the rates multiplied by ``lr_batch_decay`` after every batch (a fresh
ExponentialLR per client and round) and by ``lr_round_decay`` per round. The
compact table trains the touched rows; the other rows only decay, applied in
closed form at the end of the round (:func:`untouched_decay`). The published
code's early stop, batch size and reported round are separate settings
(``--early-stop-tol`` is not built for this backbone).

Shared: only C, the "item table" of the other parts: the server averages it
(the ``fedrap`` preset uses uniform weights, the published plain mean), and
elastic merging merges the downloaded common table with the client's own
copy of C from its last round; P_u and the head never leave the client. A
client is evaluated with its own model: P_u, its head and its own C (the
authors' code evaluates with the server's C instead).

Only batch rows get gradients, so training runs on a compact table of the
touched rows of P_u and C (see :class:`~fedem_private.models.base.Plan`); the
gradients are written by hand, and its reference in
:mod:`fedem_private.reference.models` is the obvious counterpart
(``nn.Linear``, ``F.mse_loss``, ``F.l1_loss``, ``torch.optim.Adam``).
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
    Compact,
    LocalOptimizer,
    LocalTrainConfig,
    RowsFactory,
    ScoreFn,
    clear_grad,
    clip_rows_l2,
    linear_init,
    make_plan,
    untouched_decay,
)
from fedem_private.models.options import FedRAPOptions, PartOptions


class FedRAPBackbone(Backbone):
    """FedRAP: private personal table and head, shared common table C (the item table)."""

    name = "fedrap"
    trains_item_rows = False
    optimizers = ("adam", "sgd")  # sgd: the published code's (module docstring)
    dot_product = True  # logit = w_u . (P_u[i] + C[i]) + b_u: linear in the uploaded C[i]
    Options = FedRAPOptions

    def __init__(self, n_items: int, dim: int, seed: int, init_std: float,
                 lam: float = 0.1, mu: float = 0.1) -> None:
        super().__init__(n_items, dim, seed, init_std)
        self.lam, self.mu = float(lam), float(mu)

    @classmethod
    def from_options(cls, n_items: int, dim: int, seed: int, init_std: float,
                     options: PartOptions) -> FedRAPBackbone:
        """Its options (:class:`FedRAPOptions`): lambda and mu."""
        assert isinstance(options, FedRAPOptions)
        return cls(n_items, dim, seed, init_std, lam=options.lambda_, mu=options.mu)

    def init_private(self, clients: np.ndarray) -> dict[str, Tensor]:
        """Personal tables N(0, init_std^2) and heads (nn.Linear's init), keyed by client."""
        k = len(clients)
        personal = torch.empty((k, self.n_items, self.dim))
        w, b = torch.empty((k, self.dim)), torch.empty(k)
        for j, u in enumerate(np.asarray(clients).tolist()):
            g = rng.generator(self.seed, rng.Stream.MODEL_INIT, 0, u)
            wj, bj = linear_init(self.dim, 1, g)
            w[j], b[j] = wj[:, 0], bj[0]
            personal[j] = torch.randn((self.n_items, self.dim), generator=g) * self.init_std
        return {"personal": personal, "w": w, "b": b}

    def memory_per_client(self) -> int:
        return 4 * 4 * self.n_items * self.dim  # the personal table, its grad and moments

    def train_chunk(self, start: ClientParams, clients: np.ndarray, samples: ClientSamples,
                    cfg: LocalTrainConfig, round_: int,
                    rows: RowsFactory | None = None) -> tuple[ClientParams, Tensor]:
        if rows is not None:  # its loss regularises whole tables; see trains_item_rows
            raise ValueError(f"{self.name} trains its item table itself (no ItemRows)")
        c_start, p_start = start.items, start.private["personal"]
        k, m, d = c_start.shape
        plan = make_plan(self.seed, round_, clients, samples, cfg, c_start.dtype,
                         device=c_start.device)
        # C and P_u side by side in one compact table (k, rows, 2d): each step gathers,
        # accumulates and clears both with one indexed operation each (same values as
        # two tables: every element sees the same additions in the same order)
        cp_start = torch.cat((c_start, p_start), dim=2)
        both = Compact.of(cp_start, plan)
        cp = both.table
        w = start.private["w"].clone().contiguous()
        b = start.private["b"].clone().contiguous()
        opt = LocalOptimizer([cp, w, b], ["items", "head", "head"], cfg, round_,
                             int(plan.steps.max(initial=0)))
        gcp, gw, gb = opt.grads
        cpflat, gcpflat = cp.view(-1, 2 * d), gcp.view(-1, 2 * d)
        for s, a, flat, y, wgt in plan.schedule():
            rows = cpflat.index_select(0, flat).view(a, -1, 2 * d)
            c_rows, p_rows = rows[..., :d], rows[..., d:]
            item = p_rows + c_rows
            logits = torch.bmm(item, w[:a, :, None]).squeeze(2) + b[:a, None]
            dz = (torch.sigmoid(logits) - y) * wgt  # d(batch-mean BCE)/d logit
            gw[:a] = torch.bmm(dz[:, None, :], item).squeeze(1)
            gb[:a] = dz.sum(dim=1)
            per = (wgt / d)[:, :, None]  # d(mean over entries and dims)/d entry
            score_grad = dz[:, :, None] * w[:a, None, :]
            diff = 2.0 * self.lam * per * (p_rows - c_rows)
            g = torch.empty_like(rows)  # [d/dC | d/dP_u] of the batch entries
            torch.add(score_grad, diff, out=g[..., :d])
            g[..., :d].addcmul_(per, torch.sign(c_rows), value=self.mu)  # mu * per * sign(C)
            torch.sub(score_grad, diff, out=g[..., d:])
            gcpflat.index_add_(0, flat, g.view(-1, 2 * d))
            if cfg.grad_clip is not None:  # paper mode: the uploaded table's gradient
                clip_rows_l2(gcp[:a, :, :d], cfg.grad_clip)
            opt.step(a, s)
            clear_grad(gcp, a, flat, plan)
        decays = opt.sgd and cfg.weight_decay > 0
        if decays:
            # rows outside the compact table had zero gradients but still decayed at each
            # of the client's steps: p * prod_s (1 - lr_s * weight_decay)
            cp_start.mul_(untouched_decay(opt.group_rates["items"], plan.steps,
                                          cfg.weight_decay).to(cp_start)[:, None, None])
        cp_local, touched = both.scatter(cp_start, inplace=True)  # cp_start is ours
        if decays:
            touched = torch.ones_like(touched)  # every row moved
        c_local, p_local = cp_local[..., :d].contiguous(), cp_local[..., d:].contiguous()
        return ClientParams(c_local, {}, {"personal": p_local, "w": w, "b": b}), touched

    #: the personal table travels beside the item rows in the IMIA shadow
    shadow_row_groups = ("personal",)

    def shadow_logits(self, params: dict[str, Tensor], q_rows: Tensor) -> Tensor:
        """w_u . (C[i] + P_u[i]) + b_u for rows [C[i] | P_u[i]] (c, R, 2d), for the IMIA
        shadow. The server never sees P_u or the head: the shadow draws both as the client
        does at the start (:meth:`init_private`; docs/design.md section 10)."""
        d = self.dim
        item = q_rows[..., :d] + q_rows[..., d:]
        return torch.bmm(item, params["w"][:, :, None]).squeeze(2) + params["b"][:, None]

    def shadow_row_loss(self, rows: Tensor) -> Tensor:
        """-lambda mean_d (P_u[i] - C[i])^2 + mu mean_d |C[i]| per entry: the two
        regularisers of the client's batch loss (module docstring), rows [C[i] | P_u[i]]."""
        d = self.dim
        c_rows, p_rows = rows[..., :d], rows[..., d:]
        return (-self.lam * (p_rows - c_rows).pow(2).mean(-1)
                + self.mu * c_rows.abs().mean(-1))

    def scores(self, params: ClientParams) -> Tensor:
        item = params.private["personal"] + params.items
        return (torch.bmm(item, params.private["w"][:, :, None]).squeeze(2)
                + params.private["b"][:, None])

    def adapter_score(self, params: ClientParams) -> tuple[Tensor, ScoreFn]:
        """The merged rows stand for C[i]; P_u[i] is looked up by the batch's item ids."""
        personal, bias = params.private["personal"], params.private["b"]

        def score(rows: Tensor, w_rows: Tensor, c_items: Tensor, items: Tensor) -> Tensor:
            k, m, d = personal.shape
            flat = (rows[:, None] * m + items).reshape(-1)
            p_items = personal.reshape(k * m, d).index_select(0, flat).view(*items.shape, d)
            return (torch.einsum("ad,abd->ab", w_rows, p_items + c_items)
                    + bias.index_select(0, rows)[:, None])

        return params.private["w"], score
