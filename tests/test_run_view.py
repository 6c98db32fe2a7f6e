"""The run's read-only view (simulation.view.RunView) and recording through it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from recorded_runs import small_config

from attacks.observations import load_observations, load_public
from fedem_private.experiments.recording import Recorder, RecordSpec
from fedem_private.experiments.runner import prepare
from fedem_private.simulation.loop import SimState, Simulation
from fedem_private.simulation.view import RunView


@pytest.fixture(scope="module")
def view_sim():  # type: ignore[no-untyped-def]
    return prepare(small_config())


def test_view_fields_cannot_be_assigned(view_sim) -> None:  # type: ignore[no-untyped-def]
    view = view_sim.view
    assert isinstance(view, RunView)
    for name in ("cfg", "split", "dataset_name", "seed", "device", "central", "round"):
        with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
            setattr(view, name, None)


def test_view_demographics_are_read_only(view_sim) -> None:  # type: ignore[no-untyped-def]
    gender = np.zeros(view_sim.split.n_users)
    view = Simulation(view_sim.cfg, view_sim.split, demographics={"g": gender}).view
    with pytest.raises(TypeError):
        view.demographics["g"] = np.ones(3)  # type: ignore[index]
    with pytest.raises(ValueError):
        view.demographics["g"][0] = 1.0
    assert gender.flags.writeable  # the owner's array is untouched


def test_view_holds_no_client_state(view_sim) -> None:  # type: ignore[no-untyped-def]
    """No field of the view is the simulation, its state or its privacy layer."""
    for f in dataclasses.fields(RunView):
        value = getattr(view_sim.view, f.name)
        assert value is not view_sim
        assert not isinstance(value, SimState)
        assert value is not view_sim.privacy


def test_view_follows_the_run(view_sim) -> None:  # type: ignore[no-untyped-def]
    view = view_sim.view
    before = view.round
    view_sim.step()
    assert view.round == before + 1 == view_sim.state.round
    assert view.cfg is view_sim.cfg and view.split is view_sim.split
    assert view.privacy_params() == view_sim.privacy.params.as_log()
    assert view.privacy_summary() == view_sim.privacy.summary()
    np.testing.assert_array_equal(view.participants(1), view_sim.participants(1))


def test_recording_works_through_the_view(tmp_path: Path) -> None:
    sim = prepare(small_config(**{"train.rounds": 2}))
    recorder = Recorder(sim.view, tmp_path, RecordSpec((1, "last"), 5))
    recorder.write_static()
    sim.observe(on_chunk=recorder)
    sim.run()
    public = load_public(tmp_path)
    assert public.n_clients == sim.split.n_users and public.n_items == sim.split.n_items
    rounds = sorted({o.round for o in load_observations(tmp_path)})
    assert rounds == [1, 2]
