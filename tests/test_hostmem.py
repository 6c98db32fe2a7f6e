"""The host allocator's tuning (fedem_private.hostmem): freed large blocks are reused while
a round runs, glibc's defaults are back outside it, and nothing a run computes changes.
The checks on real allocations run in a fresh interpreter, so the state of this test
process does not matter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedem_private import hostmem

glibc = pytest.mark.skipif(
    not hostmem.is_glibc(), reason="the tuning is glibc's mallopt; elsewhere it does nothing")

# a round-like pattern: three 72 MiB tables (one chunk of 64 clients x 17,632 items x d 16,
# LastFM-2K's size) and three results computed from them are alive at once, then freed;
# minor page faults per cycle. First three cycles after a context was entered and left
# (glibc's defaults must be back: each cycle's tables mapped and faulted in afresh), then
# ten cycles inside one. The heap settles after a few cycles inside (small allocations can
# split a freed block, so the first cycles still grow it; how many varies from run to run);
# glibc's default faults every cycle's tables in again.
_FAULTS = """
import resource, torch
from fedem_private.hostmem import keep_freed_memory
def cycle():
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tables = [torch.empty(64, 17632 * 16) for _ in range(3)]
    for t in tables:
        t.fill_(1.0)
    results = [t * 2.0 for t in tables]
    del tables, results
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
with keep_freed_memory():
    pass
after = [cycle() for _ in range(3)]
with keep_freed_memory() as tuned:
    inside = [cycle() for _ in range(10)]
print(tuned, *after, *inside)
"""

# two FedEM rounds with chunk tables past glibc's mmap threshold: the synthetic generator
# keeps the 773 items that drew an interaction, so the width comes from d = 256
# (64 clients x 773 items x 256 x 4 bytes = 48 MiB): a digest of the state
_RUN = """
import hashlib
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.experiments.runner import prepare
from fedem_private import hostmem
cfg = with_overrides(RunConfig(), {
    "data.dataset": "synthetic", "data.synthetic.n_users": 130,
    "data.synthetic.n_items": 20000, "data.synthetic.mean_activity": 12.0,
    "federation.method": "fedem", "train.rounds": 2, "train.local_epochs": 1,
    "train.dim": 256, "train.eval_every": 2})
sim = prepare(cfg)
sim.run()
h = hashlib.sha256()
for t in (sim.state.q_local, sim.state.p, sim.aggregator.table):
    h.update(t.contiguous().numpy().tobytes())
print(sim.host_allocator_tuned, hostmem.in_force(), h.hexdigest())
"""


def _python(code: str, malloc: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != hostmem.ENV}
    env["OMP_NUM_THREADS"] = "1"
    if malloc is not None:
        env[hostmem.ENV] = malloc
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    return out.stdout.split()


@glibc
def test_freed_large_tables_are_reused_inside_and_mapped_apart_once_left():
    tuned, *faults = _python(_FAULTS, None)
    system, *faults_system = _python(_FAULTS, "system")
    assert (tuned, system) == ("True", "False")
    after, inside = [int(f) for f in faults[:3]], [int(f) for f in faults[3:]]
    inside_system = [int(f) for f in faults_system[3:]]
    pages = 6 * 64 * 17632 * 16 * 4 // 4096  # a cycle's six tables, in 4 KiB pages
    # the default: every cycle's tables are fresh mappings, faulted in again
    assert all(f > 0.9 * pages for f in inside_system[-3:])
    # tuned: after the heap has grown for a few cycles, freed tables' pages serve the next
    # ones (how soon varies from run to run, so the check is on the ten cycles' total)
    assert sum(inside) < 0.5 * sum(inside_system)
    # a context left: large blocks are mapped apart again, each cycle faulted in afresh
    assert all(f > 0.9 * pages for f in after)


@glibc
def test_the_tuning_changes_no_result_and_ends_with_the_round():
    tuned, in_force, digest = _python(_RUN, None)
    system, _, digest_system = _python(_RUN, "system")
    assert (tuned, system) == ("True", "False")
    assert in_force == "False"  # between rounds glibc's defaults are back
    assert digest == digest_system


class _Mallopt:
    """Records mallopt's calls (parameter, value) and accepts them all."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


@pytest.fixture
def fake_glibc(monkeypatch):
    rec = _Mallopt()
    monkeypatch.delenv(hostmem.ENV, raising=False)
    monkeypatch.setattr(hostmem, "is_glibc", lambda: True)
    monkeypatch.setattr(hostmem, "_mallopt", rec)
    return rec


def test_only_the_outermost_context_sets_and_restores(fake_glibc):
    tuned = [(hostmem._M_TRIM_THRESHOLD, hostmem._TRIM_NEVER), (hostmem._M_MMAP_MAX, 0)]
    restored = [(hostmem._M_MMAP_MAX, 65536), (hostmem._M_TRIM_THRESHOLD, 128 * 1024)]
    with hostmem.keep_freed_memory() as outer:
        assert outer and hostmem.in_force()
        with hostmem.keep_freed_memory() as inner:
            assert inner
        assert fake_glibc.calls == tuned  # the inner context changed nothing
        assert hostmem.in_force()
    assert fake_glibc.calls == tuned + restored
    assert not hostmem.in_force()


def test_settings_are_restored_when_the_round_raises(fake_glibc):
    with pytest.raises(RuntimeError), hostmem.keep_freed_memory():
        raise RuntimeError("a round failed")
    assert fake_glibc.calls[-2:] == [(hostmem._M_MMAP_MAX, 65536),
                                     (hostmem._M_TRIM_THRESHOLD, 128 * 1024)]
    assert not hostmem.in_force() and hostmem._depth == 0


def test_a_refused_setting_is_undone(fake_glibc, monkeypatch):
    def refuse_mmap(param: int, value: int) -> int:
        fake_glibc.calls.append((param, value))
        return 0 if (param, value) == (hostmem._M_MMAP_MAX, 0) else 1

    monkeypatch.setattr(hostmem, "_mallopt", refuse_mmap)
    with hostmem.keep_freed_memory() as tuned:
        assert tuned is False
        assert fake_glibc.calls[-2:] == [(hostmem._M_MMAP_MAX, 65536),
                                         (hostmem._M_TRIM_THRESHOLD, 128 * 1024)]


def test_elsewhere_than_glibc_it_does_nothing(monkeypatch):
    monkeypatch.setattr(hostmem.platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(hostmem, "_mallopt", None)
    monkeypatch.setattr(hostmem.ctypes, "CDLL", lambda *a, **k: pytest.fail("mallopt called"))
    with hostmem.keep_freed_memory() as tuned:
        assert tuned is False


def test_the_opt_out_is_read_at_each_entry(fake_glibc, monkeypatch):
    monkeypatch.setenv(hostmem.ENV, "System")
    with hostmem.keep_freed_memory() as tuned:
        assert tuned is False
    assert fake_glibc.calls == []
    monkeypatch.delenv(hostmem.ENV)
    with hostmem.keep_freed_memory() as tuned:
        assert tuned is True


def test_a_finished_run_frees_its_simulation_at_once(tmp_path):
    """A run's Simulation sits in reference cycles (its privacy layer and view hold it);
    ``execute`` frees it before it returns, so a process that runs trial after trial
    (a tune worker, the ladder) does not keep every finished run's tables. The
    collector is off here: nothing but ``execute`` itself may free the cycle."""
    import gc
    import weakref

    from fedem_private.experiments.runner import execute
    from fedem_private.simulation.config import RunConfig, with_overrides

    cfg = with_overrides(RunConfig(), {"train.rounds": 2, "train.eval_every": 2,
                                       "privacy.mode": "cdp-gaussian", "privacy.epsilon": 4.0,
                                       "privacy.sample_rate": 0.5, "privacy.clip": 1.0})
    seen: list[weakref.ref] = []
    was_on = gc.isenabled()
    gc.disable()
    try:
        execute(cfg.validate().resolved(), tmp_path / "run",
                on_start=lambda sim: seen.append(weakref.ref(sim)))
        assert len(seen) == 1 and seen[0]() is None
    finally:
        if was_on:
            gc.enable()


def test_release_between_runs_collects_cycles_and_trims_only_on_glibc(monkeypatch):
    import gc

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    trims: list[int] = []

    def trim(pad: int) -> int:  # stands in for the C function
        trims.append(pad)
        return 1

    monkeypatch.setattr(hostmem, "_malloc_trim", trim)
    monkeypatch.delenv(hostmem.ENV, raising=False)
    monkeypatch.setattr(hostmem, "is_glibc", lambda: True)
    was_on = gc.isenabled()
    gc.disable()
    try:
        Cycle()
        assert hostmem.release_between_runs() >= 1
    finally:
        if was_on:
            gc.enable()
    assert trims == [0]
    monkeypatch.setenv(hostmem.ENV, "system")
    hostmem.release_between_runs()
    monkeypatch.delenv(hostmem.ENV)
    monkeypatch.setattr(hostmem, "is_glibc", lambda: False)
    hostmem.release_between_runs()
    assert trims == [0]  # neither with the opt-out nor off glibc


def test_the_between_runs_probe_reports_each_run(tmp_path, capsys):
    """benchmarks.probes.between_runs runs each config in this process and reports its
    resident memory and the peak so far after it; without ``--keep-cycles`` the runner's
    release after each run stays in place."""
    import json

    from benchmarks.probes import between_runs
    from fedem_private.experiments import runner
    from fedem_private.simulation.config import RunConfig, to_dict, to_toml, with_overrides

    cfg = with_overrides(RunConfig(), {"train.rounds": 1, "train.eval_every": 1})
    path = tmp_path / "config.toml"
    path.write_text(to_toml(to_dict(cfg.validate().resolved())))
    assert between_runs.main([str(path), str(path)]) == 0
    out = json.loads(capsys.readouterr().out.split("\n", 2)[2])
    assert not out["keep_cycles"] and len(out["runs"]) == 2
    assert all(r["rss_mib"] > 0 and r["peak_mib"] >= r["rss_mib"] for r in out["runs"])
    assert runner.release_between_runs is hostmem.release_between_runs


def test_a_population_whose_per_client_tables_cannot_fit_is_refused_in_one_line(
        monkeypatch):
    """Issue 66, item 2: every client keeps an (m, d) item table; where n m d entries
    exceed the free memory the run stops before allocating, naming the size it needs."""
    from fedem_private.data import SyntheticConfig
    from fedem_private.errors import UserError
    from fedem_private.experiments.runner import prepare
    from fedem_private.simulation.config import DataConfig, RunConfig, TrainConfig

    cfg = RunConfig(data=DataConfig(synthetic=SyntheticConfig(n_users=40, n_items=50)),
                    train=TrainConfig(rounds=1, dim=8))
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 10_000)
    with pytest.raises(UserError, match=r"keeps an item table per client: \d+ clients x 50 "
                                        r"items x 8 x 4 B = .* GiB of state"):
        prepare(cfg)
    monkeypatch.setattr(hostmem, "available_bytes", lambda: None)  # unknown: no refusal
    prepare(cfg)
