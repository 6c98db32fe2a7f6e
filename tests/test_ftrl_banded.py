"""dp-ftrl --ftrl-strategy banded (issue 81; fedem_private/privacy/mf.py, privacy/ftrl.py).

Checked against slow, obvious references written here apart from the implementation: the
dense matrices (C built entry by entry, C^{-1} and B = A C^{-1} by numpy's solver), the
streamed noise against the dense B z, the sensitivity by enumerating every participation
pattern (every cyclic cohort, every min-separated set of rounds) and every sign of a
scalar contribution, the eps by dp-accounting directly, the optimiser against the tree
and against scipy's Nelder-Mead on the dense objective, a run end to end, the
neighbour-world harness, and jax-privacy's Toeplitz functions where it is installed.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle

import numpy as np
import pytest
import torch

from fedem_private.errors import UserError
from fedem_private.privacy import ftrl, mf, registry
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params

MECH = registry.mechanism_for("dp-ftrl")


# ------------------------------------------------------------------ naive references
def dense_c(coefs, n: int) -> np.ndarray:
    """C[t, s] = c_{t-s} for 0 <= t - s < b, entry by entry."""
    out = np.zeros((n, n))
    for t in range(n):
        for s in range(t + 1):
            if t - s < len(coefs):
                out[t, s] = coefs[t - s]
    return out


def prefix_ones(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n)))


def brute_squared(cmat: np.ndarray, patterns) -> float:
    """max over the patterns S and the signs of unit scalar contributions g_s = +-1 of
    ||C g||^2: the worst change of C x when one client takes part in S."""
    best = 0.0
    for pattern in patterns:
        for signs in itertools.product((-1.0, 1.0), repeat=len(pattern)):
            g = np.zeros(cmat.shape[1])
            g[list(pattern)] = signs
            best = max(best, float(np.sum((cmat @ g) ** 2)))
    return best


def cyclic_patterns(rounds: int, groups: int):
    """Each cohort's rounds (0-based): g, g + G, ..."""
    return [tuple(range(g, rounds, groups)) for g in range(min(groups, rounds))]


def minsep_patterns(rounds: int, sep: int, k: int):
    """Every non-empty set of at most k rounds (0-based) pairwise at least sep apart."""
    out = []
    for size in range(1, k + 1):
        for pattern in itertools.combinations(range(rounds), size):
            if all(b - a >= sep for a, b in itertools.pairwise(pattern)):
                out.append(pattern)
    return out


def assert_random_directions_within(c: np.ndarray, groups: int, bound: float) -> None:
    """300 draws of contributions in 4 dimensions, norm <= 1, alternately on the worst
    cohort (every 4th round) and on a random pattern of at most 5 rounds ``groups`` apart:
    ||C G||_F^2 never exceeds ``bound`` (the strategy's S_T)."""
    gen = np.random.default_rng(1)
    rounds = c.shape[1]
    patterns = minsep_patterns(rounds, groups, 5)
    for i in range(300):
        pattern = patterns[gen.integers(len(patterns))] if i % 2 else range(0, rounds, 4)
        g = np.zeros((rounds, 4))
        for s in pattern:
            v = gen.normal(size=4)
            g[s] = v / max(np.linalg.norm(v), 1.0)
        assert float(np.sum((c @ g) ** 2)) <= bound + 1e-9


def tree_error(rounds: int, groups: int) -> float:
    """The tree's ||B||_F^2 x S_T: each prefix sums popcount(t) i.i.d. nodes."""
    nodes = sum(bin(t).count("1") for t in range(1, rounds + 1))
    return nodes * ftrl.tree_squared_sensitivity(rounds, groups)[0]


def dense_error(coefs, rounds: int, groups: int) -> float:
    """||A C^{-1}||_F^2 x (the brute-force cyclic squared sensitivity)."""
    c = dense_c(coefs, rounds)
    b = prefix_ones(rounds) @ np.linalg.inv(c)
    return float(np.sum(b * b)) * brute_squared(c, cyclic_patterns(rounds, groups))


# ------------------------------------------------------------ (1) the factorisation
@pytest.mark.parametrize("coefs", [(1.0,), (1.0, 0.5), (1.0, 0.6, 0.3, -0.2), (1.0, -0.9, 0.1)])
def test_the_coefficients_are_the_dense_inverse_and_decoder(coefs):
    n = 12
    c = dense_c(coefs, n)
    assert np.array_equal(mf.toeplitz_matrix(np.array(coefs), n), c)
    inv = np.linalg.inv(c)
    np.testing.assert_allclose(mf.inverse_coefs(np.array(coefs), n), inv[:, 0], atol=1e-12)
    b = prefix_ones(n) @ inv
    np.testing.assert_allclose(mf.decoder_coefs(np.array(coefs), n), b[:, 0], atol=1e-12)
    np.testing.assert_allclose(b @ c, prefix_ones(n), atol=1e-12)  # A = B C
    assert mf.decoder_squared_norm(np.array(coefs), n) == pytest.approx(np.sum(b * b),
                                                                        rel=1e-12)


def test_the_streamed_noise_is_the_dense_c_inverse_z_in_o_b_memory():
    """w_t from the recurrence equals (C^{-1} Z)_t row by row; the stream never keeps more
    than b - 1 past vectors."""
    gen = np.random.default_rng(0)
    coefs = (1.0, 0.55, 0.31, 0.12)
    n = 30
    z = gen.normal(size=(n, 3, 2))
    dense = np.linalg.solve(dense_c(coefs, n), z.reshape(n, -1)).reshape(z.shape)
    stream = mf.BandedNoise(coefs)
    for t in range(n):
        w = stream.step(torch.from_numpy(z[t]))
        np.testing.assert_allclose(w.numpy(), dense[t], rtol=0, atol=1e-12)
        assert len(stream._past) <= len(coefs) - 1
    assert stream.round == n


def _run_banded(rounds, shapes, sigma, seed, coefs):
    """Drive a BandedSecureSum round by round with a chained base; returns the releases
    and the leaves x_t (each one unclipped client: its delta is below C)."""
    gen = torch.Generator().manual_seed(5)
    summed = ftrl.BandedSecureSum(clip=10.0, sigma=sigma, expected_count=1.0, seed=seed,
                                  rounds=rounds, coefs=coefs)
    bases: dict = {}
    out, leaves = [], []
    for t in range(1, rounds + 1):
        shape = shapes(t)
        summed.begin_round(t)
        delta = torch.randn((1, *shape), generator=gen, dtype=torch.float64) * 0.1
        summed.add(torch.zeros_like(delta), delta)
        leaves.append(delta[0])
        base = bases.get(shape, torch.zeros(shape, dtype=torch.float64))
        bases[shape] = summed.release(base.unsqueeze(0))[0]
        out.append(bases[shape].clone())
    return out, leaves


def test_the_released_prefix_sums_are_a_x_plus_b_z():
    """theta_t - theta_0 = sum_{s <= t} x_s + (A C^{-1} Z)_t, Z's rows the keyed draws."""
    rounds, sigma, seed, coefs = 11, 0.8, 4, (1.0, 0.5, 0.25)
    out, leaves = _run_banded(rounds, lambda t: (2, 3), sigma, seed, coefs)
    z = torch.stack([ftrl.node_noise((2, 3), sigma, seed=seed, node=t)
                     for t in range(1, rounds + 1)]).reshape(rounds, -1).numpy()
    bz = prefix_ones(rounds) @ np.linalg.solve(dense_c(coefs, rounds), z)
    for t in range(1, rounds + 1):
        truth = torch.stack(leaves[:t]).sum(0).numpy().ravel()
        np.testing.assert_allclose(out[t - 1].numpy().ravel(), truth + bz[t - 1],
                                   rtol=0, atol=1e-10)


def test_a_new_shape_streams_its_own_noise_from_round_one():
    """From round 4 the released shape changes (a FedPEFT warm-up ending): its releases are
    its own leaves plus (B Z')_t, Z' its own phase's draws, rounds 1..3 leaves of zero."""
    rounds, sigma, seed, coefs = 8, 0.5, 2, (1.0, 0.4)
    out, leaves = _run_banded(rounds, lambda t: (4,) if t < 4 else (2, 2), sigma, seed, coefs)
    z = torch.stack([ftrl.node_noise((2, 2), sigma, seed=seed, node=t, phase=1)
                     for t in range(1, rounds + 1)]).reshape(rounds, -1).numpy()
    bz = prefix_ones(rounds) @ np.linalg.solve(dense_c(coefs, rounds), z)
    for t in range(4, rounds + 1):
        truth = torch.stack(leaves[3:t]).sum(0).numpy().ravel()
        np.testing.assert_allclose(out[t - 1].numpy().ravel(), truth + bz[t - 1],
                                   rtol=0, atol=1e-10)


# ----------------------------------------------------------------- (2) sensitivity
@pytest.mark.parametrize("rounds", [1, 2, 3, 5, 7, 9])
def test_the_cyclic_sensitivity_matches_enumeration_at_every_prefix(rounds):
    """For every G and every b <= min(G, T), the plan's S_t equals the brute force over every
    cohort and every sign at every prefix t, and equals the (k, G)-min-separation bound
    (every set of <= ceil(T/G) rounds G apart) at T: b <= G columns never overlap."""
    gen = np.random.default_rng(rounds)
    for groups in range(1, rounds + 2):
        k = math.ceil(rounds / groups)
        for bands in range(1, min(groups, rounds) + 1):
            coefs = (1.0, *gen.normal(size=bands - 1))  # any signs
            plan = ftrl.FtrlPlan.for_run(rounds, groups, "banded", coefs=coefs)
            for t in range(1, rounds + 1):
                c_t = dense_c(coefs, t)
                brute = brute_squared(c_t, cyclic_patterns(t, groups))
                assert plan.squared_at(t) == pytest.approx(brute, rel=1e-12, abs=1e-12)
            c = dense_c(coefs, rounds)
            minsep = brute_squared(c, minsep_patterns(rounds, groups, k))
            assert plan.tree_sq == pytest.approx(minsep, rel=1e-12)
            assert mf.minsep_squared_sensitivity(np.array(coefs), rounds, groups, k) == \
                pytest.approx(minsep, rel=1e-12)
            norm2 = float(np.sum(np.square(coefs)))
            assert plan.tree_sq <= k * norm2 + 1e-12  # sqrt(k) x the largest column norm
            if (k - 1) * groups + bands <= rounds:  # the k-th column whole: equality
                assert plan.tree_sq == pytest.approx(k * norm2, rel=1e-12)
            assert plan.participation_sq <= norm2 + 1e-12
            assert plan.max_participations == k


def test_random_directions_never_exceed_the_sensitivity():
    """Contributions in 4 dimensions, norm <= 1, on the worst cohort and on random
    min-separated patterns: ||C G||_F^2 never exceeds S_T."""
    rounds, groups, coefs = 20, 4, (1.0, 0.7, -0.4, 0.2)
    plan = ftrl.FtrlPlan.for_run(rounds, groups, "banded", coefs=coefs)
    assert_random_directions_within(dense_c(coefs, rounds), groups, plan.tree_sq)


def test_overlapping_columns_break_the_column_norm_bound():
    """Why b <= G is required: with b = 2 > G = 1 and a positive c_1 one client's columns
    overlap, and the brute force exceeds the sum of its column norms; with a negative c_1
    signs matter too. The configuration refuses b > G."""
    rounds = 4
    c = dense_c((1.0, 0.5), rounds)
    brute = brute_squared(c, cyclic_patterns(rounds, 1))
    assert brute > float(np.sum(c * c)) + 0.5
    c_neg = dense_c((1.0, -0.5), rounds)
    all_plus = float(np.sum((c_neg @ np.ones(rounds)) ** 2))
    assert brute_squared(c_neg, cyclic_patterns(rounds, 1)) > all_plus
    with pytest.raises(ValueError, match="needs G >= 2"):
        mf.cyclic_squared_curve(np.array([1.0, 0.5]), rounds, 1)
    with pytest.raises(UserError, match="at most G = ceil"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, sample_rate=0.5, ftrl_strategy="banded",
                      ftrl_bands=3)


# --------------------------------------------------------------- (3) the optimiser
def test_the_gradient_is_the_finite_difference():
    gen = np.random.default_rng(2)
    rounds = 40
    v = np.zeros(rounds)
    v[::5] = 1.0
    free = gen.uniform(0.1, 0.6, size=4)
    _, grad = mf._objective(free, rounds, v)
    for j in range(free.size):
        step = np.zeros_like(free)
        step[j] = 1e-6
        num = (mf._objective(free + step, rounds, v)[0]
               - mf._objective(free - step, rounds, v)[0]) / 2e-6
        assert grad[j] == pytest.approx(num, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("rounds", [4, 12, 33, 100])
def test_banded_has_no_more_error_than_the_tree(rounds):
    """The optimised banded plan's total squared error ||B||_F^2 x S_T (recomputed from the
    dense matrices and the brute-force sensitivity for T <= 12) is at most the tree's, and
    at most b = 1's (independent noise each round), for every G; below 0.8 of the tree's
    from T = 12 with G >= 2."""
    for groups in sorted({1, 2, 3, 4, 10, rounds // 2 or 1, rounds, rounds + 3}):
        plan = ftrl.FtrlPlan.for_run(rounds, groups, "banded")
        assert plan.bands == min(groups, rounds)
        ours = mf.decoder_squared_norm(np.array(plan.coefs), rounds) * plan.tree_sq
        if rounds <= 12:
            assert ours == pytest.approx(dense_error(plan.coefs, rounds, groups), rel=1e-9)
        assert ours <= tree_error(rounds, groups) * (1 + 1e-9)
        independent = rounds * (rounds + 1) / 2 * math.ceil(rounds / groups)
        assert ours <= independent * (1 + 1e-9)
        if rounds >= 12 and groups >= 2:  # a real gain where there is room for one
            assert ours < 0.8 * tree_error(rounds, groups)


def test_the_optimum_is_not_beaten_by_another_solver():
    """scipy's Nelder-Mead from three random starts, on the dense objective computed
    here, finds nothing better than the plan's coefficients (T = 24, G = b = 3)."""
    from scipy import optimize

    rounds, groups = 24, 3
    plan = ftrl.FtrlPlan.for_run(rounds, groups, "banded")

    def dense(free):
        return dense_error((1.0, *free), rounds, groups)

    ours = dense(plan.coefs[1:])
    gen = np.random.default_rng(3)
    for _ in range(3):
        found = optimize.minimize(dense, gen.uniform(-0.5, 1.0, size=2), method="Nelder-Mead",
                                  options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000})
        assert ours <= found.fun * (1 + 1e-6)


# ----------------------------------------------------------------- (4) accounting
@pytest.mark.parametrize("z", [0.7, 2.0])
def test_the_eps_is_recomputed_independently(z):
    """T = 30, G = 5, --noise-multiplier z: sigma over the brute-force sensitivity gives z
    back, and the reported eps is dp-accounting's PLD of GaussianDpEvent(z)."""
    import dp_accounting
    from dp_accounting import pld

    p = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=z, sample_rate=0.2,
                                     clip=0.3, ftrl_strategy="banded"), 30)
    assert p.ftrl is not None and p.ftrl.strategy == "banded" and p.ftrl.bands == 5
    c = dense_c(p.ftrl.coefs, 30)
    sens = 0.3 * math.sqrt(brute_squared(c, cyclic_patterns(30, 5)))
    assert p.noise_scale / sens == pytest.approx(z, rel=1e-9)
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(p.noise_scale / sens))
    assert MECH.release_epsilon(p, 30)["reported"] == pytest.approx(acc.get_epsilon(1e-5),
                                                                    rel=0.01)


def assert_ledger_conservative(p, rounds: int, clients: int = 12, groups: int = 4) -> None:
    """Over ``rounds`` of cyclic cohorts, the release's eps never falls and the per-client
    ledger (the clients' actual rounds) never reads below it."""
    from fedem_private.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger(p)
    group = np.arange(clients) % groups
    last = 0.0
    for t in range(1, rounds + 1):
        entry = ledger.record_round(t, np.flatnonzero(group == (t - 1) % groups))
        ours = MECH.release_epsilon(p, t)["reported"]
        assert ours >= last - 1e-12
        last = ours
        assert entry["epsilon"]["reported"] >= ours * (1 - 1e-9)


def test_a_target_eps_is_met_at_the_last_round_and_the_ledger_is_conservative():
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=4.0, sample_rate=0.25,
                                     ftrl_strategy="banded"), 40)
    assert MECH.release_epsilon(p, 40)["reported"] == pytest.approx(4.0, abs=1e-6)
    assert_ledger_conservative(p, 40)


def test_the_logged_plan_is_read_back_exactly():
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=2.0, sample_rate=0.1,
                                     ftrl_strategy="banded", ftrl_bands=6), 50)
    logged = json.loads(json.dumps(p.as_log()))
    back = MECH.restore_params(logged)["ftrl"]
    assert back == p.ftrl and back.bands == 6
    tree = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=2.0, sample_rate=0.1), 50)
    assert "strategy" not in tree.as_log()["ftrl"]  # a tree plan logs as before
    assert MECH.restore_params(json.loads(json.dumps(tree.as_log())))["ftrl"] == tree.ftrl


# ----------------------------------------------------------- (5) options and a run
def test_options_it_refuses():
    with pytest.raises(UserError, match="unknown --ftrl-strategy 'toeplitz'"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, ftrl_strategy="toeplitz")
    with pytest.raises(UserError, match="--ftrl-bands is for --ftrl-strategy banded"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, sample_rate=0.25, ftrl_bands=2)
    with pytest.raises(UserError, match="integer >= 0"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, ftrl_strategy="banded", ftrl_bands=-1)
    with pytest.raises(UserError, match="--ftrl-strategy .* is for --privacy dp-ftrl"):
        PrivacyConfig(mode="cdp-gaussian", epsilon=1.0, sample_rate=0.5,
                      ftrl_strategy="banded")
    with pytest.raises(UserError, match="at most the 3 planned rounds"):
        resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=1.0, sample_rate=0.1,
                                     ftrl_strategy="banded", ftrl_bands=5), 3)


def test_list_and_help_name_the_strategies(capsys):
    from fedem_private.cli import main

    assert main(["list"]) == 0
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert [n for k, n in rows if k == "ftrl-strategy"] == ["tree", "banded", "blt"]
    with pytest.raises(SystemExit):
        main(["run", "--help-all"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--ftrl-strategy" in text and "banded: a b-banded Toeplitz" in text
    assert "at least G rounds apart" in text and "--ftrl-bands" in text


def test_a_run_end_to_end_states_its_strategy(tmp_path, capsys):
    from fedem_private.cli import main

    out = tmp_path / "run"
    assert main(["run", "--dataset", "synthetic", "--privacy", "dp-ftrl", "--ftrl-strategy",
                 "banded", "--epsilon", "4", "--sample-rate", "0.25", "--clip", "0.5",
                 "--rounds", "6", "--local-epochs", "1", "--dim", "4", "--no-progress",
                 "--out", str(out)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:")]
    assert line and "eps spent (worst client) 4" in line[0]
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["epsilon"]["reported"] == pytest.approx(4.0, abs=1e-6)
    assert privacy["dp_ftrl"]["strategy"] == "banded" and privacy["dp_ftrl"]["bands"] == 4
    assert len(privacy["dp_ftrl"]["coefficients"]) == 4
    assert "min-separation" in privacy["participation"]["also_valid_for"]
    assert privacy["epsilon_ledger"]["reported"] >= privacy["epsilon"]["reported"] - 1e-9


# ------------------------------------------------------- (6) the neighbour worlds
#: a small dp-ftrl run for the neighbour worlds, per Toeplitz strategy (BLT's tests use it too)
TOEPLITZ = {name: {"clip": 0.05, "noise_multiplier": 1.0, "sample_rate": 0.5,
                   "ftrl_strategy": name} for name in ("banded", "blt")}


@pytest.mark.parametrize("strategy", sorted(TOEPLITZ))
def test_the_neighbour_harness_meets_the_strategy_and_would_catch_a_halved_claim(
        monkeypatch, strategy):
    """Each round's released increment moves by at most C when TARGET is removed (the
    streamed noise is shared by the worlds); a claim of C / 2 fails."""
    from fedem_private.experiments import neighbours as nb

    cfg = nb.make_config("dp-ftrl", method="fedmf", settings=TOEPLITZ[strategy])
    assert cfg.privacy.ftrl_strategy == strategy
    found = nb.run_pair(cfg)
    assert found.sound and found.target_gap > 0.5, found.violations
    monkeypatch.setattr(MECH, "claimed_gap", classmethod(lambda cls, c: (2, c.clip / 2)))
    assert not nb.run_pair(cfg).sound


@pytest.mark.parametrize("strategy", sorted(TOEPLITZ))
def test_a_resumed_run_continues_the_same_streamed_noise(strategy):
    from fedem_private.experiments import neighbours as nb
    from fedem_private.simulation.loop import Simulation

    cfg = nb.make_config("dp-ftrl", method="fedmf", settings=TOEPLITZ[strategy])
    split = nb.base_split()
    whole = Simulation(cfg, split)
    for _ in range(3):
        whole.step()
    part = Simulation(cfg, split)
    for _ in range(2):
        part.step()
    resumed = pickle.loads(pickle.dumps(part))
    resumed.attach_split(split)
    resumed.step()
    assert torch.equal(whole.state.q_global, resumed.state.q_global)


# ------------------------------------------------------ (7) jax-privacy, where installed
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")
@pytest.mark.usefixtures("jax_x64")
def test_jax_privacy_computes_the_same_toeplitz_quantities():
    """jax-privacy's inverse coefficients and min-sep sensitivity of the optimised banded
    strategy equal ours (optional extra [ftrl]; skipped without it)."""
    toeplitz = pytest.importorskip("jax_privacy.matrix_factorization.toeplitz")
    for rounds, groups in ((16, 4), (30, 5), (40, 10)):
        plan = ftrl.FtrlPlan.for_run(rounds, groups, "banded")
        coefs = np.array(plan.coefs)
        np.testing.assert_allclose(np.asarray(toeplitz.inverse_coef(coefs, n=rounds)),
                                   mf.inverse_coefs(coefs, rounds), rtol=1e-6, atol=1e-9)
        theirs = float(toeplitz.minsep_sensitivity_squared(
            coefs, min_sep=groups, max_participations=plan.max_participations, n=rounds))
        assert theirs == pytest.approx(plan.tree_sq, rel=1e-6)


# ------------------------------------------------------------ (8) the canary audit
def test_the_canary_audit_runs_the_banded_release_and_catches_half_the_noise():
    """attacks/canary.py on a banded plan (T = 16, G = 4): without noise the statistic is
    C S_T present and 0 absent; with the run's sigma the groups sit 1 / z apart; the sound
    release passes at its whole eps and half the noise is caught."""
    import dataclasses

    from attacks.canary import canary_audit, canary_scores

    params = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=4.0, sample_rate=0.25,
                                          clip=1.0, ftrl_strategy="banded"), 16)
    plan = params.ftrl
    quiet = dataclasses.replace(params, noise_scale=0.0)
    scores, labels = canary_scores(quiet, n_clients=100, seed=2)
    np.testing.assert_allclose(scores, plan.tree_sq * labels, atol=1e-9)
    scores, labels = canary_scores(params, n_clients=40_000, seed=2)
    s, y = scores[:, 0], labels[:, 0] == 1.0
    sd = math.sqrt((s[y].var() + s[~y].var()) / 2)
    assert sd == pytest.approx(params.noise_scale * math.sqrt(plan.tree_sq), rel=0.02)
    assert (s[y].mean() - s[~y].mean()) / sd == pytest.approx(1 / params.noise_multiplier,
                                                              abs=0.04)
    sound = canary_audit(params, seed=4, n_clients=20_000)
    assert sound["eps_claimed"] == pytest.approx(4.0, rel=1e-6)
    assert sound["audit_ok"] is True and sound["eps_lower_bound"] <= 4.0
    half = canary_audit(params, seed=4, n_clients=20_000, noise_factor=0.5)
    assert half["audit_ok"] is False and half["eps_lower_bound"] > 4.0


def test_a_tree_runs_identity_is_unchanged_and_banded_enters_it():
    """Run directories written before issue 81 keep their identity: the new options enter
    a config's identity only when set."""
    from fedem_private.simulation.config import RunConfig, identity_dict, with_overrides

    base = {"privacy.mode": "dp-ftrl", "privacy.epsilon": 4.0, "privacy.sample_rate": 0.25}
    tree = identity_dict(with_overrides(RunConfig(), base).validate().resolved())["privacy"]
    assert "ftrl_strategy" not in tree and "ftrl_bands" not in tree
    banded = identity_dict(with_overrides(RunConfig(), {
        **base, "privacy.ftrl_strategy": "banded"}).validate().resolved())["privacy"]
    assert banded["ftrl_strategy"] == "banded"


def test_bands_with_a_cohort_size_are_checked_against_the_cohorts_rate(tmp_path, capsys):
    """--ftrl-bands b with --cohort-size K: G = ceil(n / K) is known only once n is, so b is
    checked then (it was refused against q = 1 before); b > G is still refused, in one
    line."""
    from fedem_private.cli import main

    base = ["run", "--dataset", "synthetic", "--rounds", "3", "--privacy", "dp-ftrl",
            "--epsilon", "4", "--ftrl-strategy", "banded", "--cohort-size", "100",
            "--client-tables", "global", "--local-epochs", "1"]
    assert main([*base, "--ftrl-bands", "3", "--out", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    assert main([*base, "--ftrl-bands", "7", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert "at most G = ceil(1/q) = 6 bands" in err and len(err.splitlines()) == 1
