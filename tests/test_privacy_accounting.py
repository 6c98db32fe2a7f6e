"""Composition bounds: pinned values, Gaussian closed form, ordering, monotonicity."""

from __future__ import annotations

import math

import pytest

from fedem_private.errors import UserError
from fedem_private.privacy import accounting as acc
from fedem_private.privacy.accounting import RoundMechanism, compose, epsilon_bounds, repeated

DELTA = 1e-5


def test_pinned_laplace_values() -> None:
    # T = 100 rounds of eps_round = 0.1 Laplace (noise multiplier b / 2C = 10), delta = 1e-5
    bounds = compose(RoundMechanism("laplace", 10.0), 100, DELTA)
    assert round(bounds.basic, 3) == 10.0
    assert round(bounds.advanced, 3) == 5.850
    assert round(bounds.rdp, 3) == 4.533
    assert round(bounds.pld, 3) == 4.220
    assert bounds.reported == bounds.pld
    assert bounds.gaussian_exact is None


def test_pure_dp_figure_is_basic() -> None:
    bounds = compose(RoundMechanism("laplace", 10.0), 100, 0.0)
    assert bounds.basic == pytest.approx(10.0) and bounds.reported == bounds.basic
    assert math.isinf(bounds.pld) and math.isinf(bounds.rdp) and math.isinf(bounds.advanced)


@pytest.mark.parametrize(("z", "rounds"), [(1.0, 10), (3.0, 100), (20.0, 1000), (50.0, 1)])
def test_gaussian_pld_matches_closed_form(z: float, rounds: int) -> None:
    # dp-accounting composes T Gaussians into one Gaussian and discretises its privacy loss
    # pessimistically (rounded up to the grid), and eps is read off that grid: the PLD figure
    # is an upper bound at most ~2 grid steps above the exact one.
    bounds = compose(RoundMechanism("gaussian", z), rounds, DELTA)
    assert bounds.gaussian_exact is not None
    assert bounds.gaussian_exact - 1e-9 <= bounds.pld <= bounds.gaussian_exact \
        + 2 * acc.PLD_DISCRETIZATION
    assert bounds.reported == pytest.approx(bounds.gaussian_exact, abs=1e-12)


def test_gaussian_closed_form_hits_delta() -> None:
    mu = 0.7
    eps = acc.gaussian_epsilon(mu, DELTA)
    assert acc.gaussian_delta(eps, mu) <= DELTA
    assert acc.gaussian_delta(eps * (1 - 1e-6), mu) > DELTA
    assert acc.gaussian_epsilon(0.0, DELTA) == 0.0
    assert math.isinf(acc.gaussian_epsilon(mu, 0.0))


def test_opacus_cross_check_matches_rdp() -> None:
    for z, rounds in [(1.1, 50), (4.0, 300)]:
        ours = compose(RoundMechanism("gaussian", z), rounds, DELTA).rdp
        assert acc.opacus_rdp_epsilon(z, rounds, DELTA) == pytest.approx(ours, rel=1e-9)


CASES = [("laplace", 5.0, 50), ("laplace", 0.8, 7), ("gaussian", 2.0, 40), ("gaussian", 8.0, 3)]


@pytest.mark.parametrize(("kind", "z", "rounds"), CASES)
def test_reported_is_min_of_bounds(kind: str, z: float, rounds: int) -> None:
    b = compose(RoundMechanism(kind, z), rounds, DELTA)
    for value in (b.basic, b.advanced, b.rdp, b.pld):
        assert b.reported <= value
    assert b.reported > 0


@pytest.mark.parametrize(("kind", "z", "rounds"), CASES)
def test_monotone_in_rounds_noise_and_clip(kind: str, z: float, rounds: int) -> None:
    base = compose(RoundMechanism(kind, z), rounds, DELTA)
    more_rounds = compose(RoundMechanism(kind, z), rounds + 5, DELTA)
    more_noise = compose(RoundMechanism(kind, z * 1.5), rounds, DELTA)
    # doubling C at a fixed noise scale halves the noise multiplier scale / 2C
    bigger_clip = compose(RoundMechanism(kind, z / 2), rounds, DELTA)
    for name in ("basic", "advanced", "rdp", "pld", "reported"):
        v = getattr(base, name)
        assert getattr(more_rounds, name) >= v
        assert getattr(more_noise, name) <= v
        assert getattr(bigger_clip, name) >= v


def test_heterogeneous_history_and_cache() -> None:
    a, b = RoundMechanism("laplace", 10.0), RoundMechanism("laplace", 5.0)
    mixed = acc.composition([(a, 3), (b, 2), (a, 1)])
    assert mixed == acc.composition([(b, 2), (a, 4)])
    bounds = epsilon_bounds(mixed, DELTA)
    assert bounds.basic == pytest.approx(4 * 0.1 + 2 * 0.2)
    assert epsilon_bounds(mixed, DELTA) is bounds  # cached
    assert compose(a, 4, DELTA).reported <= bounds.reported <= compose(b, 6, DELTA).reported


def test_no_noise_and_no_rounds() -> None:
    none = compose(RoundMechanism("laplace", 0.0), 3, DELTA)
    assert all(math.isinf(v) for v in (none.basic, none.advanced, none.rdp, none.pld))
    assert none.as_dict()["reported"] is None
    empty = epsilon_bounds(repeated(RoundMechanism("gaussian", 1.0), 0), DELTA)
    assert empty.reported == 0.0 and empty.pld == 0.0


def test_pld_interval_widens_only_for_huge_round_eps() -> None:
    small = repeated(RoundMechanism("laplace", 10.0), 100)  # eps_round 0.1: the pinned case
    assert acc.pld_interval(small) == acc.PLD_DISCRETIZATION
    big = repeated(RoundMechanism("laplace", 1 / 500.0), 50)  # eps_round 500
    assert acc.pld_interval(big) == pytest.approx(2 * 500.0 / acc.PLD_MAX_BINS)
    # pessimistic at any interval: at least a finer grid's figure, and within one
    # interval per round of it
    import dp_accounting
    from dp_accounting import pld as dp_pld

    fine = dp_pld.PLDAccountant(value_discretization_interval=0.01)
    fine.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1 / 500.0), 50))
    reference = fine.get_epsilon(DELTA)
    bounds = epsilon_bounds(big, DELTA)
    assert reference - 50 * 0.01 <= bounds.pld <= reference + 50 * acc.pld_interval(big)
    assert bounds.pld <= bounds.basic
    # beyond ~700 per round dp-accounting's PLD overflows to inf (no finite bound from
    # it): the reported figure falls back on the other bounds
    huge = epsilon_bounds(repeated(RoundMechanism("laplace", 1 / 2000.0), 50), DELTA)
    assert math.isinf(huge.pld) and huge.reported == min(huge.basic, huge.rdp) < math.inf


def test_calibration_round_trip_at_large_budget() -> None:
    from fedem_private.privacy.calibration import noise_multiplier_for

    z = noise_multiplier_for("laplace", 2.5e4, DELTA, 50, "pld")
    assert compose(RoundMechanism("laplace", z), 50, DELTA).pld <= 2.5e4
    assert compose(RoundMechanism("laplace", 0.999 * z), 50, DELTA).pld > 2.5e4
    with pytest.raises(UserError, match="beyond the PLD accountant's range"):
        noise_multiplier_for("laplace", 1e5, DELTA, 50, "pld")
    z = noise_multiplier_for("laplace", 1e5, DELTA, 50, "rdp")
    assert compose(RoundMechanism("laplace", z), 50, DELTA).rdp <= 1e5
