"""Adding a part is local (issue 41): a backbone, an aggregator or a merge is one class and one
registry line, and its capabilities are read from the class, never from a list of names; a
part's options are its own dataclass, which refuses a bad value in one line."""

from __future__ import annotations

import pytest

import fedem_private as fp
from fedem_private import models
from fedem_private.client import strategies
from fedem_private.client.merges import AdapterOptions, StaticMerge
from fedem_private.errors import UserError
from fedem_private.models.mf import MFBackbone
from fedem_private.models.options import OPTIONS, FedRAPOptions


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


class QuarterMerge(StaticMerge):
    """A toy merge: every client takes a quarter of the sent table, whatever ``rho`` says."""

    name = "quarter"
    calls = 0

    def weights(self, state, q_local, q_global):
        type(self).calls += 1
        return q_local.new_tensor(0.25)


@pytest.fixture
def quarter(monkeypatch):
    monkeypatch.setitem(strategies.REGISTRY, "quarter", f"{__name__}:QuarterMerge")
    QuarterMerge.calls = 0
    return "quarter"


def test_a_registered_merge_runs_and_is_asked_for_its_capabilities(quarter, tmp_path):
    cfg = {"data": {"dataset": "synthetic", "synthetic": {"n_users": 30, "n_items": 40,
                                                          "mean_activity": 8}},
           "train": {"rounds": 2, "local_epochs": 1},
           "federation": {"method": "fedem", "merge": "quarter"}}
    result = fp.run(cfg, out=tmp_path / "run", force=True)
    assert result.config.federation.resolved_merge == "quarter"
    assert result.hr10 is not None and result.hr10 >= 0
    assert QuarterMerge.calls >= 1  # round 2 merged through the class
    assert "quarter" in strategies.strategies_where("merges")
    assert "quarter" not in strategies.strategies_where("learned")
    with pytest.raises(UserError, match="merge 'quarter' has none; use --merge em or dm"):
        fp.resolve_config({**cfg, "federation": {**cfg["federation"],
                                                 "adapter_objective": "holdout"}})
    with pytest.raises(UserError, match="but merge is 'quarter'; use --merge em"):
        fp.resolve_config({**cfg, "federation": {**cfg["federation"],
                                                 "merge_every_batch": True}})


def test_the_merger_never_names_a_merge():
    """The merge algorithm asks its merge class; no merge's name is compared in client/."""
    import re
    from pathlib import Path

    client = Path(fp.__file__).parent / "client"
    names = "|".join(strategies.REGISTRY)
    pattern = re.compile(rf"""[=!]= *["']({names})["']|in \(["']({names})["']""")
    for path in client.glob("*.py"):
        assert not pattern.search(path.read_text()), path.name


@pytest.mark.parametrize("key, value, options, needle", [
    ("fedrap_mu", -1.0, FedRAPOptions, "federation.fedrap_mu must be a number >= 0, got -1.0"),
    ("adapter_folds", 1, AdapterOptions, "--adapter-folds (federation.adapter_folds) must be"),
])
def test_a_parts_options_refuse_a_bad_value_in_one_line(key, value, options, needle):
    from fedem_private.simulation.sections import FederationConfig

    bad = options.from_config(FederationConfig(**{key: value}))
    with pytest.raises(UserError) as direct:
        bad.check()
    assert needle in str(direct.value) and "\n" not in str(direct.value)
    with pytest.raises(UserError) as via_config:  # the configuration asks the same class
        fp.resolve_config({"federation": {key: value}})
    assert str(via_config.value) == str(direct.value)


def test_every_part_option_is_a_federation_key_with_the_same_default():
    from fedem_private.simulation.sections import FederationConfig

    fed = FederationConfig()
    for options in OPTIONS:
        assert options.from_config(fed) == options()  # the flat keys keep the parts' defaults
