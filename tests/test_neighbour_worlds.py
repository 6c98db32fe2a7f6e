"""The neighbour-world harness over every composition the configuration accepts
(:mod:`tests.neighbours`; docs/design.md section 5, "What the server may use").

A new mechanism, aggregator, merge, codec or backbone joins the axes by
being accepted by the configuration, and is not done until it passes here.
"""

from __future__ import annotations

import pytest

from fedem_private.experiments import neighbours as nb

ACCEPTED = nb.accepted()
COVER = nb.covering(ACCEPTED)


def _id(combo: dict) -> str:
    return nb.describe(nb.config_of(combo))


def test_the_cover_meets_every_value_of_every_axis() -> None:
    """Every value of every axis that any accepted composition uses is run, and the only
    value no privacy mode accepts is aggregation 'none' (the local baseline uploads
    nothing)."""
    never = set()
    for axis, values in nb.AXES.items():
        used = {c[axis] for c in ACCEPTED}
        covered = {c[axis] for c in COVER}
        assert covered == used, axis
        never |= {(axis, v) for v in values if v not in used}
    assert never == {("aggregation", "none")}
    modes = {c["mode"] for c in COVER}
    for axis in ("aggregation", "merge", "codec", "backbone", "protocol", "agg_ratio"):
        met = {(c["mode"], c[axis]) for c in COVER}
        possible = {(c["mode"], c[axis]) for c in ACCEPTED}
        assert met == possible and {m for m, _ in met} == modes, axis


@pytest.mark.parametrize("combo", COVER, ids=_id)
def test_what_the_server_sees_differs_only_as_the_mechanism_allows(combo: dict) -> None:
    cfg = nb.config_of(combo)
    found = nb.run_pair(cfg)
    server_side = [v for v in found.violations if "target" not in v]
    assert not server_side, server_side  # no mode may leak through the server
    if cfg.privacy.mode not in nb.NO_GUARANTEE:
        assert found.sound, found.violations


@pytest.mark.parametrize("mode", nb.NO_GUARANTEE)
def test_the_harness_finds_the_modes_that_claim_no_guarantee(mode: str) -> None:
    """paper (no clip of the delta) and ldp-touched-rows (the touched set shows) leak;
    the harness must say so, or its passes above mean nothing."""
    found = nb.run_pair(nb.make_config(mode, method="fedmf"))
    assert found.target_gap > 2 and not found.sound


# ------------------------------------------------------------ the three regression cases
def test_regression_a_share_rule_release_is_centred_on_the_last_public_table() -> None:
    """Finding 1: under the FedEM code's 10% rule a client the server sent nothing kept
    training from its own table, and the local mechanisms released around that private
    table; the target's round-2 gap was about 90x its sensitivity."""
    for mode in ("ldp-laplace", "ldp-gaussian"):
        found = nb.run_pair(nb.make_config(mode, method="fedem", protocol="paper-code"))
        assert found.sound, (mode, found.violations)
        assert found.target_gap > 0.1  # the target did release something different


def test_regression_centring_on_private_state_is_caught(monkeypatch) -> None:
    """The same case with the old centre (the client's own table) put back fails."""
    from fedem_private.simulation.loop import Simulation

    monkeypatch.setattr(Simulation, "_release_base", lambda self, idx, recv, enc: enc)
    found = nb.run_pair(nb.make_config("ldp-laplace", method="fedem", protocol="paper-code"))
    assert any("target" in v for v in found.violations)


@pytest.mark.parametrize("mode,method", [("ldp-laplace", "fedmf"), ("ldp-gaussian", "fedem"),
                                         ("ldp-dpsgd", "fedmf"), ("paper", "fedsim")])
def test_regression_data_sizes_never_reach_the_weights(mode: str, method: str) -> None:
    """Finding 2: FedAvg's |D_u| / sum |D| and equation 13's p_v used the true sizes under
    every mechanism (a neighbour moved every other client's round-2 upload)."""
    found = nb.run_pair(nb.make_config(mode, method=method))
    assert not [v for v in found.violations if "target" not in v], found.violations


def test_regression_size_weights_are_caught(monkeypatch) -> None:
    """Putting the true sizes back into the server's weights under DP fails the harness."""
    import numpy as np

    from fedem_private.simulation import loop

    monkeypatch.setattr(loop, "server_sizes",
                        lambda counts, cfg: np.asarray(counts, dtype=np.float64))
    found = nb.run_pair(nb.make_config("ldp-laplace", method="fedmf"))
    assert any("depends on the target" in v for v in found.violations)


def test_declared_public_sizes_narrow_the_printed_relation() -> None:
    """--sizes public keeps FedAvg's size weights; the relation then keeps |D_u| (the
    harness's neighbour has as many items), and every printed relation says so."""
    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.simulation.loop import Simulation

    cfg = nb.make_config("ldp-laplace", method="fedmf", sizes="public")
    assert nb.run_pair(cfg).sound
    sim = Simulation(cfg, nb.base_split())
    summary = sim.privacy.summary()
    assert "declared public" in summary["neighbouring"]
    assert summary["sizes"] == "public"
    assert float(sim.sizes.std()) > 0  # the true sizes
    private = Simulation(nb.make_config("ldp-laplace", method="fedmf"), nb.base_split())
    assert bool((private.sizes == 1).all())
    assert "declared public" not in PrivacyConfig(mode="ldp-laplace", epsilon=1.0
                                                  ).threat_model()["neighbouring"]


@pytest.mark.parametrize("mode,extra", [("ldp-dpsgd", {"noise_multiplier": 1.0}),
                                        ("cdp-gaussian", {"noise_multiplier": 1.0})])
def test_public_sizes_are_refused_where_the_relation_forbids_or_ignores_them(
        mode: str, extra: dict) -> None:
    from fedem_private.errors import UserError
    from fedem_private.privacy.config import PrivacyConfig

    with pytest.raises(UserError, match="--sizes public"):
        PrivacyConfig(mode=mode, sizes="public", **extra)


# ------------------------------------------------ the score a private search releases
CENTRAL = [c for c in COVER if c["mode"] == "cdp-gaussian"]


@pytest.mark.parametrize("combo", CENTRAL, ids=_id)
def test_a_private_searchs_validation_count_moves_by_one_user_at_most(combo: dict) -> None:
    """fedem_private.privacy.tuning claims sensitivity 1 for the validation hit count: with
    the releases shared, every user but TARGET ranks its validation item the same in both
    worlds, whatever the method does with released values and its own data."""
    from dataclasses import replace

    cfg = nb.config_of(combo)
    cfg = replace(cfg, train=replace(cfg.train, select_round="best-val")).validate()
    ranks_a, ranks_b, found = nb.validation_ranks_pair(cfg)
    assert found.sound, found.violations
    assert (ranks_a >= 0).all() and len(set(ranks_a.tolist())) > 1  # ranked, not all alike
    others = [u for u in range(len(ranks_a)) if u != nb.TARGET]
    assert (ranks_a[others] == ranks_b[others]).all()
    hits_a, hits_others_b = (ranks_a < 10).sum(), (ranks_b[others] < 10).sum()
    assert abs(int(hits_a) - int(hits_others_b)) <= 1  # world B without TARGET


# ------------------------------------------------- two trials of one search (issue 65)
@pytest.mark.parametrize("mode", ["cdp-gaussian", "ldp-gaussian", "ldp-laplace"])
def test_two_trials_of_a_search_draw_independent_noise(mode: str) -> None:
    """Two runs at one setting on one dataset, told apart only by ``train.nonce`` as two
    trials of a private search are: the difference of their releases (less the public
    tables they are centred on) spreads like the difference of two independent noises,
    sqrt(2) noise standard deviations. With one key for both (what a private search did
    before each trial drew its own nonce) the noise cancels and the check fails."""
    cfg = nb.make_config(mode)
    own = nb.trials_pair(cfg, nonces=(1, 2))
    assert own.sound, own.violations
    assert all(1.0 < s < 2.0 for s in own.spreads), own.spreads
    shared = nb.trials_pair(cfg, nonces=(5, 5))
    assert not shared.sound and max(shared.spreads) == 0.0
