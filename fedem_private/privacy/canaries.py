"""One-shot canary audit of cdp-gaussian inside a real run (Andrew, Kairouz, Oh, Oprea,
McMahan and Suriyakumar, "One-shot empirical privacy estimation for federated learning",
ICLR 2024).

**Design.** ``2k`` canary clients get fixed random directions u_i: independent
isotropic Gaussian vectors, normalised to unit L2 norm in the space of the
encoded upload. Directions are keyed by (seed, canary). The first k are
*inserted*. Each round an inserted canary takes part independently with the
clients' rate q (its own Poisson draw), and its delta is C u_i. That delta has
norm exactly C, so clipping leaves it unchanged. It enters the secure sum like
any client's. The other k are *held out*: they have the same participation
draws, but add nothing. They measure the statistic's null distribution on the
same run.

Each round the audit reads what the aggregator releases: the noisy sum
S_t = sum_u clip(Delta_u) + N(0, z^2 C^2), which is (new global - base) x q n. It
records the projections <S_t, u_i> / C of every canary. Two views, two statistics:

- **Aggregator** (knows who took part; no amplification): for canary i,
  a_i = sum over the rounds it took part in of <S_t, u_i> / (C z sqrt(r_i)),
  where r_i is its number of rounds. An inserted canary's a_i is about
  N(sqrt(r_i) / z, 1); a held-out canary's is about N(0, 1), plus the real
  clients' projection, which both groups share.
- **Observer** (sees only the released models): o_i = sum over all T rounds of
  <S_t, u_i> / (C z sqrt(T)): the final model minus the first one, projected.

For each view the statistic's two groups are fitted with Gaussians of pooled
variance. mu = (mean_in - mean_out) / sd gives eps_hat, the (eps, delta) of the
Gaussian mechanism with that mu. Like the paper's, this is an ESTIMATE of the
privacy a run leaks to an adversary of that view. It is not a certified lower
bound. A sound run's eps_hat should not exceed the accounted eps of that
view, beyond the estimate's sampling error. The audit flags a run whose
eps_hat does, with the standard error stated.

The canaries do change the run: each inserted one adds C u_i / (q n) to a
round's mean when it takes part, in a random direction. With k much smaller
than q n this is small, but a run with canaries is not the run without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedem_private import rng
from fedem_private.privacy.accounting import gaussian_epsilon

#: client ids of the canaries (no real client has one); canary i is CANARY_BASE + i
CANARY_BASE = 1 << 42


def canary_directions(seed: int, count: int, size: int) -> torch.Tensor:
    """(count, size) float64 unit vectors, row i isotropic and keyed by (seed, canary i)."""
    out = rng.client_noise(seed, 0, CANARY_BASE + np.arange(count), size, "gaussian", 1.0,
                           stream=rng.Stream.CANARY)
    return out / out.norm(dim=1, keepdim=True)


def canary_participation(seed: int, round_: int, count: int, sample_rate: float) -> np.ndarray:
    """(count,) bool: which canaries take part in ``round_`` (Poisson at the clients' q)."""
    if sample_rate >= 1.0:
        return np.ones(count, dtype=bool)
    ids = CANARY_BASE + np.arange(count)
    return rng.uniform(rng.key(seed, rng.Stream.POISSON, round_, ids), 0) < sample_rate


def gaussian_fit_epsilon(inserted: np.ndarray, held_out: np.ndarray,
                         delta: float) -> dict[str, float]:
    """eps_hat of two groups of a statistic fitted as Gaussians with pooled variance.

    mu = (mean_in - mean_out) / sd_pooled; eps_hat = eps(delta) of the Gaussian mechanism
    with that mu (0 when mu <= 0). ``mu_se`` is mu's standard error,
    sqrt(1 / n_in + 1 / n_out + mu^2 / (2 (n_in + n_out - 2))).
    """
    a, b = np.asarray(inserted, dtype=np.float64), np.asarray(held_out, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return {"mu": math.nan, "mu_se": math.nan, "eps_hat": math.nan,
                "n_inserted": int(a.size), "n_held_out": int(b.size)}
    pooled = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2)
    sd = math.sqrt(pooled)
    mu = float((a.mean() - b.mean()) / sd) if sd > 0 else math.inf
    se = math.sqrt(1 / a.size + 1 / b.size + mu * mu / (2 * (a.size + b.size - 2)))
    return {"mu": mu, "mu_se": se, "eps_hat": gaussian_epsilon(max(mu, 0.0), delta),
            "n_inserted": int(a.size), "n_held_out": int(b.size)}


@dataclass
class CanaryAudit:
    """The canaries of one cdp-gaussian run (see the module docstring).

    ``count`` canaries are inserted and ``count`` held out. The secure sum asks
    :meth:`contribution` for the inserted canaries' deltas and calls :meth:`observe`
    with each round's noisy sum.
    """

    count: int
    clip: float
    noise_multiplier: float
    sample_rate: float
    seed: int
    directions: torch.Tensor | None = None  # (2 count, size), made at the first round
    projections: list[np.ndarray] = field(default_factory=list)  # per round (2 count,)
    took_part: list[np.ndarray] = field(default_factory=list)  # per round (2 count,) bool

    def _ensure(self, size: int) -> torch.Tensor:
        if self.directions is None:
            self.directions = canary_directions(self.seed, 2 * self.count, size)
        if self.directions.shape[1] != size:
            raise ValueError("the encoded upload changed size between rounds")
        return self.directions

    def contribution(self, round_: int, shape: torch.Size) -> torch.Tensor:
        """sum of C u_i over the inserted canaries taking part in ``round_``, shaped like the
        secure sum (``shape``; float64, on the CPU)."""
        u = self._ensure(math.prod(shape))
        part = canary_participation(self.seed, round_, 2 * self.count, self.sample_rate)
        self.took_part.append(part)
        inserted = torch.from_numpy(np.flatnonzero(part[: self.count]))
        total = u[inserted].sum(dim=0) * self.clip
        return total.reshape(tuple(shape))

    def observe(self, noisy_sum: torch.Tensor) -> None:
        """Record <S_t, u_i> / C for every canary (the round's released noisy sum S_t)."""
        assert self.directions is not None, "observe() after contribution()"
        flat = noisy_sum.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        self.projections.append((self.directions @ flat).numpy() / self.clip)

    def statistics(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per view: (inserted statistic, held-out statistic, rounds per canary)."""
        if not self.projections:
            raise ValueError("no round was observed")
        proj = np.stack(self.projections)  # (T, 2k)
        part = np.stack(self.took_part)  # (T, 2k)
        z = self.noise_multiplier if self.noise_multiplier > 0 else 1.0
        rounds = part.sum(axis=0)
        agg = (proj * part).sum(axis=0) / (z * np.sqrt(np.maximum(rounds, 1)))
        obs = proj.sum(axis=0) / (z * math.sqrt(proj.shape[0]))
        keep = rounds > 0
        k = self.count
        return {
            "aggregator": (agg[:k][keep[:k]], agg[k:][keep[k:]], rounds),
            "observer": (obs[:k], obs[k:], rounds),
        }

    def report(self, delta: float, accounted: dict[str, float | None]) -> dict[str, Any]:
        """Both views' eps_hat beside the accounted eps of each (None = inf); JSON-ready.

        ``accounted['aggregator']`` should be the unamplified eps of the inserted canary
        with the most rounds, and ``accounted['observer']`` the run's amplified eps; both
        are reported beside eps_hat. A view is flagged when its fitted mu exceeds the mu
        the mechanism promises for its statistic (``mu_expected``) by more than 3
        standard errors: the noise was smaller than accounted.
        """
        stats = self.statistics()
        rounds = stats["aggregator"][2]
        out: dict[str, Any] = {
            "method": ("one-shot canary audit (Andrew et al., ICLR 2024): random-direction "
                       "canary clients, Gaussian fit of the projection statistic; an "
                       "ESTIMATE, not a certified bound"),
            "canaries_inserted": self.count, "canaries_held_out": self.count,
            "max_rounds_inserted": int(rounds[: self.count].max(initial=0)),
            "mean_rounds_inserted": float(rounds[: self.count].mean()) if self.count else 0.0,
            "views": {},
        }
        z = self.noise_multiplier
        for view, (a, b, _) in stats.items():
            fit = gaussian_fit_epsilon(a, b, delta)
            acc = accounted.get(view)
            acc_mu = self._accounted_mu(view, rounds, z)
            flagged = bool(math.isfinite(fit["mu"]) and fit["mu"] - 3 * fit["mu_se"] > acc_mu)
            out["views"][view] = {**{k: (None if isinstance(v, float) and not math.isfinite(v)
                                         else v) for k, v in fit.items()},
                                  "eps_accounted": acc, "mu_expected": acc_mu,
                                  "flagged": bool(flagged)}
        out["ok"] = not any(v["flagged"] for v in out["views"].values())
        return out

    def _accounted_mu(self, view: str, rounds: np.ndarray, z: float) -> float:
        """The mu the mechanism promises for the view's statistic: the aggregator's a_i has
        mean sqrt(r_i) / z, the observer's r_i / (z sqrt T); averaged over the inserted."""
        if z <= 0:
            return math.inf
        r = rounds[: self.count].astype(np.float64)
        if view == "aggregator":
            r = r[r > 0]
            return float(np.sqrt(r).mean() / z) if r.size else 0.0
        return float(r.mean() / (z * math.sqrt(max(len(self.projections), 1))))
