"""Release functions: noise distribution, per-client determinism, what each mode perturbs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedem_private import rng
from fedem_private.errors import UserError
from fedem_private.privacy.clipping import clip_l1, clip_l2
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.mechanisms import release
from fedem_private.privacy.params import paper_heuristic_epsilon, resolve_params

K, M, D = 6, 40, 8


def _tables(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sent = torch.randn((K, M, D), generator=gen)
    local = sent + 0.3 * torch.randn((K, M, D), generator=gen)
    return sent, local


def _release(cfg: PrivacyConfig, sent, local, clients=None, round_=3, touched=None):
    params = resolve_params(cfg, rounds=10)
    ids = np.arange(sent.shape[0]) if clients is None else clients
    return release(params, sent, local, seed=11, round_=round_, clients=ids, touched=touched)


def test_none_returns_local_as_is() -> None:
    sent, local = _tables()
    out, stats = _release(PrivacyConfig(), sent, local)
    assert out is local and stats.noise_scale == 0.0 and stats.clip is None


def test_laplace_b_is_2c_over_eps_round_and_doubles_with_c() -> None:
    p1 = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon_round=0.5, clip=0.7), 10)
    p2 = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon_round=0.5, clip=1.4), 10)
    assert math.isclose(p1.noise_scale, 2 * 0.7 / 0.5, rel_tol=1e-15)
    assert p2.noise_scale == 2 * p1.noise_scale
    g1 = resolve_params(PrivacyConfig(mode="ldp-gaussian", noise_multiplier=1.3, clip=0.7), 10)
    g2 = resolve_params(PrivacyConfig(mode="ldp-gaussian", noise_multiplier=1.3, clip=1.4), 10)
    assert math.isclose(g1.noise_scale, 1.3 * 2 * 0.7) and g2.noise_scale == 2 * g1.noise_scale
    # calibrated from a total budget: the noise multiplier does not depend on C
    t1 = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon=2.0, clip=0.5), 10)
    t2 = resolve_params(PrivacyConfig(mode="ldp-laplace", epsilon=2.0, clip=1.0), 10)
    assert t2.noise_scale == 2 * t1.noise_scale


def _noise_only(cfg: PrivacyConfig, k: int = 4, m: int = 500, d: int = 25) -> torch.Tensor:
    zeros = torch.zeros((k, m, d))
    out, _ = _release(cfg, zeros, zeros)
    return out.double().reshape(-1)


def test_laplace_noise_moments() -> None:
    cfg = PrivacyConfig(mode="ldp-laplace", epsilon_round=0.8, clip=1.5)
    b = 2 * 1.5 / 0.8
    x = _noise_only(cfg)
    n = x.numel()
    # Laplace(b): x has mean 0, sd sqrt(2) b; |x| ~ Exp(b): mean b, sd b;
    # x^2: mean 2b^2, sd sqrt(E x^4 - (E x^2)^2) = sqrt(24 - 4) b^2. Bounds: 5 standard errors.
    assert abs(float(x.mean())) <= 5 * math.sqrt(2) * b / math.sqrt(n)
    assert abs(float(x.abs().mean()) - b) <= 5 * b / math.sqrt(n)
    assert abs(float((x * x).mean()) - 2 * b * b) <= 5 * math.sqrt(20) * b * b / math.sqrt(n)
    assert torch.isfinite(x).all()


def test_gaussian_noise_std() -> None:
    cfg = PrivacyConfig(mode="ldp-gaussian", noise_multiplier=0.9, clip=2.0)
    sigma = 0.9 * 2 * 2.0
    x = _noise_only(cfg)
    n = x.numel()
    assert abs(float(x.mean())) <= 5 * sigma / math.sqrt(n)
    # x^2 has mean sigma^2 and sd sqrt(2) sigma^2
    assert abs(float((x * x).mean()) - sigma**2) <= 5 * math.sqrt(2) * sigma**2 / math.sqrt(n)


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_noise_is_per_client_deterministic(kind: str) -> None:
    all_ids = np.array([3, 17, 5, 999, 42])
    full = rng.client_noise(7, 2, all_ids, 300, kind, 1.5)
    part = rng.client_noise(7, 2, np.array([42, 17]), 300, kind, 1.5)
    assert torch.equal(part[0], full[4]) and torch.equal(part[1], full[1])
    assert not torch.equal(rng.client_noise(7, 3, all_ids, 300, kind, 1.5), full)
    assert not torch.equal(full[0], full[2])


def test_release_is_per_client_deterministic() -> None:
    cfg = PrivacyConfig(mode="ldp-laplace", epsilon_round=1.0)
    sent, local = _tables()
    ids = np.array([10, 20, 30, 40, 50, 60])
    out, _ = _release(cfg, sent, local, clients=ids)
    sub, _ = _release(cfg, sent[[4, 1]], local[[4, 1]], clients=ids[[4, 1]])
    assert torch.equal(sub[0], out[4]) and torch.equal(sub[1], out[1])
    other_round, _ = _release(cfg, sent, local, clients=ids, round_=4)
    assert not torch.equal(other_round, out)


def test_ldp_laplace_is_sent_plus_clipped_delta_plus_noise_everywhere() -> None:
    cfg = PrivacyConfig(mode="ldp-laplace", epsilon_round=1.0, clip=0.5)
    sent, local = _tables()
    out, stats = _release(cfg, sent, local)
    assert out.dtype == torch.float32 and out.shape == sent.shape
    clipped, clip_stats = clip_l1(local.double() - sent.double(), 0.5)
    base = (sent.double() + clipped).float()
    assert bool((out != base).all())  # every entry perturbed
    assert stats.noised_fraction == 1.0 and stats.noise_scale == 1.0
    assert stats.fraction_clipped == clip_stats.fraction_clipped == 1.0
    assert math.isclose(stats.mean_pre_clip_norm, clip_stats.mean_norm)
    log = stats.as_log()
    assert log["clip"] == 0.5 and log["noise_scale"] == 1.0


def test_touched_rows_leaves_untouched_rows_noise_free() -> None:
    cfg = PrivacyConfig(mode="ldp-touched-rows", epsilon_round=1.0, clip=0.5)
    sent, local = _tables()
    gen = torch.Generator().manual_seed(3)
    touched = torch.rand((K, M), generator=gen) < 0.3
    out, stats = _release(cfg, sent, local, touched=touched)
    clipped, _ = clip_l1(local.double() - sent.double(), 0.5)
    base = (sent.double() + clipped).float()
    assert torch.equal(out[~touched], base[~touched])
    assert bool((out[touched] != base[touched]).all())
    assert math.isclose(stats.noised_fraction, float(touched.double().mean()))
    params = resolve_params(cfg, 10)
    assert not params.guarantee and math.isinf(params.epsilon_round)
    assert params.nominal_epsilon_round == 1.0
    with pytest.raises(ValueError):
        _release(cfg, sent, local)  # touched is required


def test_gaussian_release_uses_l2_clipping() -> None:
    cfg = PrivacyConfig(mode="ldp-gaussian", epsilon=math.inf, clip=0.25)
    sent, local = _tables()
    out, stats = _release(cfg, sent, local)
    clipped, _ = clip_l2(local.double() - sent.double(), 0.25)
    assert torch.equal(out, (sent.double() + clipped).float())  # eps = inf: clip, no noise
    assert stats.noise_scale == 0.0 and stats.noised_fraction == 0.0 and stats.norm == "l2"


def test_paper_mode_adds_laplace_lambda_to_local() -> None:
    cfg = PrivacyConfig(mode="paper", paper_lambda=0.2, paper_clip=0.5)
    sent, local = _tables()
    out, stats = _release(cfg, sent, local)
    noise = rng.client_noise(11, 3, np.arange(K), M * D, "laplace", 0.2).reshape(K, M, D)
    assert torch.equal(out, (local.double() + noise).float())
    assert stats.clip is None and stats.noise_scale == 0.2
    params = resolve_params(cfg, 10)
    assert not params.guarantee and params.paper_clip == 0.5
    eps = paper_heuristic_epsilon(np.array([0.25, 0.75]), lr=0.01, paper_clip=0.5,
                                  paper_lambda=0.2)
    assert np.allclose(eps, 2 * np.array([0.25, 0.75]) * 0.01 * 0.5 / 0.2)


def test_non_finite_upload_is_a_user_error() -> None:
    cfg = PrivacyConfig(mode="ldp-laplace", epsilon_round=1.0)
    sent, local = _tables()
    local[2, 0, 0] = math.inf
    with pytest.raises(UserError, match=r"client\(s\) \[12\]"):
        _release(cfg, sent, local, clients=np.arange(10, 10 + K))


def test_noise_to_signal_statistics():
    """noise_std per kind, and the mean |delta| on trained rows (clients with none left out)."""
    import math as _math

    import torch as _torch

    from fedem_private.privacy.mechanisms import mean_abs_trained, noise_std

    class P:  # the two fields of MechanismParams that noise_std reads
        def __init__(self, kind, scale):
            self.noise_kind, self.noise_scale = kind, scale

    assert noise_std(P("laplace", 2.0)) == 2.0 * _math.sqrt(2.0)
    assert noise_std(P("gaussian", 3.0)) == 3.0
    assert noise_std(P(None, 0.0)) == 0.0
    delta = _torch.zeros(3, 4, 2)
    delta[0, 1] = _torch.tensor([1.0, -3.0])  # client 0 trained row 1: mean |.| 2
    delta[0, 2] = 5.0  # untrained row: ignored
    delta[1, 0] = _torch.tensor([-4.0, 4.0])  # client 1 trained rows 0 and 3: (8 + 0) / 4
    touched = _torch.zeros(3, 4, dtype=_torch.bool)
    touched[0, 1] = True
    touched[1, 0] = touched[1, 3] = True  # client 2 trained nothing: left out
    assert mean_abs_trained(delta, touched) == (2.0 + 2.0) / 2
    assert mean_abs_trained(delta, None) is None
    assert mean_abs_trained(delta, _torch.zeros(3, 4, dtype=_torch.bool)) is None


def test_ldp_run_reports_noise_to_signal(tmp_path):
    from fedem_private.experiments.runner import execute
    from fedem_private.simulation.config import RunConfig, with_overrides

    cfg = with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "data.synthetic.n_users": 30, "data.synthetic.n_items": 40,
        "train.rounds": 2, "train.local_epochs": 1, "train.dim": 4,
        "privacy.mode": "ldp-laplace", "privacy.epsilon": 4.0, "privacy.clip": 1.0})
    p = execute(cfg, tmp_path / "run")["privacy"]
    nsr = p["noise_to_signal"]
    # b = 2C / eps_round = 2 * 1 / 2 = 1, std sqrt(2); the clipped L1 norm is <= 1 over at
    # least d = 4 trained entries, so the mean |delta| per trained entry is <= 1/4
    assert nsr["last_round"] >= 4 * math.sqrt(2.0) * 0.999
    assert nsr["mean_over_rounds"] > 0
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "noise_to_signal" in header
