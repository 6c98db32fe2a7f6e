"""A read-only view of a run, for the code that records, reports and benchmarks it.

Recording (:mod:`fedem_private.experiments.recording`), the runner's summary, the
references and the benchmarks read a run through :class:`RunView`
(``Simulation.view``), not through :class:`~fedem_private.simulation.loop.Simulation`'s
attributes. Actions (``step``, ``run``, ``evaluate``, registering an observer) stay
methods of ``Simulation``.

Who reads what, and what the view does NOT hold:

- the view is the *experiment harness's* (the operator's), not the server's: it holds
  the split (every client's training positives and held-out items) because the
  recorder writes the ground truth the scorer reads, and the seed, because the
  recorder redraws each recorded client's keyed training sample. Code that models
  the honest-but-curious server must not read it: the server's view is the
  observations (:class:`~fedem_private.simulation.loop.ChunkView`,
  :class:`~fedem_private.simulation.loop.AggregateView`) and ``public.json``;
- no client's state is reachable through it: neither the per-client tables
  (``SimState.q_local``, the private groups such as p_u, the dense groups) nor the
  server's aggregators or the privacy layer's noise generators. The privacy layer is
  seen only through what the run reports of it: its public parameters, its summary
  and its ledger (the accounting, docs/design.md section 5), whose guarantees are the
  ledger's and are not restated here;
- fields cannot be assigned (a frozen dataclass: ``FrozenInstanceError``); the
  demographic arrays are read-only numpy views. The split's arrays are the run's own
  (shared, not copied, as a run's data can be large): read them, never write them.

The current round and whether the last round ran with the host allocator tuned change
as the run steps; they, the privacy reports and the participants are read through
accessors (closures) the ``Simulation`` hands the view, so no field of the view is the
``Simulation`` or a part of it. Python cannot seal a closure against introspection: the
narrowing is of the interface the harness is written against, not a capability boundary
(the attacks are kept from the simulation by the import contracts, docs/design.md
section 1, and read only the recorded files).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from fedem_private.data.split import Split
from fedem_private.models.base import ClientSamples, draw_samples
from fedem_private.simulation.config import RunConfig


def read_only(arrays: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """A read-only mapping of read-only numpy views of ``arrays`` (the arrays stay writable
    to their owner; only these views refuse writes)."""
    out = {}
    for name, values in arrays.items():
        view = np.asarray(values).view()
        view.flags.writeable = False
        out[name] = view
    return MappingProxyType(out)


@dataclass(frozen=True)
class RunView:
    """What a run shows the harness that records, reports and benchmarks it (module docstring).

    ``cfg`` is the validated, resolved configuration; ``split`` the run's data split (ground
    truth: the harness's, never the server's); ``dataset_name`` the loaded dataset's name;
    ``demographics`` per split user (read-only); ``seed`` the run's seed (never written where
    the server could read it: it would let it regenerate the noise); ``device`` that of the
    heavy tensors; ``central`` / ``dpsgd`` what kind of mechanism the privacy layer runs.
    """

    cfg: RunConfig
    split: Split
    dataset_name: str
    demographics: Mapping[str, np.ndarray]
    seed: int
    device: torch.device
    central: bool
    dpsgd: bool
    _round: Callable[[], int] = field(repr=False, compare=False)
    _tuned: Callable[[], bool] = field(repr=False, compare=False)
    _participants: Callable[[int], np.ndarray] = field(repr=False, compare=False)
    _excl: tuple[np.ndarray, np.ndarray] = field(repr=False, compare=False)
    _privacy_params: Callable[[], dict[str, object]] = field(repr=False, compare=False)
    _privacy_summary: Callable[[], dict[str, Any]] = field(repr=False, compare=False)
    _privacy_ledger: Callable[[], dict[str, Any]] = field(repr=False, compare=False)

    @property
    def round(self) -> int:
        """The last round run (0 before the first)."""
        return self._round()

    @property
    def host_allocator_tuned(self) -> bool:
        """Whether the last round ran with the host allocator tuned
        (:mod:`fedem_private.hostmem`)."""
        return self._tuned()

    @property
    def n_users(self) -> int:
        """Clients in the split."""
        return self.split.n_users

    @property
    def n_items(self) -> int:
        """Items in the split."""
        return self.split.n_items

    def participants(self, round_: int) -> np.ndarray:
        """The clients taking part in ``round_`` (a pure function of the seed, the round and
        the configuration: the privacy layer's Poisson sample, all, or a client fraction)."""
        return self._participants(round_)

    def samples(self, round_: int, clients: np.ndarray) -> ClientSamples:
        """``clients``' keyed training sample of ``round_`` (positives and the negatives
        they draw; a pure function of (seed, round, client), :func:`draw_samples`): what
        a participant trained on, or what a client that sat the round out would have."""
        sp = self.split
        return draw_samples(self.seed, round_, clients, sp.train_indptr, sp.train_items,
                            *self._excl, sp.n_items, self.cfg.train.num_negatives)

    def privacy_params(self) -> dict[str, object]:
        """The mechanism's public parameters, JSON-ready (``MechanismParams.as_log``)."""
        return self._privacy_params()

    def privacy_summary(self) -> dict[str, Any]:
        """The privacy layer's summary (``PrivacyLayer.summary``: the ledger's worst client,
        the threat model, under cdp-gaussian both guarantees), JSON-ready."""
        return self._privacy_summary()

    def privacy_ledger(self) -> dict[str, Any]:
        """The whole privacy ledger, JSON-ready (written as privacy_ledger.json)."""
        return self._privacy_ledger()
