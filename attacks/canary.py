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

- ``dp-ftrl`` (add/remove one client; the whole run): the canary client belongs to
  the cyclic cohort g* whose tree sensitivity is the largest (s2_T(g*) = S_T,
  :func:`fedem_private.privacy.ftrl.tree_squared_sensitivity`) and is present
  (b = 1, a delta of 2C clipped to C, the same in every round it takes part in:
  the case that meets the sensitivity bound) or absent (b = 0). Each trial runs
  all T rounds through the run's own
  :class:`fedem_private.privacy.ftrl.TreeSecureSum` with its sigma, and the
  auditor sees every release P~_1 .. P~_T (what DP-FTRL's accounting covers).
  Score: the Neyman-Pearson statistic of the node vector, sum_e n_e(g*)
  node~_e, with node~_e = P~_e - P~_{e - lowbit(e)}; present, its mean is
  C S_T against sd sigma sqrt(S_T), so mu = C sqrt(S_T) / sigma = 1 / z exactly.
  The claim audited is the whole release's eps (:meth:`DpFtrl.audit_claim`),
  not one round's. Under ``--ftrl-strategy banded`` (issue 81) the trials run
  through the run's :class:`fedem_private.privacy.ftrl.BandedSecureSum` instead;
  the auditor recovers C x + z = C y from the released increments y_t = P~_t -
  P~_{t-1}, and scores sum_t v_t (C y)_t with v = C 1_{g*}, 1_{g*} the indicator
  of the worst cohort's rounds (||v||^2 = S_T): again mean C S_T against sd
  sigma sqrt(S_T), mu = 1 / z. ``--ftrl-strategy blt`` is scored the same way with
  its own C (:class:`fedem_private.privacy.ftrl.BLTSecureSum`); there C^T C >= 0, so
  all-equal deltas on the worst cohort again meet S_T = ||v||^2. Under
  ``--ftrl-sampling poisson`` the canary takes part in every round of its group
  (G = b, none sampled out): the audit checks the unamplified release (one Gaussian,
  mu = C sqrt(S_T) / sigma) against its unamplified eps; the amplification by Poisson
  sampling is not audited.

- ``ldp-dpsgd`` (interaction-level: one positive added or removed): gradient
  canaries through the accounted mechanism of one round. The canary client
  holds the canary positive (b = 1) or not (b = 0). Each of the round's S
  local steps (``dpsgd_steps`` plus ``dpsgd_adapter_steps``, the steps the
  accountant charges per round) samples it with probability q_e (Poisson);
  a sampled canary's gradient lies along one fixed coordinate with norm
  above C, so clipping makes its contribution exactly C (the sensitivity the
  accountant assumes; the engine's clip factor C / (norm + 1e-6) gives a hair
  less, see tests/test_attacks_canary.py), and every step adds N(0, sigma^2
  C^2) to that coordinate. Everything else in the step is the same in both
  worlds and is left out. The auditor is white-box: it sees every step's
  noisy coordinate x_s (DP-SGD's accounting covers releasing every step, so
  this adversary is within the claim; the upload, their sum, is
  post-processing). Score: the log-likelihood ratio of the composed
  subsampled Gaussian with the CLAIMED sigma, sum_s log(1 - q + q exp((x_s C
  - C^2 / 2) / (sigma C)^2)), the Neyman-Pearson statistic of this pair.
  The steps are drawn here (numpy, seeded), not by
  :func:`fedem_private.privacy.dpsgd.train_chunk` (the attacks must not import
  the simulation's models); a test checks one engine step against this law.

Bounds (:mod:`attacks.audit`, :mod:`fedem_private.privacy.audit_bounds`), on
a seeded split of the canaries: 20% choose the threshold / guess rule, the
other 80% give the bound. Clopper-Pearson (one threshold, eps at delta) and
the one-run bound of Steinke, Nasr and Jagielski (NeurIPS 2023) for every
mode; for ``ldp-gaussian`` and ``cdp-gaussian``, whose claim is one Gaussian
release (exactly mu-GDP with mu = 1 / z), also the GDP bound: a certified
lower bound mu_lb on mu, reported as eps(delta) of mu_lb. Each bound is
computed at level 1 - (1 - confidence) / k for k bounds (Bonferroni), so the
largest holds with probability >= ``confidence``. ``noise_factor`` scales the
noise below what the parameters claim (0.5: the deliberately broken mechanism
of the tests and of benchmarks/probes/audit_power.py). Statistical power is limited:
with n trials per class a perfect attack certifies about ln(n) through the
(eps, delta) bounds; the GDP bound is not capped that way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from fedem_private.privacy.audit_bounds import gdp_eps_lower_bound
from fedem_private.privacy.mechanisms import release
from fedem_private.privacy.params import MechanismParams
from fedem_private.privacy.registry import capability, lookup

from .audit import cp_audit, gdp_audit, one_run_audit
from .registry import Attack, Capabilities
from .scoring import auc

DEFAULT_CONFIDENCE = 0.95
# Each mechanism's canary design is its own (fedem_private.privacy.mech): audit_canaries
# (canaries per audit, each a fair coin: enough that half the accounted noise is caught
# at eps 1 and 8; benchmarks/probes/audit_power.py, docs/audits.md; the (eps, delta) bounds need
# many trials at large eps, the GDP bound few), audit_confidence (the one-run bound
# describes the Laplace canary exactly, so at 0.95 it exceeds a sound mechanism's
# accounted eps in about 5% of audits, 2 of 40 measured; at 0.999, 0 of 40 did and every
# half-noise run was still caught), audit_gdp (one Gaussian release per round: a GDP
# claim, bound 3) and audit_at_delta (audited at the run's delta; else pure eps).


def audited(mode: object) -> bool:
    """Whether the mechanism ``mode`` has a canary design."""
    return capability(mode, "audit_canaries")


def _mechanism(mode: object) -> Any:
    cls = lookup(mode)
    if cls is None or not cls.audit_canaries:
        raise ValueError(f"no canary design for privacy mode {mode!r}")
    return cls


#: share of the canaries that choose the threshold / guess rule
SELECT_SHARE = 0.2


def audit_confidence(mode: str) -> float:
    """The confidence the canary record of ``mode`` is stated at (its mechanism's
    ``audit_confidence``; :data:`DEFAULT_CONFIDENCE` for a mode without a design)."""
    cls = lookup(mode)
    return cls.audit_confidence if cls is not None else DEFAULT_CONFIDENCE
_M, _D = 4, 2


def params_from_log(log: Mapping[str, Any]) -> MechanismParams:
    """Rebuild :class:`MechanismParams` from its ``as_log()`` dict (None eps = inf)."""
    names = {f.name for f in dataclasses.fields(MechanismParams)}
    values = {k: v for k, v in log.items() if k in names}
    if values.get("epsilon_round") is None:
        values["epsilon_round"] = math.inf
    cls = lookup(values.get("mode"))
    if cls is not None:  # its own plan (dp-ftrl's tree) rebuilt from its log entry
        values = cls.restore_params(values)
    return MechanismParams(**values)


def claimed_epsilon(params: MechanismParams) -> float | None:
    """Per-round eps the mode guarantees, or (touched rows) the nominal eps it claims."""
    if params.guarantee:
        return params.epsilon_round if math.isfinite(params.epsilon_round) else None
    if capability(params.mode, "nominal_only") and params.nominal_epsilon_round is not None:
        value = float(params.nominal_epsilon_round)
        return value if math.isfinite(value) else None
    return None


def audited_claim(params: MechanismParams) -> tuple[float | None, str]:
    """(eps, what it is) the canary audit holds its lower bound to: the mechanism's own
    claim where it has one (dp-ftrl: the whole release), else :func:`claimed_epsilon`."""
    cls = lookup(params.mode)
    if cls is not None and cls.audit_claim_kind:
        return cls.audit_claim(params), cls.audit_claim_kind
    return claimed_epsilon(params), ""


def canary_scores(params: MechanismParams, *, n_clients: int | None = None, seed: int = 0,
                  noise_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(scores, labels), both (n_clients, 1): one coin-flipped canary per client
    (``n_clients`` None: the mechanism's ``audit_canaries``)."""
    mech = _mechanism(params.mode)
    n_clients = mech.audit_canaries if n_clients is None else int(n_clients)
    if n_clients < 4 or not noise_factor > 0:
        raise ValueError("need n_clients >= 4 and noise_factor > 0")
    assert params.clip is not None
    coins = np.random.default_rng(seed).integers(0, 2, size=n_clients).astype(bool)
    if params.ftrl is not None:
        return _ftrl_scores(params, coins, seed, noise_factor)[:, None], coins.astype(
            np.float64)[:, None]
    if mech.central:
        return _central_scores(params, coins, seed, noise_factor), coins.astype(
            np.float64)[:, None]
    if mech.in_training:
        return _dpsgd_scores(params, coins, seed, noise_factor)[:, None], coins.astype(
            np.float64)[:, None]
    used = dataclasses.replace(params, noise_scale=params.noise_scale * noise_factor)
    sent = torch.zeros((n_clients, _M, _D), dtype=torch.float32)
    local = sent.clone()
    touched = torch.zeros((n_clients, _M), dtype=torch.bool)
    c = float(params.clip)
    b = torch.from_numpy(coins)
    if mech.nominal_only:
        row = torch.where(b, 0, 1)
        local[torch.arange(n_clients), row, 0] = c / 1000.0
        touched[torch.arange(n_clients), row] = True
    else:
        local[:, 0, 0] = torch.where(b, c, -c)
    upload, _ = release(used, sent, local, seed=seed, round_=1,
                        clients=np.arange(n_clients), touched=touched)
    delta = (upload.double() - sent.double()).numpy()
    if mech.nominal_only:
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


def _ftrl_scores(params: MechanismParams, coins: np.ndarray, seed: int,
                 noise_factor: float) -> np.ndarray:
    """dp-ftrl: each trial's whole tree release, scored by sum_e n_e(g*) node~_e (the
    module docstring), (n,). The trials are the n entries of one release vector: the
    tree's node noise is i.i.d. per entry, so they are independent."""
    from fedem_private.privacy.central import SumPart, clipped_deltas
    from fedem_private.privacy.ftrl import lowbit, node_counts, secure_sum_for

    plan = params.ftrl
    assert plan is not None and params.clip is not None
    rounds, groups = int(plan.rounds), int(plan.groups)
    toeplitz = plan.strategy != "tree"
    if toeplitz:  # banded or BLT
        from fedem_private.privacy.mf import toeplitz_matrix

        cmat = toeplitz_matrix(plan.toeplitz_coefs(rounds), rounds)
        member = np.arange(rounds)[None, :] % groups == np.arange(groups)[:, None]  # (G, T)
        shifts = member.astype(np.float64) @ cmat.T  # row g: C 1_g
        worst = int(np.argmax((shifts ** 2).sum(axis=1)))  # ||C 1_g*||^2 = S_T
    else:
        counts = node_counts(rounds, groups)  # (T, G): n_e(g)
        worst = int(np.argmax((counts.astype(np.float64) ** 2).sum(axis=0)))  # s2_T(g*)
    c, n = float(params.clip), coins.shape[0]
    sent = torch.zeros((n, 1), dtype=torch.float64)
    local = torch.where(torch.from_numpy(coins)[:, None], 2.0 * c, 0.0).to(torch.float64)
    clipped, stats = clipped_deltas(sent, local, c)  # C (present) or 0, trial by trial
    leaf = SumPart(clipped.reshape(1, n), stats, c)
    tree = secure_sum_for(plan, c, float(params.noise_scale) * noise_factor, 1.0, seed)
    prefix = np.zeros((rounds + 1, n), dtype=np.float64)  # P~_0 = 0, P~_1 .. P~_T
    released = torch.zeros((1, n), dtype=torch.float64)
    for t in range(1, rounds + 1):
        tree.begin_round(t)
        if (t - 1) % groups == worst:  # the canary's cohort takes part
            tree.add_part(leaf)
        released = tree.release(released)  # theta_0 = 0, m = 1: theta_t = P~_t
        prefix[t] = released.numpy()[0]
    if toeplitz:  # C y = C x + z from the increments y
        return shifts[worst] @ (cmat @ np.diff(prefix, axis=0))
    score = np.zeros(n, dtype=np.float64)
    for e in range(1, rounds + 1):
        weight = counts[e - 1, worst]
        if weight:
            score += weight * (prefix[e] - prefix[e - lowbit(e)])
    return score


def _dpsgd_scores(params: MechanismParams, coins: np.ndarray, seed: int,
                  noise_factor: float) -> np.ndarray:
    """ldp-dpsgd: each canary's log-likelihood ratio over one round's steps, (n,)."""
    assert params.clip is not None and params.noise_multiplier is not None
    assert params.dpsgd_rate is not None and params.dpsgd_steps is not None
    c, z, q = float(params.clip), float(params.noise_multiplier), float(params.dpsgd_rate)
    steps = int(params.dpsgd_steps) + int(params.dpsgd_adapter_steps or 0)
    g = np.random.default_rng([seed, 0x5D65])  # the audit's own stream (not the run's)
    out = np.empty(coins.shape[0], dtype=np.float64)
    for at in range(0, coins.shape[0], 1 << 17):  # chunks: bounded memory
        b = coins[at: at + (1 << 17)]
        sampled = b[:, None] & (g.random((b.shape[0], steps)) < q)
        x = c * sampled + g.normal(0.0, z * noise_factor * c, size=sampled.shape)
        if z <= 0:
            out[at: at + b.shape[0]] = x.sum(axis=1)
            continue
        a = (x * c - 0.5 * c * c) / (z * c) ** 2  # per-step log-ratio if sampled
        llr = a if q >= 1.0 else np.logaddexp(math.log1p(-q), math.log(q) + a)
        out[at: at + b.shape[0]] = llr.sum(axis=1)
    return out


def canary_audit(params: MechanismParams, *, n_clients: int | None = None, seed: int = 0,
                 noise_factor: float = 1.0, confidence: float = 0.95) -> dict[str, Any]:
    """Certified eps lower bound for the mechanism of ``params``, and the audit verdict.

    The reported ``eps_lower_bound`` is the largest of the k bounds (2, or 3
    under a mechanism with ``audit_gdp``), each computed at level 1 - (1 - ``confidence``) / k
    (Bonferroni), so it holds with probability >= ``confidence``: a sound
    mechanism fails this audit with probability at most 1 - ``confidence``.
    """
    claimed, claim_kind = audited_claim(params)
    scores, labels = canary_scores(params, n_clients=n_clients, seed=seed,
                                   noise_factor=noise_factor)
    n_clients = scores.shape[0]
    delta = params.delta if capability(params.mode, "audit_at_delta") else 0.0
    gdp = capability(params.mode, "audit_gdp")
    level = 1.0 - (1.0 - confidence) / (3 if gdp else 2)
    perm = np.random.default_rng([seed, 0xA0D1]).permutation(n_clients)
    n_sel = max(2, int(SELECT_SHARE * n_clients))
    select, evaluate = np.sort(perm[:n_sel]), np.sort(perm[n_sel:])
    cp = cp_audit(scores, labels, select, evaluate, confidence=level, delta=delta, seed=seed,
                  coin_per_client=False)
    one = one_run_audit(scores, labels, select, evaluate, confidence=level, delta=delta,
                        seed=seed, balance=False)
    s, y = scores[:, 0], labels[:, 0] == 1.0
    out: dict[str, Any] = {
        "relation": "canary", "n_clients": n_clients, "n_members": int(y.sum()),
        "n_nonmembers": int((~y).sum()), "auc": auc(y.astype(np.int64), s),
        "eps_lb_cp": cp.eps_lb, "eps_lb_one_run": one.eps_lb, "eps_lb_gdp": None,
        "mu_lb_gdp": None, "confidence": level, "delta": delta,
        "audit_assumptions_met": True, "n_select": int(select.size),
        "cp_detail": {"threshold": cp.threshold, "tp": cp.tp, "n_pos": cp.n_pos,
                      "fp": cp.fp, "n_neg": cp.n_neg},
        "one_run_detail": {"m": one.m, "r": one.r, "v": one.v, "frac_in": one.frac_in,
                           "frac_out": one.frac_out},
    }
    bounds = [cp.eps_lb, one.eps_lb]
    if gdp:
        g = gdp_audit(s, y, select, evaluate, confidence=level)
        eps_gdp = gdp_eps_lower_bound(g.mu_lb, delta)
        z = params.sum_noise_multiplier if params.adaptive_clip else params.noise_multiplier
        if params.ftrl is not None and params.ftrl.sampling == "poisson":
            from fedem_private.privacy.ftrl import release_multiplier

            z = release_multiplier(params, params.ftrl.rounds)  # the unamplified release's
        out.update({"eps_lb_gdp": eps_gdp, "mu_lb_gdp": g.mu_lb,
                    "mu_claimed": (1.0 / z) if z else None,
                    "gdp_detail": {"threshold": g.threshold, "tp": g.tp, "n_pos": g.n_pos,
                                   "fp": g.fp, "n_neg": g.n_neg}})
        bounds.append(eps_gdp)
    lower = max(bounds)
    out.update({
        "mode": params.mode,
        "n_canaries": n_clients,
        "audit_confidence": confidence,
        "noise_factor": noise_factor,
        "eps_lower_bound": lower,
        "eps_claimed": claimed,
        "claim_kind": claim_kind,
        "audit_ok": None if claimed is None else bool(lower <= claimed),
    })
    return out


@dataclass(frozen=True)
class CanaryOptions:
    """``count``: canary clients (None: the mechanism's design, :func:`canary_audit`)."""

    count: int | None = None


class CanaryAudit(Attack):
    """Registration of :func:`canary_audit`: coin-flipped canaries through the run's own
    release function and public parameters (a certified audit of the mechanism)."""

    options = CanaryOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        kind="mechanism", observes=("release-function",))

    @classmethod
    def audit(cls, params: MechanismParams, options: CanaryOptions, seed: int,
              confidence: float) -> dict[str, Any]:
        """:func:`canary_audit` with ``options``."""
        return canary_audit(params, n_clients=options.count, seed=seed, confidence=confidence)
