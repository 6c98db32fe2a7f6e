"""One-shot canary audit of cdp-gaussian inside a real run (Andrew, Kairouz, Oh, Oprea,
McMahan and Suriyakumar, "One-shot empirical privacy estimation for federated learning",
ICLR 2024).

**Design.** ``2k`` canary clients get fixed random directions u_i: independent
isotropic Gaussian vectors, normalised to unit L2 norm in the space of the
encoded upload. Directions are keyed by (seed, canary). Each canary is
*inserted* by its own fair coin, keyed by (seed, canary) and drawn before the
run (about k of them). Each round an inserted canary takes part independently
with the clients' rate q (its own Poisson draw), and its delta is C u_i. That
delta has norm exactly C, so clipping leaves it unchanged. It enters the secure
sum like any client's. The others are *held out*: they have the same
participation draws, but add nothing. They measure the statistic's null
distribution on the same run.

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

**Certified lower bound.** Beside the estimate, each view reports
``eps_lower_bound``: the one-run bound of Steinke, Nasr and Jagielski (NeurIPS
2023; :mod:`fedem_private.privacy.audit_bounds`) at ``CONFIDENCE``, with its
delta term. Its assumptions hold here: membership is an independent fair coin
per canary, decided before the run, and the guess rule is fixed in advance
(guess "in" for the top fraction f of the view's statistic and "out" for the
bottom f, for f in :data:`GUESS_FRACTIONS`, Bonferroni over them). The
canaries share the run's noise, so their scores are not independent; the
theorem does not need them to be. It is compared with ``eps_bound_accounted``,
the view's accounted eps for the canary with the most rounds among ALL
canaries (the theorem needs eps-DP in every canary's coin; the aggregator's is
the unamplified composition of that many rounds, the observer's the run's
amplified eps). A bound above it flags the view: a certified failure at that
confidence. With a few hundred canaries the bound is small (it certifies at
most about ln(r) for r guesses), so it catches gross failures only; the
estimate's flag is the sensitive one.

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
from fedem_private.privacy.accounting import RoundMechanism, compose, gaussian_epsilon
from fedem_private.privacy.audit_bounds import fails, one_run_eps_lower_bound

#: confidence of the certified one-run bound
CONFIDENCE = 0.95
#: guess rules of the one-run bound: top f guessed in, bottom f out
GUESS_FRACTIONS = (0.05, 0.1, 0.25)
#: client ids of the canaries (no real client has one); canary i is CANARY_BASE + i
CANARY_BASE = 1 << 42


def canary_directions(seed: int, count: int, size: int) -> torch.Tensor:
    """(count, size) float64 unit vectors, row i isotropic and keyed by (seed, canary i)."""
    out = rng.client_noise(seed, 0, CANARY_BASE + np.arange(count), size, "gaussian", 1.0,
                           stream=rng.Stream.CANARY)
    return out / out.norm(dim=1, keepdim=True)


def canary_membership(seed: int, count: int) -> np.ndarray:
    """(count,) bool: each canary's fair coin, inserted or held out (keyed by seed, canary)."""
    ids = CANARY_BASE + np.arange(count)
    return rng.uniform(rng.key(seed, rng.Stream.CANARY, 1 << 30, ids), 0) < 0.5


def one_run_bound(inserted: np.ndarray, held_out: np.ndarray, delta: float,
                  confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The one-run eps lower bound of a statistic's two groups (module docstring).

    For each f in :data:`GUESS_FRACTIONS`: rank all canaries by the statistic, guess
    "in" for the top ceil(f m) and "out" for the bottom ceil(f m); v = right guesses.
    Each rule's bound is at level 1 - (1 - confidence) / (number of rules), the
    largest is returned with its (m, r, v, f).
    """
    s = np.concatenate([np.asarray(inserted, dtype=np.float64),
                        np.asarray(held_out, dtype=np.float64)])
    y = np.concatenate([np.ones(len(inserted), dtype=bool), np.zeros(len(held_out), dtype=bool)])
    m = int(s.size)
    level = 1.0 - (1.0 - confidence) / len(GUESS_FRACTIONS)
    best: dict[str, Any] = {"eps_lower_bound": 0.0, "m": m, "r": 0, "v": 0, "fraction": None,
                            "confidence": confidence}
    if m == 0:
        return best
    order = y[np.argsort(-s, kind="stable")]
    for f in GUESS_FRACTIONS:
        k = min(math.ceil(f * m), m // 2)
        r = 2 * k
        v = int(order[:k].sum()) + int((~order[m - k:]).sum())
        eps = one_run_eps_lower_bound(m, r, v, confidence=level, delta=delta)
        if eps > best["eps_lower_bound"] or best["fraction"] is None:
            best = {**best, "eps_lower_bound": eps, "r": r, "v": v, "fraction": f}
    return best


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
    members: np.ndarray | None = None  # (2 count,) bool: the coins (inserted or held out)
    projections: list[np.ndarray] = field(default_factory=list)  # per round (2 count,)
    took_part: list[np.ndarray] = field(default_factory=list)  # per round (2 count,) bool

    def __post_init__(self) -> None:
        if self.members is None:
            self.members = canary_membership(self.seed, 2 * self.count)

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
        assert self.members is not None
        inserted = torch.from_numpy(np.flatnonzero(part & self.members))
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
        ins = self.members
        assert ins is not None
        return {
            "aggregator": (agg[ins & keep], agg[~ins & keep], rounds),
            "observer": (obs[ins], obs[~ins], rounds),
        }

    def report(self, delta: float, accounted: dict[str, float | None]) -> dict[str, Any]:
        """Both views' eps_hat beside the accounted eps of each (None = inf); JSON-ready.

        ``accounted['aggregator']`` should be the unamplified eps of the canary
        with the most rounds, and ``accounted['observer']`` the run's amplified eps; both
        are reported beside eps_hat. A view is flagged when its fitted mu exceeds the mu
        the mechanism promises for its statistic (``mu_expected``) by more than 3
        standard errors (the noise was smaller than accounted), or when its certified
        one-run ``eps_lower_bound`` exceeds ``eps_bound_accounted`` (module docstring).
        """
        stats = self.statistics()
        rounds = stats["aggregator"][2]
        ins = self.members
        assert ins is not None
        out: dict[str, Any] = {
            "method": ("one-shot canary audit (Andrew et al., ICLR 2024): random-direction "
                       "canary clients, Gaussian fit of the projection statistic; an "
                       "ESTIMATE, not a certified bound"),
            "canaries": 2 * self.count,
            "canaries_inserted": int(ins.sum()), "canaries_held_out": int((~ins).sum()),
            "max_rounds_inserted": int(rounds[ins].max(initial=0)),
            "mean_rounds_inserted": float(rounds[ins].mean()) if ins.any() else 0.0,
            "max_rounds_any": int(rounds.max(initial=0)),
            "views": {},
        }
        bound_acc = {"aggregator": self._aggregator_eps(int(rounds.max(initial=0)), delta),
                     "observer": accounted.get("observer")}
        z = self.noise_multiplier
        for view, (a, b, _) in stats.items():
            fit = gaussian_fit_epsilon(a, b, delta)
            acc = accounted.get(view)
            acc_mu = self._accounted_mu(view, rounds, z)
            estimate_flag = bool(math.isfinite(fit["mu"])
                                 and fit["mu"] - 3 * fit["mu_se"] > acc_mu)
            bound = one_run_bound(a, b, delta)
            certified_flag = fails(bound["eps_lower_bound"], bound_acc[view])
            out["views"][view] = {**{k: (None if isinstance(v, float) and not math.isfinite(v)
                                         else v) for k, v in fit.items()},
                                  "eps_accounted": acc, "mu_expected": acc_mu,
                                  "eps_lower_bound": bound["eps_lower_bound"],
                                  "eps_bound_accounted": bound_acc[view],
                                  "one_run": bound,
                                  "flagged_estimate": estimate_flag,
                                  "flagged_certified": certified_flag,
                                  "flagged": bool(estimate_flag or certified_flag)}
        out["ok"] = not any(v["flagged"] for v in out["views"].values())
        return out

    def _aggregator_eps(self, rounds: int, delta: float) -> float | None:
        """Unamplified eps of ``rounds`` Gaussian rounds of multiplier z (None = inf)."""
        z = self.noise_multiplier
        if z <= 0:
            return None
        if rounds == 0:
            return 0.0
        eps = compose(RoundMechanism("gaussian", z), rounds, delta).reported
        return None if math.isinf(eps) else float(eps)

    def _accounted_mu(self, view: str, rounds: np.ndarray, z: float) -> float:
        """The mu the mechanism promises for the view's statistic: the aggregator's a_i has
        mean sqrt(r_i) / z, the observer's r_i / (z sqrt T); averaged over the inserted."""
        if z <= 0:
            return math.inf
        assert self.members is not None
        r = rounds[self.members].astype(np.float64)
        if view == "aggregator":
            r = r[r > 0]
            return float(np.sqrt(r).mean() / z) if r.size else 0.0
        return float(r.mean() / (z * math.sqrt(max(len(self.projections), 1))))
