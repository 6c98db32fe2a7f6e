"""Codecs are registered classes (issue 67, item 5): a codec is one class and one registry line,
and the composition rules ask its class, never its name, so a registered codec is held to the
rules a built-in is."""

from __future__ import annotations

import pytest

import fedem_private as fp
from fedem_private.client import codec_kinds, codecs
from fedem_private.client.codec_kinds import Full, Lora
from fedem_private.errors import UserError


class PlainRows(Full):
    """The full table under another name: a codec that uploads the item table itself."""

    name = "plain"
    built = 0

    @classmethod
    def build(cls, n_items, dim, dense_shapes, options=None):
        cls.built += 1
        return super().build(n_items, dim, dense_shapes, options)


class SmallLora(Lora):
    """LoRA under another name: a FedPEFT codec."""

    name = "small-lora"


@pytest.fixture
def toys(monkeypatch):
    monkeypatch.setitem(codec_kinds.REGISTRY, "plain", f"{__name__}:PlainRows")
    monkeypatch.setitem(codec_kinds.REGISTRY, "small-lora", f"{__name__}:SmallLora")
    PlainRows.built = 0


def _cfg(codec: str, **federation):
    return {"data": {"dataset": "synthetic", "synthetic": {"n_users": 30, "n_items": 40,
                                                           "mean_activity": 8}},
            "train": {"rounds": 2, "local_epochs": 1},
            "federation": {"method": "fedmf", "codec": codec, **federation}}


def test_a_registered_codec_runs_and_is_asked_for_its_capabilities(toys, tmp_path):
    result = fp.run(_cfg("plain"), out=tmp_path / "run", force=True)
    assert result.config.federation.codec == "plain"
    assert result.hr10 is not None and PlainRows.built == 1
    assert codec_kinds.codecs_where("peft", False) == ("full", "plain")
    # held to the rules of a codec that uploads the item table: a server step is fine
    fp.resolve_config(_cfg("plain", server_lr=0.5))
    with pytest.raises(UserError, match="with codec 'small-lora' is not built .* use --codec "
                                        "full or plain"):
        fp.resolve_config(_cfg("small-lora", server_lr=0.5))
    with pytest.raises(UserError, match="it needs --codec hash or c-hash, not 'small-lora'"):
        fp.resolve_config(_cfg("small-lora", hash_senet=4))


def test_codecs_build_by_name_and_refuse_an_unknown_one(toys):
    assert isinstance(codecs.build("small-lora", 40, 8, {}), codecs.PeftCodec)
    assert codecs.build("small-lora", 40, 8, {}).kind == "lora"
    assert not codecs.build("c-lora", 40, 8, {}).with_base
    with pytest.raises(ValueError, match="unknown codec 'nope'"):
        codecs.build("nope", 40, 8, {})
    with pytest.raises(UserError, match="unknown codec 'nope'; available: full, lora"):
        fp.resolve_config(_cfg("nope"))


def test_register_refuses_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        codec_kinds.register("full", f"{__name__}:PlainRows")
