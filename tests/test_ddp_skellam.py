"""``ddp-skellam`` through a simulation: accounting, dropouts, aborts, the harness."""

from __future__ import annotations

import pytest

pytest.importorskip("Crypto", reason="the [secagg] extra (pycryptodome) is not installed")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedem_private.experiments import neighbours as nb  # noqa: E402
from fedem_private.privacy.ddp import DdpSecureSum, dropouts  # noqa: E402
from fedem_private.simulation.loop import Simulation  # noqa: E402


def _run(**settings: object) -> Simulation:
    base = {"clip": 0.05, "epsilon": 8.0, "sample_rate": 0.8, "ddp_bits": 16}
    base.update(settings)
    sim = Simulation(nb.make_config("ddp-skellam", settings=base), nb.base_split())
    sim.run()
    return sim


def test_a_run_reports_the_skellam_guarantee_it_planned() -> None:
    sim = _run()
    out = sim.privacy.summary()
    ddp = out["ddp_skellam"]
    assert abs(ddp["epsilon_planned"] - 8.0) < 1e-3
    assert ddp["rounds_released"] == nb.ROUNDS and ddp["rounds_aborted"] == []
    # the worst client took part in every round it could; its eps is at most the plan's
    assert 0 < out["epsilon"]["reported"] <= 8.0 + 1e-6
    assert ddp["wrap_bound_per_round"] <= 1e-6 and ddp["wrapped_entries_total"] == 0
    assert ddp["bytes_per_client"]["masked_input"] == ddp["padded_dim"] * 16 // 8
    assert "replaced by zero" in out["neighbouring"]
    assert "noise honestly" in out["trust_model"]


def test_too_many_dropouts_abort_the_round_and_charge_nobody() -> None:
    sim = _run(dropout=0.6, ddp_tolerance=0.1)
    ddp = sim.privacy.summary()["ddp_skellam"]
    assert ddp["rounds_aborted"], "a 60% dropout must abort rounds sized for 10%"
    assert all("nothing released" in r["reason"] for r in ddp["rounds_aborted"])
    assert sim.privacy.secure.worst_rounds <= ddp["rounds_released"]


def test_an_aborted_round_releases_the_table_unchanged() -> None:
    sec = DdpSecureSum(clip=1.0, bits=16, scale=None, tolerance=0.0, dropout=0.9,
                       expected_count=10, cohort=10, seed=0, rounds=1, delta=1e-5,
                       epsilon=None, noise_multiplier=1.0)
    sec.begin_round(1)
    sent = torch.zeros(10, 6, 4)
    local = torch.randn(10, 6, 4, generator=torch.Generator().manual_seed(0))
    sec.add_keyed(sent, local, np.arange(10))
    base = torch.ones(6, 4)
    out = sec.release(base)
    assert torch.equal(out, base)
    assert not sec.records[-1].released and sec.charges == {}


def test_dropouts_are_keyed_and_at_the_rate() -> None:
    before, after = dropouts(1, 2, np.arange(20_000), 0.3)
    rate = (before.size + after.size) / 20_000
    assert abs(rate - 0.3) < 0.02 and abs(before.size / (before.size + after.size) - 0.5) < 0.03
    again = dropouts(1, 2, np.arange(20_000), 0.3)
    assert np.array_equal(before, again[0]) and np.array_equal(after, again[1])


def test_the_harness_sees_the_target_within_the_rounded_bound() -> None:
    found = nb.run_pair(nb.make_config("ddp-skellam", method="fedmf"))
    assert found.sound, found.violations
    # the target's contribution does show (the check is not vacuous), within Delta_2 / gamma
    assert 0.05 < found.target_gap <= 1 + nb.BOUND_SLACK
