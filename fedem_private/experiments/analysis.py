"""The library's names for analysis scripts: what a table or grid script reads beyond the API.

:mod:`fedem_private.api` runs, sweeps, attacks and loads results. A script that turns
those results into a table (``benchmarks/``, a notebook) also needs a few facts the
lower rooms own: whether a results row's mechanism adds noise, a mechanism's
capability, the accountant's composition, a run config and its overrides, a dataset's
split and each test user's number of full-ranking candidates. They are re-exported
here, so such a script imports ``fedem_private``, ``fedem_private.api`` and
``fedem_private.experiments`` only; the import-linter contract "Benchmarks use the
public API" (``pyproject.toml``, docs/design.md section 1) holds ``benchmarks/`` to
that. Measurement probes of internals (``benchmarks/probes/``) are exempt.
"""

from __future__ import annotations

import numpy as np

from fedem_private.data import Split, leave_one_out, load_dataset
from fedem_private.data.split import evaluation_exclusion_csr
from fedem_private.errors import UserError
from fedem_private.privacy.accounting import PLD_MAX_ROUND_EPS, RoundMechanism, compose
from fedem_private.privacy.registry import capability, no_privacy
from fedem_private.simulation.config import METHOD_DEFAULTS, RunConfig, read_toml, with_overrides

__all__ = ["METHOD_DEFAULTS", "PLD_MAX_ROUND_EPS", "RoundMechanism", "RunConfig", "Split",
           "UserError",
           "candidate_counts", "capability", "compose", "leave_one_out", "load_dataset",
           "no_privacy", "read_toml", "with_overrides"]


def candidate_counts(split: Split) -> np.ndarray:
    """Each user's number of full-ranking candidates at test time: the items not consumed
    before the test (training items and the validation item excluded, section 2)."""
    indptr, _ = evaluation_exclusion_csr(split)
    return split.n_items - np.diff(indptr)
