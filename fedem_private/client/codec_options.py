"""The FedPEFT codecs' own options (docs/design.md sections 11 and 15; the pattern is
:mod:`fedem_private.models.options`): one frozen dataclass read from its ``[federation]``
keys, with its own one-line checks; the FedPEFT codecs
(:class:`fedem_private.client.codec_kinds.Peft`) name it as their ``Options`` and build
from it. The codecs' names are their registry's (:mod:`fedem_private.client.codec_kinds`).

Importing this module is light (no torch): the configuration reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedem_private.models.options import PartOptions, part_options, require

#: FedPEFT's initial item table: random ("none") or an autoencoder over item attributes
PEFT_PRETRAINS = ("none", "attributes")
#: theta's start: "normal" N(0, s^2) as the full table, or "zero"
PEFT_INITS = ("normal", "zero")
#: the fields that are whole numbers >= 1
_POSITIVE = ("lora_rank", "hash_size", "hash_functions", "rq_levels", "rq_codebook")


@part_options
@dataclass(frozen=True)
class PeftConfig(PartOptions):
    """FedPEFT's hyper-parameters, with the paper's defaults (k_L 4; d_H 512, h 2; l 3, d_R 128)."""

    warmup: int = 2  # W rounds of full-table training before E0 is frozen
    lora_rank: int = 4  # k_L
    hash_size: int = 512  # d_H
    hash_functions: int = 2  # h
    # hash: 0 pools the h vectors by their mean (equations 4-5); r > 0 weights them by a
    # SENet (equations 6-9) of hidden width r * h (the paper's expansion ratio r_h = 16)
    hash_senet: int = 0
    rq_levels: int = 3  # l
    rq_codebook: int = 128  # d_R
    # theta's start: "normal" N(0, s^2) as the full table (the paper's choice for the
    # codebooks; LoRA's B is 0 either way), or "zero" so that the starting item vectors
    # are E0 itself (hash and RQ-VAE then start from the warm-up's table, unperturbed)
    init: str = "normal"
    # the initial item table: random ("none") or pre-trained on item attributes
    pretrain: str = "none"
    keys: ClassVar[dict[str, str]] = {"warmup": "peft_warmup", "init": "peft_init",
                                      "pretrain": "peft_pretrain"}

    def check(self) -> None:
        require(self.pretrain in PEFT_PRETRAINS,
                f"unknown --peft-pretrain (federation.peft_pretrain) {self.pretrain!r}; "
                f"choose one of {', '.join(PEFT_PRETRAINS)}")
        require(self.init in PEFT_INITS, f"--peft-init (federation.peft_init) must be normal "
                                         f"or zero, got {self.init!r}")
        require(self.warmup >= 0, f"--peft-warmup (federation.peft_warmup) must be >= 0, "
                                  f"got {self.warmup}")
        for name in _POSITIVE:
            value = getattr(self, name)
            require(value >= 1, f"--{name.replace('_', '-')} (federation.{name}) must be a "
                                f"positive integer, got {value}")
        require(self.hash_senet >= 0, f"--hash-senet (federation.hash_senet) must be 0 (mean "
                                      f"pooling) or a positive expansion ratio, got "
                                      f"{self.hash_senet}")
