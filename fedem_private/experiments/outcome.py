"""Warnings on what a finished run measured (issue 78): a model no better than ranking at
random, or uploads the noise swamped. Both go into ``summary.json``'s ``warnings`` list and
the command prints each as one line."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedem_private.data.split import Split

# the noise-to-signal ratio (privacy.noise_to_signal.mean_over_rounds) above which a run is
# said to be mostly noise
NOISY = 10.0
K = 10  # HR@K of the chance check


def full_chance(split: Split, k: int = K) -> tuple[float, float]:
    """HR@``k`` of a random ranking in the full-ranking evaluation, and the mean number of
    candidate items: user u ranks every item but its training items and its validation item
    (:func:`~fedem_private.data.split.evaluation_exclusion_csr`; in the leave-one-out split
    the validation item is none of the training items), so at random its test item is in
    the top k with probability min(1, k / c_u). Both are means over the split's users."""
    candidates = split.n_items - np.asarray(split.train_counts, dtype=np.float64) - 1.0
    candidates = np.maximum(candidates, 1.0)
    if candidates.size == 0:
        return float("nan"), float("nan")
    return float(np.minimum(1.0, k / candidates).mean()), float(candidates.mean())


def outcome_warnings(split: Split, metrics: dict[str, Any] | None,
                     privacy: dict[str, Any] | None) -> list[str]:
    """One line for each sign that the run learned nothing: full HR@10 not above
    :func:`full_chance`, or a mean noise-to-signal ratio above :data:`NOISY`."""
    out = []
    full = (metrics or {}).get("full") or {}
    hr = full.get("hr@10")
    if hr is not None:
        chance, candidates = full_chance(split)
        if hr <= chance:
            out.append(f"full HR@10 {hr:.4g} is not above chance ({chance:.4g}: a random "
                       f"ranking of a user's ~{candidates:,.0f} candidate items): the model "
                       f"ranks the held-out items no better than at random")
    nsr = ((privacy or {}).get("noise_to_signal") or {}).get("mean_over_rounds")
    if nsr is not None and float(nsr) > NOISY:
        out.append(f"the noise-to-signal ratio is {float(nsr):.3g} (mean over rounds, "
                   f"privacy.noise_to_signal; above {NOISY:g}): the noise added is many times "
                   f"the signal it is added to, which usually leaves the model near chance")
    return out
