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


# tox -e quick (pytest -m "not slow and not heavy"): a contributor's pass in a few minutes on
# a 2-core machine. These files run whole commands end to end (sweeps, tunings, ladders,
# Ray, subprocesses, the docs site, the wheel, recorded runs, neighbour worlds, audits):
# their tests are marked ``heavy`` and run in the full suite (tox, CI) only. A new test file
# is quick unless named here.
HEAVY_FILES = frozenset({
    "test_attacks_canary.py", "test_attacks_imia_shadow.py", "test_attacks_observations.py",
    "test_benchmark_tables.py", "test_benchmarks_layout.py", "test_cdp_recording.py",
    "test_checkpoint.py", "test_cli.py", "test_collapse_benchmark.py", "test_ddp_recording.py",
    "test_ddp_skellam.py", "test_device.py", "test_doc_commands.py", "test_docs_site.py",
    "test_dp_ftrl.py", "test_dp_mostpop_neighbours.py", "test_em_probes.py",
    "test_holdout.py", "test_imia_peer_benchmark.py", "test_import_cycles.py",
    "test_keep_runs.py", "test_ladder_command.py", "test_metrics_crosscheck.py",
    "test_movielens_large.py", "test_neighbour_worlds.py", "test_newcomer.py",
    "test_packaging.py", "test_paper_code.py", "test_peer_benchmark.py", "test_plugins.py",
    "test_population.py", "test_privacy_audit_bounds.py", "test_privacy_canaries.py",
    "test_prune_probe.py", "test_quick_sweep.py", "test_ray_shards.py", "test_ray_sweep.py",
    "test_realdata.py", "test_recording.py", "test_rng_keyed.py", "test_row_mean_probe.py",
    "test_secagg.py", "test_second_pass.py", "test_secure_path.py", "test_skellam.py",
    "test_sweep.py", "test_tracking.py", "test_tune.py", "test_tuning_privacy.py",
    # whole runs, sweeps or attacks in most of their tests (10-50 s a file)
    "test_attacks_run.py", "test_backbones.py", "test_fourth_pass.py", "test_hostmem.py",
    "test_pretrain.py", "test_report.py", "test_terminal.py",
})
# single tests of otherwise quick files that take seconds each (file, test function)
HEAVY_TESTS = frozenset({
    ("test_codecs.py", "test_report_has_bytes_column_and_figure"),
    ("test_floors.py", "test_sweep_references_run_the_matched_floor_at_each_epsilon_and_report_it"),
    ("test_accountants.py", "test_solving_for_eps_and_delta_round_trips"),
    ("test_accountants.py", "test_the_public_functions_are_the_generic_calibration"),
    ("test_accountants.py", "test_calibrated_noise_meets_the_target_and_barely"),
    ("test_rng_streams.py", "test_no_two_keyed_states_repeat_at_ml1m_size_over_100_rounds"),
    ("test_privacy_cdp.py", "test_calibration_round_trip"),
    ("test_privacy_cdp.py", "test_refusal_on_the_command_line_is_one_line_exit_2"),
    ("test_privacy_cdp.py", "test_end_to_end_cdp_run_records_both_guarantees"),
    ("test_privacy_cdp.py", "test_adaptive_clipping_end_to_end_moves_the_clip_and_states_it"),
    ("test_privacy_dpsgd.py", "test_calibration_round_trip"),
    ("test_privacy_dpsgd.py", "test_adapter_steps_are_charged_every_round"),
    ("test_privacy_dpsgd.py", "test_pfedrec_runs_end_to_end_and_noises_its_head"),
    ("test_privacy_dpsgd.py", "test_fedem_runs_under_dpsgd_with_its_adapter_trained_privately"),
    ("test_privacy_dpsgd.py", "test_end_to_end_run_states_the_relation_and_logs_the_steps"),
    ("test_fedmerge.py", "test_recording_and_attacks_run_on_its_uploads"),
})


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the tests of :data:`HEAVY_FILES` and :data:`HEAVY_TESTS` ``heavy`` (left out of
    ``tox -e quick``)."""
    for item in items:
        name = Path(str(item.path)).name
        if name in HEAVY_FILES or (name, getattr(item, "originalname", item.name)) in HEAVY_TESTS:
            item.add_marker(pytest.mark.heavy)


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


@pytest.fixture()
def jax_x64():
    """jax in float64 for a comparison with jax-privacy (its default float32 differs from
    our float64 at 1e-6), as it was after; skips where jax is not installed."""
    jax = pytest.importorskip("jax")
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
