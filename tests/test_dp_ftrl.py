"""dp-ftrl: DP-FTRL by tree aggregation (fedem_private/privacy/ftrl.py; docs/design.md section 5).

Checked here against slow, obvious references written apart from the implementation:
the released prefix sums (a naive dyadic decomposition of every prefix, its node noise
drawn afresh), the tree's L2 sensitivity (every node's leaves listed, every group's
worst-case contribution summed), the eps (dp-accounting's own RDP and PLD accountants,
the Balle-Wang curve solved here, and zCDP's closed form), the participation pattern,
a run end to end, and jax-privacy's sensitivity of the same encoder where it installs.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from fedem_private.errors import UserError
from fedem_private.privacy import ftrl, registry
from fedem_private.privacy.clipping import clip_rows
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params

MECH = registry.mechanism_for("dp-ftrl")


# ------------------------------------------------------------------ naive references
def naive_cover(t: int) -> list[tuple[int, int]]:
    """The dyadic intervals (start, end) partitioning [1, t], greedily from the left, the
    largest power-of-two block that fits first (the textbook binary decomposition)."""
    out, pos = [], 0
    for level in range(t.bit_length(), -1, -1):
        if pos + (1 << level) <= t:
            out.append((pos + 1, pos + (1 << level)))
            pos += 1 << level
    return out


def naive_released_nodes(rounds: int) -> list[tuple[int, int]]:
    """Every interval any prefix [1, t], t <= T, uses: the nodes the run releases."""
    return sorted({iv for t in range(1, rounds + 1) for iv in naive_cover(t)},
                  key=lambda iv: (iv[1], iv[0]))


def naive_squared(rounds: int, groups: int, upto: int | None = None) -> list[float]:
    """sum over released nodes (ending <= upto) of (rounds of group g in the node)^2, per g:
    the squared L2 norm of the change of the node-sum vector when a client of group g whose
    every clipped delta is the same unit vector is added."""
    upto = rounds if upto is None else upto
    out = []
    for g in range(groups):
        mine = {t for t in range(1, rounds + 1) if (t - 1) % groups == g}
        out.append(float(sum(len(mine & set(range(a, b + 1))) ** 2
                             for a, b in naive_released_nodes(rounds) if b <= upto)))
    return out


def balle_wang_epsilon(mu: float, delta: float) -> float:
    """The exact eps of the Gaussian mechanism of mu = sensitivity / sigma (Balle and Wang
    2018, Theorem 8), solved here with scipy.stats.norm."""
    def excess(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    return float(optimize.brentq(excess, 0.0, 500.0, xtol=1e-12))


# ------------------------------------------------------------------------ (1) the tree
def test_the_fenwick_chain_is_the_dyadic_decomposition():
    for t in range(1, 200):
        chain = ftrl.covering_nodes(t)
        assert sorted((ftrl.node_start(e), e) for e in chain) == naive_cover(t)
    assert [iv for iv in naive_released_nodes(16)] == [
        (ftrl.node_start(e), e) for e in range(1, 17)]  # one new node per round


def _run_tree(rounds, shapes, sigma, seed, chunking):
    """Drive a TreeSecureSum round by round with a chained base; returns the releases,
    the clipped leaves x_t and the shape of each round."""
    gen = torch.Generator().manual_seed(7)
    tree = ftrl.TreeSecureSum(clip=1.0, sigma=sigma, expected_count=1.0, seed=seed,
                              rounds=rounds)
    bases: dict[tuple[int, ...], torch.Tensor] = {}
    out, leaves = [], []
    for t in range(1, rounds + 1):
        shape = shapes(t)
        tree.begin_round(t)
        deltas = torch.randn((5, *shape), generator=gen, dtype=torch.float64) * 0.2
        deltas[0] *= 40  # clipped: norm far above C = 1
        sent = torch.zeros_like(deltas)
        order = chunking(t)
        for part in np.array_split(order, 2 if t % 2 else 3):
            if part.size:
                tree.add(sent[part], deltas[part])
        # the leaf: the clipped deltas' sum (clip_rows clips to C (1 - 2^-30), tested apart)
        leaves.append(clip_rows(deltas.clone(), 1.0, "l2")[0].sum(0))
        base = bases.get(shape, torch.zeros(shape, dtype=torch.float64))
        bases[shape] = tree.release(base.unsqueeze(0))[0]
        out.append(bases[shape].clone())
    return out, leaves


def test_released_prefix_sums_are_the_true_sums_plus_the_covering_nodes_noise():
    """(1) theta_t - theta_0 = sum_{s <= t} x_s + sum of the noise of the nodes covering
    [1, t], each node's noise recomputed naively from its key; the chunking and the order
    of the clients change nothing."""
    rounds, sigma, seed = 13, 0.7, 11
    out, leaves = _run_tree(rounds, lambda t: (3, 2), sigma, seed,
                            lambda t: np.arange(5))
    other, _ = _run_tree(rounds, lambda t: (3, 2), sigma, seed,
                         lambda t: np.arange(5)[::-1].copy())
    for t in range(1, rounds + 1):
        truth = torch.stack(leaves[:t]).sum(0)
        noise = sum(ftrl.node_noise((3, 2), sigma, seed=seed, node=b)
                    for _, b in naive_cover(t))
        torch.testing.assert_close(out[t - 1], truth + noise, rtol=0, atol=1e-12)
        torch.testing.assert_close(other[t - 1], out[t - 1], rtol=0, atol=1e-12)
    # a node's noise is N(0, sigma^2) and nodes differ
    big = ftrl.node_noise((200, 50), sigma, seed=seed, node=3)
    assert abs(float(big.std()) - sigma) < 0.03 and abs(float(big.mean())) < 0.01
    assert not torch.equal(big, ftrl.node_noise((200, 50), sigma, seed=seed, node=4))


def test_a_new_shape_gets_its_own_tree_over_the_same_round_indices():
    """A FedPEFT codec's warm-up ends: from round 4 the released shape changes; its
    releases are its own leaves plus its own covering noise (phase 1), leaves before the
    switch being zero."""
    rounds, sigma, seed = 9, 0.5, 3
    out, leaves = _run_tree(rounds, lambda t: (4,) if t < 4 else (2, 3), sigma, seed,
                            lambda t: np.arange(5))
    for t in range(4, rounds + 1):
        truth = torch.stack(leaves[3:t]).sum(0)
        noise = sum(ftrl.node_noise((2, 3), sigma, seed=seed, node=b, phase=1)
                    for _, b in naive_cover(t))
        torch.testing.assert_close(out[t - 1], truth + noise, rtol=0, atol=1e-12)


def test_the_server_receives_ftrl_over_the_expected_cohort():
    """theta_t = theta_0 + P~_t / m with m = n / G: the increments telescope."""
    tree = ftrl.TreeSecureSum(clip=1.0, sigma=0.3, expected_count=2.5, seed=1, rounds=4)
    theta0 = torch.randn(6, dtype=torch.float64)
    theta, total = theta0.clone(), torch.zeros(6, dtype=torch.float64)
    for t in range(1, 5):
        tree.begin_round(t)
        x = torch.full((1, 6), 0.1 * t, dtype=torch.float64)
        tree.add(torch.zeros_like(x), x)
        total += x[0]
        theta = tree.release(theta.unsqueeze(0))[0]
        noise = ftrl.prefix_noise((6,), 0.3, seed=1, round_=t)
        torch.testing.assert_close(theta, theta0 + (total + noise) / 2.5, rtol=0, atol=1e-12)
    tree.begin_round(5)
    with pytest.raises(RuntimeError, match="accounted for rounds 1..4"):
        tree.release(theta.unsqueeze(0))


# ------------------------------------------------------------------- (2) sensitivity
@pytest.mark.parametrize("rounds", range(1, 17))
def test_the_tree_sensitivity_matches_enumeration(rounds):
    """(2) For every T <= 16 and every number of cohorts G, the exact squared sensitivity
    S_T = max_g s2_T(g) and the per-participation ratio r equal the naive enumeration; one
    participation gives floor(log2 T) + 1 <= ceil(log2 T) + 1 nodes; the triangle
    inequality's k^2 (log2 T + 1) bounds it; random directions never exceed the aligned
    worst case."""
    gen = np.random.default_rng(rounds)
    depth = math.floor(math.log2(rounds)) + 1
    for groups in range(1, rounds + 2):
        s_t, ratio, k_max = ftrl.tree_squared_sensitivity(rounds, groups)
        naive = naive_squared(rounds, groups)
        assert s_t == max(naive)
        assert k_max == math.ceil(rounds / groups)
        naive_ratio = max(
            naive_squared(rounds, groups, upto=t)[g]
            / sum(1 for s in range(1, t + 1) if (s - 1) % groups == g)
            for t in range(1, rounds + 1) for g in range(min(groups, t)))
        assert ratio == pytest.approx(naive_ratio, rel=1e-12)
        if groups >= rounds:  # one participation
            assert s_t == depth <= math.ceil(math.log2(rounds)) + 1
        assert s_t <= k_max ** 2 * depth
        plan = ftrl.FtrlPlan.for_run(rounds, groups)
        for t in range(1, rounds + 1):
            assert plan.squared_at(t) == max(naive_squared(rounds, groups, upto=t))
        # random deltas in 3 dimensions (norm <= 1) move the node vector by no more
        nodes = naive_released_nodes(rounds)
        for g in range(min(groups, rounds)):
            mine = [t for t in range(1, rounds + 1) if (t - 1) % groups == g]
            for _ in range(5):
                d = gen.normal(size=(len(mine), 3))
                d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1.0)
                x = dict(zip(mine, d, strict=True))
                sq = sum(float(np.sum(sum((x[t] for t in x if a <= t <= b),
                                          np.zeros(3)) ** 2)) for a, b in nodes)
                assert sq <= s_t + 1e-9


def test_sqrt_k_depth_is_not_a_bound_when_leaves_share_ancestors():
    """T = 2, one client in both rounds: nodes x1 and x1 + x2 move by C and 2C, so the
    squared sensitivity is 5 C^2, above k * depth = 4 (docstring of privacy/ftrl.py)."""
    assert ftrl.tree_squared_sensitivity(2, 1)[0] == 5.0 > 2 * 2


def test_prefix_sums_and_nodes_are_a_bijection():
    """Releasing P~_1..P~_T is releasing the T noisy nodes: the map is unit lower
    triangular, so the tree release is exactly the Gaussian mechanism on the nodes."""
    T = 16
    A = np.zeros((T, T))
    for t in range(1, T + 1):
        for e in ftrl.covering_nodes(t):
            A[t - 1, e - 1] = 1
    assert np.allclose(np.tril(A), A) and np.all(np.diag(A) == 1)


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")
def test_jax_privacy_computes_the_same_sensitivity_for_the_tree_encoder():
    """jax-privacy's fixed-epoch sensitivity of the tree's encoder (rows: nodes, columns:
    rounds) under (k, G)-cyclic participation equals C sqrt(S_T) (optional extra [ftrl])."""
    sensitivity = pytest.importorskip("jax_privacy.matrix_factorization.sensitivity")
    for T in (4, 6, 8, 12, 16):
        enc = np.zeros((T, T))
        for e in range(1, T + 1):
            enc[e - 1, ftrl.node_start(e) - 1: e] = 1
        for G in (g for g in range(1, T + 1) if T % g == 0):
            theirs = sensitivity.fixed_epoch_sensitivity(enc, epochs=T // G)
            assert theirs == pytest.approx(math.sqrt(ftrl.tree_squared_sensitivity(T, G)[0]),
                                           rel=1e-6)
        assert sensitivity.single_participation_sensitivity(enc) == pytest.approx(
            math.sqrt(math.floor(math.log2(T)) + 1), rel=1e-6)


# ----------------------------------------------------------------------- (3) accounting
@pytest.mark.parametrize("z", [1.0, 2.0, 4.0])
def test_the_eps_is_recomputed_independently(z):
    """(3) T = 100 rounds, G = 10 cohorts, --noise-multiplier z: the sensitivity recomputed
    by enumeration gives back z; our eps equals the Balle-Wang curve solved here and is
    below dp-accounting's RDP of GaussianDpEvent(z) (which our rdp field equals) and
    below zCDP's closed form rho + 2 sqrt(rho ln(1/delta)), rho = 1 / (2 z^2)."""
    import dp_accounting
    from dp_accounting import pld, rdp

    delta = 1e-5
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=z, sample_rate=0.1,
                                     clip=0.7), 100)
    naive_s = 0.7 * math.sqrt(max(naive_squared(100, 10)))
    assert p.noise_scale / naive_s == pytest.approx(z, rel=1e-12)
    ours = MECH.release_epsilon(p, 100)
    exact = balle_wang_epsilon(1.0 / z, delta)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    their_rdp = acc.get_epsilon(delta)
    pacc = pld.PLDAccountant(value_discretization_interval=1e-4)
    pacc.compose(dp_accounting.GaussianDpEvent(z))
    their_pld = pacc.get_epsilon(delta)
    rho = 1.0 / (2 * z * z)
    closed = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert ours["reported"] == pytest.approx(exact, rel=0.01)
    assert ours["reported"] == pytest.approx(their_pld, rel=0.01)
    assert ours["rdp"] == pytest.approx(their_rdp, rel=0.01)
    assert ours["zcdp"] == pytest.approx(closed, rel=1e-12)
    assert ours["reported"] <= their_rdp <= closed


def test_a_target_eps_is_met_at_the_last_round_and_the_ledger_is_conservative():
    """--epsilon 4 over T = 100, G = 4: the tree release's eps at T is 4 (to 1e-6), below
    it before; the per-client ledger's figure bounds it from above at every round."""
    from fedem_private.privacy.ledger import PrivacyLedger

    p = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=4.0, sample_rate=0.25), 100)
    assert p.ftrl is not None and p.ftrl.groups == 4
    assert MECH.release_epsilon(p, 100)["reported"] == pytest.approx(4.0, abs=1e-6)
    assert MECH.release_epsilon(p, 100)["reported"] <= 4.0
    ledger = PrivacyLedger(p)
    n = 12
    groups = np.arange(n) % 4
    last = 0.0
    for t in range(1, 101):
        entry = ledger.record_round(t, np.flatnonzero(groups == (t - 1) % 4))
        ours = MECH.release_epsilon(p, t)["reported"]
        assert ours >= last - 1e-12
        last = ours
        assert entry["epsilon"]["reported"] >= ours * (1 - 1e-9)


def test_without_noise_there_is_no_guarantee():
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", epsilon=math.inf, sample_rate=0.5), 6)
    assert p.noise_scale == 0 and not p.guarantee
    assert MECH.release_epsilon(p, 3)["reported"] is None


# --------------------------------------------------------------------- (4) the sampler
def test_the_sampler_enforces_cyclic_cohorts():
    """(4) n = 23 clients, q = 0.2: G = 5 groups partitioning the clients, each client's
    group a keyed function of its identity alone, its participations exactly 5 rounds
    apart, at most ceil(T / 5) of them."""
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=1.0, sample_rate=0.2),
                       37)
    assert p.ftrl is not None and p.ftrl.groups == 5
    keys = np.arange(23) * 7 + 1000  # identities, not positions
    rounds: dict[int, list[int]] = {}
    for t in range(1, 38):
        chosen = MECH.participants(p, seed=9, round_=t, clients=keys)
        assert np.array_equal(chosen, np.sort(chosen))
        assert np.array_equal(chosen, ftrl.CyclicCohorts(5, 9).participants(keys, t))
        for c in chosen.tolist():
            rounds.setdefault(c, []).append(t)
    assert sorted(rounds) == list(range(23))
    for seen in rounds.values():
        assert len(seen) <= math.ceil(37 / 5) == p.ftrl.max_participations
        assert set(np.diff(seen).tolist()) == {5}
    # another seed, another assignment; the same seed, the same one
    assert not np.array_equal(ftrl.CyclicCohorts(5, 10).group_of(keys),
                              ftrl.CyclicCohorts(5, 9).group_of(keys))


def test_a_clients_cohort_is_a_function_of_its_identity_alone():
    """Issue 77: removing one user (anywhere) moves no other client between rounds; the
    cohorts were a permutation cut into n/G blocks, and removing the last of 200 users
    moved clients 74, 54 and 145 (seed 0, G = 4)."""
    p = resolve_params(PrivacyConfig(mode="dp-ftrl", noise_multiplier=1.0, sample_rate=0.25),
                       8)
    keys = np.arange(200)
    full = {t: set(keys[MECH.participants(p, 0, t, keys)].tolist()) for t in range(1, 5)}
    for gone in (199, 74, 0):
        rest = np.delete(keys, gone)
        for t in range(1, 5):
            without = set(rest[MECH.participants(p, 0, t, rest)].tolist())
            assert without == full[t] - {gone}


def test_options_and_compositions_it_refuses():
    from fedem_private.simulation.config import RunConfig, with_overrides

    assert registry.names()[7] == "dp-ftrl" and MECH.central and MECH.claims_guarantee
    with pytest.raises(UserError, match="canaries"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, canaries=10)
    with pytest.raises(UserError, match="clip-quantile"):
        PrivacyConfig(mode="dp-ftrl", epsilon=1.0, clip_quantile=0.5)
    with pytest.raises(UserError, match="needs a budget"):
        PrivacyConfig(mode="dp-ftrl")
    with pytest.raises(UserError, match="needs each client's upload"):
        with_overrides(RunConfig(), {"privacy.mode": "dp-ftrl", "privacy.epsilon": 1.0,
                                     "federation.method": "fedsim"}).validate()


# ------------------------------------------------------------------------ (5) a run
def test_a_run_end_to_end_prints_its_eps(tmp_path, capsys):
    """(5) fedem-private run --privacy dp-ftrl --epsilon 4 --sample-rate 0.5 on the default
    synthetic data: the line and summary.json state the tree's eps (4 at the last planned
    round), the cohorts and no amplification; every round's participants are one cohort."""
    from fedem_private.cli import main

    out = tmp_path / "run"
    assert main(["run", "--dataset", "synthetic", "--privacy", "dp-ftrl", "--epsilon", "4",
                 "--sample-rate", "0.5", "--clip", "0.5", "--rounds", "4", "--local-epochs",
                 "1", "--dim", "4", "--no-progress", "--out", str(out)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:")]
    assert line and "dp-ftrl" in line[0] and "eps spent (worst client) 4" in line[0]
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["epsilon"]["reported"] == pytest.approx(4.0, abs=1e-6)
    assert privacy["epsilon_ledger"]["reported"] >= privacy["epsilon"]["reported"] - 1e-9
    assert privacy["participation"]["groups"] == 2
    assert privacy["participation"]["max_participations"] == 2
    assert privacy["amplification"].startswith("none")
    assert "eps_aggregator" not in privacy and "epsilon_aggregator" not in privacy
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    seen = [set(r["clients"]) for r in ledger["rounds"]]
    assert seen[0] == seen[2] and seen[1] == seen[3] and not seen[0] & seen[1]


@pytest.mark.parametrize("rate, rounds, said", [
    # 3 of 10 cohorts trained: a warning naming what would reach them all
    ("0.1", "3", ["warning: --privacy dp-ftrl: 3 rounds reach 3 of the 10 cyclic cohorts",
                  "other 7 (70%) never take part", "--rounds 10 or more",
                  "--sample-rate 0.3334 or more"]),
    # q = 0.3 is G = 4 cohorts: a note of the fraction used
    ("0.3", "8", ["note: --privacy dp-ftrl --sample-rate 0.3:", "G = ceil(1/q) = 4",
                  "fraction 1/4 = 0.25 of them, not 0.3"]),
    ("0.25", "4", []),  # q = 1/G and every cohort reached: nothing to say
])
def test_settings_that_misfit_the_cohorts_are_said_before_the_run(capsys, rate, rounds, said):
    """issue 80: --sample-rate 0.1 --rounds 3 trained 3 of its 10 cohorts, and 0.3 became
    0.25, without a word; each is now one line on stderr (the run itself is unchanged)."""
    from fedem_private.cli import main

    assert main(["run", "--privacy", "dp-ftrl", "--epsilon", "4", "--clip", "1",
                 "--sample-rate", rate, "--rounds", rounds, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert len(err.splitlines()) == (len(said) > 0)
    for words in said:
        assert words in err
    # the rate kept is 0.3334: ceil(1/q) = 3 cohorts, within 3 rounds (0.3333 would be 4)
    assert ftrl.groups_for(0.3334) == 3 and ftrl.groups_for(0.3333) == 4


# ------------------------------------------------------------- (6) the neighbour worlds
def test_the_neighbour_harness_meets_dp_ftrl_and_would_catch_a_halved_claim(monkeypatch):
    """(6) The harness's table holds dp-ftrl (tests/test_neighbour_worlds.py runs it in every
    composition of the cover); the target's round gap reaches C, so a claim of C / 2 fails."""
    from fedem_private.experiments import neighbours as nb

    assert "dp-ftrl" in nb.AXES["mode"]
    assert any(c["mode"] == "dp-ftrl" for c in nb.covering(nb.accepted()))
    cfg = nb.make_config("dp-ftrl", method="fedmf")
    found = nb.run_pair(cfg)
    assert found.sound and found.target_gap > 0.5, found.violations
    monkeypatch.setattr(MECH, "claimed_gap", classmethod(lambda cls, c: (2, c.clip / 2)))
    assert not nb.run_pair(cfg).sound


def test_a_resumed_run_continues_the_same_tree():
    """A checkpoint pickles the whole simulation, the tree's state with it: a run resumed
    after round 2 ends on the same table as one that never stopped."""
    import pickle

    from fedem_private.experiments import neighbours as nb
    from fedem_private.simulation.loop import Simulation

    cfg = nb.make_config("dp-ftrl", method="fedmf")
    split = nb.base_split()
    whole = Simulation(cfg, split)
    for _ in range(3):
        whole.step()
    part = Simulation(cfg, split)
    for _ in range(2):
        part.step()
    resumed = pickle.loads(pickle.dumps(part))
    resumed.attach_split(split)  # a checkpoint leaves the data out
    resumed.step()
    assert torch.equal(whole.state.q_global, resumed.state.q_global)
