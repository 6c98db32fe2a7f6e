"""A certified audit of the privacy mechanism itself, with coin-flipped canaries.

The bounds of :mod:`attacks.audit` are certified lower bounds on epsilon only
when membership was decided by independent fair coins. Natural training sets
are not (members and non-members differ in distribution: a public item prior
such as popularity can separate them without any leak). This module builds a
setting where the assumption holds, on the run's own release function
(:func:`fedem_private.privacy.mechanisms.release`) with its own public
parameters, so the resulting bound can be compared with the accounted epsilon
as a proof, not a hint. The scorer side runs it: it knows the coins.

Each of ``n_clients`` canary clients gets a fair coin b and a tiny table
(``m`` x ``d``, sent = 0, public):

- ``ldp-laplace`` / ``ldp-gaussian``: the local table differs from the sent
  one by +C (b = 1) or -C (b = 0) in entry (0, 0). Both deltas lie in the
  clipping ball of radius C (L1 and L2 alike) and are 2C apart, the
  sensitivity the accountant assumes, so this pair is a worst case of the
  replace-one relation. Score: the released entry (0, 0).
- ``ldp-touched-rows``: the client trained on row 0 (b = 1) or on row 1
  (b = 0), moving it by C / 1000. The mode claims its nominal epsilon; the
  set of touched rows is released without noise on the others. Score: the
  change of row 0.
- ``cdp-gaussian``: one round of the secure sum as the aggregator sees it (it
  knows who took part, so no amplification by sampling: the claim audited is
  the per-round ``epsilon_round``). The canary client is present (b = 1), with
  a delta of 2C that the run's clipping (:func:`fedem_private.privacy.central.
  clipped_deltas`) cuts to C, or absent (b = 0): the add/remove relation.
  Everyone else contributes the same in both worlds and is left out. The
  trial's sum goes through the run's :func:`fedem_private.privacy.central.
  noisy_mean_delta` with the sum's own multiplier (z, or z_sum under adaptive
  clipping, whose count is a second, separate release). Score: the released
  entry.

Scores go through :func:`attacks.scoring.score_attack` with
``randomized_membership=True``: Clopper-Pearson with the threshold chosen on
half the canary clients, and the one-run bound of Steinke, Nasr and
Jagielski (NeurIPS 2023). ``noise_factor`` scales the noise below what the
parameters claim (0.5: the deliberately broken mechanism of the tests).
Statistical power is limited: with n trials per class a perfect attack
certifies about ln(n) at best, so only violations below that are caught.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedem_private.privacy.mechanisms import release
from fedem_private.privacy.params import MechanismParams

from .scoring import score_attack

AUDITED_MODES = ("ldp-laplace", "ldp-gaussian", "ldp-touched-rows", "cdp-gaussian")
_M, _D = 4, 2


def params_from_log(log: Mapping[str, Any]) -> MechanismParams:
    """Rebuild :class:`MechanismParams` from its ``as_log()`` dict (None eps = inf)."""
    names = {f.name for f in dataclasses.fields(MechanismParams)}
    values = {k: v for k, v in log.items() if k in names}
    if values.get("epsilon_round") is None:
        values["epsilon_round"] = math.inf
    return MechanismParams(**values)


def claimed_epsilon(params: MechanismParams) -> float | None:
    """Per-round eps the mode guarantees, or (touched rows) the nominal eps it claims."""
    if params.guarantee:
        return params.epsilon_round if math.isfinite(params.epsilon_round) else None
    if params.mode == "ldp-touched-rows" and params.nominal_epsilon_round is not None:
        value = float(params.nominal_epsilon_round)
        return value if math.isfinite(value) else None
    return None


def canary_scores(params: MechanismParams, *, n_clients: int = 10000, seed: int = 0,
                  noise_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(scores, labels), both (n_clients, 1): one coin-flipped canary per client."""
    if params.mode not in AUDITED_MODES:
        raise ValueError(f"no canary design for privacy mode {params.mode!r}")
    if n_clients < 4 or not noise_factor > 0:
        raise ValueError("need n_clients >= 4 and noise_factor > 0")
    assert params.clip is not None
    coins = np.random.default_rng(seed).integers(0, 2, size=n_clients).astype(bool)
    if params.mode == "cdp-gaussian":
        return _central_scores(params, coins, seed, noise_factor), coins.astype(
            np.float64)[:, None]
    used = dataclasses.replace(params, noise_scale=params.noise_scale * noise_factor)
    sent = torch.zeros((n_clients, _M, _D), dtype=torch.float32)
    local = sent.clone()
    touched = torch.zeros((n_clients, _M), dtype=torch.bool)
    c = float(params.clip)
    b = torch.from_numpy(coins)
    if params.mode == "ldp-touched-rows":
        row = torch.where(b, 0, 1)
        local[torch.arange(n_clients), row, 0] = c / 1000.0
        touched[torch.arange(n_clients), row] = True
    else:
        local[:, 0, 0] = torch.where(b, c, -c)
    upload, _ = release(used, sent, local, seed=seed, round_=1,
                        clients=np.arange(n_clients), touched=touched)
    delta = (upload.double() - sent.double()).numpy()
    if params.mode == "ldp-touched-rows":
        scores = np.linalg.norm(delta[:, 0, :], axis=1)
    else:
        scores = delta[:, 0, 0]
    return scores[:, None], coins.astype(np.float64)[:, None]


def _central_scores(params: MechanismParams, coins: np.ndarray, seed: int,
                    noise_factor: float) -> np.ndarray:
    """cdp-gaussian: each trial's released noisy sum (see the module docstring), (n, 1)."""
    from fedem_private.privacy.central import clipped_deltas, noisy_mean_delta

    assert params.clip is not None and params.noise_multiplier is not None
    c = float(params.clip)
    z = params.sum_noise_multiplier if params.adaptive_clip else params.noise_multiplier
    assert z is not None
    n = coins.shape[0]
    sent = torch.zeros((n, 1, 1), dtype=torch.float64)
    local = torch.where(torch.from_numpy(coins)[:, None, None], 2.0 * c, 0.0).to(torch.float64)
    clipped, _ = clipped_deltas(sent, local, c)
    released = noisy_mean_delta(clipped.reshape(n), clip=c,
                                noise_multiplier=float(z) * noise_factor, expected_count=1.0,
                                seed=seed, round_=1)
    return released.numpy()[:, None]


def canary_audit(params: MechanismParams, *, n_clients: int = 10000, seed: int = 0,
                 noise_factor: float = 1.0, confidence: float = 0.99) -> dict[str, Any]:
    """Certified eps lower bound for the mechanism of ``params``, and the audit verdict.

    The reported ``eps_lower_bound`` is the larger of the two bounds, each
    computed at level 1 - (1 - ``confidence``) / 2 (Bonferroni), so it holds
    with probability >= ``confidence``: a sound mechanism fails this audit
    with probability at most 1 - ``confidence``.
    """
    claimed = claimed_epsilon(params)
    scores, labels = canary_scores(params, n_clients=n_clients, seed=seed,
                                   noise_factor=noise_factor)
    delta = params.delta if params.mode in ("ldp-gaussian", "cdp-gaussian") else 0.0
    out = score_attack(scores, labels, relation="positive_vs_any",
                       confidence=1.0 - (1.0 - confidence) / 2.0,
                       delta=delta, seed=seed, randomized_membership=True)
    bounds = [b for b in (out["eps_lb_cp"], out["eps_lb_one_run"]) if b is not None]
    lower = max(bounds) if bounds else 0.0
    out.update({
        "mode": params.mode,
        "n_canaries": n_clients,
        "audit_confidence": confidence,
        "noise_factor": noise_factor,
        "eps_lower_bound": lower,
        "eps_claimed": claimed,
        "audit_ok": None if claimed is None else bool(lower <= claimed),
    })
    return out
