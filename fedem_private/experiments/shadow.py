"""The IMIA shadow of each backbone, built from its registration (docs/design.md section 6).

The ``attacks`` package may not import the models; the attack that retrains a
shadow of a client's local training (:func:`attacks.imia.imia`) gets it from here
as an :class:`attacks.shadow.ShadowModel`: the recorded backbone, looked up by
name in :func:`fedem_private.models.build` (the registration the round loop
uses, not a list kept here), supplies its score (``Backbone.shadow_logits``),
how its client steps (``shadow_alternating``), and its own initialisers.
Everything used is public: the backbone's name, the catalogue size, the
dimension and ``init_std`` of :class:`~attacks.observations.PublicKnowledge`.

What the server cannot know, the shadow draws as a client would at the start:
a private part (user vector, PFedRec's and FedRAP's head, GPFedRec's MLP,
FedRAP's personal rows, ``Backbone.shadow_row_groups``) comes from the
backbone's own ``init_private`` under a seed of the attacker's (never the
run's). A backbone's extra per-entry loss terms (``Backbone.shadow_row_loss``,
FedRAP's regularisers) join the shadow's loss. A backbone
without ``shadow_logits`` gets None: the attack then falls back on its MF shadow
and its record says so. MF also gets None, by its registration's choice
(``shadow_builtin``): the attack's built-in shadow is the MF client's training,
faster, and measured stronger at ML-100K round 50 than the generic one;
GPFedRec too, because its own shadow (built with ``generic``) measured weaker
than the MF shadow at round 50 (its private MLP is a start draw). A run uploading
through the LoRA codec gets the generic shadow whatever the backbone asks: the attack
wraps it to train the codec's parameters (:func:`attacks.shadow.through_lora`).
"""

from __future__ import annotations

import numpy as np
import torch

from attacks.observations import PublicKnowledge
from attacks.shadow import ShadowModel
from fedem_private.models import build
from fedem_private.models.base import Backbone


def shadow_model(public: PublicKnowledge, *, generic: bool = False) -> ShadowModel | None:
    """The recorded backbone's shadow, or None when the backbone does not offer one or
    asks for the attack's built-in MF shadow (``Backbone.shadow_builtin``; ``generic``
    builds the generic one anyway)."""
    std = float(public.extra.get("init_std", 0.1))
    try:
        base = build(public.backbone, public.n_items, public.dim, 0, std)
    except ValueError:
        return None
    if type(base).shadow_logits is Backbone.shadow_logits:
        return None
    if base.shadow_builtin and not generic and public.extra.get("codec") != "lora":
        return None

    def fresh(gen: torch.Generator) -> Backbone:
        # an attacker's own seed: the draws have the client's distribution, not its values
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        return build(public.backbone, public.n_items, public.dim, seed, std)

    row_groups = tuple(base.shadow_row_groups)

    def init_private(c: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        drawn = fresh(gen).init_private(np.arange(c, dtype=np.int64))
        return {n: v for n, v in drawn.items() if n not in row_groups}

    def init_dense(gen: torch.Generator) -> dict[str, torch.Tensor]:
        return fresh(gen).init_dense()

    def init_rows(c: int, r: int, gen: torch.Generator) -> torch.Tensor:
        # a fresh client's private rows are i.i.d. over items: any r of them have the
        # distribution of the candidates' rows
        drawn = fresh(gen).init_private(np.arange(c, dtype=np.int64))
        return torch.cat([drawn[n][:, :r] for n in row_groups], dim=2)

    row_loss = (base.shadow_row_loss
                if type(base).shadow_row_loss is not Backbone.shadow_row_loss else None)
    return ShadowModel(backbone=public.backbone, logits=base.shadow_logits,
                       init_private=init_private, init_dense=init_dense,
                       dense_names=tuple(base.init_dense()),
                       alternating=bool(base.shadow_alternating),
                       init_rows=init_rows if row_groups else None, row_loss=row_loss)
