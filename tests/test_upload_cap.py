"""--max-uploads k: local clients that enforce their own budget (issue 79, item 1).

Under a local mechanism each client uploads at most k times and declines the rounds after,
so a total eps is calibrated over min(T, k) releases. The cap reads only each client's past
participation (the keyed public schedule), never its data: under replace-one a neighbour
declines in the same rounds.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedem_private.errors import UserError
from fedem_private.privacy.calibration import laplace_epsilon_round
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params
from fedem_private.simulation.config import RunConfig, with_overrides
from fedem_private.simulation.loop import Simulation


def _cfg(**over):
    base = {"train.rounds": 8, "train.local_epochs": 1, "train.batch_size": 32,
            "train.dim": 4, "train.eval_every": 100, "data.synthetic.n_users": 30,
            "train.cohort_size": 10, "privacy.mode": "ldp-laplace", "privacy.epsilon": 4.0,
            "privacy.clip": 5.0}
    base.update(over)
    return with_overrides(RunConfig(), base)


def test_the_budget_is_spread_over_k_releases_not_the_rounds():
    capped = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon=4.0, max_uploads=2), 40)
    plain = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon=4.0), 40)
    assert capped.epsilon_round == pytest.approx(laplace_epsilon_round(4.0, 1e-5, 2, "pld"))
    assert plain.epsilon_round == pytest.approx(laplace_epsilon_round(4.0, 1e-5, 40, "pld"))
    assert capped.epsilon_round > 10 * plain.epsilon_round  # the point of the cap
    # a cap above the rounds changes nothing
    assert resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon=4.0, max_uploads=99),
                          40).epsilon_round == pytest.approx(plain.epsilon_round)


def test_no_client_uploads_more_than_k_times_and_the_ledger_stays_within_eps(small_split):
    sim = Simulation(_cfg(**{"privacy.max_uploads": 2}), small_split)
    for _ in range(8):
        sim.step()
    ledger = sim.privacy.ledger
    counts = ledger.uploads(np.arange(small_split.n_users))
    assert counts.max() == 2  # 8 rounds of 10 of 30 clients: many reach the cap
    assert (counts == 2).sum() >= 10
    # the rounds after a client's second upload do not hold it
    for c in np.flatnonzero(counts == 2)[:5]:
        assert len(ledger.rounds_of(int(c))) == 2
    spent = ledger.summary()["epsilon"]["reported"]
    assert spent <= 4.0 + 1e-9
    assert sim.privacy.summary()["upload_cap"]["max_uploads"] == 2
    # without the cap the same schedule charges some client more than twice
    free = Simulation(_cfg(), small_split)
    for _ in range(8):
        free.step()
    assert free.privacy.ledger.uploads(np.arange(small_split.n_users)).max() > 2


def test_the_cap_reads_the_schedule_not_the_data(small_split):
    """Two runs whose every upload differs (another learning rate: what other data would
    do to the deltas) decline in the same rounds: the cohort less those out of uploads is
    the same, and it shrinks as clients reach the cap."""
    a = Simulation(_cfg(**{"privacy.max_uploads": 1}), small_split)
    b = Simulation(_cfg(**{"privacy.max_uploads": 1, "train.lr": 0.5}), small_split)
    sizes = []
    for t in range(1, 9):
        assert np.array_equal(np.sort(a.participants(t)), np.sort(b.participants(t)))
        sizes.append(a.participants(t).size)
        a.step()
        b.step()
    assert sizes[0] == 10 and sizes[-1] < 10


@pytest.mark.parametrize(("mode", "budget"), [("cdp-gaussian", {"epsilon": 4.0}),
                                              ("dp-ftrl", {"epsilon": 4.0}), ("paper", {})])
def test_the_cap_is_refused_where_no_client_enforces_a_local_budget(mode, budget):
    with pytest.raises(UserError, match="--max-uploads is for the local mechanisms"):
        PrivacyConfig(mode=mode, max_uploads=2, **budget)


def test_a_bad_cap_is_one_clear_error():
    with pytest.raises(UserError, match="must be an integer >= 0"):
        PrivacyConfig(mode="ldp-laplace", epsilon=4.0, max_uploads=-1)
