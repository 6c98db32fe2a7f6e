"""Per-client privacy ledger: which rounds each client uploaded in, and what it spent.

A client is charged only for the rounds it actually took part in (no
amplification by subsampling is claimed: the server sees who took part).
Its history is a composition of per-round mechanisms, bounded at the run's delta by the
accountant the ledger holds: an :class:`~fedem_private.privacy.accountants.Accountant`
object (by default :class:`~fedem_private.privacy.accountants.LocalBounds`, every local
bound at once), stepped with each client's rounds and asked for its figures; the ledger
names no accountant.

Conventions: dicts returned here are JSON-ready and write an infinite eps
(no finite guarantee) as None; a client that uploaded nothing has spent 0.0.
Modes none and paper give no guarantee, nor does the INSECURE
ldp-touched-rows (its "nominal_epsilon" is what it would give if the set of
touched rows were public, and is labelled as such). Mode paper also carries
the FedEM paper's heuristic eps, labelled as a heuristic.

Cost: clients with the same counts of the same mechanisms have the same eps,
so bounds are computed per distinct history (and cached by the accountant);
only histories not dominated by another one
are evaluated when looking for the worst client.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedem_private.privacy.accountants import LocalBounds
from fedem_private.privacy.accounting import EpsilonBounds, RoundMechanism
from fedem_private.privacy.params import MechanismParams

#: the figures of the default accountant (each bound's name, then ``reported``)
EPSILON_KEYS: tuple[str, ...] = LocalBounds.keys()
TOUCHED_ROWS_WARNING = (
    "ldp-touched-rows is INSECURE: the set of touched rows leaks, no DP guarantee; "
    "nominal_epsilon assumes that set were public"
)
PAPER_NOTE = (
    "FedEM paper's heuristic eps = 2 p_u eta Z / lambda: bounds one SGD step, "
    "not E epochs of Adam; NOT a DP guarantee"
)


def _json(value: float) -> float | None:
    return None if math.isinf(value) else float(value)


def _epsilon_dict(bounds: EpsilonBounds, keys: tuple[str, ...]) -> dict[str, float | None]:
    return {key: _json(getattr(bounds, key)) for key in keys}


def _constant_epsilon(value: float, keys: tuple[str, ...] = EPSILON_KEYS
                      ) -> dict[str, float | None]:
    return {key: _json(value) for key in keys}


def _mechanism_json(mech: RoundMechanism | None) -> dict[str, Any] | None:
    if mech is None:
        return None
    out: dict[str, Any] = {"kind": mech.kind, "noise_multiplier": mech.noise_multiplier}
    if mech.kind == "sampled-gaussian":
        out.update(sample_rate=mech.sample_rate, steps=mech.steps)
    return out


class PrivacyLedger:
    """Rounds per client and the eps they imply, for one run (one privacy mode).

    ``accountant``: the accountant a client's rounds are composed in, empty (None:
    :class:`~fedem_private.privacy.accountants.LocalBounds`); its ``keys()`` name the
    figures of :meth:`spent`.
    """

    def __init__(self, params: MechanismParams, accountant: LocalBounds | None = None) -> None:
        self.params = params
        self.accountant = LocalBounds() if accountant is None else accountant
        self.keys = self.accountant.keys()
        self.mechanism = params.mechanism
        self.delta = float(params.delta)
        self._columns: list[RoundMechanism | None] = []
        self._counts = np.zeros((0, 0), dtype=np.int64)
        self._rounds: list[tuple[int, int, np.ndarray]] = []
        self._heuristic_sum = np.zeros(0, dtype=np.float64)
        self._heuristic_max = np.zeros(0, dtype=np.float64)
        self._has_heuristic = False
        self.log: list[dict[str, Any]] = []
        self._bounds_cache: dict[tuple[int, ...], EpsilonBounds] = {}

    # -- recording -----------------------------------------------------------------------------
    def _mechanism(self, params: MechanismParams) -> RoundMechanism | None:
        """The accounting key of a round: real, nominal (touched rows) or None (no guarantee)."""
        if params.mechanism is not self.mechanism or params.delta != self.params.delta:
            raise ValueError("a ledger records one privacy mode and one delta")
        return self.mechanism.ledger_event(params)

    def _column(self, mech: RoundMechanism | None) -> int:
        if mech not in self._columns:
            self._columns.append(mech)
            self._counts = np.pad(self._counts, ((0, 0), (0, 1)))
        return self._columns.index(mech)

    def _grow(self, n_clients: int) -> None:
        have = self._counts.shape[0]
        if n_clients > have:
            new = max(n_clients, 2 * have)
            self._counts = np.pad(self._counts, ((0, new - have), (0, 0)))
            self._heuristic_sum = np.pad(self._heuristic_sum, (0, new - have))
            self._heuristic_max = np.pad(self._heuristic_max, (0, new - have))

    def record_round(self, round_: int, clients: np.ndarray,
                     params: MechanismParams | None = None,
                     heuristic_epsilon: np.ndarray | None = None) -> dict[str, Any]:
        """Charge each client in ``clients`` for one release of ``round_``.

        ``params`` defaults to the ledger's; ``heuristic_epsilon`` (mode paper)
        is the per-client paper heuristic, aligned with ``clients``. Returns
        the round's log entry (also appended to ``self.log``): the eps spent
        so far by the worst client.
        """
        ids = np.asarray(clients, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or np.unique(ids).size != ids.size):
            raise ValueError("clients must be distinct non-negative ids")
        col = self._column(self._mechanism(params or self.params))
        self._grow(int(ids.max()) + 1 if ids.size else 0)
        self._counts[ids, col] += 1
        self._rounds.append((int(round_), col, np.sort(ids)))
        if heuristic_epsilon is not None:
            h = np.asarray(heuristic_epsilon, dtype=np.float64).reshape(-1)
            if h.shape != ids.shape:
                raise ValueError("heuristic_epsilon must align with clients")
            self._heuristic_sum[ids] += h
            self._heuristic_max[ids] = np.maximum(self._heuristic_max[ids], h)
            self._has_heuristic = True
        worst = self._worst()
        entry = {
            "round": int(round_),
            "n_clients": int(ids.size),
            "worst_client": worst,
            "worst_client_rounds": 0 if worst is None else self.n_rounds(worst),
            "epsilon": (self.spent(worst) if worst is not None
                        else _constant_epsilon(0.0, self.keys)),
        }
        self.log.append(entry)
        return entry

    # -- queries -------------------------------------------------------------------------------
    def rounds_of(self, client: int) -> list[int]:
        """The rounds in which ``client`` uploaded, in recording order."""
        out = []
        for round_, _, ids in self._rounds:
            i = np.searchsorted(ids, client)
            if i < ids.size and ids[i] == client:
                out.append(round_)
        return out

    def n_rounds(self, client: int) -> int:
        """How many rounds ``client`` uploaded in."""
        return int(self.uploads(np.array([client]))[0])

    def uploads(self, clients: np.ndarray) -> np.ndarray:
        """How many rounds each of ``clients`` uploaded in so far (vectorised
        :meth:`n_rounds`)."""
        ids = np.asarray(clients, dtype=np.int64).reshape(-1)
        out = np.zeros(ids.shape, dtype=np.int64)
        known = ids < self._counts.shape[0]
        out[known] = self._counts[ids[known]].sum(axis=1)
        return out

    def _account(self, signature: tuple[int, ...]) -> LocalBounds:
        """The ledger's accountant with a client's rounds (its counts per column) composed
        in."""
        account = self.accountant
        for mech, count in zip(self._columns, signature, strict=True):
            if count and mech is not None:
                account = account.step(mech, count)
        return account

    def _signature(self, client: int) -> tuple[int, ...]:
        if client >= self._counts.shape[0]:
            return (0,) * len(self._columns)
        return tuple(int(c) for c in self._counts[client])

    def _bounds(self, signature: tuple[int, ...]) -> EpsilonBounds | None:
        """Bounds of the (real or nominal) mechanisms of a history; None if none apply.
        Kept per signature: columns are only appended, so a signature (one count per
        column so far) names one history, and the worst client's recurs round after
        round (``benchmarks/probes/ledger_cost.py``)."""
        if not self.mechanism.takes_budget:  # nothing accounted (none, paper)
            return None
        if signature not in self._bounds_cache:
            self._bounds_cache[signature] = self._account(signature).bounds(self.delta)
        return self._bounds_cache[signature]

    def spent(self, client: int) -> dict[str, float | None]:
        """Guaranteed eps of ``client`` at the run's delta by every bound (None = inf)."""
        signature = self._signature(client)
        if not any(signature):
            return _constant_epsilon(0.0, self.keys)
        if not self.params.guarantee:
            return _constant_epsilon(math.inf, self.keys)
        bounds = self._bounds(signature)
        assert bounds is not None
        return _epsilon_dict(bounds, self.keys)

    def nominal_spent(self, client: int) -> dict[str, float | None] | None:
        """ldp-touched-rows only: the eps it would give if touched rows were public."""
        if not self.mechanism.nominal_only:
            return None
        bounds = self._bounds(self._signature(client))
        assert bounds is not None
        return _epsilon_dict(bounds, self.keys)

    def _worst(self) -> int | None:
        """The client with the largest reported (or nominal) eps; ties: most rounds."""
        counts = self._counts
        totals = counts.sum(axis=1) if counts.size else np.zeros(0, dtype=np.int64)
        if not totals.size or totals.max() == 0:
            return None
        if self.mechanism.paper_heuristic and self._has_heuristic:
            return int(np.argmax(self._heuristic_sum))
        if not self.mechanism.perturbs or counts.shape[1] == 1:
            return int(np.argmax(totals))
        active = np.flatnonzero(totals)
        sigs, first = np.unique(counts[active], axis=0, return_index=True)
        # sigs are distinct, so j dominates i iff sigs[j] >= sigs[i] everywhere and j != i
        covers = (sigs[None, :, :] >= sigs[:, None, :]).all(axis=2)
        np.fill_diagonal(covers, False)
        maximal = np.flatnonzero(~covers.any(axis=1)).tolist()

        def key(i: int) -> tuple[float, int]:
            bounds = self._bounds(tuple(int(c) for c in sigs[i]))
            reported = math.inf if bounds is None else bounds.reported
            return reported, int(sigs[i].sum())

        best = max(maximal, key=key)
        return int(active[first[best]])

    def summary(self) -> dict[str, Any]:
        """The worst client's account, JSON-ready (inf written as None)."""
        p = self.params
        worst = self._worst()
        out: dict[str, Any] = {
            "mode": p.mode,
            "description": p.description,
            "guarantee": p.guarantee,
            "delta": self.delta,
            "clip": p.clip,
            "noise_scale": p.noise_scale,
            "noise_multiplier": p.noise_multiplier,
            "epsilon_round": _json(p.epsilon_round),
            "rounds_recorded": len(self._rounds),
            "worst_client": worst,
            "worst_client_rounds": 0 if worst is None else self.n_rounds(worst),
            "epsilon": _constant_epsilon(0.0, self.keys) if worst is None else self.spent(worst),
        }
        if self.mechanism.nominal_only:
            out["nominal_epsilon"] = (_constant_epsilon(0.0, self.keys) if worst is None
                                      else self.nominal_spent(worst))
            out["warning"] = TOUCHED_ROWS_WARNING
        if self.mechanism.paper_heuristic:
            out["paper_clip"] = p.paper_clip
            out["paper_heuristic"] = self._paper_heuristic(worst)
        return out

    def _paper_heuristic(self, worst: int | None) -> dict[str, Any] | None:
        if not self._has_heuristic or worst is None:
            return None
        return {
            "epsilon_round_max": float(self._heuristic_max.max()),
            "epsilon_summed_worst_client": float(self._heuristic_sum[worst]),
            "note": PAPER_NOTE,
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything recorded, JSON-ready: params, rounds with their clients, log, summary."""
        return {
            "params": self.params.as_log(),
            "rounds": [
                {"round": r, "mechanism": _mechanism_json(self._columns[col]),
                 "clients": ids.tolist()}
                for r, col, ids in self._rounds
            ],
            "log": self.log,
            "summary": self.summary(),
        }
