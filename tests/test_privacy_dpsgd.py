"""ldp-dpsgd (docs/design.md section 5): interaction-level local DP by DP-SGD in local training.

The vectorised engine against opacus's GradSampleModule / DPOptimizer (same
batches, same negatives, same noise draws), the clip bound per positive, the
noise statistics on every entry, accounting against dp-accounting and opacus's
RDP and PRV accountants, calibration round trips, refusals, an end-to-end run
that states what it guarantees, and a planted bug (noise at half the accounted
scale) that a one-step likelihood-ratio audit catches.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from fedem_private.errors import UserError
from fedem_private.models.base import ClientParams
from fedem_private.models.mf import MFBackbone
from fedem_private.models.pfedrec import PFedRecBackbone
from fedem_private.privacy import dpsgd
from fedem_private.privacy.accounting import (
    RoundMechanism,
    compose,
    dpfedavg_bounds,
    gaussian_epsilon,
)
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.dpsgd import (
    DpsgdSettings,
    positive_masks,
    reference_train_adapter,
    reference_train_client,
    train_adapter_chunk,
    train_chunk,
)
from fedem_private.privacy.ledger import PrivacyLedger
from fedem_private.privacy.params import resolve_params
from fedem_private.simulation.config import RunConfig, with_overrides

DELTA = 1e-5


def _clients(m: int, sizes: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rs = np.random.default_rng(seed)
    indptr, items = [0], []
    for n in sizes:
        items += np.sort(rs.choice(m, size=n, replace=False)).tolist()
        indptr.append(len(items))
    return np.array(indptr), np.array(items, dtype=np.int64)


def _state(k: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, m, d, generator=g) * 0.3, torch.randn(k, d, generator=g) * 0.5


# ------------------------------------------------------------------------ against opacus
@pytest.mark.parametrize("backbone", ["mf", "pfedrec"])
@pytest.mark.parametrize("sigma", [0.0, 1.3], ids=["no-noise", "noise"])
def test_vectorised_clients_match_opacus_per_client(sigma, backbone):
    """Tables and private groups after S steps equal opacus's DPOptimizer, client by client.

    One client has a single positive (most steps sample nothing: the noise-only
    path), one has none; clips bind for most positives at C = 0.3.
    """
    m, d = 30, 4
    sizes = [11, 1, 0, 7, 25]
    indptr, items = _clients(m, sizes)
    q, p = _state(len(sizes), m, d)
    st = DpsgdSettings(sample_rate=0.4, clip=0.3, noise_multiplier=sigma, steps=7, negatives=6,
                       lr=0.5, normaliser=1.5)
    if backbone == "mf":
        bb, private = MFBackbone(m, d, 0, 0.1), {"p": p}
    else:
        bb = PFedRecBackbone(m, d, 0, 0.1)
        private = {"w": p, "b": torch.linspace(-0.5, 0.5, len(sizes))}
    out, stats = train_chunk(bb, ClientParams(q, {}, private), np.arange(len(sizes)), indptr,
                             items, st, seed=3, round_=2, lazy_noise=False)
    assert stats.examples > 0 and 0 < stats.clipped <= stats.examples
    for j in range(len(sizes)):
        rq, rpriv = reference_train_client(backbone, q[j], {n: t[j] for n, t in private.items()},
                                           items[indptr[j]: indptr[j + 1]], st, 3, 2, j)
        assert float((rq - out.items[j]).abs().max()) < 1e-5
        for name, value in rpriv.items():
            assert float((value - out.private[name][j]).abs().max()) < 1e-5, name


@pytest.mark.parametrize("backbone", ["mf", "pfedrec"])
@pytest.mark.parametrize("sigma", [0.0, 1.1], ids=["no-noise", "noise"])
def test_dp_adapter_matches_opacus_per_client(sigma, backbone):
    """EM's adapter trained by DP-SGD (per-example backpropagation through equations 9-10
    by hand) equals opacus's DPOptimizer on nn.Linear layers, client by client."""
    from fedem_private.client.merging import MergeConfig, init_merge_state

    m, d, k = 30, 4, 4
    indptr, items = _clients(m, [8, 1, 0, 14])
    g = torch.Generator().manual_seed(0)
    ql, qg = torch.randn(k, m, d, generator=g) * 0.5, torch.randn(k, m, d, generator=g) * 0.5
    head = torch.randn(k, d, generator=g)
    if backbone == "mf":
        bb, private = MFBackbone(m, d, 0, 0.1), {"p": head}
    else:
        bb, private = PFedRecBackbone(m, d, 0, 0.1), {"w": head, "b": torch.randn(k, generator=g)}
    state = init_merge_state(MergeConfig("em"), np.arange(k), d, 0)
    st = DpsgdSettings(0.5, 0.05, sigma, 4, 5, 0.7, 1.25)
    w, b, stats = train_adapter_chunk(bb, private, state.weights, state.biases, ql, qg,
                                      np.arange(k), indptr, items, st, 6, 1, 3)
    assert 0 < stats.clipped < stats.examples
    moved = max(float((x - y).abs().max()) for x, y in zip(w, state.weights, strict=True))
    assert moved > 1e-3
    for j in range(k):
        rw, rb = reference_train_adapter(tuple(x[j] for x in state.weights),
                                         tuple(x[j] for x in state.biases), ql[j], qg[j],
                                         {n: t[j] for n, t in private.items()},
                                         items[indptr[j]: indptr[j + 1]], st, 6, 1, 3, j)
        for ref, got in zip(rw + rb, [t[j] for t in w] + [t[j] for t in b], strict=True):
            assert float((ref - got).abs().max()) < 1e-5


def test_lazy_noise_is_exact_without_noise():
    m, d = 30, 4
    indptr, items = _clients(m, [11, 1, 0, 7, 25])
    q, p = _state(5, m, d)
    st = DpsgdSettings(0.4, 0.3, 0.0, 7, 6, 0.5, 1.5)
    bb = MFBackbone(m, d, 0, 0.1)
    runs = [train_chunk(bb, ClientParams(q, {}, {"p": p}), np.arange(5), indptr, items, st, 3, 2,
                        lazy_noise=lazy)[0] for lazy in (False, True)]
    assert torch.allclose(runs[0].items, runs[1].items, atol=1e-6, rtol=0)
    assert torch.allclose(runs[0].private["p"], runs[1].private["p"], atol=1e-6, rtol=0)


def test_lazy_noise_has_the_eager_distribution():
    """Lazy noise (drawn as rows are read) against the eager per-step draws: over 400 seeds
    each, every entry of the trained table and p_u has the same mean and spread."""
    m, d = 6, 2
    indptr, items = np.array([0, 3]), np.array([0, 2, 5])
    q = torch.tensor([[[0.5, -0.2], [0.1, 0.3], [-0.4, 0.2], [0.0, 0.1], [0.2, 0.2],
                       [-0.1, 0.4]]])
    p = torch.tensor([[0.6, -0.3]])
    st = DpsgdSettings(0.5, 0.5, 1.0, 5, 2, 1.0, 1.0)
    bb = MFBackbone(m, d, 0, 0.1)
    out = {}
    for lazy in (False, True):
        draws = []
        for seed in range(400):
            new, _ = train_chunk(bb, ClientParams(q, {}, {"p": p}), np.array([0]), indptr,
                                 items, st, seed, 1, lazy_noise=lazy)
            draws.append(torch.cat([new.items.reshape(-1), new.private["p"].reshape(-1)]))
        out[lazy] = torch.stack(draws).double()
    se_mean = torch.sqrt((out[False].var(0) + out[True].var(0)) / 400)
    assert bool(((out[False].mean(0) - out[True].mean(0)).abs() < 5 * se_mean).all())
    ratio = out[True].std(0) / out[False].std(0)
    assert bool(((ratio - 1).abs() < 0.2).all())  # sd ratio's s.e. at n = 400: about 0.05


def test_a_client_trains_the_same_in_any_chunk():
    """Draws are keyed by (seed, round, client): chunk composition changes nothing beyond
    float rounding (the padded batch width differs)."""
    m, d = 25, 4
    indptr, items = _clients(m, [5, 9, 3, 12])
    q, p = _state(4, m, d)
    st = DpsgdSettings(0.3, 0.5, 0.9, 5, 4, 0.3, 1.0)
    bb = MFBackbone(m, d, 0, 0.1)
    whole, _ = train_chunk(bb, ClientParams(q, {}, {"p": p}), np.arange(4), indptr, items, st,
                           1, 1)
    part, _ = train_chunk(bb, ClientParams(q[[2, 0]], {}, {"p": p[[2, 0]]}), np.array([2, 0]),
                          indptr, items, st, 1, 1)
    assert torch.allclose(part.items, whole.items[[2, 0]], atol=1e-6, rtol=0)
    assert torch.allclose(part.private["p"], whole.private["p"][[2, 0]], atol=1e-6, rtol=0)
    assert not torch.allclose(whole.items[0], whole.items[2], atol=1e-3)


# ------------------------------------------------------------------------ clipping and noise
def test_each_positive_moves_the_parameters_by_at_most_c():
    """One sampled positive, no noise, no negatives: the step is lr / L times its clipped
    gradient, whose norm over (table, p_u) is C when the raw gradient is far larger."""
    m, d = 10, 6
    indptr, items = np.array([0, 1]), np.array([4])
    q = torch.zeros(1, m, d)
    q[0, 4] = 30.0
    p = torch.full((1, d), -30.0)  # logit very negative: |sigmoid - 1| ~ 1, norm ~ 100
    st = DpsgdSettings(1.0, 0.7, 0.0, 1, 0, 0.25, 2.0)
    out, stats = train_chunk(MFBackbone(m, d, 0, 0.1), ClientParams(q, {}, {"p": p}),
                             np.array([0]), indptr, items, st, 0, 1)
    step = torch.cat([(out.items - q).reshape(-1), (out.private["p"] - p).reshape(-1)])
    moved = float(step.double().norm()) / (st.lr / st.normaliser)
    assert stats.clipped == 1 and stats.norm_sum > 50
    assert moved <= 0.7 * (1 + 1e-6) and moved == pytest.approx(0.7, rel=1e-4)
    assert torch.equal(out.items[0, :4], q[0, :4])  # no noise: only the positive's row moved


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_noise_over_steps_adds_up_to_sqrt_s_sigma_c(lazy):
    """No positive and no negative: S steps move each entry by -lr / L times the sum of S
    draws of N(0, sigma^2 C^2), lazily or not."""
    k, m, d, steps = 6, 200, 8, 5
    st = DpsgdSettings(0.5, 2.0, 1.5, steps, 0, 0.4, 3.0)
    out, _ = train_chunk(MFBackbone(m, d, 0, 0.1),
                         ClientParams(torch.zeros(k, m, d), {}, {"p": torch.zeros(k, d)}),
                         np.arange(k), np.zeros(k + 1, dtype=np.int64),
                         np.zeros(0, dtype=np.int64), st, 7, 1, lazy_noise=lazy)
    noise = -out.items.double() / (st.lr / st.normaliser)
    n = noise.numel()
    assert float(noise.std()) == pytest.approx(3.0 * math.sqrt(steps), rel=5 * math.sqrt(2 / n))
    assert bool((noise != 0).all())


def test_noise_on_every_entry_has_std_sigma_c():
    """With p_u = 0 and Q = 0 every gradient is zero, so one step moves each entry by
    -lr / L times N(0, sigma^2 C^2): every row of the table and p_u moves (the touched set is
    not released) and the spread is the accounted one."""
    k, m, d = 8, 300, 16
    indptr, items = _clients(m, [20] * k)
    st = DpsgdSettings(0.5, 2.0, 1.5, 1, 10, 0.4, 3.0)
    out, _ = train_chunk(MFBackbone(m, d, 0, 0.1),
                         ClientParams(torch.zeros(k, m, d), {}, {"p": torch.zeros(k, d)}),
                         np.arange(k), indptr, items, st, 7, 1)
    noise = -out.items.double() / (st.lr / st.normaliser)
    assert bool((noise != 0).all())
    assert bool((out.private["p"] != 0).all())
    n = noise.numel()
    assert abs(float(noise.mean())) < 5 * 3.0 / math.sqrt(n)
    assert float(noise.std()) == pytest.approx(3.0, rel=5 * math.sqrt(2 / n))
    # Gaussian, not Laplace: excess kurtosis near 0
    assert abs(float(sps.kurtosis(noise.reshape(-1).numpy()))) < 0.1


def test_poisson_sample_of_positives_has_rate_q():
    masks = positive_masks(0, 1, 5, 400, 50, 0.15)
    assert masks.shape == (50, 400)
    assert masks.mean() == pytest.approx(0.15, abs=4 * math.sqrt(0.15 * 0.85 / masks.size))
    # batch sizes vary (Poisson), they are not a fixed count
    assert len(set(masks.sum(axis=1).tolist())) > 5


# ------------------------------------------------------------------------ accounting
@pytest.mark.parametrize("q,z,steps,rounds", [(0.1, 1.0, 20, 3), (0.05, 2.0, 10, 20),
                                              (0.3, 0.9, 5, 4)])
def test_ledger_accounting_matches_dp_accounting_and_opacus(q, z, steps, rounds):
    """A client's R rounds of S steps: the ledger's eps is dp-accounting's for R S subsampled
    Gaussian steps, and opacus's RDP and PRV accountants agree on that history."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    params = resolve_params(PrivacyConfig(mode="ldp-dpsgd", noise_multiplier=z, dpsgd_rate=q,
                                          dpsgd_steps=steps), rounds)
    ledger = PrivacyLedger(params)
    for t in range(1, rounds + 1):
        ledger.record_round(t, np.array([0, 1] if t == 1 else [0]))
    spent = ledger.spent(0)
    direct = dpfedavg_bounds(q, z, rounds * steps, DELTA)
    assert spent["pld"] == pytest.approx(direct.pld, rel=1e-3)
    assert spent["rdp"] == pytest.approx(direct.rdp, rel=1e-6)
    assert spent["reported"] == pytest.approx(min(direct.pld, direct.rdp), rel=1e-3)
    # the unsampled bounds are valid and looser
    assert spent["basic"] >= spent["reported"] and spent["advanced"] >= spent["reported"]
    rdp = RDPAccountant()
    rdp.history = [(z, q, rounds * steps)]
    assert rdp.get_epsilon(DELTA) == pytest.approx(spent["rdp"], rel=0.02)
    prv = PRVAccountant()
    prv.history = [(z, q, rounds * steps)]
    assert prv.get_epsilon(DELTA, eps_error=0.01) == pytest.approx(spent["pld"],
                                                                  abs=0.03 + 0.01 * spent["pld"])
    # client 1 took part once: one round's S steps
    assert ledger.spent(1)["reported"] == pytest.approx(params.epsilon_round, rel=1e-9)


def test_sampled_gaussian_at_rate_1_is_the_plain_gaussian_composed():
    mech = RoundMechanism("sampled-gaussian", 2.0, sample_rate=1.0, steps=9)
    b = compose(mech, 2, DELTA)
    exact = gaussian_epsilon(math.sqrt(18) / 2.0, DELTA)
    assert exact <= b.reported <= exact + 0.05
    with pytest.raises(ValueError, match="sampled-gaussian"):
        RoundMechanism("gaussian", 1.0, sample_rate=0.5)


@pytest.mark.parametrize("eps,rounds,q,steps", [(1.0, 10, 0.1, 20), (8.0, 50, 0.2, 10),
                                                (64.0, 5, 0.5, 4)])
def test_calibration_round_trip(eps, rounds, q, steps):
    """sigma calibrated for `rounds` rounds gives eps <= target, within 1% of it."""
    params = resolve_params(PrivacyConfig(mode="ldp-dpsgd", epsilon=eps, dpsgd_rate=q,
                                          dpsgd_steps=steps), rounds)
    got = dpfedavg_bounds(q, params.noise_multiplier, rounds * steps, DELTA).pld
    assert got <= eps and got == pytest.approx(eps, rel=0.01)
    assert params.noise_scale == params.noise_multiplier * params.clip


def test_infinite_epsilon_is_clip_only_without_guarantee():
    params = resolve_params(PrivacyConfig(mode="ldp-dpsgd", epsilon=math.inf), 5)
    assert params.noise_multiplier == 0 and not params.guarantee
    assert params.round_mechanism() is None


# ------------------------------------------------------------------------ refusals
def _cfg(**over) -> RunConfig:
    base = {"data.dataset": "synthetic", "train.rounds": 2, "train.local_epochs": 1,
            "train.dim": 8, "privacy.mode": "ldp-dpsgd", "privacy.epsilon": 4.0}
    base.update(over)
    return with_overrides(RunConfig(), base)


@pytest.mark.parametrize("over,needle", [
    ({"federation.method": "fedem"}, "give --dpsgd-adapter-steps"),
    ({"federation.merge": "dm"}, "adapter on the client's data without DP"),
    ({"privacy.dpsgd_adapter_steps": 3}, "is for merge 'em', not 'sr'"),
    ({"federation.method": "fedem", "privacy.dpsgd_adapter_steps": 3,
      "federation.adapter_objective": "holdout"}, "holdout is not built"),
    ({"federation.codec": "lora"}, "use --codec full"),
    ({"federation.method": "fedncf"}, "per-example gradients"),
    ({"federation.backbone": "fedrap"}, "per-example gradients"),
    ({"train.early_stop_tol": 1e-4}, "data-dependent early stop"),
])
def test_refused_in_one_line(over, needle):
    with pytest.raises(UserError, match=needle) as err:
        _cfg(**over).validate()
    assert "\n" not in str(err.value)


def test_sm_and_sr_merges_run():
    _cfg(**{"federation.merge": "sm"}).validate()
    _cfg(**{"federation.method": "fedsim"}).validate()  # similarity of LDP uploads is fine
    _cfg(**{"federation.method": "pfedrec"}).validate()


@pytest.mark.parametrize("values,needle", [
    ({"epsilon_round": 1.0, "epsilon": None}, "not epsilon_round"),
    ({"epsilon": None}, "needs a budget"),
    ({"delta": 0.0}, "delta > 0"),
    ({"accountant": "basic"}, "Poisson subsampling"),
    ({"dpsgd_rate": 0.0}, "dpsgd-rate"),
    ({"dpsgd_steps": 0}, "dpsgd-steps"),
    ({"dpsgd_negatives": -1}, "dpsgd-negatives"),
    ({"dpsgd_lr": math.inf}, "dpsgd-lr"),
])
def test_bad_dpsgd_settings(values, needle):
    settings = {"mode": "ldp-dpsgd", "epsilon": 4.0, **values}
    with pytest.raises(UserError, match=needle):
        PrivacyConfig(**settings)


def test_dpsgd_settings_are_refused_for_other_modes():
    with pytest.raises(UserError, match="--dpsgd-steps .* is for ldp-dpsgd"):
        PrivacyConfig(mode="ldp-laplace", epsilon=4.0, dpsgd_steps=3)


# ------------------------------------------------------------------------ end to end
def test_adapter_steps_are_charged_every_round():
    """S training + S_a adapter steps per round: the ledger composes (S + S_a) R steps."""
    params = resolve_params(PrivacyConfig(mode="ldp-dpsgd", noise_multiplier=1.2,
                                          dpsgd_steps=10, dpsgd_adapter_steps=4), 3)
    ledger = PrivacyLedger(params)
    for t in (1, 2, 3):
        ledger.record_round(t, np.array([0]))
    assert ledger.spent(0)["rdp"] == pytest.approx(dpfedavg_bounds(0.1, 1.2, 42, DELTA).rdp,
                                                   rel=1e-9)
    eps = resolve_params(PrivacyConfig(mode="ldp-dpsgd", epsilon=4.0, dpsgd_steps=10,
                                       dpsgd_adapter_steps=4), 3)
    plain = resolve_params(PrivacyConfig(mode="ldp-dpsgd", epsilon=4.0, dpsgd_steps=10), 3)
    assert eps.noise_multiplier > plain.noise_multiplier  # more steps, more noise


def test_fedem_runs_under_dpsgd_with_its_adapter_trained_privately(tmp_path):
    from fedem_private.experiments.runner import execute

    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 30, "data.synthetic.n_items": 40,
        "train.rounds": 3, "train.dim": 8, "federation.method": "fedem",
        "privacy.mode": "ldp-dpsgd", "privacy.epsilon": 8.0, "privacy.dpsgd_steps": 4,
        "privacy.dpsgd_adapter_steps": 3})
    summary = execute(cfg, tmp_path / "run")
    p = summary["privacy"]
    assert p["epsilon"]["reported"] <= 8.0 and p["dpsgd"]["worst_client_steps"] == 21
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    last = dict(zip(header, rows[-1].split(","), strict=True))
    assert 0 <= float(last["adapter_frac_clipped"]) <= 1  # the adapter trained in round 3
    assert summary["merge_rho_mean"] is not None


def test_pfedrec_runs_end_to_end_and_noises_its_head(tmp_path):
    from fedem_private.experiments.runner import execute

    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 30, "data.synthetic.n_items": 40,
        "train.rounds": 2, "train.dim": 8, "federation.method": "pfedrec",
        "privacy.mode": "ldp-dpsgd", "privacy.epsilon": 8.0, "privacy.dpsgd_steps": 4})
    summary = execute(cfg, tmp_path / "run")
    assert summary["privacy"]["epsilon"]["reported"] <= 8.0
    assert math.isfinite(summary["metrics"]["full"]["hr@10"])


def test_end_to_end_run_states_the_relation_and_logs_the_steps(tmp_path):
    from fedem_private.experiments.results import collect
    from fedem_private.experiments.runner import execute

    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 40, "data.synthetic.n_items": 50,
        "train.rounds": 3, "train.dim": 8, "privacy.mode": "ldp-dpsgd", "privacy.epsilon": 8.0,
        "privacy.dpsgd_steps": 6, "privacy.dpsgd_rate": 0.2, "privacy.clip": 0.5})
    execute(cfg, tmp_path / "run")
    p = json.loads((tmp_path / "run" / "summary.json").read_text())["privacy"]
    assert p["mode"] == "ldp-dpsgd" and p["guarantee"]
    assert "interaction-level" in p["neighbouring"] and "local" in p["trust_model"]
    assert "own positives" in p["amplification"]
    assert p["epsilon"]["reported"] == pytest.approx(8.0, rel=0.01)
    assert p["epsilon"]["reported"] <= 8.0
    assert p["dpsgd"]["worst_client_steps"] == 18
    assert p["noise_to_signal"]["mean_over_rounds"] > 0
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = dict(zip(header, lines[-1].split(","), strict=True))
    assert 0 <= float(row["frac_clipped"]) <= 1 and float(row["mean_pre_clip_norm"]) > 0
    table = collect(tmp_path)
    assert "interaction-level" in table["neighbouring"].iloc[0]


def test_cli_line_states_the_relation():
    from fedem_private.cli import privacy_text

    text = privacy_text({"mode": "ldp-dpsgd", "epsilon": {"reported": 3.0}, "delta": 1e-5})
    assert "interaction-level" in text and "3" in text and "\n" not in text


# ------------------------------------------------------------------------ PLANTED BUG
def _one_step_scores(sigma: float, clip: float, trials: int, with_canary: bool,
                     half: bool) -> np.ndarray:
    """The server's view of one DP-SGD step (q = 1, no negatives) of a one-positive client,
    projected on the canary's clipped gradient direction, over `trials` keyed runs.

    The canary's gradient is huge, so its clipped contribution is exactly C along a known
    direction; without it the step is noise only. ``half`` plants the bug: noise drawn at
    sigma / 2 while the accountant assumes sigma.
    """
    m, d = 4, 3
    q = torch.zeros(1, m, d)
    q[0, 1] = torch.tensor([40.0, 0.0, 0.0])
    p = torch.zeros(1, d)
    p[0, 0] = -40.0  # the canary's gradient: e p on its row, e q_1 on p_u (both along x)
    direction = torch.zeros(m * d + d)
    direction[1 * d] = 1.0  # row 1, x
    direction[m * d] = -1.0  # p_u, -x (e q_1 with e = -1)
    direction /= direction.norm()
    indptr = np.array([0, 1 if with_canary else 0])
    items = np.array([1]) if with_canary else np.zeros(0, dtype=np.int64)
    st = DpsgdSettings(1.0, clip, sigma / 2 if half else sigma, 1, 0, 1.0, 1.0)
    out = np.empty(trials)
    for t in range(trials):
        new, _ = train_chunk(MFBackbone(m, d, 0, 0.1), ClientParams(q, {}, {"p": p}),
                             np.array([0]), indptr, items, st, seed=t, round_=1)
        move = torch.cat([(q - new.items).reshape(-1), (p - new.private["p"]).reshape(-1)])
        out[t] = float(move @ direction) / clip
    return out


@pytest.mark.parametrize("planted", [False, True], ids=["sound", "PLANTED-half-noise"])
def test_planted_bug_noise_at_half_the_accounted_scale_is_caught(planted):
    """An audit of one step: with and without the canary the server's projection is
    N(mu, s^2) vs N(0, s^2), and the accounted mechanism says mu / s = 1 / sigma. The fitted
    mu / s has a standard error of about sqrt(2 / n); the bugged step's 2 / sigma is far out."""
    sigma, clip, n = 2.0, 0.8, 600
    with_c = _one_step_scores(sigma, clip, n, True, planted)
    without = _one_step_scores(sigma, clip, n, False, planted)
    s = math.sqrt((with_c.var(ddof=1) + without.var(ddof=1)) / 2)
    separation = (with_c.mean() - without.mean()) / s
    accounted = 1.0 / sigma
    # the canary's clipped gradient is C along the direction (the clip binds)
    assert with_c.mean() == pytest.approx(1.0, abs=5 * s / math.sqrt(n))
    caught = abs(separation - accounted) > 5 * math.sqrt(2.0 / n)
    assert caught == planted


def test_the_dpsgd_module_states_its_relation_and_trust_model():
    doc = dpsgd.__doc__ or ""
    for needle in ("Neighbouring relation", "Trust model", "Sensitivity", "opacus"):
        assert needle in doc
