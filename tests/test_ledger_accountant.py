"""The per-client ledger holds an accountant object (issue 67, item 5): it steps it with each
client's rounds and reports the figures it names, never looking an accountant up by name."""

from __future__ import annotations

import numpy as np
import pytest

from fedem_private.privacy.accountants import Accountant, LocalBounds
from fedem_private.privacy.accounting import RoundMechanism, epsilon_bounds, repeated
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.ledger import EPSILON_KEYS, PrivacyLedger
from fedem_private.privacy.params import resolve_params

DELTA = 1e-5


def _params():
    return resolve_params(PrivacyConfig(mode="ldp-gaussian", noise_multiplier=2.0), rounds=5)


def test_the_ledger_steps_its_accountant_with_each_clients_rounds() -> None:
    ledger = PrivacyLedger(_params())
    assert isinstance(ledger.accountant, LocalBounds) and ledger.accountant.history == ()
    assert EPSILON_KEYS == LocalBounds.keys() == ("basic", "advanced", "rdp", "pld",
                                                  "reported")
    for r in range(3):
        ledger.record_round(r, np.array([0, 1] if r else [0]))
    mech = RoundMechanism("gaussian", 2.0)
    for client, n in ((0, 3), (1, 2)):
        bounds = LocalBounds(repeated(mech, n)).bounds(DELTA)
        assert bounds == epsilon_bounds(repeated(mech, n), DELTA)
        assert ledger.spent(client) == {k: pytest.approx(getattr(bounds, k))
                                        for k in EPSILON_KEYS}
    assert LocalBounds().step(mech, 3).epsilon(DELTA) == pytest.approx(
        ledger.spent(0)["reported"])
    assert all(issubclass(m, Accountant) for m in LocalBounds.members)
