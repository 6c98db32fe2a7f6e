"""benchmarks/probes/row_work.py: the Adam row-steps of a vectorised round against the reference."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.probes import row_work
from fedem_private.models.base import Plan


def _plan(touched: list[int], rows: int, active: list[int], steps: list[int]) -> Plan:
    empty = torch.zeros((0, 1))
    return Plan.of_touched([np.arange(t) for t in touched], rows, loc=empty, lab=empty,
                           wgt=empty, active=np.array(active),
                           offsets=np.zeros(len(active) + 1, int), steps=np.array(steps),
                           epochs=1)


def test_counts_follow_the_plans():
    # client 0 touches 3 rows over 2 steps, client 1 one row in 1 step; catalogue of 5
    out = row_work.count([_plan([3, 1], rows=3, active=[2, 1], steps=[2, 1])], n_items=5)
    assert out["reference"] == 3 * 5  # every step updates the whole catalogue
    assert out["padded"] == 2 * 3 + 1 * 3  # step 0: both clients, step 1: client 0
    assert out["valid"] == (3 + 1) + 3
    assert out["reference_over_padded"] == 15 / 9


def test_a_real_round_is_counted_from_its_own_plans():
    out = row_work.measure("synthetic", "fedmf")
    assert out["chunks"] >= 1
    assert out["reference"] > out["padded"] >= out["valid"] > 0
