"""FedPEFT's client training the obvious way: decode the whole table, then train as the
full-table path does; the reference :class:`~fedem_private.client.codecs.PeftRows` is
tested against."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedem_private.client.codecs import PeftCodec
from fedem_private.models.base import LocalTrainConfig
from fedem_private.reference.models import reference_batches

LogitsFn = Callable[[dict[str, Tensor], Tensor, Tensor], Tensor]


def reference_train_client(codec: PeftCodec, logits_fn: LogitsFn,
                           params: dict[str, Tensor], theta: dict[str, Tensor], base: Tensor,
                           items: np.ndarray, labels: np.ndarray, cfg: LocalTrainConfig,
                           seed: int, round_: int, client: int,
                           groups: list[tuple[str, ...]]) -> tuple[dict[str, Tensor],
                                                                   dict[str, Tensor]]:
    """The obvious counterpart of :class:`~fedem_private.client.codecs.PeftRows`: decode,
    then the full-table path.

    One client. Per batch the whole table base + f_theta (m, d) is decoded with
    autograd, ``logits_fn(params, rows, items)`` scores the batch's rows, and
    each group of ``groups`` (names from ``params`` and ``"theta"``) takes its
    own ``torch.optim.Adam`` step on the batch-mean BCE, in order (PFedRec:
    the head, then theta; MF and NCF: everything at once). A gradient clip
    (``cfg.grad_clip``) applies to theta's joint gradient. Returns the
    trained (params, theta).
    """
    ps = {n: torch.nn.Parameter(v.detach().clone()) for n, v in params.items()}
    th = {n: torch.nn.Parameter(v.detach().clone()) for n, v in theta.items()}
    opts = []
    for group in groups:
        tensors = [t for n in group if n != "theta" for t in [ps[n]]]
        if "theta" in group:
            tensors += list(th.values())
        opts.append((group, torch.optim.Adam(tensors, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)))
    items_t = torch.from_numpy(items)
    labels_t = torch.from_numpy(labels).to(base.dtype)
    for batch in reference_batches(seed, round_, client, items.shape[0], cfg):
        for group, opt in opts:
            table = base + codec.delta({n: v[None] for n, v in th.items()})[0]
            logits = logits_fn(ps, table[items_t[batch]], items_t[batch])
            loss = F.binary_cross_entropy_with_logits(logits, labels_t[batch])
            for _, o in opts:
                o.zero_grad()
            loss.backward()
            if "theta" in group and cfg.grad_clip is not None:
                norm = torch.sqrt(sum(v.grad.double().pow(2).sum() for v in th.values()))
                if norm > cfg.grad_clip:
                    for v in th.values():
                        v.grad.mul_(float(cfg.grad_clip / norm))
            opt.step()
    return ({n: v.detach() for n, v in ps.items()}, {n: v.detach() for n, v in th.items()})
