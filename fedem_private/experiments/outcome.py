"""A finished run beside its references, and warnings on what it measured (issues 78, 80).

Every summary carries ``references``: chance and MostPop on the same evaluated users as the
run's own full HR@10 (:func:`references`), so a figure never stands alone. The warnings go
into ``summary.json``'s ``warnings`` list and the command prints each as one line: a model
no better than ranking at random (within :data:`NOISE_SE` standard errors of chance), or
uploads the noise swamped."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedem_private.data.split import Split

# the noise-to-signal ratio (privacy.noise_to_signal.mean_over_rounds) above which a run is
# said to be mostly noise
NOISY = 10.0
K = 10  # HR@K of the chance check
# a figure within this many standard errors of chance is "at chance" (the floors' verdicts
# use the same number for "beyond seed noise")
NOISE_SE = 2.0


def _chance_terms(split: Split, users: np.ndarray | None, k: int) -> tuple[np.ndarray,
                                                                           np.ndarray]:
    """(each evaluated user's chance of a hit in the top ``k`` at random, its candidates)."""
    counts = np.asarray(split.train_counts, dtype=np.float64)
    if users is not None:
        counts = counts[np.asarray(users, dtype=np.int64)]
    candidates = np.maximum(split.n_items - counts - 1.0, 1.0)
    return np.minimum(1.0, k / candidates), candidates


def full_chance(split: Split, k: int = K) -> tuple[float, float]:
    """HR@``k`` of a random ranking in the full-ranking evaluation, and the mean number of
    candidate items: user u ranks every item but its training items and its validation item
    (:func:`~fedem_private.data.split.evaluation_exclusion_csr`; in the leave-one-out split
    the validation item is none of the training items), so at random its test item is in
    the top k with probability min(1, k / c_u). Both are means over the split's users."""
    p, candidates = _chance_terms(split, None, k)
    if p.size == 0:
        return float("nan"), float("nan")
    return float(p.mean()), float(candidates.mean())


def chance_reference(split: Split, users: np.ndarray | None = None,
                     k: int = K) -> dict[str, float]:
    """Chance's full HR@``k`` on ``users`` (default: every user) as :func:`full_chance`
    computes it, with its standard error: a random ranking hits user u's test item with
    probability p_u, independently across users, so the HR of one evaluation of N users
    has standard deviation sqrt(sum p_u (1 - p_u)) / N around chance. A model's figure
    within :data:`NOISE_SE` of these of chance could be a random ranking's. Keys ``hr@10``
    (for k = 10), ``hr@10_se``, ``candidates`` (mean) and ``users``."""
    p, candidates = _chance_terms(split, users, k)
    n = int(p.size)
    if n == 0:
        nan = float("nan")
        return {f"hr@{k}": nan, f"hr@{k}_se": nan, "candidates": nan, "users": 0}
    return {f"hr@{k}": float(p.mean()), f"hr@{k}_se": float(math.sqrt((p * (1 - p)).sum()) / n),
            "candidates": float(candidates.mean()), "users": n}


REFERENCES_NOTE = ("on the run's own evaluated users and evaluation sets: chance is a random "
                   "ranking's expected HR@10 (hr@10_se: its standard error over these users), "
                   "MostPop ranks items by their training counts (not private)")


def references(cfg: Any, split: Split) -> dict[str, Any]:
    """summary.json's ``references``: chance (:func:`chance_reference`) and MostPop (items
    ranked by their training counts, the ``mostpop`` baseline's scores and tie-break) on the
    users the run evaluates (``train.eval_users``'s sample, or everyone) and with the
    run's evaluation sets, so they read beside its own figures. MostPop is one more
    evaluation of one score vector: cheap beside the run."""
    from fedem_private import baselines
    from fedem_private.baselines.popularity import mostpop_scores
    from fedem_private.evaluation.metrics import eval_sample

    users = eval_sample(split.n_users, cfg.train.eval_users, cfg.train.seed)
    pop = baselines.evaluate(cfg, split, mostpop_scores(split, cfg.train.run_seed))
    kept = {kind: {m: float(pop[kind][m]) for m in ("hr@10", "ndcg@10") if m in pop[kind]}
            for kind in ("full", "sampled") if kind in pop}
    return {"users": int(users.size), "chance": {"full": chance_reference(split, users)},
            "mostpop": kept, "note": REFERENCES_NOTE}


def outcome_warnings(split: Split, metrics: dict[str, Any] | None,
                     privacy: dict[str, Any] | None,
                     users: np.ndarray | None = None) -> list[str]:
    """One line for each sign that the run learned nothing: full HR@10 not above chance on
    the evaluated ``users`` (default: every user) by :data:`NOISE_SE` of its standard errors
    (:func:`chance_reference`; "at chance" within them, "below chance" beneath), or a mean
    noise-to-signal ratio above :data:`NOISY`."""
    out = []
    full = (metrics or {}).get("full") or {}
    hr = full.get("hr@10")
    if hr is not None:
        ref = chance_reference(split, users)
        chance, se, candidates = ref["hr@10"], ref["hr@10_se"], ref["candidates"]
        where = (f"{chance:.4g} ± {se:.2g}: a random ranking of a user's ~{candidates:,.0f} "
                 f"candidate items, on the same {ref['users']:,} users")
        if hr < chance - NOISE_SE * se:
            out.append(f"full HR@10 {hr:.4g} is below chance ({where}): the model ranks the "
                       f"held-out items worse than at random")
        elif hr <= chance + NOISE_SE * se:
            out.append(f"full HR@10 {hr:.4g} is at chance ({where}; within {NOISE_SE:g} "
                       f"standard errors): the model ranks the held-out items no better "
                       f"than at random")
    nsr = ((privacy or {}).get("noise_to_signal") or {}).get("mean_over_rounds")
    if nsr is not None and float(nsr) > NOISY:
        out.append(f"the noise-to-signal ratio is {float(nsr):.3g} (mean over rounds, "
                   f"privacy.noise_to_signal; above {NOISY:g}): the noise added is many times "
                   f"the signal it is added to, which usually leaves the model near chance")
    return out
