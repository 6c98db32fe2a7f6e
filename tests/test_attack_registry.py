"""The attack registry (docs/design.md, section 15): one place lists an attack, with its
options and capabilities; a new attack is one class and one line, then runs through the
same path as the others (`fedem-private attack`, the api)."""

from __future__ import annotations

import sys
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from recorded_runs import recorded_run

import fedem_private as fp
from attacks import registry
from attacks.base import blank_nonparticipants
from attacks.poplabel import poplabel, popularity_direction
from attacks.registry import Attack, Capabilities
from fedem_private.cli import main
from fedem_private.errors import UserError


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_run(tmp_path_factory.mktemp("reg") / "none", rounds="last", clients=40)


@dataclass(frozen=True)
class ToyOptions:
    """How much of the delta norm the toy keeps."""

    scale: float = 1.0


class ToyAttack(Attack):
    """A toy item attack: the scaled L1 norm of each row of the delta."""

    options = ToyOptions
    capabilities: ClassVar[Capabilities] = Capabilities(kind="item", observes=("uploads",),
                                                        default=False)
    calls: ClassVar[list[float]] = []

    @staticmethod
    def function(obs: Any, public: Any, *, scale: float = 1.0) -> np.ndarray:
        ToyAttack.calls.append(scale)
        return blank_nonparticipants(scale * np.abs(obs.delta()).sum(axis=2), obs)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> type[ToyAttack]:
    ToyAttack.calls.clear()
    monkeypatch.setitem(registry.REGISTRY, "toy", f"{__name__}:ToyAttack")  # the one line
    return ToyAttack


def test_every_attack_has_frozen_options_and_capabilities() -> None:
    for name in registry.names():
        cls = registry.attack_class(name)
        assert cls.capabilities.kind in ("item", "client", "mechanism")
        opts = registry.default_options(name)
        for field in getattr(opts, "__dataclass_fields__", {}):
            with pytest.raises(FrozenInstanceError):
                setattr(opts, field, None)
    assert registry.names_where(kind="mechanism") == ("canary",)
    assert registry.names_where(kind="client") == ("attribute",)
    assert "poplabel" in registry.names_where(kind="item")
    assert "poplabel" not in registry.default_attacks()
    assert set(registry.names_where(device=True)) == {"projection", "imia"}
    with pytest.raises(ValueError, match="unknown attack"):
        registry.attack_class("nope")


def test_options_are_parsed_by_their_declared_types() -> None:
    assert registry.options_with("imia", {"iterations": "2", "scope": "outliers"}) == \
        registry.attack_class("imia").options(iterations=2, scope="outliers")
    assert registry.options_with("canary", {"count": "500"}).count == 500
    with pytest.raises(ValueError, match="no option 'lambda'"):
        registry.options_with("imia", {"lambda": "1"})
    with pytest.raises(ValueError, match="not a int"):
        registry.options_with("imia", {"iterations": "many"})


def test_a_registered_toy_attack_runs_through_the_api_and_the_cli(
        toy: type[ToyAttack], plain_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedem_private.experiments.attack_step import known_attacks

    assert "toy" in known_attacks()
    report = fp.attack(plain_run, ["toy"], options={"toy": {"scale": "2.5"}})
    (rec,) = report["records"]
    assert rec["attack"] == "toy" and toy.calls == [2.5]
    assert rec["relations"]["positive_vs_any"]["auc"] > 0.6  # every positive is a touched row
    assert main(["attack", str(plain_run), "--attacks", "toy", "--quiet",
                 "--attack-option", "toy.scale=3"]) == 0
    assert toy.calls == [2.5, 3.0]
    with pytest.raises(UserError, match="no option"):
        fp.attack(plain_run, ["toy"], options={"toy": {"nope": "1"}})
    with pytest.raises(UserError, match="not run"):
        fp.attack(plain_run, ["support"], options={"toy": {"scale": "1"}})
    capsys.readouterr()


def test_an_unregistered_name_is_refused(plain_run: Path) -> None:
    with pytest.raises(UserError, match="unknown attack 'toy'"):
        fp.attack(plain_run, ["toy"])


def test_listing_the_registry_imports_no_attack_module() -> None:
    import subprocess

    code = ("import sys\nfrom fedem_private.experiments.attack_step import known_attacks\n"
            "print(','.join(known_attacks()), "
            "[m for m in ('torch', 'sklearn', 'attacks.imia') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == [",".join(registry.names()), "[]"]


# --------------------------------------------------------------------------- poplabel

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten noise-free rounds: enough for popularity to shape the sent table (the attack's
    premise; after two or three rounds its direction is still the random initialisation)."""
    return recorded_run(tmp_path_factory.mktemp("reg") / "ten", rounds="last", clients=40,
                        **{"train.rounds": 10, "train.eval_every": 10})


def test_poplabel_beats_random_on_a_noise_free_run_and_is_deterministic(
        trained_run: Path) -> None:
    report = fp.attack(trained_run, ["poplabel"])
    (rec,) = report["records"]
    sampled = rec["relations"]["positive_vs_sampled"]
    anyrel = rec["relations"]["positive_vs_any"]
    assert sampled["auc"] > 0.7 and anyrel["auc"] > 0.7
    assert sampled["f1@20%"] > sampled["f1@20%_random_baseline"]
    again = fp.attack(trained_run, ["poplabel"])["records"][0]
    assert again["relations"] == rec["relations"]


def test_the_popularity_direction_points_to_the_long_tail() -> None:
    rng = np.random.default_rng(0)
    v = np.array([0.6, 0.8, 0.0])
    pop = rng.pareto(1.5, size=400)  # few items are popular
    sent = pop[:, None] * v[None, :] + 0.01 * rng.normal(size=(400, 3))
    for sign in (1.0, -1.0):  # whichever way the table's axis points
        got = popularity_direction(sign * sent[None])[0]
        assert np.allclose(got, sign * v, atol=1e-3)


def test_poplabel_scores_moves_along_the_direction_and_the_prior() -> None:
    from attacks.observations import Observation, PublicKnowledge

    rng = np.random.default_rng(1)
    pop = rng.pareto(1.5, size=50)
    sent = np.zeros((1, 50, 2), dtype=np.float32)
    sent[0, :, 0] = pop
    sent[0, :, 1] = 0.01 * rng.normal(size=50)
    upload = sent.copy()
    upload[0, 7, 0] += 1.0  # a positive: moved along +v
    upload[0, 9, 0] -= 1.0  # a negative: moved along -v
    obs = Observation(3, np.array([0]), sent, upload, np.array([True]))
    public = PublicKnowledge(1, 50, 2, 0.1, 1, 8, 4, "fedmf")
    move_only = poplabel(obs, public, prior_weight=0.0)[0]
    assert move_only.argmax() == 7 and move_only.argmin() == 9
    both = poplabel(obs, public)[0]
    order = np.argsort(-both)
    assert order[0] == 7 or pop[order[0]] > pop[7]  # only the prior can outrank the move
    with pytest.raises(ValueError):
        poplabel(obs, public, prior_weight=-1.0)


def test_submodule_names_are_modules_in_any_import_order() -> None:
    """``attacks.imia`` is the module, before and after the registry loads it (a lazy
    function of the same name would change meaning once the submodule was imported)."""
    import types

    import attacks
    import attacks.registry as reg
    first = attacks.imia
    reg.attack_class("imia")
    assert isinstance(first, types.ModuleType) and attacks.imia is first
    assert callable(first.imia)
