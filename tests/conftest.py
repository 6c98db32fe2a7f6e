"""Shared fixtures: the reference datasets beside the project or in the download cache.

A real-data test whose dataset is in neither place is skipped, and the run
ends with one section naming every such test and how to get the data.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))


def _checkout_benchmarks() -> None:
    """Import ``benchmarks`` from this checkout. It is not in the wheel (pyproject.toml), and
    opacus, a dependency, installs a top-level ``benchmarks`` of its own into site-packages,
    which would shadow ours wherever the checkout is not first on sys.path (tox runs the
    tests against the installed fedem_private)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location(
        "benchmarks", folder / "__init__.py", submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    spec.loader.exec_module(module)


_checkout_benchmarks()

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
SKIPPED: dict[str, list[str]] = {}  # dataset -> the real-data tests skipped for want of it


def dataset_dir(name: str, test: str = "") -> Path:
    """Path of a reference dataset (../shared/datasets, else the download cache), or skip."""
    from fedem_private.data.download import cached_dir, default_cache_dir

    path = SHARED / name
    if path.is_dir():
        return path
    cached = cached_dir(name)
    if cached is not None:
        return cached
    SKIPPED.setdefault(name, []).append(test or "?")
    pytest.skip(f"real dataset {name} not found in {SHARED} nor in the cache "
                f"{default_cache_dir() / name}")


@pytest.fixture
def ml100k_dir(request) -> Path:
    return dataset_dir("ml-100k", request.node.nodeid)


@pytest.fixture
def filmtrust_dir(request) -> Path:
    return dataset_dir("filmtrust", request.node.nodeid)


@pytest.fixture(scope="module")
def small_split():
    """A small synthetic leave-one-out split (30 users, 100 items); a test module may
    define its own ``small_split`` of another size, which takes precedence."""
    from fedem_private.data import SyntheticConfig, generate, leave_one_out

    data = generate(SyntheticConfig(n_users=30, n_items=100, mean_activity=25,
                                    activity_sigma=1.0), seed=5)
    return leave_one_out(data, 5)


@pytest.fixture
def sorted_chunk(small_split):
    """A function of a LocalTrainConfig giving (clients sorted by steps, descending, and
    their round-1 samples): one chunk of every client of ``small_split``, as the loop
    hands a backbone (seed 0, strict exclusions)."""
    import numpy as np

    from fedem_private.data.split import exclusion_csr
    from fedem_private.models.base import draw_samples, num_steps

    sp = small_split
    excl = exclusion_csr(sp, "strict")

    def make(cfg):
        clients = np.arange(sp.n_users)
        first = draw_samples(0, 1, clients, sp.train_indptr, sp.train_items, *excl,
                             sp.n_items, cfg.num_negatives)
        order = clients[np.argsort(-num_steps(np.diff(first.indptr), cfg), kind="stable")]
        return order, draw_samples(0, 1, order, sp.train_indptr, sp.train_items, *excl,
                                   sp.n_items, cfg.num_negatives)

    return make


@pytest.fixture
def float64():
    """Run a test with torch's default dtype float64 (restored afterwards)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _skip_reason(report) -> str:
    """A skipped test's reason, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter) -> None:
    """Once per run: every skip counted by its reason (a GPU, an optional package, a
    dataset), then which real-data tests were skipped, and why."""
    from collections import Counter

    tr = terminalreporter
    reasons = Counter(_skip_reason(r) for r in tr.stats.get("skipped", []))
    if reasons:
        tr.section("skipped, by reason")
        for reason, count in reasons.most_common():
            tr.write_line(f"{count:3d} skipped: {reason}")
    if not SKIPPED:
        return
    tr.section("real-data tests skipped")
    for name, tests in sorted(SKIPPED.items()):
        tr.write_line(f"{len(tests)} skipped: dataset {name} is not in {SHARED} nor in the "
                      f"cache; `fedem-private datasets download {name}` fetches it:")
        for test in tests:
            tr.write_line(f"  {test}")


class Killed(BaseException):
    """Stands in for a kill part way through a run (a BaseException, as KeyboardInterrupt
    is: nothing between the round and the test catches it)."""


@pytest.fixture
def kill_after(monkeypatch):
    """``kill_after(r)``: every run's round ``r`` ends by raising :class:`Killed` (after the
    round, before its checkpoint); ``kill_after(None)`` lets runs finish again."""
    from fedem_private.simulation.loop import Simulation

    real_step = Simulation.step

    def arm(round_: int | None) -> None:
        def step_then_die(self):
            stats = real_step(self)
            if stats.round == round_:
                raise Killed
            return stats

        monkeypatch.setattr(Simulation, "step", real_step if round_ is None else step_then_die)

    return arm
