"""Privacy ledger: clients are charged only for their rounds; summary is JSON-ready."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedem_private.privacy.accounting import RoundMechanism, compose
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.ledger import EPSILON_KEYS, PrivacyLedger
from fedem_private.privacy.params import resolve_params

DELTA = 1e-5


def _ledger(mode: str = "ldp-laplace", **kw: object) -> PrivacyLedger:
    if mode.startswith("ldp") and not kw:
        kw = {"epsilon_round": 0.1}
    return PrivacyLedger(resolve_params(PrivacyConfig(mode=mode, **kw), rounds=10))


def test_charges_only_for_rounds_taken_part_in() -> None:
    ledger = _ledger()
    ledger.record_round(0, np.array([0, 1, 2]))
    ledger.record_round(1, np.array([1]))
    ledger.record_round(2, np.array([2, 1]))
    assert ledger.rounds_of(0) == [0] and ledger.rounds_of(1) == [0, 1, 2]
    assert ledger.rounds_of(2) == [0, 2] and ledger.rounds_of(7) == []
    mech = RoundMechanism("laplace", 10.0)
    for client, n in [(0, 1), (1, 3), (2, 2)]:
        expected = compose(mech, n, DELTA)
        spent = ledger.spent(client)
        assert set(spent) == set(EPSILON_KEYS)
        assert spent["basic"] == pytest.approx(0.1 * n)
        assert spent["reported"] == pytest.approx(expected.reported)
    assert ledger.spent(99) == {k: 0.0 for k in EPSILON_KEYS}


def test_summary_is_worst_client_and_json_ready() -> None:
    ledger = _ledger()
    entries = [ledger.record_round(r, np.array([0, 5]) if r % 2 else np.array([5]))
               for r in range(4)]
    summary = ledger.summary()
    json.dumps(summary, allow_nan=False)
    assert summary["worst_client"] == 5 and summary["worst_client_rounds"] == 4
    assert summary["mode"] == "ldp-laplace" and summary["delta"] == DELTA
    assert summary["clip"] == 1.0 and summary["noise_scale"] == pytest.approx(20.0)
    assert set(summary["epsilon"]) == set(EPSILON_KEYS)
    assert summary["epsilon"] == ledger.spent(5)
    reported = [e["epsilon"]["reported"] for e in entries]
    assert reported == sorted(reported) and entries[-1]["epsilon"] == summary["epsilon"]
    json.dumps(ledger.to_dict(), allow_nan=False)


def test_no_guarantee_modes_report_none() -> None:
    for mode in ("none", "paper", "ldp-touched-rows"):
        ledger = _ledger(mode)
        ledger.record_round(0, np.arange(3),
                            heuristic_epsilon=np.full(3, 0.5) if mode == "paper" else None)
        summary = ledger.summary()
        json.dumps(summary, allow_nan=False)
        assert summary["epsilon"] == {k: None for k in EPSILON_KEYS}
        assert summary["guarantee"] is False
    assert "INSECURE" in summary["warning"]
    assert summary["nominal_epsilon"]["basic"] == pytest.approx(0.1)
    paper = _ledger("paper")
    paper.record_round(0, np.array([0, 1]), heuristic_epsilon=np.array([0.2, 0.4]))
    paper.record_round(1, np.array([1]), heuristic_epsilon=np.array([0.4]))
    heuristic = paper.summary()["paper_heuristic"]
    assert heuristic["epsilon_summed_worst_client"] == pytest.approx(0.8)
    assert "heuristic" in heuristic["note"] and "NOT" in heuristic["note"]


def test_changed_noise_makes_a_heterogeneous_history() -> None:
    ledger = _ledger()
    louder = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon_round=0.05), rounds=10)
    ledger.record_round(0, np.array([0, 1]))
    ledger.record_round(1, np.array([1, 2]), params=louder)
    ledger.record_round(2, np.array([2]), params=louder)
    assert ledger.spent(1)["basic"] == pytest.approx(0.15)
    assert ledger.spent(2)["basic"] == pytest.approx(0.10)
    assert ledger.summary()["worst_client"] == 1
    with pytest.raises(ValueError):
        ledger.record_round(3, np.array([0]), params=resolve_params(PrivacyConfig(), 10))


def test_the_worst_of_ten_thousand_clients_has_the_most_rounds() -> None:
    ledger = _ledger(epsilon_round=0.2)
    gen = np.random.default_rng(0)
    for r in range(30):
        ledger.record_round(r, np.flatnonzero(gen.random(10_000) < 0.2))
    counts = [ledger.n_rounds(c) for c in range(10_000)]
    assert ledger.summary()["worst_client_rounds"] == max(counts)


def test_rejects_duplicate_clients() -> None:
    with pytest.raises(ValueError):
        _ledger().record_round(0, np.array([1, 1]))


def test_kept_bounds_equal_a_fresh_ledgers_after_a_column_is_appended() -> None:
    """The bounds kept per signature are those a ledger composing afresh gives, also once
    a new mechanism's column has lengthened every signature."""
    louder = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon_round=0.05), rounds=10)
    history = [(0, [0, 1], None), (1, [1], None), (2, [1, 2], louder), (3, [0, 2], louder),
               (4, [1], None)]
    kept = _ledger()
    for round_, ids, params in history:  # the worst client's bounds are read every round
        kept.record_round(round_, np.array(ids), params=params)
    fresh = _ledger()
    for round_, ids, params in history:
        fresh.record_round(round_, np.array(ids), params=params)
        fresh._bounds_cache.clear()
    for client in range(3):
        fresh._bounds_cache.clear()
        assert kept.spent(client) == fresh.spent(client)
    assert len(kept._bounds_cache) >= 3
