"""Options of three variants of a client's start and local training (issue 69; docs/design.md
section 4, "Variants under strict"): which rows elastic merging mixes, and a proximal pull of
the local table toward the received one.

- ``federation.merge_rows`` (:class:`MergeRowsOptions`): ``all`` (equation 10 on every row,
  as published) or ``seen`` (equation 10 on the rows of the client's own training items
  only; every other row takes the received table, rho = 1):

      rho'_ui = rho_ui  if i in I_u,   rho'_ui = 1  otherwise,
      Q_m = Q_l + rho' (.) (Q_g - Q_l)                              (equation 10 with rho')

  I_u is the client's training positives (its own items D_u; under ``holdout`` the fold the
  adapter fits on included).
- ``federation.prox_mu`` (:class:`ProxOptions`): mu >= 0; local training adds
  (mu / 2) ||Q_l - Q_g||^2 over the rows the client trains in the round (its positives and
  that round's sampled negatives) to each batch's loss (Ditto / FedProx style), Q_g the table
  the client received. 0 (the default) is the published loss.

- ``federation.merge_every`` (:class:`MergeEveryOptions`): K >= 1; a client receives the
  server's table and merges (equation 10) only in rounds t with (t - 1) mod K = 0; in the
  other rounds it starts from its own table, as a client that received nothing does under
  the FedEM code's ``agg_clients_ratio``:

      Q_start(t) = Q_l + rho (.) (Q_g - Q_l)  if (t - 1) mod K = 0,  else  Q_l

  Its uploads are aggregated every round. K = 1 (the default) is the published schedule;
  an ablation of how long the local table runs on its own (built without privacy).

Every default leaves every run as it was (and out of a run's identity,
``simulation/config_io.py:LATER_FIELDS``). The tensor code is
:mod:`fedem_private.client.variants`; this module imports no torch, so the configuration
reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from fedem_private.models.options import PartOptions, part_options, require

#: which rows elastic merging mixes: every row, or the client's own training items only
MERGE_ROWS = ("all", "seen")


@part_options
@dataclass(frozen=True)
class MergeRowsOptions(PartOptions):
    """``federation.merge_rows``: ``all`` (equation 10 on every row) or ``seen`` (rho' = rho
    on the client's training items, 1 elsewhere; module docstring)."""

    rows: str = "all"
    keys: ClassVar[dict[str, str]] = {"rows": "merge_rows"}

    def check(self) -> None:
        require(self.rows in MERGE_ROWS,
                f"federation.merge_rows must be one of {', '.join(MERGE_ROWS)}, "
                f"got {self.rows!r}")


@part_options
@dataclass(frozen=True)
class ProxOptions(PartOptions):
    """``federation.prox_mu``: the weight mu of (mu / 2) ||Q_l - Q_g||^2 in local training
    (module docstring); 0 turns it off."""

    mu: float = 0.0
    keys: ClassVar[dict[str, str]] = {"mu": "prox_mu"}

    def check(self) -> None:
        require(isinstance(self.mu, int | float) and math.isfinite(self.mu) and self.mu >= 0,
                f"federation.prox_mu must be a number >= 0, got {self.mu}")


@part_options
@dataclass(frozen=True)
class MergeEveryOptions(PartOptions):
    """``federation.merge_every``: K, the rounds from one merge to the next (module
    docstring); 1 merges every round, as published."""

    every: int = 1
    keys: ClassVar[dict[str, str]] = {"every": "merge_every"}

    def check(self) -> None:
        require(isinstance(self.every, int) and not isinstance(self.every, bool)
                and self.every >= 1,
                f"federation.merge_every must be an integer >= 1, got {self.every!r}")

    def merges_in(self, round_: int) -> bool:
        """Whether round ``round_`` (from 1) is a merge round: (round - 1) mod K = 0."""
        return (int(round_) - 1) % self.every == 0
