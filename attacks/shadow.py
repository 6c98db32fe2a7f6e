"""A backbone's local training as an honest-but-curious server can replay it (the IMIA shadow).

The attacks may not import the models (pyproject's import contracts): what
:func:`attacks.imia.imia` needs of a backbone comes in as a :class:`ShadowModel`,
built by the experiments layer (:mod:`fedem_private.experiments.shadow`) from the
backbone's own registration, out of public facts only (the backbone's name and
the public hyper-parameters of :class:`~attacks.observations.PublicKnowledge`).

A shadow model is three plain functions:

- ``logits(params, q)``: the client's logits (c, R) for item rows q (c, R, d),
  given its non-item parameters ``params`` (name -> (c, ...), client axis first:
  the private groups and the shared dense ones), differentiable in both;
- ``init_private(c, gen)``: c clients' private groups (user vector, score head)
  drawn as a client draws them at the start of training. The server cannot
  know a client's private part; this draw is its guess, and after round 1 a
  private part the client kept training (PFedRec's head, every user vector)
  has moved away from any such draw;
- ``init_dense(gen)``: the shared dense groups (FedNCF's MLP) as the server
  initialises them: only a fallback for a recording that did not store the
  dense groups the server sent (:attr:`Observation.sent_dense`).

Two optional parts, for a client with a private row per item (FedRAP's
personal table P_u): ``init_rows(c, R, gen)`` draws (c, R, e) private row parts
as the client draws them at the start (rows i.i.d., so any R rows of a fresh
table); they travel with the item rows, so ``logits`` gets rows [q_i | P_u[i]]
of width d + e, both label copies of a row start from the same draw and train
on, and only the first d columns are the simulated delta. ``row_loss(rows)``
(c, R) is a per-entry term of the batch loss beside the BCE (FedRAP's
regularisers), weighted like it.

:func:`train_shadow` replays E epochs of mean-BCE Adam (fresh state, the clients'
optimiser) on every candidate row twice in parallel, labelled 1 and labelled 0;
the non-item parameters train on the guessed labels only, so both copies of a
row see the same trajectory of them. ``alternating`` (PFedRec): each batch first
steps the non-item parameters with the rows frozen, then the rows with the
updated parameters frozen (two Adam states), as that backbone's client does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class ShadowModel:
    """What the IMIA shadow needs of a backbone (see the module docstring)."""

    backbone: str
    logits: Callable[[Mapping[str, Tensor], Tensor], Tensor]
    init_private: Callable[[int, torch.Generator], dict[str, Tensor]]
    init_dense: Callable[[torch.Generator], dict[str, Tensor]]
    dense_names: tuple[str, ...] = ()
    alternating: bool = False
    init_rows: Callable[[int, int, torch.Generator], Tensor] | None = None
    row_loss: Callable[[Tensor], Tensor] | None = None
    #: columns at the end of each row that never train (a codec's frozen base, see
    #: :func:`through_lora`); the attack supplies them per candidate
    frozen_tail: int = 0
    #: non-item parameters that step with the rows in an ``alternating`` client (a
    #: codec's shared factor trains as part of the item table's step)
    row_phase: tuple[str, ...] = ()


#: the dense-group name under which :func:`through_lora` carries LoRA's B
LORA_B = "codec.B"


def through_lora(inner: ShadowModel, rank: int, dim: int) -> ShadowModel:
    """``inner``'s client training with its item table trained through FedPEFT's LoRA codec.

    The client's item i is base_i + B a_i (FedPEFT, equations 1-2): it trains a_i (its
    row of A, width ``rank``) and B (d, rank), never the frozen base. Here a row is
    [a_i | base_i] (width rank + ``dim``; the base is the frozen tail, supplied per candidate
    by the attack), B travels as the dense group :data:`LORA_B` (what the server sent)
    and trains beside the backbone's own non-item parameters, with the rows in a
    client that alternates (PFedRec: the head first, then theta). The simulated delta is
    that of a_i. A backbone with private row groups (FedRAP) is not covered (ValueError)."""
    if inner.init_rows is not None:
        raise ValueError("through_lora: a backbone with private rows is not covered")

    def logits(params: Mapping[str, Tensor], rows: Tensor) -> Tensor:
        a, base = rows[..., :rank], rows[..., rank:]
        item = base + torch.einsum("crk,cdk->crd", a, params[LORA_B])
        return inner.logits({n: v for n, v in params.items() if n != LORA_B}, item)

    return ShadowModel(backbone=inner.backbone, logits=logits,
                       init_private=inner.init_private, init_dense=inner.init_dense,
                       dense_names=(*inner.dense_names, LORA_B),
                       alternating=inner.alternating, row_loss=None,
                       frozen_tail=dim, row_phase=(LORA_B,))


def _adam(params: list[Tensor], grads: list[Tensor], m1: list[Tensor], m2: list[Tensor],
          active: Tensor, step: int, lr: float) -> None:
    """torch.optim.Adam's update at step ``step`` (1-based) for the active clients only."""
    b1, b2 = BETAS
    c1, c2 = 1.0 - b1 ** step, 1.0 - b2 ** step
    for p, g, m, v in zip(params, grads, m1, m2, strict=True):
        on = active.view(-1, *([1] * (p.dim() - 1)))
        m.copy_(torch.where(on, b1 * m + (1.0 - b1) * g, m))
        v.copy_(torch.where(on, b2 * v + (1.0 - b2) * g * g, v))
        upd = lr * (m / c1) / ((v / c2).sqrt() + ADAM_EPS)
        p.sub_(torch.where(on, upd, torch.zeros_like(upd)))


def batch_slots(valid: Tensor, nb: Tensor, epochs: int, gen: torch.Generator) -> Tensor:
    """(c, E, NB, W) slot indices of every client's batches, epoch by epoch (-1: padding).

    Client j's valid slots are shuffled each epoch (the attacker's own order, drawn
    on the CPU generator) and cut into nb[j] batches of at most ceil(R_j / nb[j]).
    """
    c, r = valid.shape
    size = valid.sum(1).cpu().numpy()
    nbs = nb.cpu().numpy()
    width = int(max(1, np.max(-(-size // np.maximum(nbs, 1)))))
    out = np.full((c, epochs, int(nbs.max()), width), -1, dtype=np.int64)
    for e in range(epochs):
        keys = torch.rand((c, r), generator=gen).numpy()
        for j in range(c):
            n = int(size[j])
            order = np.argsort(keys[j, :n], kind="stable")  # valid slots are a prefix
            w = -(-n // int(nbs[j]))
            for b in range(int(nbs[j])):
                part = order[b * w: (b + 1) * w]
                out[j, e, b, : part.size] = part
    return torch.from_numpy(out).to(valid.device)


def train_shadow(model: ShadowModel, sent: Tensor, valid: Tensor, guess: Tensor,
                 trains: Tensor, params0: Mapping[str, Tensor], per_epoch: Tensor, *,
                 lr: float, epochs: int, batch_size: int, gen: torch.Generator,
                 rows0: Tensor | None = None) -> Tensor:
    """Simulated deltas (c, 2, R, d) of every candidate row under labels 0 and 1.

    ``sent`` (c, R, d): the candidate rows as sent; ``valid`` (c, R) marks real
    slots (a prefix of each row); ``guess`` (c, R) the guessed labels; the
    non-item parameters ``params0`` (name -> (c, ...)) train on the guessed
    copies of the rows in ``trains`` (c, R) only (the rows believed trained: a
    candidate set wider than the trained rows must not flood them with
    negatives); ``per_epoch`` (c,) the samples a client trains on per epoch
    (K (1 + N)), which sets its number of batches and the weight of each of its
    ``trains`` slots in the batch mean. ``rows0`` (c, R, e): the private row parts
    (``ShadowModel.init_rows``) appended to the rows; None: none.
    """
    c, r, d_out = sent.shape
    wide = sent.float() if rows0 is None else torch.cat((sent.float(), rows0.float()), dim=2)
    d = wide.shape[2]
    dev = sent.device
    nb = torch.div(per_epoch + batch_size - 1, batch_size, rounding_mode="floor").clamp(min=1)
    nb = torch.minimum(nb, valid.sum(1).clamp(min=1))
    slots = batch_slots(valid, nb, epochs, gen)  # (c, E, NB, W)
    width = slots.shape[-1]
    # each slot stands for per_epoch / R_j samples of the client's epoch: the batch mean's weight
    trains = trains & valid
    weight = (per_epoch.double() / trains.sum(1).clamp(min=1).double()).float()
    q = wide[:, None].expand(c, 2, r, d).contiguous()
    qm, qv = torch.zeros_like(q), torch.zeros_like(q)
    theta = {n: t.float().clone().contiguous() for n, t in params0.items()}
    names = list(theta)
    tm = [torch.zeros_like(theta[n]) for n in names]
    tv = [torch.zeros_like(theta[n]) for n in names]
    with_rows = [n for n in names if n in model.row_phase]  # step with the rows (alternating)
    head = [n for n in names if n not in model.row_phase]
    with_at = [names.index(n) for n in with_rows]
    head_at = [names.index(n) for n in head]
    labels = torch.tensor([0.0, 1.0], device=dev)[None, :, None]
    choose = torch.stack([1.0 - guess.float(), guess.float()], dim=1)  # (c, 2, R): theta's copy
    steps = epochs * nb
    rows = torch.arange(c, device=dev)
    t_steps = 0
    for s in range(int(steps.max())):
        active = steps > s
        epoch = torch.div(s, nb, rounding_mode="floor").clamp(max=epochs - 1)
        idx = slots[rows, epoch, s % nb]  # (c, W)
        on = (idx >= 0) & active[:, None]
        safe = idx.clamp(min=0)
        sel = on & trains.gather(1, safe)
        count = (sel.sum(1) * weight).clamp(min=1.0)
        wgt = on.float() / count[:, None]  # (c, W)
        gather = safe[:, None, :, None].expand(c, 2, width, d)
        pick = choose.gather(2, safe[:, None, :].expand(c, 2, width)) * sel[:, None].float()

        def loss_of(th: Mapping[str, Tensor], q_rows: Tensor, *, chosen: bool,
                    wgt: Tensor = wgt, pick: Tensor = pick) -> Tensor:
            flat_rows = q_rows.reshape(c, 2 * width, d)
            z = model.logits(th, flat_rows).view(c, 2, width)
            bce = F.binary_cross_entropy_with_logits(z, labels.expand(c, 2, width),
                                                     reduction="none")
            if model.row_loss is not None:
                bce = bce + model.row_loss(flat_rows).view(c, 2, width)
            bce = bce * wgt[:, None]
            return (bce * pick).sum() if chosen else bce.sum()

        t_steps += 1
        with torch.enable_grad():
            leaves = {n: theta[n].detach().requires_grad_(True) for n in names}
            q_rows = torch.gather(q, 2, gather).detach().requires_grad_(True)
            if model.alternating:  # PFedRec: the head first, the rows frozen
                g_head = torch.autograd.grad(loss_of(leaves, q_rows.detach(), chosen=True),
                                             [leaves[n] for n in head], allow_unused=True)
                _adam([theta[n] for n in head], _zeros_for(g_head, theta, head),
                      [tm[i] for i in head_at], [tv[i] for i in head_at], active, t_steps, lr)
                leaves = {n: theta[n].detach().requires_grad_(n in with_rows) for n in names}
                g_rows = torch.autograd.grad(loss_of(leaves, q_rows, chosen=False), q_rows,
                                             retain_graph=bool(with_rows))[0]
                if with_rows:  # a codec's shared factor: with the rows, on the guessed labels
                    g_with = torch.autograd.grad(loss_of(leaves, q_rows, chosen=True),
                                                 [leaves[n] for n in with_rows],
                                                 allow_unused=True)
            else:
                g_rows = torch.autograd.grad(loss_of(leaves, q_rows, chosen=False), q_rows,
                                             retain_graph=True)[0]
                g_theta = torch.autograd.grad(loss_of(leaves, q_rows, chosen=True),
                                              [leaves[n] for n in names], allow_unused=True)
        gq = torch.zeros_like(q)
        gq.scatter_add_(2, gather, g_rows * on[:, None, :, None])
        if model.frozen_tail:
            gq[..., d - model.frozen_tail:] = 0.0  # a frozen base never moves (Adam: 0 step)
        if not model.alternating:
            _adam([theta[n] for n in names], _zeros_for(g_theta, theta, names), tm, tv,
                  active, t_steps, lr)
        elif with_rows:
            _adam([theta[n] for n in with_rows], _zeros_for(g_with, theta, with_rows),
                  [tm[i] for i in with_at], [tv[i] for i in with_at], active, t_steps, lr)
        _adam([q], [gq], [qm], [qv], active, t_steps, lr)
    return (q[..., :d_out] - sent.float()[:, None]).double()


def _zeros_for(grads: tuple[Tensor | None, ...], theta: Mapping[str, Tensor],
               names: list[str]) -> list[Tensor]:
    return [torch.zeros_like(theta[n]) if g is None else g for g, n in zip(grads, names,
                                                                            strict=True)]
