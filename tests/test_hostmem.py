"""The host allocator's tuning (fedem_private.hostmem): freed large blocks are reused, and
nothing a run computes changes. Each check runs in a fresh interpreter, so the tuning of
this test process (or its absence) does not matter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedem_private import hostmem

glibc = pytest.mark.skipif(
    not hostmem.is_glibc(), reason="the tuning is glibc's mallopt; elsewhere it does nothing")

# a round-like pattern: three 72 MiB tables (one chunk of 64 clients x 17,632 items x d 16,
# LastFM-2K's size) and three results computed from them are alive at once, then freed; ten
# such cycles, minor page faults per cycle (in thousands). The heap settles after a few
# cycles (small allocations can split a freed block, so the first cycles still grow it;
# how many varies from run to run); glibc's default faults every cycle's tables in again.
_FAULTS = """
import resource, torch
from fedem_private.hostmem import keep_freed_memory
tuned = keep_freed_memory()
def cycle():
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tables = [torch.empty(64, 17632 * 16) for _ in range(3)]
    for t in tables:
        t.fill_(1.0)
    results = [t * 2.0 for t in tables]
    del tables, results
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
print(tuned, *[cycle() for _ in range(10)])
"""

# two FedEM rounds with chunk tables past glibc's mmap threshold: the synthetic generator
# keeps the 773 items that drew an interaction, so the width comes from d = 256
# (64 clients x 773 items x 256 x 4 bytes = 48 MiB): a digest of the state
_RUN = """
import hashlib
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.experiments.runner import prepare
cfg = with_overrides(RunConfig(), {
    "data.dataset": "synthetic", "data.synthetic.n_users": 130,
    "data.synthetic.n_items": 20000, "data.synthetic.mean_activity": 12.0,
    "federation.method": "fedem", "train.rounds": 2, "train.local_epochs": 1,
    "train.dim": 256,
    "train.eval_every": 2})
sim = prepare(cfg)
sim.run()
h = hashlib.sha256()
for t in (sim.state.q_local, sim.state.p, sim.aggregator.table):
    h.update(t.contiguous().numpy().tobytes())
print(sim.host_allocator_tuned, h.hexdigest())
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
def test_freed_large_tables_are_reused_not_faulted_in_again():
    tuned, *faults = _python(_FAULTS, None)
    system, *faults_system = _python(_FAULTS, "system")
    assert (tuned, system) == ("True", "False")
    pages = 6 * 64 * 17632 * 16 * 4 // 4096  # a cycle's six tables, in 4 KiB pages
    # the default: every cycle's tables are fresh mappings, faulted in again
    assert all(int(f) > 0.9 * pages for f in faults_system[-3:])
    # tuned: after the heap has grown for a few cycles, freed tables' pages serve the next
    # ones (how soon varies from run to run, so the check is on the ten cycles' total)
    assert sum(int(f) for f in faults) < 0.5 * sum(int(f) for f in faults_system)


@glibc
def test_the_tuning_changes_no_result():
    tuned, digest = _python(_RUN, None)
    system, digest_system = _python(_RUN, "system")
    assert (tuned, system) == ("True", "False")
    assert digest == digest_system


def test_elsewhere_than_glibc_it_does_nothing(monkeypatch):
    monkeypatch.setattr(hostmem, "_applied", None)
    monkeypatch.setattr(hostmem.platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(hostmem.ctypes, "CDLL", lambda *a, **k: pytest.fail("mallopt called"))
    assert hostmem.keep_freed_memory() is False
    assert hostmem.keep_freed_memory() is False  # decided once


def test_the_opt_out_is_read_at_the_first_call(monkeypatch):
    monkeypatch.setattr(hostmem, "_applied", None)
    monkeypatch.setenv(hostmem.ENV, "System")
    monkeypatch.setattr(hostmem.ctypes, "CDLL", lambda *a, **k: pytest.fail("mallopt called"))
    assert hostmem.keep_freed_memory() is False


# narrow tables (ML-100K's size) and then wide ones, built in one process: the
# tuning waits for the blocks that need it (fedem_private.hostmem: it risks fragmentation)
_NARROW_THEN_WIDE = """
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.experiments.runner import prepare
def sim(dim):
    return prepare(with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 130,
        "data.synthetic.n_items": 20000, "data.synthetic.mean_activity": 12.0,
        "federation.method": "fedem", "train.dim": dim}))
narrow = sim(16)  # 64 x 773 x 16 x 4 bytes: 3 MiB
wide = sim(256)   # 48 MiB
print(narrow.host_table_bytes(), narrow.host_allocator_tuned,
      wide.host_table_bytes(), wide.host_allocator_tuned)
"""


@glibc
def test_only_tables_above_the_mmap_threshold_tune_the_allocator():
    nb, narrow, wb, wide = _python(_NARROW_THEN_WIDE, None)
    assert int(nb) <= hostmem.MMAP_THRESHOLD_MAX < int(wb)
    assert (narrow, wide) == ("False", "True")


def test_small_blocks_leave_the_allocator_and_the_decision_open(monkeypatch):
    monkeypatch.setattr(hostmem, "_applied", None)
    monkeypatch.delenv(hostmem.ENV, raising=False)
    monkeypatch.setattr(hostmem.ctypes, "CDLL", lambda *a, **k: pytest.fail("mallopt called"))
    assert hostmem.keep_freed_memory(hostmem.MMAP_THRESHOLD_MAX) is False
    assert hostmem._applied is None  # a wider table later may still apply it
