"""PrivacyConfig validation: bad input raises UserError with a one-line message."""

from __future__ import annotations

import math

import pytest

from fedem_private.errors import UserError
from fedem_private.privacy.config import MODE_DESCRIPTIONS, PrivacyConfig


def _one_line_error(**kwargs: object) -> str:
    with pytest.raises(UserError) as info:
        PrivacyConfig(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mode": "ldp"}, "unknown privacy mode"),
        ({"mode": "ldp-laplace", "epsilon": 0.0}, "epsilon must be > 0"),
        ({"mode": "ldp-laplace", "epsilon": -1.0}, "epsilon must be > 0"),
        ({"mode": "ldp-laplace", "epsilon": math.nan}, "NaN"),
        ({"mode": "ldp-laplace", "epsilon_round": 0}, "epsilon_round must be > 0"),
        ({"mode": "ldp-laplace", "epsilon": "1"}, "must be a number"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "delta": 1.0}, "delta must be in [0, 1)"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "delta": -1e-9}, "delta must be in [0, 1)"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "delta": math.nan}, "NaN"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "clip": 0.0}, "clip must be finite and > 0"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "clip": -2.0}, "clip must be finite and > 0"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "clip": math.inf}, "clip must be finite"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "epsilon_round": 0.1}, "only one of"),
        ({"mode": "ldp-gaussian", "epsilon": 1.0, "noise_multiplier": 1.0}, "only one of"),
        ({"mode": "ldp-laplace"}, "needs a budget"),
        ({"mode": "ldp-touched-rows"}, "needs a budget"),
        ({"mode": "ldp-gaussian", "noise_multiplier": -1.0}, "noise_multiplier"),
        ({"mode": "ldp-gaussian", "epsilon": 1.0, "delta": 0.0}, "needs delta > 0"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "delta": 0.0}, "accountant 'basic'"),
        ({"mode": "none", "epsilon": 1.0}, "remove privacy.epsilon"),
        ({"mode": "paper", "epsilon": 1.0}, "paper_lambda"),
        ({"mode": "paper", "paper_lambda": 0.0}, "paper_lambda must be finite and > 0"),
        ({"mode": "ldp-laplace", "epsilon": 1.0, "accountant": "moments"}, "unknown privacy acc"),
    ],
)
def test_invalid_settings_raise_one_line_user_error(kwargs: dict, needle: str) -> None:
    assert needle in _one_line_error(**kwargs)


def test_valid_settings() -> None:
    PrivacyConfig()
    PrivacyConfig(mode="ldp-laplace", epsilon=1.0)
    PrivacyConfig(mode="ldp-laplace", epsilon=1.0, delta=0.0, accountant="basic")
    PrivacyConfig(mode="ldp-gaussian", noise_multiplier=1.2)
    PrivacyConfig(mode="paper", paper_lambda=0.5, paper_clip=0.1)


def test_infinite_epsilon_means_clip_without_noise() -> None:
    cfg = PrivacyConfig(mode="ldp-laplace", epsilon=math.inf)
    assert not cfg.adds_noise
    # no noise, so delta = 0 is not a problem even for the Gaussian mode
    assert not PrivacyConfig(mode="ldp-gaussian", epsilon_round=math.inf, delta=0.0).adds_noise
    assert PrivacyConfig(mode="ldp-laplace", epsilon=3.0).adds_noise


def test_descriptions_flag_insecure_and_heuristic_modes() -> None:
    assert "INSECURE" in MODE_DESCRIPTIONS["ldp-touched-rows"]
    assert "HEURISTIC" in MODE_DESCRIPTIONS["paper"]
    assert PrivacyConfig(mode="paper").description == MODE_DESCRIPTIONS["paper"]


def test_frozen() -> None:
    cfg = PrivacyConfig()
    with pytest.raises(AttributeError):
        cfg.mode = "ldp-laplace"  # type: ignore[misc]
