"""Upload codecs: what a client's shared groups look like on the wire, and back.

A codec (docs/design.md section 9, and section 11 for FedPEFT's) turns a chunk's
shared groups (item table (k, m, d) and dense groups such as an MLP) into one
upload tensor (k, rows, d), and the server decodes an upload into the
item-table and dense groups it implies. The privacy mechanism clips and
noises the encoded upload as a whole, so every value that leaves the client
is covered; aggregation and the attacks see the decoded item table.

The codecs are registered classes (:mod:`fedem_private.client.codec_kinds`: ``full``,
``lora``, ``hash``, ``rqvae`` and the compressed ``c-`` variants, and whatever a test or a
plugin registers); :func:`build` makes the one a run names. The objects that encode and
decode (:class:`FullCodec`, :class:`PeftCodec` and FedPEFT's training rows) live in
:mod:`fedem_private.client.codec_tensors`, whose names are importable from here.
"""

from __future__ import annotations

from fedem_private.client.codec_kinds import codec_class
from fedem_private.client.codec_options import PeftConfig
from fedem_private.client.codec_tensors import (  # noqa: F401  (re-exported)
    HASH_PRIME,
    Codec,
    FullCodec,
    PeftCodec,
    PeftRows,
    code_itemsize,
    hash_codes,
    residual_kmeans,
    senet_weights,
)


def build(name: str, n_items: int, dim: int, dense_shapes: dict[str, tuple[int, ...]],
          peft: PeftConfig | None = None) -> Codec:
    """The codec registered as ``name`` (:func:`~fedem_private.client.codec_kinds.
    codec_class`; ValueError ``unknown codec 'NAME'`` when none), built by its class with
    its options ``peft`` (None: the defaults)."""
    return codec_class(name).build(n_items, dim, dense_shapes, peft)
