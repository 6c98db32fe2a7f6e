"""High-confidence LOWER bounds on a mechanism's privacy from an audit's guesses (pure functions).

What an audit may conclude. An audit runs a mechanism on canaries whose
membership it decided by fair coins, scores each canary from what the
mechanism released, and counts how well the scores separate members from
non-members. The functions below turn those counts into a figure that is
below the mechanism's true privacy parameter with probability at least
``confidence`` over the audit's own randomness (coins and noise). A sound
mechanism therefore exceeds its accounted figure in at most 1 - confidence of
audits; a figure above the accounted one is evidence of a bug at that level.

Neighbouring relation and trust model are the audited mechanism's: each
function assumes only that the mechanism is private in each canary's
inclusion bit (for local DP: the client's data with or without the canary; for
cdp-gaussian: the canary client present or absent; for DP-SGD: the canary
interaction present or absent), and that the coins were independent and fair
and decided before the run.

Three bounds.

1. One run (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
   Training Run", NeurIPS 2023). m canaries, each included with probability
   1/2 independently; the auditor guesses in/out for r of them by a rule fixed
   before seeing the coins, and gets v right. Under eps-DP in each canary, v
   is stochastically dominated by Binomial(r, e^eps / (1 + e^eps)) (their
   Theorem 3.1), so the p-value of eps is P[Binomial(r, q) >= v],
   q = e^eps / (1 + e^eps). Under (eps, delta)-DP their Theorem 5.2 (the code
   of their Appendix D) adds 2 m delta max_{i = 1..v} P[v > Binomial(r, q) >=
   v - i] / i. The bound is the largest eps whose p-value is below
   beta = 1 - confidence (bisection; the p-value grows with eps). The delta
   term grows with m: for a Gaussian mechanism at large eps the bound is weak
   (the paper says so too).

2. Clopper-Pearson point (:func:`attacks.audit.cp_eps_lower_bound`, kept
   there): one threshold test, eps from (TPR, FPR) at delta.

3. Gaussian differential privacy (Dong, Roth and Su 2022; the f-DP view used
   for auditing by Nasr et al. 2023 and Mahloujifar et al. 2024). A mechanism
   is mu-GDP when every test of "canary in" against "canary out" has
   TPR <= Phi(Phi^-1(FPR) + mu). :func:`gdp_mu_lower_bound` bounds TPR from
   below and FPR from above (one-sided Clopper-Pearson, each at level
   (1 - confidence) / 2) and returns mu_lb = Phi^-1(TPR_lo) - Phi^-1(FPR_hi)
   (0 when not positive): with probability >= confidence the mechanism is not
   mu-GDP for any mu < mu_lb. The Gaussian mechanism of sensitivity s and
   noise std sigma is EXACTLY (s / sigma)-GDP, and its accounted (eps, delta)
   is the eps(delta) of that mu (:func:`~fedem_private.privacy.accounting.
   gaussian_epsilon`), so :func:`gdp_eps_lower_bound` = eps(delta) of mu_lb is
   a lower bound on the accounted eps of a sound Gaussian mechanism at the
   stated confidence. Only for mechanisms whose claim IS a GDP claim (one
   Gaussian release; not Laplace, not a subsampled or composed-with-
   subsampling Gaussian such as DP-SGD, whose tradeoff curve is not a GDP
   curve): for those the figure is not a bound on their eps.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

_EPS_CAP = 1000.0


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float = 0.0) -> float:
    """P-value of v correct guesses out of r (m canaries) under (eps, delta)-DP (bound 1)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m; got v={v}, r={r}, m={m}")
    if eps < 0 or not 0 <= delta <= 1:
        raise ValueError("need eps >= 0 and 0 <= delta <= 1")
    q = float(special.expit(eps))
    p = float(stats.binom.sf(v - 1, r, q))
    if delta > 0 and v > 0:
        i = np.arange(1, v + 1)
        below = stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - 1 - i, r, q)
        p += 2.0 * m * delta * float(np.max(below / i))
    return min(p, 1.0)


def one_run_eps_lower_bound(m: int, r: int, v: int, *, confidence: float = 0.95,
                            delta: float = 0.0, iterations: int = 60) -> float:
    """Largest eps with one_run_p_value(m, r, v, eps, delta) < 1 - confidence; 0 if none."""
    beta = 1.0 - confidence
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi < _EPS_CAP and one_run_p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2.0 * hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


def _cp_lower(x: float, n: float, alpha: float) -> float:
    return 0.0 if x <= 0 else float(stats.beta.ppf(alpha, x, n - x + 1))


def _cp_upper(x: float, n: float, alpha: float) -> float:
    return 1.0 if x >= n else float(stats.beta.ppf(1 - alpha, x + 1, n - x))


def gdp_mu_lower_bound(tp: float, n_pos: float, fp: float, n_neg: float, *,
                       confidence: float = 0.95) -> float:
    """mu_lb = max(0, Phi^-1(TPR_lo) - Phi^-1(FPR_hi)) from tp/n_pos members and fp/n_neg
    non-members flagged by ONE threshold test fixed in advance (bound 3).

    TPR_lo and FPR_hi are one-sided Clopper-Pearson bounds at level
    (1 - confidence) / 2 each, so both hold together with probability >=
    confidence (Bonferroni). The test may flag members by high or by low scores;
    the expression is the same (the GDP tradeoff curve is symmetric).
    """
    if n_pos <= 0 or n_neg <= 0:
        return 0.0
    alpha = (1.0 - confidence) / 2.0
    tpr, fpr = _cp_lower(tp, n_pos, alpha), _cp_upper(fp, n_neg, alpha)
    if tpr <= 0.0 or fpr >= 1.0:
        return 0.0
    return max(0.0, float(special.ndtri(tpr) - special.ndtri(fpr)))


def gdp_eps_lower_bound(mu_lb: float, delta: float) -> float:
    """eps(delta) of the mu_lb-GDP (Gaussian) mechanism: a lower bound on a sound Gaussian
    mechanism's accounted eps at the confidence mu_lb was computed at (bound 3)."""
    from fedem_private.privacy.accounting import gaussian_epsilon

    if not mu_lb > 0:
        return 0.0
    return float(gaussian_epsilon(mu_lb, delta))


def fails(lower_bound: float | None, accounted: float | None) -> bool:
    """True when a lower bound exceeds the accounted eps (None: nothing to compare)."""
    return (lower_bound is not None and accounted is not None
            and math.isfinite(accounted) and lower_bound > accounted)
