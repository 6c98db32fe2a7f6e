"""dp-ftrl --ftrl-sampling poisson: amplified banded MF (issue 81, item 2).

Checked against references written here apart from the implementation: the sampler by
its definition (only round t's group, each member at rate p, keyed by identity so that a
removal moves no one else), the eps by dp-accounting's PLD built directly from the
Poisson-subsampled Gaussian and by its RDP accountant, the sensitivity by enumerating the
b-min-sep patterns, the eps against the cyclic release at the same sigma (amplification
helps at small p; at p = 1 it is the cyclic figure up to the PLD's discretisation), a run
end to end, the command line's refusals, the neighbour-world and removal harnesses, and
the canary audit of the (unamplified) release.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from fedem_private.errors import UserError
from fedem_private.privacy import ftrl, mf, registry
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.mech.dp_ftrl import _cohorts
from fedem_private.privacy.params import resolve_params

MECH = registry.mechanism_for("dp-ftrl")
DELTA = 1e-5


def poisson_cfg(**over) -> PrivacyConfig:
    base = {"mode": "dp-ftrl", "noise_multiplier": 1.0, "sample_rate": 0.05, "clip": 0.5,
            "ftrl_strategy": "banded", "ftrl_sampling": "poisson", "ftrl_bands": 4}
    return PrivacyConfig(**{**base, **over})


def direct_pld_eps(p: float, z: float, steps: int, interval: float = 1e-4) -> float:
    """dp-accounting's PLD of ``steps`` Poisson-subsampled Gaussians, built directly."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    one = pld.from_gaussian_mechanism(standard_deviation=z, sampling_prob=p,
                                      value_discretization_interval=interval,
                                      pessimistic_estimate=True)
    return float(one.self_compose(steps).get_epsilon_for_delta(DELTA))


def dense_c(coefs, n: int) -> np.ndarray:
    out = np.zeros((n, n))
    for t in range(n):
        for s in range(max(0, t - len(coefs) + 1), t + 1):
            out[t, s] = coefs[t - s]
    return out


# ------------------------------------------------------------------- (1) the sampler
def test_only_the_rounds_group_takes_part_each_member_at_rate_p():
    params = resolve_params(poisson_cfg(sample_rate=0.1, ftrl_bands=4), 40)  # p = 0.4
    plan = params.ftrl
    assert plan.sampling == "poisson" and plan.groups == 4 and plan.rate == pytest.approx(0.4)
    assert params.sample_rate == pytest.approx(0.1)  # the divisor q N: the expected cohort
    n = 4000
    group = _cohorts(np.arange(n, dtype=np.int64), 4, 7)
    seen = np.zeros(n)
    for t in range(1, 41):
        chosen = MECH.participants(params, 7, t, n)
        assert np.all(group[chosen] == (t - 1) % 4)
        seen[chosen] += 1
    # each client's group comes 10 times: Binomial(10, 0.4) participations, mean 4
    assert seen.mean() == pytest.approx(4.0, rel=0.03)
    assert 0.20 < np.mean(seen == 4) < 0.30  # P(Binomial(10, 0.4) = 4) = 0.251
    assert np.array_equal(MECH.participants(params, 7, 3, n), MECH.participants(params, 7, 3, n))
    assert not np.array_equal(MECH.participants(params, 7, 3, n),
                              MECH.participants(params, 8, 3, n))


def test_removing_a_user_moves_no_other_client():
    params = resolve_params(poisson_cfg(sample_rate=0.1, ftrl_bands=4), 12)
    keys = np.arange(500, dtype=np.int64) * 7919 + 11
    without = np.delete(keys, 123)
    for t in range(1, 13):
        whole = set(keys[MECH.participants(params, 3, t, keys)].tolist())
        less = set(without[MECH.participants(params, 3, t, without)].tolist())
        assert whole - {int(keys[123])} == less


def test_at_p_one_the_groups_are_the_cyclic_cohorts():
    params = resolve_params(poisson_cfg(sample_rate=0.25, ftrl_bands=4), 8)
    cyclic = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=1.0,
                                          sample_rate=0.25, ftrl_strategy="banded"), 8)
    assert params.ftrl.rate == 1.0
    for t in range(1, 9):
        assert np.array_equal(MECH.participants(params, 5, t, 300),
                              MECH.participants(cyclic, 5, t, 300))


# --------------------------------------------------------------- (2) the strategy
def test_the_bands_are_optimised_for_b_min_sep_and_columns_never_overlap():
    """C is optimised at G = b; every pattern at least b apart meets S_T = ||C 1_0||^2 by
    enumeration; the largest column norm is ||c|| (the first)."""
    params = resolve_params(poisson_cfg(sample_rate=0.1, ftrl_bands=3), 9)
    plan = params.ftrl
    assert plan.coefs == mf.optimise_banded(9, 3, 3) and len(plan.coefs) == 3
    c = dense_c(plan.coefs, 9)
    assert np.sqrt((c * c).sum(axis=0)).max() == pytest.approx(math.sqrt(plan.column_sq))
    best = 0.0
    for size in range(1, 4):
        for rounds in itertools.combinations(range(9), size):
            if all(b - a >= 3 for a, b in itertools.pairwise(rounds)):
                for signs in itertools.product((-1.0, 1.0), repeat=size):
                    g = np.zeros(9)
                    g[list(rounds)] = signs
                    best = max(best, float(np.sum((c @ g) ** 2)))
    assert best == pytest.approx(plan.tree_sq, rel=1e-9)
    assert params.sensitivity == pytest.approx(0.5 * math.sqrt(plan.column_sq))
    assert params.noise_scale == pytest.approx(1.0 * params.sensitivity)  # sigma = z C ||c||


# ---------------------------------------------------------------- (3) accounting
def test_the_eps_is_the_poisson_subsampled_gaussians_computed_directly():
    rate, bands, z = 0.02, 5, 0.8
    params = resolve_params(poisson_cfg(sample_rate=rate, ftrl_bands=bands,
                                        noise_multiplier=z), 20)
    eps = MECH.release_epsilon(params, 20)
    steps = math.ceil(20 / bands)
    assert eps["pld"] == pytest.approx(direct_pld_eps(rate * bands, z, steps), rel=0.01)
    # RDP is an upper bound, looser by its conversion: above the PLD, within 40%
    assert eps["pld"] * 0.999 <= eps["rdp"] <= 1.4 * eps["pld"]
    assert eps["reported"] == min(eps["rdp"], eps["pld"], eps["unamplified"])
    # after round 1 only one step has happened
    first = MECH.release_epsilon(params, 1)
    assert first["pld"] == pytest.approx(direct_pld_eps(rate * bands, z, 1), rel=0.01)


def test_small_p_is_below_the_cyclic_release_and_p_one_matches_it():
    """At the same sigma and the same C: with p = 0.2 the amplified eps is far below the
    unamplified release's (the cyclic mechanism at G = b); at p = 1 (T a multiple of b,
    every column whole) the k sampled Gaussians are the one Gaussian of S_T = k ||c||^2."""
    small = resolve_params(poisson_cfg(sample_rate=0.05, ftrl_bands=4, noise_multiplier=1.0),
                           20)
    eps = MECH.release_epsilon(small, 20)
    cyclic = ftrl.FtrlPlan.for_run(20, 4, "banded", coefs=small.ftrl.coefs)
    z_cyclic = small.noise_scale / (small.clip * math.sqrt(cyclic.tree_sq))
    from fedem_private.privacy.accounting import gaussian_release_bounds

    assert eps["unamplified"] == pytest.approx(
        gaussian_release_bounds(z_cyclic, DELTA)["reported"], rel=1e-12)
    assert eps["reported"] == eps["pld"] < 0.5 * eps["unamplified"]
    whole = resolve_params(poisson_cfg(sample_rate=0.25, ftrl_bands=4, noise_multiplier=1.0),
                           20)
    eps1 = MECH.release_epsilon(whole, 20)
    assert eps1["pld"] == pytest.approx(eps1["unamplified"], rel=0.01)
    assert eps1["reported"] <= eps1["unamplified"]


def test_a_target_eps_is_met_and_the_ledger_is_unamplified():
    from fedem_private.privacy.ledger import PrivacyLedger

    params = resolve_params(poisson_cfg(epsilon=4.0, noise_multiplier=None, sample_rate=0.05,
                                        ftrl_bands=5), 20)
    eps = MECH.release_epsilon(params, 20)
    assert eps["pld"] == pytest.approx(4.0, abs=1e-3) and eps["reported"] <= 4.0 + 1e-6
    assert MECH.audit_claim(params) == eps["unamplified"] > 4.0
    ledger = PrivacyLedger(params)
    group = np.arange(10) % 5
    for t in range(1, 21):
        entry = ledger.record_round(t, np.flatnonzero(group == (t - 1) % 5))
    assert entry["epsilon"]["reported"] >= eps["unamplified"] * (1 - 1e-9)


def test_the_logged_plan_is_read_back_and_a_cyclic_plan_logs_as_before():
    params = resolve_params(poisson_cfg(sample_rate=0.1, ftrl_bands=3), 12)
    log = json.loads(json.dumps(params.as_log()))
    assert log["ftrl"]["sampling"] == "poisson" and log["ftrl"]["rate"] == pytest.approx(0.3)
    assert MECH.restore_params(log)["ftrl"] == params.ftrl
    cyclic = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=1.0,
                                          sample_rate=0.25, ftrl_strategy="banded"), 12)
    assert "sampling" not in cyclic.as_log()["ftrl"]


# ------------------------------------------------------- (4) refusals, list, help
@pytest.mark.parametrize(("over", "said"), [
    ({"ftrl_strategy": "tree", "ftrl_bands": 0}, "is for --ftrl-strategy banded, not 'tree'"),
    ({"ftrl_strategy": "blt", "ftrl_bands": 0}, "is for --ftrl-strategy banded, not 'blt'"),
    ({"ftrl_sampling": "shuffle"}, "unknown --ftrl-sampling 'shuffle'"),
    ({"accountant": "basic"}, "with rdp or pld, not 'basic'"),  # the central modes' rule
])
def test_settings_it_refuses(over, said):
    with pytest.raises(UserError, match=said):
        poisson_cfg(**over)


def brute_error(rounds: int, bands: int, rate: float, eps: float) -> float:
    """The amplified error built the slow way: z from dp-accounting's PLD of the DP-SGD
    event solved by bisection here, B = A C^{-1} as dense matrices, ||B||_F^2 ||c||^2 z^2."""
    lo, hi = 0.2, 20.0
    steps = -(-rounds // bands)
    for _ in range(12):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if direct_pld_eps(rate * bands, mid, steps, 1e-3) > eps else (lo, mid)
    coefs = mf.optimise_banded(rounds, bands, bands)
    b_mat = np.tril(np.ones((rounds, rounds))) @ np.linalg.inv(dense_c(coefs, rounds))
    return hi * hi * float(np.sum(np.square(coefs))) * float(np.sum(b_mat * b_mat))


def test_bands_zero_picks_the_b_of_least_expected_error_computed_the_slow_way():
    from fedem_private.privacy import ftrl

    rounds, rate, eps = 12, 0.25, 2.0
    slow = {b: brute_error(rounds, b, rate, eps) for b in (1, 2, 3, 4)}
    for b, value in slow.items():  # the fast path is the dense one, within calibration
        assert ftrl.amplified_error(rounds, b, rate, eps, DELTA) == pytest.approx(value,
                                                                                   rel=2e-2)
    params = resolve_params(poisson_cfg(epsilon=eps, noise_multiplier=None, sample_rate=rate,
                                        ftrl_bands=0), rounds)
    assert params.ftrl.groups == min(slow, key=slow.get)
    assert params.ftrl.rate == pytest.approx(rate * params.ftrl.groups)
    assert params.ftrl.groups <= 1 / rate  # q b <= 1: 6, 8, ... are never offered here


def test_bands_zero_needs_an_epsilon_to_compare_at():
    with pytest.raises(UserError, match="--ftrl-bands 0 .* needs --epsilon"):
        resolve_params(poisson_cfg(ftrl_bands=0), 20)


def test_too_many_bands_for_the_rate_is_refused_at_calibration():
    with pytest.raises(UserError, match=r"p = q b = 1.5 <= 1: give at most 10 bands"):
        resolve_params(poisson_cfg(sample_rate=0.1, ftrl_bands=15), 30)
    with pytest.raises(UserError, match="--ftrl-bands b in 1..3"):
        resolve_params(poisson_cfg(sample_rate=0.1, ftrl_bands=4), 3)


def test_the_command_line_refuses_poisson_with_the_tree_in_one_line(capsys):
    from fedem_private.cli import main

    assert main(["run", "--privacy", "dp-ftrl", "--epsilon", "4", "--sample-rate", "0.25",
                 "--ftrl-sampling", "poisson", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ftrl-sampling poisson" in err


def test_list_and_help_say_when_it_applies(capsys):
    from fedem_private.cli import main

    assert main(["list"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert [n for k, n in rows if k == "ftrl-sampling"] == ["cyclic", "poisson"]
    with pytest.raises(SystemExit):
        main(["run", "--help-all"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--ftrl-sampling" in text and "banded only, with --ftrl-bands b" in text


# ------------------------------------------------------------------- (5) a run
def test_a_run_states_the_sampling_and_its_amplification(tmp_path, capsys):
    from fedem_private.cli import main

    out = tmp_path / "run"
    assert main(["run", "--dataset", "synthetic", "--privacy", "dp-ftrl", "--ftrl-strategy",
                 "banded", "--ftrl-sampling", "poisson", "--ftrl-bands", "2",
                 "--noise-multiplier", "1", "--sample-rate", "0.25", "--clip", "0.5",
                 "--rounds", "4", "--local-epochs", "1", "--dim", "4", "--no-progress",
                 "--out", str(out)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:")]
    assert line and "amplification: Poisson within b-min-sep groups" in line[0]
    assert "no amplification" not in line[0]
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["sampling"] == "poisson"
    assert privacy["amplification"] == "Poisson within b-min-sep groups"
    assert "no sampling amplification" not in privacy["description"]
    assert "add/remove" in privacy["neighbouring"] and privacy["trust_model"]
    assert privacy["participation"]["poisson_rate"] == pytest.approx(0.5)
    assert privacy["participation"]["pattern"].startswith("b-min-sep Poisson sampling")
    dp = privacy["dp_ftrl"]
    assert dp["dpsgd_equivalent"] == {"sample_rate": 0.5, "noise_multiplier": 1.0,
                                      "steps_planned": 2, "steps_released": 2}
    eps = privacy["epsilon"]
    assert eps["reported"] == pytest.approx(direct_pld_eps(0.5, 1.0, 2), rel=0.01)
    assert "Poisson within b-min-sep groups" in privacy["epsilon_view"]
    assert "/ (q N)" in dp["variant"] and "q N" in privacy["aggregation_weights"]


# ------------------------------------------------------ (6) the neighbour worlds
POISSON = {"clip": 0.05, "noise_multiplier": 1.0, "sample_rate": 0.4,
           "ftrl_strategy": "banded", "ftrl_sampling": "poisson", "ftrl_bands": 2}


def test_the_neighbour_harness_meets_it_and_would_catch_a_halved_claim(monkeypatch):
    from fedem_private.experiments import neighbours as nb

    cfg = nb.make_config("dp-ftrl", method="fedmf", settings=POISSON)
    found = nb.run_pair(cfg)
    assert found.sound and found.target_gap > 0.5, found.violations
    monkeypatch.setattr(MECH, "claimed_gap", classmethod(lambda cls, c: (2, c.clip / 2)))
    assert not nb.run_pair(cfg).sound


def test_removing_a_user_from_the_data_moves_no_other_release():
    from fedem_private.experiments import neighbours as nb

    cfg = nb.make_config("dp-ftrl", method="fedmf",
                         settings={**POISSON, "public_population": 200, "sample_rate": 0.2})
    found = nb.removal_pair(cfg, nb.population_split())
    assert found.sound, found.violations
    assert 0 < found.target_gap <= 1 + nb.BOUND_SLACK


# ------------------------------------------------------------- (7) the canary audit
def test_the_canary_audit_holds_the_unamplified_release_and_catches_half_the_noise():
    from attacks.canary import canary_audit

    params = resolve_params(poisson_cfg(sample_rate=0.125, ftrl_bands=4, clip=1.0,
                                        noise_multiplier=1.5), 16)
    sound = canary_audit(params, seed=4, n_clients=20_000)
    claim = MECH.release_epsilon(params, 16)["unamplified"]
    assert sound["eps_claimed"] == pytest.approx(claim)
    assert sound["mu_claimed"] == pytest.approx(
        math.sqrt(params.ftrl.tree_sq) * params.clip / params.noise_scale)
    assert sound["audit_ok"] is True
    half = canary_audit(params, seed=4, n_clients=20_000, noise_factor=0.5)
    assert half["audit_ok"] is False
