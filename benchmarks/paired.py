"""Paired verdicts on shared users, and Holm's rule over a study's cells (issue 78, item 3).

Two runs at one seed rank the same evaluated users (the sample is keyed by the seed), and
each writes ``ranks.csv``. A verdict compares them user by user: the difference of the two
test hits@10, averaged; the seeds' means are averaged with equal weight. Used by the
population study on calibrated users (``benchmarks/population_study.py``) and on gowalla
(``benchmarks/gowalla_study.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def hits(run: Path) -> dict[int, int]:
    """Each evaluated user's full-ranking hit@10 (user id -> 0/1) from ``run/ranks.csv``."""
    import pandas as pd

    r = pd.read_csv(run / "ranks.csv")
    return dict(zip(r["user"].tolist(), (r["full_rank"] < 10).astype(int).tolist(), strict=True))


@dataclass(frozen=True)
class Paired:
    """A paired comparison of a against b: ``diff`` = mean(hit_a - hit_b), its standard
    error ``se``, the users compared over all seeds, and the seeds."""

    diff: float
    se: float
    users: int
    seeds: int

    @property
    def p_greater(self) -> float:
        """One-sided p-value of diff > 0 under a normal statistic diff / se."""
        return one_sided_p(self.diff, self.se)

    @property
    def p_less(self) -> float:
        """One-sided p-value of diff < 0."""
        return one_sided_p(-self.diff, self.se)


def one_sided_p(diff: float, se: float) -> float:
    """P(Z >= diff / se) for a standard normal Z (0 when se is 0 and diff > 0)."""
    if se <= 0:
        return 0.0 if diff > 0 else 1.0
    return 0.5 * math.erfc(diff / se / math.sqrt(2))


def paired(a: list[dict[int, int]], b: list[dict[int, int]]) -> Paired:
    """a against b over seeds (``a[s]`` and ``b[s]`` the hits of seed s): per seed, the users
    both runs ranked and each user's hit difference; the seeds' means averaged with equal
    weight. The standard error is the larger of the pooled paired one (root-sum-square of
    each seed's sd / sqrt(users), over the number of seeds) and, with two seeds or more, the
    seeds' standard deviation of their mean differences over sqrt(seeds): the second holds
    the training randomness a single evaluation sample leaves out."""
    means, ses, n = [], [], 0
    for x, y in zip(a, b, strict=True):
        users = sorted(set(x) & set(y))
        d = np.array([x[u] - y[u] for u in users], dtype=np.float64)
        means.append(float(d.mean()))
        ses.append(float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else math.inf)
        n += len(d)
    k = len(means)
    se = math.sqrt(sum(s * s for s in ses)) / k
    if k > 1:
        se = max(se, float(np.std(means, ddof=1)) / math.sqrt(k))
    return Paired(float(np.mean(means)), se, n, k)


def holm(pvalues: list[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down rule: which hypotheses are rejected at family-wise level ``alpha``
    (sorted p-values p_(1) <= ...; reject while p_(r) <= alpha / (m - r + 1))."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected


def verdicts(tests: list[Paired], alpha: float = 0.05) -> list[str]:
    """Each comparison's verdict with Holm's rule over all of them: a two-sided test per
    comparison (p = 2 min(p_greater, p_less)); "beats" or "below" by the sign of the
    difference where Holm rejects it at family-wise level ``alpha``, else "not shown"."""
    two = [min(1.0, 2 * min(t.p_greater, t.p_less)) for t in tests]
    return [("beats" if t.diff > 0 else "below") if r else "not shown"
            for t, r in zip(tests, holm(two, alpha), strict=True)]
