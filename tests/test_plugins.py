"""Parts from other packages (docs/design.md section 15, "Plugins"; issue 67, item 5).

The example plugin (``examples/plugin``: the mechanism ``ldp-gaussian-boxed`` and the
attack ``rownorm``) is pip-installed into a temporary folder, never into the venv, which is
put on ``sys.path`` for this module only; it then shows up in ``fedem-private list``, runs
from the command line, in a sweep and through the attack step, and passes the
neighbour-world harness. Fake distributions (a ``.dist-info`` folder with
``entry_points.txt``) check the other groups and that a broken plugin is one line, exit 2.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import fedem_private as fp
from attacks import registry as attack_registry
from fedem_private import models, plugins
from fedem_private.cli import main
from fedem_private.client import codec_kinds, strategies
from fedem_private.errors import UserError
from fedem_private.experiments import neighbours as nb
from fedem_private.experiments.sweep_spec import grid, load_spec
from fedem_private.privacy import registry
from fedem_private.server import registry as aggregators

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin"
MECH, ATTACK = "ldp-gaussian-boxed", "rownorm"
SMALL_DATA = """
[data]
dataset = "synthetic"
[data.synthetic]
n_users = 60
n_items = 80
mean_activity = 10
"""
TINY = ["--rounds", "2", "--dim", "4", "--local-epochs", "1"]


def _forget_modules(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example plugin pip-installed (no deps, no index) into a temporary target folder,
    on sys.path until the module's tests end; the registries are restored afterwards."""
    pytest.importorskip("setuptools", reason="building the example plugin needs setuptools")
    source = tmp_path_factory.mktemp("source") / "plugin"  # pip writes build files beside it
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--no-build-isolation", "--quiet", "--target", str(target),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    plugins.forget()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        registry.unregister(MECH)
        attack_registry.REGISTRY.pop(ATTACK, None)
        _forget_modules("fedem_plugin_example")
        plugins.forget()


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_example_plugin_is_listed_runs_and_is_attacked_from_the_command_line(
        installed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert ["privacy", MECH] in rows and ["attack", ATTACK] in rows
    boxed, gauss, plain = tmp_path / "boxed", tmp_path / "gauss", tmp_path / "plain"
    (tmp_path / "small.toml").write_text(SMALL_DATA)
    tiny = ["--config", str(tmp_path / "small.toml"), *TINY]
    noise = ["--clip", "0.5", "--noise-multiplier", "1"]
    assert main(["run", *tiny, "--privacy", MECH, *noise, "--record-rounds", "last",
                 "--out", str(boxed)]) == 0
    assert main(["run", *tiny, "--privacy", "ldp-gaussian", *noise, "--out", str(gauss)]) == 0
    assert main(["run", *tiny, "--record-rounds", "last", "--out", str(plain)]) == 0
    mine, theirs = _summary(boxed)["privacy"], _summary(gauss)["privacy"]
    assert mine["mode"] == MECH and mine["guarantee"]
    assert "clamps" in mine["trust_model"]  # its own self-description is what is printed
    # post-processing of the same Gaussian mechanism: the same accounting as ldp-gaussian
    assert mine["epsilon"] == theirs["epsilon"] and mine["epsilon_round"] > 0
    for run_dir in (boxed, plain):
        assert main(["attack", str(run_dir), "--attacks", ATTACK, "--quiet",
                     "--attack-option", f"{ATTACK}.p=2"]) == 0
    noisy, exact = (json.loads((d / "attacks.json").read_text())["records"][0]
                    for d in (boxed, plain))
    assert noisy["attack"] == exact["attack"] == ATTACK
    assert noisy["eps_accounted"] == pytest.approx(mine["epsilon_round"])
    # without noise the trained rows are the ones that move; under the mechanism they are not
    # (positive_vs_any: the sampled negatives move too, so even noise-free it is not 1)
    assert exact["relations"]["positive_vs_any"]["auc"] > 0.75
    assert noisy["relations"]["positive_vs_any"]["auc"] < 0.6
    assert main(["run", *tiny, "--privacy", MECH, "--clip", "0.5", "--epsilon", "2"]) == 2
    assert "takes its noise as privacy.noise_multiplier" in capsys.readouterr().err


def test_the_example_mechanism_runs_in_a_sweep(installed: Path, tmp_path: Path) -> None:
    spec = tmp_path / "sweep.toml"
    spec.write_text(f"""
[base.data]
dataset = "synthetic"
[base.data.synthetic]
n_users = 40
n_items = 60
mean_activity = 8
[base.train]
rounds = 1
dim = 4
local_epochs = 1
[base.privacy]
mode = "{MECH}"
clip = 0.5
noise_multiplier = 2.0
[sweep]
privacy = ["none", "{MECH}"]
""")
    table = fp.sweep(spec, out=tmp_path / "out", jobs=1)
    assert sorted(table["mode"]) == sorted(["none", MECH])
    row = table[table["mode"] == MECH].iloc[0]
    assert f"{MECH}-z2" in row["run"] and bool(row["guarantee"])
    assert 0 < row["eps_reported"] < float("inf")


def test_the_example_mechanism_passes_the_neighbour_world_harness(installed: Path) -> None:
    cfg = nb.make_config(MECH, settings={"clip": 0.05, "noise_multiplier": 1.0})
    found = nb.run_pair(cfg)
    assert found.sound, found.violations
    assert 0 < found.target_gap <= 1  # clipping binds, and the claimed 2C holds


def test_the_box_is_post_processing_nearer_the_clipped_delta(installed: Path) -> None:
    """Under the same keyed noise the boxed release equals ldp-gaussian's wherever that one
    lies in [-C, C] and is nearer the clipped delta everywhere else."""
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.mechanisms import clipped_delta, release_ldp_gaussian

    cfg = PrivacyConfig(mode=MECH, clip=0.5, noise_multiplier=2.0)
    params = cfg.mechanism.calibrate(cfg, rounds=3)
    gen = torch.Generator().manual_seed(0)
    sent, local = torch.randn(4, 30, 3, generator=gen), torch.randn(4, 30, 3, generator=gen)
    clients = np.arange(4)
    boxed, stats = cfg.mechanism.release(params, sent, local, seed=1, round_=2, clients=clients)
    plain, _ = release_ldp_gaussian(params, sent, local, seed=1, round_=2, clients=clients)
    target = clipped_delta(params, sent, local)[0].float()
    db, dp = boxed - sent, plain - sent
    assert float(db.abs().max()) <= 0.5 + 1e-6 and stats.noise_scale == pytest.approx(2.0)
    inside = dp.abs() <= 0.5
    assert 0 < int(inside.sum()) < inside.numel()
    assert torch.allclose(db[inside], dp[inside], atol=1e-6)
    assert bool(((db - target).abs() <= (dp - target).abs() + 1e-6).all())


# ------------------------------------------------------------ fake distributions
def _fake_dist(root: Path, name: str, entry_points: str, modules: dict[str, str]) -> Path:
    """A distribution ``name`` in ``root`` (metadata and modules only, as pip leaves one)."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)
    return root


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake distributions go on sys.path through monkeypatch; what they load is forgotten
    and what they register removed after the test."""
    registries = (models.REGISTRY, strategies.REGISTRY, aggregators.REGISTRY,
                  codec_kinds.REGISTRY)
    saved = [dict(r) for r in registries]
    plugins.forget()
    yield
    for reg, old in zip(registries, saved, strict=True):
        reg.clear()
        reg.update(old)
    _forget_modules("fake_parts")
    plugins.forget()


def test_a_broken_plugin_is_one_line_naming_it_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_path: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    _fake_dist(tmp_path, "broken_plugin", "[fedem_private.mechanisms]\n"
               "boom = fake_parts_boom:register\n"
               "[fedem_private.attacks]\nnotfn = fake_parts_value:VALUE\n",
               {"fake_parts_boom": "raise RuntimeError('boom at import')\n",
                "fake_parts_value": "VALUE = 3\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "plugin 'boom'" in err and "broken_plugin 0.1" in err
    assert "RuntimeError: boom at import" in err
    with pytest.raises(plugins.PluginError, match="plugin 'boom'"):  # again, not silently gone
        registry.names()
    with pytest.raises(plugins.PluginError, match="plugin 'boom'"):
        fp.resolve_config({"train": {"rounds": 1}})
    with pytest.raises(plugins.PluginError, match="plugin 'notfn'.*not a function"):
        attack_registry.names()


def test_backbones_merges_and_aggregators_register_from_entry_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_path: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = ("from fedem_private import models\n"
            "from fedem_private.client import strategies\n"
            "from fedem_private.server import registry\n"
            "from fedem_private.client import codec_kinds\n"
            "def codec():\n"
            "    codec_kinds.register('lora-again', 'fedem_private.client.codec_kinds:Lora')\n"
            "def backbone():\n"
            "    models.register('mf-again', 'fedem_private.models.mf:MFBackbone')\n"
            "def merge():\n"
            "    strategies.register('sm-again', 'fedem_private.client.merges:StaticMerge')\n"
            "def aggregator():\n"
            "    registry.register('uniform-again',\n"
            "                      'fedem_private.server.aggregators:UniformAggregator')\n")
    _fake_dist(tmp_path, "more_parts", "[fedem_private.backbones]\n"
               "mf-again = fake_parts_more:backbone\n"
               "[fedem_private.merges]\nsm-again = fake_parts_more:merge\n"
               "[fedem_private.aggregators]\nuniform-again = fake_parts_more:aggregator\n"
               "[fedem_private.codecs]\nlora-again = fake_parts_more:codec\n",
               {"fake_parts_more": text})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["list"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    for row in (["backbone", "mf-again"], ["merge", "sm-again"],
                ["aggregation", "uniform-again"], ["codec", "lora-again"]):
        assert row in rows
    cfg = fp.resolve_config({"federation": {"method": "fedmf", "backbone": "mf-again",
                                            "merge": "sm-again",
                                            "aggregation": "uniform-again"}})
    assert (cfg.federation.backbone, cfg.federation.merge) == ("mf-again", "sm-again")
    lora = fp.resolve_config({"federation": {"method": "pfedrec", "codec": "lora-again"}})
    assert lora.federation.codec == "lora-again"  # a PEFT codec by its class, not its name
    assert aggregators.aggregator_class("uniform-again").__name__ == "UniformAggregator"
    spec = tmp_path / "sweep.toml"  # a sweep names them too (its grid checked, not run)
    spec.write_text('[sweep]\nmethods = ["fedmf"]\nmerges = ["sm-again"]\n'
                    'aggregations = ["uniform-again", "fedavg"]\n')
    points = grid(load_spec(spec))
    assert {(p.config.federation.merge, p.config.federation.aggregation) for p in points} \
        == {("sm-again", "uniform-again"), ("sm-again", "fedavg")}
    with pytest.raises(ValueError, match="already registered"):
        models.register("mf-again", "fedem_private.models.ncf:NCFBackbone")
    with pytest.raises(UserError, match="'mf-again' has no preset method"):  # one line
        fp.resolve_config({"federation": {"backbone": "mf-again"}})
