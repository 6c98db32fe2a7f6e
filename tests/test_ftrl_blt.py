"""dp-ftrl --ftrl-strategy blt (issue 81; fedem_private/privacy/blt.py, privacy/ftrl.py).

Checked against slow, obvious references written here apart from the implementation: the
coefficients summed term by term, C and C^{-1} as dense matrices (numpy's solver), the
streamed noise against the dense C^{-1} Z, the sensitivity by enumerating every
participation pattern (every cyclic cohort, every min-separated set of rounds) and every
sign of a scalar contribution, the eps by dp-accounting directly, the optimiser against the
tree, the banded strategy and scipy's Nelder-Mead on the dense objective, a run end to end,
the neighbour-world harness, the canary audit, and jax-privacy's BLT where it is installed.
"""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
import torch
from test_ftrl_banded import (
    assert_ledger_conservative,
    assert_random_directions_within,
    brute_squared,
    cyclic_patterns,
    minsep_patterns,
    prefix_ones,
    tree_error,
)

from fedem_private.errors import UserError
from fedem_private.privacy import blt, ftrl, mf, registry
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params

MECH = registry.mechanism_for("dp-ftrl")
PARAMS = ((0.3, 0.25), (0.9, 0.6))  # (omega, theta) of a 2-buffer BLT


def naive_coefs(omega, theta, n: int) -> list[float]:
    """c_0 = 1, c_k = sum_j omega_j theta_j^(k-1), term by term."""
    return [1.0] + [sum(w * th ** (k - 1) for w, th in zip(omega, theta, strict=True))
                    for k in range(1, n)]


def dense_c(omega, theta, n: int) -> np.ndarray:
    c = naive_coefs(omega, theta, n)
    return np.array([[c[t - s] if t >= s else 0.0 for s in range(n)] for t in range(n)])


def random_params(gen: np.random.Generator, d: int) -> tuple[tuple, tuple]:
    """d weights >= 0 summing below 1 and d decays in (0, 1)."""
    w = gen.dirichlet(np.ones(d + 1))[:d]
    return tuple(w), tuple(gen.uniform(0.05, 0.99, size=d))


# ------------------------------------------------------------ (1) the factorisation
def test_the_coefficients_are_eq_1_and_the_constraint_is_enforced():
    np.testing.assert_allclose(blt.blt_coefs(*PARAMS, 12), naive_coefs(*PARAMS, 12),
                               rtol=1e-14)
    c = blt.blt_coefs(*PARAMS, 40)
    assert np.all(c > 0) and np.all(np.diff(c) <= 0)  # the sensitivity rule's condition
    for omega, theta in (((-0.1, 0.5), (0.5, 0.9)), ((0.6, 0.5), (0.5, 0.9)),
                         ((0.3,), (1.0,)), ((0.3,), (0.0,)), ((0.3, 0.2), (0.5,))):
        with pytest.raises(ValueError):
            blt.blt_coefs(omega, theta, 5)


def test_the_streamed_noise_is_the_dense_c_inverse_z_in_o_d_memory():
    """w_t from the d buffers equals (C^{-1} Z)_t to 1e-10, and a pickled stream resumed
    midway continues the same numbers."""
    gen = np.random.default_rng(0)
    n = 40
    z = gen.normal(size=(n, 3, 2))
    dense = np.linalg.solve(dense_c(*PARAMS, n), z.reshape(n, -1)).reshape(z.shape)
    stream = blt.BLTNoise(*PARAMS)
    for t in range(n):
        if t == 17:
            stream = pickle.loads(pickle.dumps(stream))
        w = stream.step(torch.from_numpy(z[t]))
        np.testing.assert_allclose(w.numpy(), dense[t], rtol=0, atol=1e-10)
        assert len(stream._buffers) == 2
    assert stream.round == n


def test_the_released_prefix_sums_are_a_x_plus_b_z():
    """theta_t - theta_0 = sum_{s <= t} x_s + (A C^{-1} Z)_t through the run's BLTSecureSum,
    Z's rows the keyed draws."""
    rounds, sigma, seed = 11, 0.8, 4
    gen = torch.Generator().manual_seed(5)
    summed = ftrl.BLTSecureSum(clip=10.0, sigma=sigma, expected_count=1.0, seed=seed,
                               rounds=rounds, omega=PARAMS[0], theta=PARAMS[1])
    base = torch.zeros((1, 2, 3), dtype=torch.float64)
    leaves, out = [], []
    for t in range(1, rounds + 1):
        summed.begin_round(t)
        delta = torch.randn((1, 2, 3), generator=gen, dtype=torch.float64) * 0.1
        summed.add(torch.zeros_like(delta), delta)
        leaves.append(delta[0])
        base = summed.release(base)
        out.append(base[0].clone())
    z = torch.stack([ftrl.node_noise((2, 3), sigma, seed=seed, node=t)
                     for t in range(1, rounds + 1)]).reshape(rounds, -1).numpy()
    bz = prefix_ones(rounds) @ np.linalg.solve(dense_c(*PARAMS, rounds), z)
    for t in range(1, rounds + 1):
        truth = torch.stack(leaves[:t]).sum(0).numpy().ravel()
        np.testing.assert_allclose(out[t - 1].numpy().ravel(), truth + bz[t - 1],
                                   rtol=0, atol=1e-10)


# ----------------------------------------------------------------- (2) sensitivity
@pytest.mark.parametrize("rounds", [1, 2, 3, 5, 7, 9])
def test_the_cyclic_sensitivity_matches_enumeration_at_every_prefix(rounds):
    """For every G and random BLTs of 1 to 3 buffers, the plan's S_t equals the brute force
    over every cohort and every sign at every prefix t, and S_T equals the brute force over
    every set of <= ceil(T/G) rounds G apart (no b <= G condition here)."""
    gen = np.random.default_rng(rounds)
    for groups in range(1, rounds + 2):
        k = math.ceil(rounds / groups)
        for d in (1, 2, 3):
            omega, theta = random_params(gen, d)
            plan = ftrl.FtrlPlan.for_run(rounds, groups, "blt", blt=(omega, theta))
            assert plan.buffers == d and plan.max_participations == k
            for t in range(1, rounds + 1):
                brute = brute_squared(dense_c(omega, theta, t), cyclic_patterns(t, groups))
                assert plan.squared_at(t) == pytest.approx(brute, rel=1e-12, abs=1e-12)
            minsep = brute_squared(dense_c(omega, theta, rounds),
                                   minsep_patterns(rounds, groups, k))
            assert plan.tree_sq == pytest.approx(minsep, rel=1e-12)
            ratio = max(plan.squared_at(t) / math.ceil(t / groups)
                        for t in range(1, rounds + 1))
            assert plan.participation_sq == pytest.approx(ratio, rel=1e-12)


@pytest.mark.parametrize("rounds", [4, 7, 9])
def test_the_minsep_rule_holds_for_every_separation_and_cap(rounds):
    """minsep_squared_sensitivity(sep, k) is the brute force over every set of at most k
    rounds pairwise >= sep apart, for every sep and k (the earliest packing is the worst)."""
    gen = np.random.default_rng(10 + rounds)
    omega, theta = random_params(gen, 3)
    c = dense_c(omega, theta, rounds)
    for sep in range(1, rounds + 1):
        for k in range(1, math.ceil(rounds / sep) + 2):
            brute = brute_squared(c, minsep_patterns(rounds, sep, k))
            ours = blt.minsep_squared_sensitivity(omega, theta, rounds, sep, k)
            assert ours == pytest.approx(brute, rel=1e-12)


def test_random_directions_never_exceed_the_sensitivity():
    """Contributions in 4 dimensions, norm <= 1, on the worst cohort and on random
    min-separated patterns: ||C G||_F^2 never exceeds S_T (C^T C >= 0: equal unit vectors
    are the worst)."""
    rounds, groups = 20, 4
    plan = ftrl.FtrlPlan.for_run(rounds, groups, "blt", blt=PARAMS)
    assert_random_directions_within(dense_c(*PARAMS, rounds), groups, plan.tree_sq)


def test_outside_the_constraint_the_rule_would_understate():
    """Why negative or increasing coefficients are refused: with a negative weight some
    coefficients are negative and a client's mixed signs beat its all-equal deltas; with
    increasing ones a later pattern beats the earliest."""
    rounds = 6
    neg = mf.toeplitz_matrix(np.array(naive_coefs((0.9, -0.8), (0.5, 0.95), rounds)), rounds)
    assert brute_squared(neg, cyclic_patterns(rounds, 2)) > \
        float(np.sum((neg @ (np.arange(rounds) % 2 == 0)) ** 2)) + 1e-3
    up = mf.toeplitz_matrix(np.array([1.0, 0.1, 0.1, 0.9, 0.1, 0.1]), rounds)
    early = float(np.sum((up @ (np.arange(rounds) % 2 == 0)) ** 2))
    assert brute_squared(up, minsep_patterns(rounds, 2, 3)) > early + 1e-3
    with pytest.raises(ValueError, match="non-increasing"):
        ftrl.FtrlPlan.for_run(rounds, 2, "blt", blt=((0.9, -0.8), (0.5, 0.95)))


# --------------------------------------------------------------- (3) the optimiser
def test_the_gradient_is_the_finite_difference():
    gen = np.random.default_rng(2)
    rounds = 40
    v = mf._cyclic_indicator(rounds, 5)
    free = gen.normal(size=6)
    _, grad = blt._objective(free, rounds, v)
    for j in range(free.size):
        step = np.zeros_like(free)
        step[j] = 1e-6
        num = (blt._objective(free + step, rounds, v)[0]
               - blt._objective(free - step, rounds, v)[0]) / 2e-6
        assert grad[j] == pytest.approx(num, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("rounds", [4, 12, 33, 100])
def test_blt_has_less_error_than_the_tree(rounds):
    """The optimised BLT's total squared error ||B||_F^2 x S_T (from the dense matrices and
    the brute-force sensitivity for T <= 12) is at most the tree's and independent noise's
    for every G; below 0.8 of the tree's from T = 12 with G >= 2; within 15% of the banded
    strategy's (b = min(G, T)) and, for G >= T, within 1% of it."""
    for groups in sorted({1, 2, 3, 4, 10, rounds // 2 or 1, rounds, rounds + 3}):
        plan = ftrl.FtrlPlan.for_run(rounds, groups, "blt")
        ours = blt.decoder_squared_norm(plan.omega, plan.theta, rounds) * plan.tree_sq
        if rounds <= 12:
            c = dense_c(plan.omega, plan.theta, rounds)
            b = prefix_ones(rounds) @ np.linalg.inv(c)
            dense = float(np.sum(b * b)) * brute_squared(c, cyclic_patterns(rounds, groups))
            assert ours == pytest.approx(dense, rel=1e-9)
        assert ours <= tree_error(rounds, groups) * (1 + 1e-9)
        assert ours <= rounds * (rounds + 1) / 2 * math.ceil(rounds / groups) * (1 + 1e-9)
        if rounds >= 12 and groups >= 2:
            assert ours < 0.8 * tree_error(rounds, groups)
        band = ftrl.FtrlPlan.for_run(rounds, groups, "banded")
        banded = mf.decoder_squared_norm(np.array(band.coefs), rounds) * band.tree_sq
        assert ours <= banded * (1.01 if groups >= rounds else 1.15)


def test_the_optimum_is_not_beaten_by_another_solver():
    """scipy's Nelder-Mead from three random starts in the same parametrisation, on the dense
    objective computed here, finds nothing better than the plan (T = 24, G = 3, d = 2)."""
    from scipy import optimize

    rounds, groups = 24, 3
    plan = ftrl.FtrlPlan.for_run(rounds, groups, "blt", buffers=2)
    ones = prefix_ones(rounds)
    v = (np.arange(rounds) % groups == 0).astype(float)

    def dense(omega, theta) -> float:
        c = dense_c(omega, theta, rounds)
        b = ones @ np.linalg.inv(c)
        return float(np.sum(b * b)) * float(np.sum((c @ v) ** 2))

    def free(x) -> float:
        a, th = np.exp(x[:2]), 1 / (1 + np.exp(-x[2:]))
        return dense(a / (1 + a.sum()), th)

    ours = dense(plan.omega, plan.theta)
    gen = np.random.default_rng(3)
    for _ in range(3):
        found = optimize.minimize(free, gen.normal(size=4), method="Nelder-Mead",
                                  options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000})
        assert ours <= found.fun * (1 + 1e-6)


# ----------------------------------------------------------------- (4) accounting
@pytest.mark.parametrize("z", [0.7, 2.0])
def test_the_eps_is_recomputed_independently(z):
    """T = 30, G = 5, --noise-multiplier z: sigma over the brute-force-checked sensitivity
    gives z back, and the reported eps is dp-accounting's PLD of GaussianDpEvent(z)."""
    import dp_accounting
    from dp_accounting import pld

    p = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=z, sample_rate=0.2,
                                     clip=0.3, ftrl_strategy="blt"), 30)
    assert p.ftrl is not None and p.ftrl.strategy == "blt" and p.ftrl.buffers == 3
    c = dense_c(p.ftrl.omega, p.ftrl.theta, 30)
    sens = 0.3 * math.sqrt(float(np.sum((c @ (np.arange(30) % 5 == 0)) ** 2)))
    assert p.noise_scale / sens == pytest.approx(z, rel=1e-9)
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(p.noise_scale / sens))
    assert MECH.release_epsilon(p, 30)["reported"] == pytest.approx(acc.get_epsilon(1e-5),
                                                                    rel=0.01)


def test_a_target_eps_is_met_at_the_last_round_and_the_ledger_is_conservative():
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=4.0, sample_rate=0.25,
                                     ftrl_strategy="blt", ftrl_buffers=2), 40)
    assert p.ftrl is not None and p.ftrl.buffers == 2
    assert MECH.release_epsilon(p, 40)["reported"] == pytest.approx(4.0, abs=1e-6)
    assert_ledger_conservative(p, 40)


def test_the_logged_plan_is_read_back_exactly():
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=2.0, sample_rate=0.1,
                                     ftrl_strategy="blt", ftrl_buffers=4), 50)
    logged = json.loads(json.dumps(p.as_log()))
    assert logged["ftrl"]["strategy"] == "blt" and logged["ftrl"]["buffers"] == 4
    back = MECH.restore_params(logged)["ftrl"]
    assert back == p.ftrl and back.buffers == 4


# ----------------------------------------------------------- (5) options and a run
def test_options_it_refuses():
    with pytest.raises(UserError, match="--ftrl-buffers is for --ftrl-strategy blt"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, ftrl_strategy="banded", ftrl_buffers=2)
    with pytest.raises(UserError, match="integer in 0..8"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, ftrl_strategy="blt", ftrl_buffers=9)
    with pytest.raises(UserError, match="--ftrl-bands is for --ftrl-strategy banded"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, ftrl_strategy="blt", ftrl_bands=2)
    with pytest.raises(UserError, match="--ftrl-buffers .* is for --privacy dp-ftrl"):
        PrivacyConfig(mode="cdp-gaussian", epsilon=1.0, sample_rate=0.5, ftrl_buffers=2)
    with pytest.raises(UserError, match="at most the 3 planned rounds"):
        resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=1.0, sample_rate=0.1,
                                     ftrl_strategy="blt", ftrl_buffers=5), 3)


def test_list_and_help_say_when_blt_applies(capsys):
    from fedem_private.cli import main

    assert main(["list"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.split()[:2] == ["ftrl-strategy", "blt"]]
    assert len(rows) == 1 and "d buffers" in rows[0] and "whatever G" in rows[0]
    with pytest.raises(SystemExit):
        main(["run", "--help"])  # the short help: --ftrl-strategy and each strategy's case
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    assert "tree: the online binary tree" in text and "banded: a b-banded Toeplitz" in text
    assert "blt: a buffered-linear-Toeplitz" in text and "whatever G" in text
    with pytest.raises(SystemExit):
        main(["run", "--help-all"])
    assert "--ftrl-buffers" in capsys.readouterr().out


def test_a_run_end_to_end_states_its_strategy(tmp_path, capsys):
    from fedem_private.cli import main

    out = tmp_path / "run"
    assert main(["run", "--dataset", "synthetic", "--privacy", "dp-ftrl", "--ftrl-strategy",
                 "blt", "--ftrl-buffers", "2", "--epsilon", "4", "--sample-rate", "0.25",
                 "--clip", "0.5", "--rounds", "6", "--local-epochs", "1", "--dim", "4",
                 "--no-progress", "--out", str(out)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:")]
    assert line and "eps spent (worst client) 4" in line[0]
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["epsilon"]["reported"] == pytest.approx(4.0, abs=1e-6)
    dp = privacy["dp_ftrl"]
    assert dp["strategy"] == "blt" and dp["buffers"] == 2 and len(dp["theta"]) == 2
    assert "buffered-linear-Toeplitz" in dp["variant"]
    assert "min-separation" in privacy["participation"]["also_valid_for"]
    assert privacy["epsilon_ledger"]["reported"] >= privacy["epsilon"]["reported"] - 1e-9


# ------------------------------------------------------- (6) the neighbour worlds
# the harness and the resumed noise: tests/test_ftrl_banded.py, parametrised over banded
# and blt


# ------------------------------------------------------ (7) jax-privacy, where installed
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")
@pytest.mark.usefixtures("jax_x64")
def test_jax_privacy_computes_the_same_blt_quantities():
    """jax-privacy's BLT coefficients and min-sep sensitivity of the optimised BLT equal ours
    (optional extra [ftrl]; skipped without it)."""
    buffered = pytest.importorskip("jax_privacy.matrix_factorization.buffered_toeplitz")
    toeplitz = pytest.importorskip("jax_privacy.matrix_factorization.toeplitz")
    for rounds, groups in ((16, 4), (30, 5), (40, 10)):
        plan = ftrl.FtrlPlan.for_run(rounds, groups, "blt")
        theirs = buffered.BufferedToeplitz.build(buf_decay=np.array(plan.theta),
                                                 output_scale=np.array(plan.omega))
        coefs = np.asarray(theirs.toeplitz_coefs(rounds))
        np.testing.assert_allclose(coefs, plan.toeplitz_coefs(rounds), rtol=1e-6)
        sens = float(toeplitz.minsep_sensitivity_squared(
            coefs, min_sep=groups, max_participations=plan.max_participations, n=rounds))
        assert sens == pytest.approx(plan.tree_sq, rel=1e-6)


# ------------------------------------------------------------ (8) the canary audit
def test_the_canary_audit_runs_the_blt_release_and_catches_half_the_noise():
    """attacks/canary.py on a BLT plan (T = 16, G = 4): without noise the statistic is
    C S_T present and 0 absent; the sound release passes at its whole eps and half the noise
    is caught."""
    import dataclasses

    from attacks.canary import canary_audit, canary_scores

    params = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=4.0, sample_rate=0.25,
                                          clip=1.0, ftrl_strategy="blt"), 16)
    plan = params.ftrl
    quiet = dataclasses.replace(params, noise_scale=0.0)
    scores, labels = canary_scores(quiet, n_clients=100, seed=2)
    np.testing.assert_allclose(scores, plan.tree_sq * labels, atol=1e-9)
    sound = canary_audit(params, seed=4, n_clients=20_000)
    assert sound["eps_claimed"] == pytest.approx(4.0, rel=1e-6)
    assert sound["audit_ok"] is True and sound["eps_lower_bound"] <= 4.0
    half = canary_audit(params, seed=4, n_clients=20_000, noise_factor=0.5)
    assert half["audit_ok"] is False and half["eps_lower_bound"] > 4.0


def test_blt_enters_a_runs_identity_only_when_set():
    from fedem_private.simulation.config import RunConfig, identity_dict, with_overrides

    base = {"privacy.mode": "dp-ftrl", "privacy.epsilon": 4.0, "privacy.sample_rate": 0.25}
    banded = identity_dict(with_overrides(RunConfig(), {
        **base, "privacy.ftrl_strategy": "banded"}).validate().resolved())["privacy"]
    assert "ftrl_buffers" not in banded
    ours = identity_dict(with_overrides(RunConfig(), {
        **base, "privacy.ftrl_strategy": "blt", "privacy.ftrl_buffers": 2}
    ).validate().resolved())["privacy"]
    assert ours["ftrl_strategy"] == "blt" and ours["ftrl_buffers"] == 2
