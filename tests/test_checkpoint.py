"""Checkpoints: a run killed part way resumes from its last checkpoint and ends with the
numbers of a run that never stopped (fedem_private/experiments/checkpoint.py)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import Killed

from fedem_private.errors import UserError
from fedem_private.experiments import checkpoint as checkpoints
from fedem_private.experiments.checkpoint import Checkpointing
from fedem_private.experiments.runner import execute
from fedem_private.simulation.config import from_dict, with_overrides
from fedem_private.simulation.loop import Simulation

BASE = {"data": {"dataset": "synthetic",
                 "synthetic": {"n_users": 30, "n_items": 40, "mean_activity": 8}},
        "train": {"rounds": 5, "eval_every": 1, "local_epochs": 1, "dim": 8}}

# the parts that keep state between rounds: merge adapters, similarity weights, narrow
# state, server momentum, a central and a local mechanism's accounting, a FedPEFT codec
CASES = {
    "fedem-dm-similarity-bf16": {"federation.method": "fedem", "federation.merge": "dm",
                                 "federation.aggregation": "similarity",
                                 "train.state_dtype": "bfloat16"},
    "fedem-sm-momentum": {"federation.method": "fedem", "federation.merge": "sm",
                          "federation.aggregation": "fedavg",
                          "federation.server_momentum": 0.9},
    "fedmf-cdp": {"federation.method": "fedmf", "privacy.mode": "cdp-gaussian",
                  "privacy.epsilon": 4.0},
    "fedmf-ldp-dpsgd": {"federation.method": "fedmf", "privacy.mode": "ldp-dpsgd",
                        "privacy.epsilon": 4.0},
    # the clip from a DP warm-up (spent once, in the first process, not again on resuming)
    "fedmf-ldp-laplace-clip-auto": {"federation.method": "fedmf",
                                    "privacy.mode": "ldp-laplace", "privacy.epsilon": 8.0,
                                    "privacy.clip": None, "privacy.clip_auto": True},
    # Poisson sampling and adaptive clipping: the clip moves every round
    "fedmf-cdp-sampled-adaptive": {"federation.method": "fedmf",
                                   "privacy.mode": "cdp-gaussian", "privacy.epsilon": 4.0,
                                   "privacy.sample_rate": 0.5, "privacy.clip_quantile": 0.5,
                                   "privacy.clip_count_noise": 2.0},
    "fedmf-peft-c-lora": {"federation.method": "fedmf", "federation.codec": "c-lora",
                     "federation.peft_warmup": 2},
}


def _cfg(over):
    return with_overrides(from_dict(BASE), over).validate().resolved()


def _rows(run):
    with (run / "metrics.csv").open() as fh:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(fh)]


def _kill_after(round_):
    def on_round(stats):
        if stats.round == round_:
            raise Killed
    return on_round


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_killed_run_resumes_with_the_numbers_of_one_that_never_stopped(tmp_path, case):
    cfg = _cfg(CASES[case])
    straight = execute(cfg, tmp_path / "straight")
    ck = Checkpointing(tmp_path / "run.checkpoint", every=2)
    with pytest.raises(Killed):  # killed after round 3: the checkpoint of round 2 is kept
        execute(cfg, tmp_path / "resumed", checkpoint=ck, on_round=_kill_after(3))
    assert ck.path.exists() and not (tmp_path / "resumed").exists()
    seen = []
    resumed = execute(cfg, tmp_path / "resumed", checkpoint=ck,
                      on_round=lambda stats: seen.append(stats.round))
    assert seen == [3, 4, 5]  # rounds 1 and 2 came from the checkpoint
    assert _rows(tmp_path / "resumed") == _rows(tmp_path / "straight")
    assert resumed["metrics"] == straight["metrics"]
    assert resumed["privacy"] == straight["privacy"]
    assert resumed.get("selected") == straight.get("selected")
    assert resumed["checkpoint"] == {"resumed_at": [2], "code_changed": False}
    assert "checkpoint" not in straight
    assert not ck.path.exists()  # removed once the run directory is written
    ledger = json.loads((tmp_path / "resumed" / "privacy_ledger.json").read_text())
    assert ledger == json.loads((tmp_path / "straight" / "privacy_ledger.json").read_text())


def test_the_state_read_back_is_the_state_saved(tmp_path):
    """Every tensor of the simulation survives the round trip bit for bit, and the copy
    gets a fresh view and no observers."""
    from fedem_private.experiments.runner import prepare

    sim = prepare(_cfg(CASES["fedem-dm-similarity-bf16"]))
    sim.observe(on_chunk=lambda view: None)
    sim.step()
    ck = Checkpointing(tmp_path / "c", every=1)
    checkpoints.save(ck, "cfg", sim, [], 1.5, [])
    back = checkpoints.load(ck, "cfg")
    assert back is not None and back.round == 1 and back.seconds == 1.5
    assert isinstance(back.sim, Simulation) and back.sim.observers == []
    assert back.sim.view.round == 1
    assert torch.equal(back.sim.state.q_local, sim.state.q_local)
    assert back.sim.state.q_local.dtype == torch.bfloat16
    assert torch.equal(back.sim.aggregator.table, sim.aggregator.table)


def test_a_checkpoint_leaves_the_data_out_and_checks_it_when_read_back(tmp_path):
    """The split and its exclusion CSR are not in the file (the config reads them again);
    the resumed simulation takes only the split it was saved with (its digest)."""
    import dataclasses
    import pickle

    from fedem_private.experiments.runner import prepare

    sim = prepare(_cfg({"federation.method": "fedmf"}))
    sim.step()
    blob = pickle.dumps(sim)
    state = sim.__getstate__()
    assert "split" not in state and "excl" not in state
    assert len(blob) < len(pickle.dumps(dict(state, split=sim.split, excl=sim.excl)))
    back = pickle.loads(blob)
    assert back.split is None and back.excl is None
    other = dataclasses.replace(sim.split, test_items=(sim.split.test_items + 1)
                                % sim.split.n_items)
    with pytest.raises(UserError, match="other data"):
        back.attach_split(other)
    back.attach_split(sim.split)
    assert all(np.array_equal(a, b) for a, b in zip(back.excl, sim.excl, strict=True))
    assert back.view.split is sim.split
    back.step()
    sim.step()
    assert torch.equal(back.state.q_global, sim.state.q_global)
    older = Simulation.__new__(Simulation)  # a checkpoint that still held its split
    older.__setstate__(dict(state, split=sim.split, excl=sim.excl, _split_digest=None))
    older.attach_split(sim.split)
    assert older.split is sim.split


def test_a_checkpoint_of_another_config_or_a_broken_file_is_refused(tmp_path):
    cfg = _cfg({"federation.method": "fedmf"})
    ck = Checkpointing(tmp_path / "run.checkpoint", every=1)
    with pytest.raises(Killed):
        execute(cfg, tmp_path / "a", checkpoint=ck, on_round=_kill_after(2))
    other = _cfg({"federation.method": "fedmf", "train.lr": 0.5})
    with pytest.raises(UserError, match="another configuration"):
        execute(other, tmp_path / "b", checkpoint=ck)
    fresh = execute(other, tmp_path / "b", checkpoint=ck, force=True)  # in the way: removed
    assert "checkpoint" not in fresh and not ck.path.exists()
    ck.path.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        execute(cfg, tmp_path / "c", checkpoint=ck)
    with pytest.raises(UserError, match="positive number of rounds"):
        Checkpointing(tmp_path / "d", every=0)


def test_a_resumption_after_the_code_changed_is_said_in_the_summary(tmp_path, monkeypatch):
    cfg = _cfg({"federation.method": "fedmf"})
    ck = Checkpointing(tmp_path / "run.checkpoint", every=1)
    with pytest.raises(Killed):
        execute(cfg, tmp_path / "run", checkpoint=ck, on_round=_kill_after(2))
    monkeypatch.setattr(checkpoints, "source_fingerprint", lambda: "edited")
    summary = execute(cfg, tmp_path / "run", checkpoint=ck)
    # killed in round 2's on_round, before its checkpoint: round 1's is the last
    assert summary["checkpoint"] == {"resumed_at": [1], "code_changed": True}


def test_run_command_checkpoints_and_resumes(tmp_path, capsys, kill_after):
    from fedem_private import api
    from fedem_private.cli import main

    out = tmp_path / "run"
    args = ["run", "--dataset", "synthetic", "--method", "fedmf", "--rounds", "3",
            "--no-progress", "--out", str(out)]
    kill_after(2)
    with pytest.raises(Killed):
        main([*args, "--checkpoint-every", "1"])
    assert api.checkpoint_path(out).exists()
    kill_after(None)
    capsys.readouterr()
    assert main([*args, "--checkpoint-every", "1"]) == 0
    assert "resumed from the checkpoint after round 1\n" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"]["resumed_at"] == [1]
    assert not api.checkpoint_path(out).exists()
    capsys.readouterr()
    assert main(args[:-2] + ["--checkpoint-every", "1"]) == 2
    assert "needs --out" in capsys.readouterr().err
    assert main([*args[:-1], str(tmp_path / "rec"), "--checkpoint-every", "1",
                 "--record-rounds", "last"]) == 2
    assert "--record-rounds" in capsys.readouterr().err


def test_a_setup_may_write_files_on_resumption_but_not_attach_observers(tmp_path):
    """A sweep's setup writes its point file into each run directory, resumed or not; a
    recording setup (observers) would miss the rounds before the checkpoint: refused."""
    cfg = _cfg({"federation.method": "fedmf"})
    ck = Checkpointing(tmp_path / "run.checkpoint", every=1)
    with pytest.raises(Killed):
        execute(cfg, tmp_path / "run", checkpoint=ck, on_round=_kill_after(2))

    def records(sim, path):
        sim.observe(on_chunk=lambda view: None)

    with pytest.raises(UserError, match="cannot record"):
        execute(cfg, tmp_path / "run", checkpoint=ck, setup=records)
    assert ck.path.exists()  # refused before any round: the checkpoint is kept

    def writes(sim, path):
        (path / "point.json").write_text("{}")

    summary = execute(cfg, tmp_path / "run", checkpoint=ck, setup=writes)
    assert summary["checkpoint"]["resumed_at"] == [1]
    assert (tmp_path / "run" / "point.json").is_file()


def test_a_diverged_run_removes_its_checkpoint(tmp_path, monkeypatch):
    """Resuming a run that diverged would diverge again: its checkpoint goes with it."""
    from fedem_private.errors import Diverged

    real_step = Simulation.step

    def step_then_diverge(self):
        stats = real_step(self)
        if stats.round == 3:
            raise Diverged("non-finite value")
        return stats

    monkeypatch.setattr(Simulation, "step", step_then_diverge)
    ck = Checkpointing(tmp_path / "run.checkpoint", every=1)
    with pytest.raises(Diverged):
        execute(_cfg({"federation.method": "fedmf"}), tmp_path / "run", checkpoint=ck)
    assert not ck.path.exists()
