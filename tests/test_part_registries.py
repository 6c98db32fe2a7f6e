"""Adding a part is local (issue 41): a backbone is one class and one registry line, and its
capabilities are read from the class, never from a list of names."""

from __future__ import annotations

import pytest

import fedem_private as fp
from fedem_private import models
from fedem_private.errors import UserError
from fedem_private.models.mf import MFBackbone


class ToyBackbone(MFBackbone):
    """MF under another name, without early stopping or per-example gradients."""

    name = "toy"
    early_stop = False
    per_example_grads = False


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "toy", f"{__name__}:ToyBackbone")
    return "toy"


def _cfg(**over):
    base = {"data": {"dataset": "synthetic", "synthetic": {"n_users": 30, "n_items": 40,
                                                           "mean_activity": 8}},
            "train": {"rounds": 2, "local_epochs": 1},
            "federation": {"method": "fedmf", "backbone": "toy"}}
    for dotted, value in over.items():
        section, key = dotted.split(".")
        base.setdefault(section, {})[key] = value
    return base


def test_a_registered_backbone_runs_and_its_capabilities_come_from_its_class(toy, tmp_path):
    result = fp.run(_cfg(), out=tmp_path / "run", force=True)
    assert result.config.federation.resolved_backbone == "toy"
    assert result.hr10 is not None and result.hr10 >= 0
    assert models.backbones_where("early_stop") == ("mf",)
    assert "toy" in models.backbones_where("trains_item_rows")
    with pytest.raises(UserError, match="--early-stop-tol is built for backbone mf, not 'toy'"):
        fp.resolve_config(_cfg(**{"train.early_stop_tol": 1e-4}))
    with pytest.raises(UserError, match="built for backbone mf, pfedrec .* not 'toy'"):
        fp.resolve_config(_cfg(**{"privacy.mode": "ldp-dpsgd", "privacy.epsilon": 4.0}))


def test_an_unregistered_backbone_is_one_clear_error():
    with pytest.raises(UserError, match="unknown backbone 'toy'"):
        fp.resolve_config(_cfg())


def test_a_run_checks_its_configuration_once_where_it_is_built(monkeypatch, tmp_path):
    """The API checks the input and its resolution; the runner and the simulation take the
    resolved config as it is; a copy changed by dataclasses.replace is checked again."""
    import dataclasses

    from fedem_private.simulation import config as c

    calls = []
    real = c.TrainConfig.validate
    monkeypatch.setattr(c.TrainConfig, "validate",
                        lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1])
    raw = {"data": {"dataset": "synthetic", "synthetic": {"n_users": 30, "n_items": 40,
                                                          "mean_activity": 8}},
           "train": {"rounds": 1, "local_epochs": 1}}
    cfg = fp.resolve_config(raw)
    assert len(calls) == 2  # the input, then the resolved preset
    fp.run(cfg, out=tmp_path / "run", force=True)
    assert len(calls) == 2  # nothing downstream checks again
    changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, rounds=-1))
    with pytest.raises(UserError, match="rounds"):
        changed.validate()


class ToyAggregator:
    """Filled in by the fixture below (the server module loads torch)."""


def _toy_aggregator_class():
    from fedem_private.server.aggregators import UniformAggregator

    class Toy(UniformAggregator):
        """The uniform mean, counting the uploads it takes."""

        name = "toy-mean"
        uploads_taken = 0

        def add(self, idx, uploads):
            type(self).uploads_taken += int(idx.shape[0])
            super().add(idx, uploads)

    return Toy


@pytest.fixture
def toy_aggregator(monkeypatch):
    import sys

    from fedem_private.server import registry

    cls = _toy_aggregator_class()
    monkeypatch.setattr(sys.modules[__name__], "ToyAggregator", cls)
    monkeypatch.setitem(registry.REGISTRY, "toy-mean", f"{__name__}:ToyAggregator")
    return cls


def test_a_registered_aggregator_runs_and_is_asked_for_its_capabilities(toy_aggregator,
                                                                        tmp_path):
    cfg = {"data": {"dataset": "synthetic", "synthetic": {"n_users": 30, "n_items": 40,
                                                          "mean_activity": 8}},
           "train": {"rounds": 2, "local_epochs": 1},
           "federation": {"method": "fedmf", "aggregation": "toy-mean"}}
    result = fp.run(cfg, out=tmp_path / "run", force=True)
    assert result.config.federation.resolved_aggregation == "toy-mean"
    assert toy_aggregator.uploads_taken == 2 * 30  # every client, both rounds
    from fedem_private.server.registry import aggregators_where

    assert "toy-mean" in aggregators_where("one_table")  # inherited from the sums
    assert "toy-mean" not in aggregators_where("needs_each_upload")
    # a central mechanism takes it (it can adopt the aggregate), as it does uniform
    fp.resolve_config({**cfg, "privacy": {"mode": "cdp-gaussian", "epsilon": 4.0}})
