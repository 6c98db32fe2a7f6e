"""Record what an honest-but-curious server saw, for the attacks (docs/design.md, section 6).

``fedem-private run ... --record-rounds 1,50,last --record-clients N`` attaches a
:class:`Recorder` to the simulation. In each recorded round it stores, for the
recorded clients, into the run directory:

- ``observations/round_XXXX_part_YYYY.npz``: what the server saw: the table it
  sent each client (with the shared dense groups it sent, e.g. FedNCF's MLP),
  the upload, and participation (one part per simulation
  chunk; see :mod:`attacks.observations`). Tables are stored in float32 (float16
  overflows once Laplace noise at small eps exceeds 65504): the
  delta ``upload - sent`` is computed in float64 before the cast, untouched
  rows stay exactly zero, and a table sent identically to every client of a
  part (FedAvg) is stored once;
- ``observations/public.json``: the public hyper-parameters (learning rate,
  epochs, batch size, negatives ratio, method, the privacy mode's public
  parameters; never the seed, which would let the server regenerate the
  noise);
- ``ground_truth/round_XXXX_part_YYYY.npz``: the clients' training positives and
  the negatives they sampled that round, and ``ground_truth/demographics.npz``
  (e.g. gender, where the dataset has it). Only the scorer reads these.

Under a central mechanism (``cdp-gaussian``, docs/design.md section 6) no upload is
observed: the secure sum hides each client's, and the server sees one noisy
aggregate a round. A recorded round then holds, for every recorded client, the
global table it was sent and the one released after the round (the same two
tables for all), with ``participated`` True for the round's Poisson-sampled
clients; ``public.json`` says ``"observation": "released-aggregate"``. The
ground truth of a client that sat the round out is the sample it would have
drawn (the same keyed draw), so the attacks can score it as a control: what
the aggregate reveals about a client it does not contain is the population's
signal (popularity), not the client's.

Under ``ddp-skellam`` the server's real view is the secure aggregation's transcript, and
each recorded round also writes ``observations/secagg/round_XXXX.npz``
(:func:`save_secagg_transcript`): the recorded clients' masked b-bit inputs as the server
received them (uniform over Z_{2^b} to it, not their updates), the cohort, senders and
survivors, the modular sum, and the public decoding parameters (bits, scale gamma, the
rotation's signs, the dimension, q n). The sum decodes to the released aggregate (the
observation above), which is what the attacks read: nothing else in the transcript
carries a client's update. ``public.json`` says ``"server_view": "secagg-transcript"``.

Which clients: the first N client ids of the split (ids ``0 .. N-1`` of the
re-indexed users that survived the split), a deterministic choice that does
not depend on the data, the seed or chunking. ``"last"`` is the run's final
round. A recorded client that does not take part in a recorded round (client
fraction below 1) gets a row with ``participated`` False and zero tables.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.ground_truth import save_demographics, save_ground_truth
from attacks.observations import (
    AGGREGATE_OBSERVATION,
    Observation,
    PublicKnowledge,
    save_observation,
    save_public,
)
from fedem_private.errors import UserError
from fedem_private.models import backbone_class
from fedem_private.models.base import ClientSamples
from fedem_private.simulation.config import RecordConfig
from fedem_private.simulation.loop import AggregateView, ChunkView, Simulation
from fedem_private.simulation.view import RunView

STORE_DTYPE = "float32"
#: public.json's ``extra["server_view"]`` when the secure aggregation's transcript is kept
SECAGG_VIEW = "secagg-transcript"
SECAGG_FOLDER = "secagg"
SELECTION_RULE = "first N client ids of the split (0 .. N-1)"
#: public.json's ``extra["observation"]`` when each client's upload was recorded
OBSERVED_UPLOADS = "uploads"


@dataclass(frozen=True)
class RecordSpec:
    """Which rounds (ints, or "last") and how many clients to record."""

    rounds: tuple[int | str, ...]
    clients: int

    def __post_init__(self) -> None:
        if not self.rounds:
            raise UserError("--record-rounds needs at least one round")
        for r in self.rounds:
            if r != "last" and not (isinstance(r, int) and r >= 1):
                raise UserError(f"--record-rounds: rounds are integers >= 1 or 'last', got {r!r}")
        if not isinstance(self.clients, int) or self.clients < 1:
            raise UserError(f"--record-clients must be a positive integer, got {self.clients!r}")

    @classmethod
    def parse(cls, rounds: str, clients: int | None) -> RecordSpec:
        """From the command line: ``"1,50,last"`` and N (default 100)."""
        return cls(RecordConfig(rounds=str(rounds)).parsed_rounds(),
                   100 if clients is None else int(clients))

    def resolve(self, total_rounds: int) -> tuple[int, ...]:
        """The recorded round numbers for a run of ``total_rounds`` rounds, sorted."""
        out = set()
        for r in self.rounds:
            value = total_rounds if r == "last" else int(r)
            if value > total_rounds:
                raise UserError(f"--record-rounds: round {value} is beyond the run's "
                                f"{total_rounds} rounds")
            out.add(value)
        return tuple(sorted(out))


def public_knowledge(view: RunView, rounds: Sequence[int], clients: np.ndarray
                     ) -> PublicKnowledge:
    """What the server knows about the training (section 5 threat model); no seed."""
    cfg = view.cfg
    tr, fed = cfg.train, cfg.federation
    return PublicKnowledge(
        n_clients=view.n_users, n_items=view.n_items, dim=tr.dim, lr=tr.lr,
        local_epochs=tr.local_epochs, batch_size=tr.batch_size,
        num_negatives=tr.num_negatives, method=fed.method,
        privacy_mode=cfg.privacy.mode, privacy_params=view.privacy_params(),
        backbone=fed.resolved_backbone, optimizer="adam", protocol=cfg.data.protocol,
        extra={
            "dataset": view.dataset_name,
            "aggregation": fed.resolved_aggregation,
            "merge": fed.resolved_merge,
            "codec": fed.codec,
            "dot_product": bool(backbone_class(fed.resolved_backbone).dot_product),
            "rounds": tr.rounds,
            "init_std": tr.init_std,
            "client_fraction": tr.client_fraction,
            "recorded_rounds": [int(r) for r in rounds],
            "recorded_clients": int(clients.shape[0]),
            "recorded_client_rule": SELECTION_RULE,
            "observation": AGGREGATE_OBSERVATION if view.central else OBSERVED_UPLOADS,
        },
    )


class Recorder:
    """A simulation observer that writes the recorded rounds' observations and truth.

    It reads the run through its :class:`~fedem_private.simulation.view.RunView`: the
    public parameters, the demographics, and (for the ground truth only) the split and
    the keyed samples; never a client's state."""

    def __init__(self, view: RunView, run_dir: str | Path, spec: RecordSpec,
                 secure: Any = None) -> None:
        self.view = view
        # ddp-skellam's secure sum (its last round's secure-aggregation view), else None
        self.secure = secure
        self.run_dir = Path(run_dir)
        self.rounds = frozenset(spec.resolve(view.cfg.train.rounds))
        n = view.n_users
        self.clients = np.arange(min(spec.clients, n), dtype=np.int64)
        self.selected = np.zeros(n, dtype=bool)
        self.selected[self.clients] = True
        self._parts: dict[int, int] = defaultdict(int)
        self._started: set[int] = set()

    def write_static(self) -> None:
        """public.json and the demographics of the recorded clients."""
        public = public_knowledge(self.view, sorted(self.rounds), self.clients)
        if self.secure is not None:
            public = replace(public, extra={**public.extra, "server_view": SECAGG_VIEW})
        save_public(self.run_dir, public)
        demo = {name: np.asarray(values)[self.clients]
                for name, values in self.view.demographics.items()}
        if demo:
            save_demographics(self.run_dir, self.clients, demo)

    def _next_part(self, round_: int) -> int:
        part = self._parts[round_]
        self._parts[round_] += 1
        return part

    def _record_absent(self, round_: int) -> None:
        """Rows for recorded clients that do not take part in ``round_``."""
        taking_part = np.zeros(self.view.n_users, dtype=bool)
        taking_part[self.view.participants(round_)] = True
        absent = self.clients[~taking_part[self.clients]]
        if absent.size == 0:
            return
        m, d = self.view.n_items, self.view.cfg.train.dim
        zeros = np.zeros((absent.size, m, d), dtype=np.float32)
        obs = Observation(round_, absent, zeros, zeros, np.zeros(absent.size, dtype=bool))
        self._write(obs, [self.view.split.train_of(int(c)) for c in absent],
                    [np.zeros(0, dtype=np.int64)] * absent.size)

    def _write(self, obs: Observation, positives: list[np.ndarray],
               negatives: list[np.ndarray]) -> None:
        part = self._next_part(obs.round)
        save_observation(self.run_dir, obs, part=part, sent_dtype=STORE_DTYPE,
                         delta_dtype=STORE_DTYPE)
        save_ground_truth(self.run_dir, obs.round, obs.clients, positives, negatives, part=part)

    def __call__(self, view: ChunkView) -> None:
        if view.round not in self.rounds:
            return
        if view.round not in self._started:
            self._started.add(view.round)
            self._record_absent(view.round)
        rows = np.flatnonzero(self.selected[view.clients])
        if rows.size == 0:
            return
        idx = rows.tolist()
        clients = np.asarray(view.clients)[rows].astype(np.int64)
        sent = view.sent.detach()[idx].cpu().numpy().astype(np.float32, copy=True)
        upload = view.upload.detach()[idx].cpu().numpy().astype(np.float32, copy=True)
        def rows_of(groups: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
            return {name: value.detach()[idx].cpu().numpy().astype(np.float32, copy=True)
                    for name, value in groups.items()}

        obs = Observation(view.round, clients, sent, upload, np.ones(rows.size, dtype=bool),
                          rows_of(view.dense_sent), rows_of(view.theta_sent),
                          rows_of(view.theta_upload))
        self._write(obs, *self._truth(clients, view.samples, idx))

    def _truth(self, clients: np.ndarray, samples: ClientSamples, rows: Sequence[int]
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The clients' training positives, and the negatives rows ``rows`` of ``samples``
        drew (row rows[j] is clients[j]'s)."""
        positives = [self.view.split.train_of(int(c)) for c in clients]
        ptr = samples.negatives_indptr
        return positives, [samples.negatives[ptr[j]: ptr[j + 1]] for j in rows]

    def on_aggregate(self, view: AggregateView) -> None:
        """A central round: every recorded client saw the same sent and released tables."""
        if view.round not in self.rounds:
            return
        clients = self.clients
        k = clients.shape[0]
        took = np.zeros(self.view.n_users, dtype=bool)
        took[np.asarray(view.participants, dtype=np.int64)] = True
        sent = view.sent.detach().cpu().numpy().astype(np.float32)
        released = view.released.detach().cpu().numpy().astype(np.float32)
        obs = Observation(view.round, clients, np.broadcast_to(sent, (k, *sent.shape)),
                          np.broadcast_to(released, (k, *released.shape)), took[clients])
        # every recorded client's keyed draw of the round: what a participant trained on,
        # and for the others the control's negatives (a pure function of seed, round, client)
        s = self.view.samples(view.round, clients)
        self._write(obs, *self._truth(clients, s, range(k)))
        if self.secure is not None:
            save_secagg_transcript(self.run_dir, view.round, self.secure, clients)


def save_secagg_transcript(run_dir: str | Path, round_: int, secure: Any,
                           clients: np.ndarray) -> Path | None:
    """ddp-skellam: what the server received in ``round_`` from the recorded ``clients``
    (their masked inputs; a recorded client not among the senders has none) and the
    modular sum, to ``observations/secagg/round_XXXX.npz``; None when the round aborted
    (nothing released: the server saw no sum)."""
    rec = secure.records[-1] if secure.records else None
    sv = secure.last_view
    if rec is None or rec.round != round_ or not rec.released or sv is None:
        return None
    if not sv.masked and sv.senders.size:
        raise UserError("--record-rounds under ddp-skellam needs the simulated secure "
                        "aggregation (DdpSecureSum.simulate_protocol), not the benchmarks' "
                        "plain sum")
    from fedem_private.privacy.skellam import rotation_signs

    plan = secure.plan
    sent = np.asarray([c for c in clients.tolist() if c in sv.masked], dtype=np.int64)
    masked = (np.stack([sv.masked[int(c)] for c in sent]) if sent.size
              else np.zeros((0, plan.padded), dtype=np.uint32))
    arrays = {"round": np.array(round_, dtype=np.int64), "bits": np.array(plan.bits),
              "scale": np.array(plan.scale), "dim": np.array(plan.dim),
              "padded_dim": np.array(plan.padded),
              "expected_count": np.array(secure.expected_count),
              "rotation_signs": rotation_signs(secure.seed, round_, plan.padded).astype(np.int8),
              "cohort": sv.cohort, "senders": sv.senders, "survivors": sv.survivors,
              "recorded_senders": sent, "masked": masked.astype(np.uint32),
              "total": np.asarray(sv.total, dtype=np.uint32)}
    folder = Path(run_dir) / "observations" / SECAGG_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"round_{round_:04d}.npz"
    tmp = folder / f".round_{round_:04d}.tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return path


def recording_setup(spec: RecordSpec) -> Callable[[Simulation, Path], None]:
    """A ``setup`` for :func:`~fedem_private.experiments.runner.execute`: attach a Recorder
    (to the uploads, or under a central mechanism to the released aggregates)."""

    def setup(sim: Simulation, run_dir: Path) -> None:
        secure = getattr(sim.privacy, "secure", None)
        recorder = Recorder(sim.view, run_dir, spec,
                            secure if hasattr(secure, "last_view") else None)
        recorder.write_static()
        if sim.view.central:
            sim.observe(on_aggregate=recorder.on_aggregate)
        else:
            sim.observe(on_chunk=recorder)

    return setup
