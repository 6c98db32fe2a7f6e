"""``ddp-skellam``'s round: distributed Skellam noise under simulated secure aggregation.

The mechanism (encoding, accounting) is :mod:`fedem_private.privacy.skellam`; the protocol
is :mod:`fedem_private.privacy.secagg`; this module runs them for the privacy layer
(:class:`DdpSecureSum`, in the place of cdp-gaussian's ``SecureSum``).

One round t: the cohort is a fixed-size keyed draw of K = round(q n) clients (public,
data-independent; no amplification claimed). Each participant L2-clips its encoded delta
to C, encodes it (rotate, scale gamma, round conditionally, add Skellam of variance
mu / n_t, mod 2^b). With ``dropout`` p each participant drops with probability p, half of
them before sending its masked input and half after (keyed draws). Fewer than n_t inputs
in the sum: the round aborts (the noise would fall short of mu), nothing is released and
nobody is charged. Otherwise secure aggregation runs over the cohort (its own abort:
too few shares to unmask); the server decodes the modular sum, divides by q n and adds it
to the table it sent.

Neighbouring relation: user-level, one client's contribution to one round's sum present
or replaced by zero. Trust model: clients add their noise shares honestly; the server sees
only the secure aggregation transcript (masked inputs, uniform to it) and the modular sum;
the guarantee holds while at least n_t honest clients' inputs are in the sum, so a round
with m inputs tolerates m - n_t colluding (or dropped) clients. Accounting: every released
round is the Skellam mechanism of variance >= mu with sensitivities Delta_1, Delta_2
(:class:`~fedem_private.privacy.skellam.DdpPlan`); a client's released participations are
composed (RDP) and the worst client's eps is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedem_private import rng
from fedem_private.errors import UserError
from fedem_private.privacy import skellam
from fedem_private.privacy.central import CentralRoundStats, SumPart, clipped_deltas
from fedem_private.privacy.client_secrets import ClientSecrets
from fedem_private.privacy.clipping import ClipStats


def fixed_cohort(seed: int, round_: int, clients: int | np.ndarray, size: int) -> np.ndarray:
    """The round's cohort: the ``size`` clients with the smallest draws keyed by (seed,
    COHORT, round, identity) (sorted indices). ``clients``: each client's identity key
    (``Split.source_users``; a count n: the keys 0..n-1). A client's draw depends on its
    identity alone: removing a user outside the cohort moves nobody, removing a member lets
    in the next-smallest draw (a fixed size cannot avoid that; the mechanism's relation is
    zero-out, under which the cohort never moves)."""
    keys = rng.identities(clients)
    ids = np.arange(keys.shape[0])
    if size >= ids.shape[0]:
        return ids
    u = rng.uniform(rng.key(seed, skellam.COHORT, round_, keys), 0)
    return ids[rng.smallest(u, size)]


def dropouts(seed: int, round_: int, clients: np.ndarray, p: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """(before, after): the clients that drop before sending their masked input and after
    it, each participant dropping with probability ``p`` (half of them each way)."""
    clients = np.asarray(clients, dtype=np.int64)
    if p <= 0 or clients.size == 0:
        return clients[:0], clients[:0]
    k = rng.key(seed, skellam.DROPOUT, round_, clients)
    drop = rng.uniform(k, 0) < p
    early = rng.uniform(k, 1) < 0.5
    return clients[drop & early], clients[drop & ~early]


@dataclass
class RoundRecord:
    """One round as the run's log and summary see it."""

    round: int
    cohort: int
    senders: int
    survivors: int
    released: bool
    reason: str = ""
    slack: int = 0  # senders - n_t: the colluders or further dropouts the round tolerates
    wrapped_entries: int = 0  # diagnostic (the simulator knows the true sum); not released
    costs: dict[str, float] = field(default_factory=dict)


class DdpSecureSum:
    """The layer's secure sum for ``ddp-skellam`` (see the module docstring).

    ``add_keyed`` takes a chunk's encoded (sent, local) tables and its client ids; nothing
    per client leaves it but what secure aggregation shows the server (the masked inputs,
    kept in :attr:`last_view`); :meth:`release` returns the new encoded global.
    """

    adaptive = None
    canaries = None
    unclipped_estimate = None
    #: True: each round runs the simulated protocol (:func:`secagg.run_round`). False, for
    #: accuracy benchmarks only: :func:`secagg.plain_round`, the same senders, abort rule and
    #: modular sum without the cryptography (no masked inputs to record, no costs)
    simulate_protocol: bool = True

    def __init__(self, *, clip: float, bits: int, scale: float | None, tolerance: float,
                 dropout: float, expected_count: float, cohort: int, seed: int, rounds: int,
                 delta: float, epsilon: float | None, noise_multiplier: float | None,
                 client_secret_seed: int | None = None) -> None:
        self.clip = self.round_clip = float(clip)
        self.bits, self.scale, self.tolerance = int(bits), scale, float(tolerance)
        self.dropout = float(dropout)
        self.expected_count = float(expected_count)
        self.cohort = int(cohort)
        self.noise_clients = max(1, math.floor((1.0 - self.tolerance) * self.cohort + 1e-9))
        self.seed, self.rounds, self.delta = int(seed), int(rounds), float(delta)
        self.epsilon, self.z = epsilon, noise_multiplier
        self.noise_multiplier = float(noise_multiplier or 0.0)
        self.plan: skellam.DdpPlan | None = None
        self.round = 0
        self.records: list[RoundRecord] = []
        self.charges: dict[int, int] = {}  # client -> released rounds it took part in
        self.last_view: Any = None
        # the clients' secrets, never the run seed (docs/design.md section 5)
        self.secrets = ClientSecrets(client_secret_seed)
        self._reset()

    def configure(self, *, rounds: int) -> None:
        """The planned rounds the budget is calibrated for (the layer's, set once); refuses
        in one line, before any training, when the secure-aggregation extra is missing."""
        try:
            from fedem_private.privacy import secagg  # noqa: F401
        except ImportError as exc:
            raise UserError(f"ddp-skellam needs the secure-aggregation extra ({exc.name} is "
                            "missing): pip install 'fedem-private[secagg]'") from exc
        self.rounds = int(rounds)
        self.plan = None

    def _reset(self) -> None:
        self._ids: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._raw: list[np.ndarray] = []
        self._true: np.ndarray | None = None
        self.stats = CentralRoundStats()

    def begin_round(self, round_: int) -> None:
        self.round = int(round_)
        self._reset()

    def _plan_for(self, dim: int) -> skellam.DdpPlan:
        if self.plan is None or self.plan.dim != dim:
            plan = {"clip": self.clip, "dim": dim, "cohort": self.cohort,
                    "noise_clients": self.noise_clients, "rounds": self.rounds,
                    "delta": self.delta, "epsilon": self.epsilon,
                    "noise_multiplier": self.z, "scale": self.scale}
            try:
                self.plan = skellam.make_plan(bits=self.bits, **plan)
            except ValueError as err:  # too few bits for this noise, cohort and dimension
                enough = skellam.smallest_bits(bits=self.bits, **plan)
                fix = (f"give --ddp-bits {enough} or more" if enough is not None else
                       f"not even --ddp-bits {skellam.MAX_BITS} holds it: fewer clients a "
                       f"round (--sample-rate, --cohort-size) or a smaller upload need fewer")
                raise UserError(f"ddp-skellam: {err}; {fix}") from err
        return self.plan

    def add(self, sent: torch.Tensor, local: torch.Tensor) -> ClipStats:
        raise RuntimeError("ddp-skellam keys each client's rounding and noise by its id: "
                           "use add_keyed")

    def add_part(self, part: SumPart) -> None:
        raise RuntimeError("ddp-skellam encodes each client's input itself; a round's "
                           "shards (sums formed elsewhere) are not supported")

    def add_keyed(self, sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray
                  ) -> ClipStats:
        """Clip and encode k clients' deltas (each client's own steps, keyed by its id)."""
        clipped, stats = clipped_deltas(sent, local, self.clip)
        flat = clipped.reshape(clipped.shape[0], -1).cpu().numpy()
        plan = self._plan_for(flat.shape[1])
        enc = skellam.encode(plan, flat, seed=self.seed, round_=self.round,
                             clients=np.asarray(clients, dtype=np.int64), secrets=self.secrets)
        self._ids.append(np.asarray(clients, dtype=np.int64))
        self._values.append(enc.values)
        self._raw.append(enc.raw)
        part = flat.sum(axis=0)
        self._true = part if self._true is None else self._true + part
        k = flat.shape[0]
        self.stats.n_clients += k
        self.stats.n_clipped += stats.fraction_clipped * k
        if k:
            self.stats.norm_sum += stats.mean_norm * k
        return stats

    def claimed_gap(self) -> tuple[int, float]:
        """The L2 gap one client's contribution can put between two decoded sums:
        Delta_2 / gamma (the rounded integer vector, rotated back)."""
        assert self.plan is not None
        return 2, self.plan.l2 / self.plan.scale

    def release(self, base: torch.Tensor) -> torch.Tensor:
        """The new encoded global (``base`` + decoded sum / q n), or ``base`` unchanged when
        the round aborts (too many dropouts: nothing released, nobody charged)."""
        from fedem_private.privacy import secagg

        t = self.round
        ids = np.concatenate(self._ids) if self._ids else np.zeros(0, dtype=np.int64)
        rec = RoundRecord(t, int(ids.size), 0, 0, False)
        self.records.append(rec)
        if ids.size == 0 or self.plan is None:
            rec.reason = "no participant"
            return base
        plan = self.plan
        values = np.concatenate(self._values)
        before, after = dropouts(self.seed, t, ids, self.dropout)
        rec.senders = int(ids.size - before.size)
        rec.survivors = int(rec.senders - after.size)
        rec.slack = rec.senders - plan.noise_clients
        if rec.senders < plan.noise_clients:
            rec.reason = (f"ddp-skellam: round {t}: only {rec.senders} inputs reached the sum, "
                          f"the noise needs {plan.noise_clients}; nothing released")
            return base
        try:
            if self.simulate_protocol:
                view = secagg.run_round(values, ids, plan.bits, seed=self.seed, round_=t,
                                        drop_before=before, drop_after=after,
                                        secrets=self.secrets)
            else:
                view = secagg.plain_round(values, ids, plan.bits, seed=self.seed, round_=t,
                                          drop_before=before, drop_after=after)
        except secagg.SecAggAbort as err:
            rec.reason = str(err)
            return base
        self.last_view = view
        rec.costs = view.costs.per_client() if self.simulate_protocol else {}
        assert view.total is not None
        est = skellam.decode(plan, view.total, seed=self.seed, round_=t)
        sent_ids = view.senders
        for c in sent_ids.tolist():
            self.charges[c] = self.charges.get(c, 0) + 1
        rec.released = True
        # diagnostic only (never released): entries whose true integer sum left the range
        keep = np.isin(ids, sent_ids)
        true_int = np.concatenate(self._raw)[keep].sum(axis=0)
        rec.wrapped_entries = int(np.count_nonzero(np.abs(true_int) > (1 << (plan.bits - 1)) - 1))
        if self._true is not None:
            self.stats.signal_abs_sum = float(np.abs(self._true).sum())
            self.stats.signal_entries = int(np.count_nonzero(self._true))
        mean = torch.from_numpy(est / self.expected_count).reshape(base.shape)
        return (base.detach().to(torch.float64) + mean.to(base.device)).to(base.dtype)

    # -- accounting --------------------------------------------------------------------------
    @property
    def worst_rounds(self) -> int:
        return max(self.charges.values(), default=0)

    def epsilon_spent(self, round_: int | None = None) -> float:
        """The worst client's eps over its released participations so far."""
        if self.plan is None:
            return 0.0
        return self.plan.epsilon(self.worst_rounds)
