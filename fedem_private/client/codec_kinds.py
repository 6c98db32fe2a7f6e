"""The upload codecs as registered classes (docs/design.md sections 9, 11 and 15): the one
place a codec is listed.

:data:`REGISTRY` maps a name to its class as ``"module:Class"``, imported on first use. A
class (:class:`CodecKind`) declares what the codec is and can do as class variables, read
by the configuration's composition rules, the listing and the loop instead of its name:

- ``peft``: after a warm-up of full-table rounds it trains and uploads its own parameters
  theta in place of the item table (FedPEFT, section 11), so whatever needs the item
  table itself on the wire (a server step, a share of the uploads, merging on every
  batch, early stopping, DP-SGD, ``--clip auto``) is refused with it;
- ``senet``: it can weight its hash vectors by a squeeze-and-excitation net
  (``--hash-senet``);
- ``Options``: its own options (:class:`~fedem_private.client.codec_options.PeftConfig`
  for FedPEFT's).

:meth:`CodecKind.build` makes the codec object that encodes and decodes uploads
(:mod:`fedem_private.client.codec_tensors`, loaded then); a new codec is its class and one
line here, or :func:`register` from a test or a plugin.

Importing this module is light (no torch): the configuration and the listing read names
and capabilities here. It imports no other codec module at the top, and none imports it
back but :mod:`fedem_private.client.codecs` (docs/design.md section 1: no import circles).
"""

from __future__ import annotations

from typing import Any, ClassVar

from fedem_private.client.codec_options import PeftConfig
from fedem_private.lazy import add, resolve
from fedem_private.models.options import PartOptions

REGISTRY: dict[str, str] = {
    "full": "fedem_private.client.codec_kinds:Full",
    "lora": "fedem_private.client.codec_kinds:Lora",
    "hash": "fedem_private.client.codec_kinds:Hash",
    "rqvae": "fedem_private.client.codec_kinds:Rqvae",
    "c-lora": "fedem_private.client.codec_kinds:CompressedLora",
    "c-hash": "fedem_private.client.codec_kinds:CompressedHash",
    "c-rqvae": "fedem_private.client.codec_kinds:CompressedRqvae",
}


class CodecKind:
    """A codec: what a client's shared groups look like on the wire (module docstring)."""

    name: ClassVar[str]
    #: whether it trains and uploads its own parameters in place of the item table
    #: (after a warm-up of full-table rounds; FedPEFT)
    peft: ClassVar[bool] = False
    #: whether it can weight its hash vectors by a SENet (``--hash-senet``)
    senet: ClassVar[bool] = False
    #: its own options (read from the ``[federation]`` keys, docs/design.md section 15)
    Options: ClassVar[type[PartOptions]] = PartOptions

    @classmethod
    def build(cls, n_items: int, dim: int, dense_shapes: dict[str, tuple[int, ...]],
              options: Any = None) -> Any:
        """The codec object for a catalogue of ``n_items`` rows of width ``dim`` and the
        backbone's dense groups (name -> shape); ``options``: its :attr:`Options`
        (None: their defaults)."""
        raise NotImplementedError(f"codec {cls.name!r} has no build")


class Full(CodecKind):
    """``full``: the item table itself, the dense groups as extra rows below it."""

    name = "full"

    @classmethod
    def build(cls, n_items: int, dim: int, dense_shapes: dict[str, tuple[int, ...]],
              options: Any = None) -> Any:
        from fedem_private.client.codec_tensors import FullCodec

        return FullCodec(n_items, dim, dense_shapes)


class Peft(CodecKind):
    """A FedPEFT codec (section 11): frozen base E0 and trainable theta, item i =
    E0[i] + f_theta(i) (without E0 when compressed, ``with_base`` False)."""

    peft = True
    Options = PeftConfig
    #: the parameters theta: "lora", "hash" or "rqvae"
    kind: ClassVar[str]
    #: whether the item vectors add the frozen base E0 (the ``c-`` codecs do not)
    with_base: ClassVar[bool] = True

    @classmethod
    def build(cls, n_items: int, dim: int, dense_shapes: dict[str, tuple[int, ...]],
              options: Any = None) -> Any:
        from fedem_private.client.codec_tensors import PeftCodec

        return PeftCodec(cls.name, n_items, dim, dense_shapes, options or PeftConfig(),
                         kind=cls.kind, with_base=cls.with_base)


class Lora(Peft):
    """``lora``: theta = (A, B), f(i) = B a_i (equations 1-2)."""

    name = "lora"
    kind = "lora"


class Hash(Peft):
    """``hash``: theta = H, f(i) pools H's rows at h universal hashes of i (equations 3-9)."""

    name = "hash"
    kind = "hash"
    senet = True


class Rqvae(Peft):
    """``rqvae``: theta = codebooks, f(i) sums i's residual codes' rows (equation 11)."""

    name = "rqvae"
    kind = "rqvae"


class CompressedLora(Lora):
    """``c-lora``: LoRA without E0 in the item vector."""

    name = "c-lora"
    with_base = False


class CompressedHash(Hash):
    """``c-hash``: the hash codec without E0 in the item vector."""

    name = "c-hash"
    with_base = False


class CompressedRqvae(Rqvae):
    """``c-rqvae``: RQ-VAE codes without E0 in the item vector."""

    name = "c-rqvae"
    with_base = False


def register(name: str, target: str) -> None:
    """Make the codec class ``target`` (``"module:Class"``) known as ``name``: a test's or a
    plugin's one line (:mod:`fedem_private.plugins`); ValueError if ``name`` is taken."""
    add(REGISTRY, name, target, "codec")


def codec_class(name: str) -> type[CodecKind]:
    """The class registered as ``name`` (ValueError ``unknown codec 'NAME'`` when none)."""
    return resolve(REGISTRY, name, "codec")


def codecs_where(capability: str, value: object = True) -> tuple[str, ...]:
    """The registered codecs whose class variable ``capability`` is ``value``, in order."""
    return tuple(n for n in REGISTRY if getattr(codec_class(n), capability) == value)
