"""``--clip auto``: the clip bound C from a differentially private warm-up round.

What happens (``privacy.clip_auto = true``, modes ``ldp-laplace`` and
``ldp-gaussian`` only):

1. Warm-up, round 0, before any upload: every client trains locally from the
   public initial table exactly as it would in round 1, measures the norm of
   its delta (L1 for ``ldp-laplace``, L2 for ``ldp-gaussian``, in float64) and
   throws the trained table away. Nothing of the warm-up is uploaded except
   step 2's single number.
2. Each client releases ``y_u = clamp(ln norm_u, ln a, ln b) + Lap(s)`` with
   ``s = (ln b - ln a) / eps_w``, where ``[a, b]`` is a PUBLIC range fixed in
   the config (``clip_auto_min``, ``clip_auto_max``; default 0.1 to 1e5) and
   ``eps_w`` is ``clip_auto_epsilon`` (default: 10% of the total epsilon).
3. The server sets ``C = exp(median_u y_u)``, clamped to ``[a, b]``; every
   round then clips and noises with that C as usual.

Guarantee, and what it is not:

- Neighbouring relation: replace-one, the client's whole dataset (and its
  private state) replaced by any other, as for the LDP modes themselves.
- Trust model: local. Each client noises its own ``y_u``; the server is not
  trusted and sees every ``y_u``. C is a function of the noisy ``y_u`` only
  (post-processing), so it is public from then on.
- Sensitivity: the clamped log norm lies in ``[ln a, ln b]`` for every
  possible dataset, so its replace-one sensitivity is ``ln b - ln a``, and
  Laplace noise of scale ``(ln b - ln a) / eps_w`` makes the release
  ``eps_w``-DP (pure). The same caveat as the main Laplace mechanism
  applies: the noise is drawn in floating point by inverse CDF.
- Accounting: every client is charged one Laplace release with noise
  multiplier ``1 / eps_w`` in round 0 of the privacy ledger
  (``privacy_ledger.json``), composed with its rounds by every accountant.
  With a total ``epsilon`` the rounds are calibrated to ``epsilon - eps_w``,
  so warm-up plus rounds stay within ``epsilon`` (basic composition of the
  two parts; the tighter accountants may report less). With
  ``epsilon_round`` or ``noise_multiplier`` the warm-up adds ``eps_w`` on
  top. The rounds' noise multiplier (noise scale over sensitivity) does not
  depend on C, so choosing C adaptively from the warm-up does not change any
  round's privacy loss distribution.
- Not claimed: that C is a good clip. It is a noisy median of round-0
  norms; later rounds' norms can differ (FedEM's grow), and with few clients
  or a small ``eps_w`` the median is far off (its error is about
  ``s / sqrt(n)`` in log space). ``metrics.csv`` shows the fraction clipped
  per round. A clip-only run (epsilon = inf) still noises the warm-up but,
  like any clip-only run, guarantees nothing.
"""

from __future__ import annotations

import math

import numpy as np

from .. import rng
from .params import MechanismParams

WARMUP_ROUND = 0  # the ledger round and the noise key of the warm-up release
RULE = ("C = exp(median of the clients' Laplace-noised, clamped log pre-clip norms from a "
        "warm-up local training round (round 0)); each client charged eps_w in round 0")


def noisy_log_norms(norms: np.ndarray, clients: np.ndarray, low: float, high: float,
                    epsilon: float, seed: int) -> np.ndarray:
    """Each client's release ``clamp(ln norm, ln low, ln high) + Lap((ln high - ln low) / eps)``.

    The noise of client ``c`` is keyed by (seed, round 0, c), like every upload's.
    """
    if not (0 < low < high < math.inf) or not (0 < epsilon < math.inf):
        raise ValueError("need 0 < low < high < inf and 0 < epsilon < inf")
    lo, hi = math.log(low), math.log(high)
    z = np.clip(np.log(np.maximum(np.asarray(norms, dtype=np.float64), low)), lo, hi)
    scale = (hi - lo) / epsilon
    noise = rng.client_noise(seed, WARMUP_ROUND, np.asarray(clients), 1, "laplace", scale)
    return z + noise.numpy()[:, 0]


def estimate_clip(released: np.ndarray, low: float, high: float) -> float:
    """The server's C from the released values: exp of their median, clamped to [low, high]."""
    if released.size == 0:
        raise ValueError("no released norms")
    return float(np.clip(math.exp(float(np.median(released))), low, high))


def warmup_params(main: MechanismParams, epsilon: float, low: float, high: float
                  ) -> MechanismParams:
    """The ledger's view of the warm-up release: pure Laplace, noise multiplier 1 / eps_w.

    Same mode and delta as the run (a ledger records one of each); scale
    ``(ln b - ln a) / eps_w`` on sensitivity ``ln b - ln a`` is eps_w-DP.
    """
    sensitivity = math.log(high) - math.log(low)
    return MechanismParams(
        mode=main.mode, delta=main.delta, norm="log-norm", clip=None, sensitivity=sensitivity,
        noise_kind="laplace", noise_scale=sensitivity / epsilon,
        noise_multiplier=1.0 / epsilon, epsilon_round=epsilon)
