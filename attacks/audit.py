"""Empirical lower bounds on epsilon from an attack's guesses (docs/design.md, section 6).

Two bounds, each with what it assumes.

1. Clopper-Pearson (hypothesis-testing view of DP; Kairouz, Oh and
   Viswanath 2015; used for auditing by Jagielski, Ullman and Oprea 2020).
   For an (eps, delta)-DP mechanism every test satisfies
   TPR <= e^eps FPR + delta and (1 - FPR) <= e^eps (1 - TPR) + delta, so

       eps >= max( ln((TPR - delta) / FPR), ln((1 - delta - FPR) / (1 - TPR)) ).

   TPR and FPR are replaced by one-sided Clopper-Pearson bounds (TPR from
   below, FPR from above), each at level (1 - confidence) / 2 so that both
   hold together with probability >= ``confidence`` (Bonferroni). The bound is
   0 when the expression is not positive.
   Assumes: independent Bernoulli trials with a threshold fixed before
   looking at them. :func:`cp_audit` therefore uses ONE trial per client
   (clients' uploads are independent; items of one upload are not) and picks
   the threshold on a disjoint half of the clients.

2. One run (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
   Training Run", NeurIPS 2023). m canaries are each included independently
   with probability 1/2; the auditor guesses in/out for r of them and gets v
   right. If the mechanism is eps-DP in each canary, v is stochastically
   dominated by Binomial(r, e^eps / (1 + e^eps)) (their Theorem 3.1), so the
   p-value of eps is P[Binomial(r, q) >= v], q = e^eps / (1 + e^eps)
   (:mod:`fedem_private.privacy.audit_bounds`, re-exported here). With
   delta > 0 their Corollary 5.4 (the code of their Appendix D) adds
   2 m delta max_{i = 1..v} P[v > Binomial(r, q) >= v - i] / i. The bound is
   the largest eps whose p-value is below 1 - ``confidence`` (found by
   bisection, as in their Appendix D, which relies on the p-value growing
   with eps).
   Assumes: membership of each canary decided by an independent fair coin
   BEFORE training, and the guesses (here: which fractions of the ranking to
   guess) fixed without looking at the evaluated canaries. Natural training
   sets do not satisfy the first: positives are not coin-flipped items (and
   under "positive_vs_sampled" only about 1 in 1 + num_negatives labelled
   items is a member). The figure is then a heuristic estimate, not a
   certified bound; it is certified only for runs whose canary items were
   inserted by coin flip. Under local DP one client's upload is eps_round-DP
   for any change of its data, hence also for one canary, so canaries from
   many clients of the same round can be pooled.

Both bounds are per audited release: compare them with the accountant's
epsilon for the rounds that produced the scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

# the one-run bound lives in the privacy layer (the in-run canary audit uses it too)
from fedem_private.privacy.audit_bounds import (  # noqa: F401  (re-exported)
    gdp_mu_lower_bound,
    one_run_eps_lower_bound,
    one_run_p_value,
)


def cp_lower(successes: float | np.ndarray, trials: float | np.ndarray, alpha: float
             ) -> np.ndarray:
    """One-sided Clopper-Pearson lower bound at level ``alpha`` (0 when no successes)."""
    x = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = stats.beta.ppf(alpha, x, n - x + 1)
    return np.where(x <= 0, 0.0, lo)


def cp_upper(successes: float | np.ndarray, trials: float | np.ndarray, alpha: float
             ) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound at level ``alpha`` (1 when all succeed)."""
    x = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        hi = stats.beta.ppf(1 - alpha, x + 1, n - x)
    return np.where(x >= n, 1.0, hi)


def eps_from_rates(tpr: float | np.ndarray, fpr: float | np.ndarray, delta: float = 0.0
                   ) -> np.ndarray:
    """max(0, ln((TPR - delta)/FPR), ln((1 - delta - FPR)/(1 - TPR))), elementwise."""
    t = np.asarray(tpr, dtype=np.float64)
    f = np.asarray(fpr, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.log(np.clip(t - delta, 0.0, None) / f)
        b = np.log(np.clip(1.0 - delta - f, 0.0, None) / (1.0 - t))
    best = np.fmax(np.nan_to_num(a, nan=-np.inf), np.nan_to_num(b, nan=-np.inf))
    return np.clip(best, 0.0, None)


def cp_eps_lower_bound(tp: float, n_pos: float, fp: float, n_neg: float, *,
                       confidence: float = 0.95, delta: float = 0.0) -> float:
    """Epsilon lower bound from tp/n_pos members and fp/n_neg non-members flagged (bound 1)."""
    if n_pos <= 0 or n_neg <= 0:
        return 0.0
    alpha = (1.0 - confidence) / 2.0
    tpr_lo = cp_lower(tp, n_pos, alpha)
    fpr_hi = cp_upper(fp, n_neg, alpha)
    return float(eps_from_rates(tpr_lo, fpr_hi, delta))


# ---------------------------------------------------------------------------
# audit procedures on (clients, items) scores


def split_clients(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random halving of ``range(n)``: (selection rows, evaluation rows)."""
    perm = np.random.default_rng(seed).permutation(n)
    half = n // 2
    return np.sort(perm[:half]), np.sort(perm[half:])


@dataclass(frozen=True)
class CPAudit:
    """Result of :func:`cp_audit`: the bound and the counts behind it."""

    eps_lb: float
    threshold: float
    tp: int
    n_pos: int
    fp: int
    n_neg: int


def _rank_order(s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices sorting ``s`` descending, ties in a random order (so ties leak nothing)."""
    return np.lexsort((rng.random(s.shape[0]), -s))


def cp_audit(scores: np.ndarray, labels: np.ndarray, select: np.ndarray, evaluate: np.ndarray,
             *, confidence: float = 0.95, delta: float = 0.0, seed: int = 0,
             coin_per_client: bool = True) -> CPAudit:
    """Clopper-Pearson audit with one trial per evaluation client.

    Evaluation trials: for each client in ``evaluate`` a fair coin (seeded)
    picks "member" or "non-member", then one labelled item of that class is
    drawn uniformly; a client lacking that class gives no trial. With
    ``coin_per_client=False`` each client's single labelled item is its trial
    as it is: meant for canary designs where every client holds exactly one
    canary whose membership was itself a fair coin (no second coin needed,
    and no trial lost to a missing class). Threshold:
    chosen on the ``select`` clients (all their labelled items), as the one
    maximising the bound when their member / non-member rates are scaled to
    the evaluation trial counts. Flag "member" when score >= threshold.
    """
    rng = np.random.default_rng(seed)
    trial_scores, trial_class = [], []
    for row in evaluate:
        if not coin_per_client:
            items = np.flatnonzero(~np.isnan(labels[row]))
            if items.size > 1:
                raise ValueError("coin_per_client=False needs one labelled item per client")
            if items.size:
                trial_scores.append(scores[row, items[0]])
                trial_class.append(bool(labels[row, items[0]] == 1.0))
            continue
        b = bool(rng.integers(2))
        items = np.flatnonzero(labels[row] == (1.0 if b else 0.0))
        if items.size:
            trial_scores.append(scores[row, items[rng.integers(items.size)]])
            trial_class.append(b)
    ts, tc = np.asarray(trial_scores, dtype=np.float64), np.asarray(trial_class, dtype=bool)
    n_pos, n_neg = int(tc.sum()), int((~tc).sum())
    sel_s, sel_y = scores[select], labels[select]
    pos, neg = sel_s[sel_y == 1.0], sel_s[sel_y == 0.0]
    if n_pos == 0 or n_neg == 0 or pos.size == 0 or neg.size == 0:
        return CPAudit(0.0, math.inf, 0, n_pos, 0, n_neg)
    cand = np.unique(np.concatenate([pos, neg]))
    if cand.size > 1024:
        cand = np.unique(np.quantile(cand, np.linspace(0.0, 1.0, 1024)))
    tpr = 1.0 - np.searchsorted(np.sort(pos), cand, side="left") / pos.size
    fpr = 1.0 - np.searchsorted(np.sort(neg), cand, side="left") / neg.size
    alpha = (1.0 - confidence) / 2.0
    est = eps_from_rates(cp_lower(tpr * n_pos, n_pos, alpha), cp_upper(fpr * n_neg, n_neg, alpha),
                         delta)
    t = float(cand[int(np.argmax(est))])
    tp, fp = int((ts[tc] >= t).sum()), int((ts[~tc] >= t).sum())
    eps = cp_eps_lower_bound(tp, n_pos, fp, n_neg, confidence=confidence, delta=delta)
    return CPAudit(eps, t, tp, n_pos, fp, n_neg)


@dataclass(frozen=True)
class GdpAudit:
    """Result of :func:`gdp_audit`: the GDP bound and the counts behind it."""

    mu_lb: float
    threshold: float
    tp: int
    n_pos: int
    fp: int
    n_neg: int


def gdp_audit(scores: np.ndarray, members: np.ndarray, select: np.ndarray,
              evaluate: np.ndarray, *, confidence: float = 0.95) -> GdpAudit:
    """GDP bound (:func:`~fedem_private.privacy.audit_bounds.gdp_mu_lower_bound`) from
    one-dimensional canary scores, one coin-flipped canary per entry.

    ``scores`` and ``members`` (bool) are (n,); ``select`` and ``evaluate`` are
    disjoint index arrays. The threshold (flag "member" when score >= t) is the one,
    among the 5%..95% quantiles of the pooled ``select`` scores, maximising the bound
    on the ``select`` canaries, their rates scaled to the evaluation counts; it is
    then applied once to the ``evaluate`` canaries, whose counts give the bound.
    Certified only when membership was a fair coin.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(members, dtype=bool)
    ev_s, ev_y = s[evaluate], y[evaluate]
    n_pos, n_neg = int(ev_y.sum()), int((~ev_y).sum())
    pos, neg = np.sort(s[select][y[select]]), np.sort(s[select][~y[select]])
    if n_pos == 0 or n_neg == 0 or pos.size == 0 or neg.size == 0:
        return GdpAudit(0.0, math.inf, 0, n_pos, 0, n_neg)
    # central thresholds only (pooled quantiles 5%..95%): the probit of a rate is most
    # precise near 1/2, and a tail threshold picked on a few select canaries is mostly
    # their noise (it would not carry over to the evaluation canaries)
    cand = np.unique(np.quantile(np.concatenate([pos, neg]), np.linspace(0.05, 0.95, 181)))
    tpr = 1.0 - np.searchsorted(pos, cand, side="left") / pos.size
    fpr = 1.0 - np.searchsorted(neg, cand, side="left") / neg.size
    alpha = (1.0 - confidence) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        est = np.nan_to_num(special.ndtri(cp_lower(tpr * n_pos, n_pos, alpha))
                            - special.ndtri(cp_upper(fpr * n_neg, n_neg, alpha)),
                            nan=-np.inf, posinf=-np.inf)
    t = float(cand[int(np.argmax(est))])
    tp, fp = int((ev_s[ev_y] >= t).sum()), int((ev_s[~ev_y] >= t).sum())
    mu = gdp_mu_lower_bound(tp, n_pos, fp, n_neg, confidence=confidence)
    return GdpAudit(mu, t, tp, n_pos, fp, n_neg)


@dataclass(frozen=True)
class OneRunAudit:
    """Result of :func:`one_run_audit`: the bound and the guess counts behind it."""

    eps_lb: float
    m: int
    r: int
    v: int
    frac_in: float
    frac_out: float


GUESS_FRACTIONS: tuple[float, ...] = (0.0, 0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _guess_counts(s: np.ndarray, y: np.ndarray, frac_in: float, frac_out: float,
                  rng: np.random.Generator) -> tuple[int, int]:
    """(r, v): guess "in" for the top frac_in, "out" for the bottom frac_out, abstain between."""
    n = s.shape[0]
    k_in = min(n, math.ceil(frac_in * n))
    k_out = min(n - k_in, math.ceil(frac_out * n))
    ranked = y[_rank_order(s, rng)]
    v = int((ranked[:k_in] == 1.0).sum()) + int((ranked[n - k_out:] == 0.0).sum())
    return k_in + k_out, v


def balanced_pairs(scores: np.ndarray, labels: np.ndarray, rows: np.ndarray,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pooled (scores, labels) of ``rows`` with, per client, as many non-members as members.

    The larger class of each client is subsampled (seeded) to the size of the
    smaller, so members make up half of the canaries, as under the fair-coin
    design; a client lacking either class contributes nothing.
    """
    s_out, y_out = [], []
    for row in rows:
        pos = np.flatnonzero(labels[row] == 1.0)
        neg = np.flatnonzero(labels[row] == 0.0)
        n = min(pos.size, neg.size)
        if n == 0:
            continue
        keep = np.concatenate([rng.choice(pos, n, replace=False),
                               rng.choice(neg, n, replace=False)])
        s_out.append(scores[row, keep])
        y_out.append(labels[row, keep])
    if not s_out:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(s_out), np.concatenate(y_out)


def coin_canaries(scores: np.ndarray, labels: np.ndarray, rows: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Pooled (scores, labels) of every labelled (client, item) of ``rows``, unbalanced.

    For canaries whose membership was decided by fair coins: the member share
    is already 1/2 in expectation, as the one-run theorem assumes.
    """
    sub_s, sub_y = scores[rows], labels[rows]
    mask = ~np.isnan(sub_y)
    return sub_s[mask], sub_y[mask]


def one_run_audit(scores: np.ndarray, labels: np.ndarray, select: np.ndarray,
                  evaluate: np.ndarray, *, confidence: float = 0.95, delta: float = 0.0,
                  seed: int = 0, balance: bool = True) -> OneRunAudit:
    """One-run audit (bound 2) over balanced labelled (client, item) pairs of ``evaluate``.

    Canaries: each client's members plus as many of its non-members, drawn at
    random (:func:`balanced_pairs`), so the member share is 1/2 as in the
    paper's design; without this, guessing "out" for everything would beat
    1/2 on natural data and fake a positive bound. This removes that artefact;
    it does not make natural membership random (see the module docstring).
    The guess rule (top ``frac_in`` of the ranking guessed in, bottom
    ``frac_out`` guessed out, the rest abstained, fractions from
    :data:`GUESS_FRACTIONS`) is the one giving the largest pure-DP bound on
    the ``select`` clients' canaries; it is then applied once to the
    evaluation canaries. ``balance=False`` (coin-flipped canaries) keeps every
    labelled pair instead (:func:`coin_canaries`).
    """
    rng = np.random.default_rng(seed)
    if balance:
        s_sel, y_sel = balanced_pairs(scores, labels, select, rng)
        s_ev, y_ev = balanced_pairs(scores, labels, evaluate, rng)
    else:
        s_sel, y_sel = coin_canaries(scores, labels, select)
        s_ev, y_ev = coin_canaries(scores, labels, evaluate)
    if s_sel.size == 0 or s_ev.size == 0:
        return OneRunAudit(0.0, int(s_ev.size), 0, 0, 0.0, 0.0)
    best = (-1.0, 0.0, 0.0)
    for f_in in GUESS_FRACTIONS:
        for f_out in GUESS_FRACTIONS:
            if f_in + f_out == 0.0 or f_in + f_out > 1.0:
                continue
            r, v = _guess_counts(s_sel, y_sel, f_in, f_out, rng)
            e = one_run_eps_lower_bound(s_sel.size, r, v, confidence=confidence, iterations=30)
            if e > best[0]:
                best = (e, f_in, f_out)
    _, f_in, f_out = best
    r, v = _guess_counts(s_ev, y_ev, f_in, f_out, rng)
    eps = one_run_eps_lower_bound(s_ev.size, r, v, confidence=confidence, delta=delta)
    return OneRunAudit(eps, int(s_ev.size), r, v, f_in, f_out)
