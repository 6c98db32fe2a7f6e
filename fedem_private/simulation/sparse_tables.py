"""Clients' item tables kept as rows, not (n, m, d) (``--client-tables sparse``; issue 79,
docs/design.md sections 7 and 17).

Under ``--client-tables kept`` every client holds its own table Q_l[u] (m, d) between
rounds, n m d numbers before anything else. Most of each table is not the client's own
information: it is a table the server sent, or what equation 10 made of one. This module
keeps only what the server cannot recompute and rebuilds a client's table exactly when it
is read (:meth:`SparseTables.tables`).

A client's table changes only when it takes part. A round starts it from one of three
tables (the loop says which, :data:`OWN`, :data:`SENT`, :data:`MERGED`): its own table
(no table received), the table the server sent, or equation 10's merge of its own table
with the one sent. Local training then changes some rows; every other row of the trained
table is the start's row bit for bit (the backbones train a compact copy of the rows they
touch and write those back). So the client's table after its participations since it last
started from a sent table (its *base*, round b, or round 0: the initial table) is

    Q = R_J(... R_1(R_0(G_b)) ...),   R_j(Q) = overlay_j(merge_j(Q, G_{t_j})),

where merge_j is equation 10 as it was applied in round t_j (the adapter as trained then,
``--merge-rows seen`` included) and overlay_j writes the rows training changed in that
participation. What is stored per client is therefore:

- the base round b (the sent tables G_t are one (m, d) table a round for the aggregations
  allowed, each kept once while a client refers to it);
- for each merge since the base, its round t_j and what it used besides the two tables:
  a copy of the client's adapter (one flat vector, :meth:`SparseTables._flat`) where rho
  on a row is learned from that row (em), the client's rho itself where it is pooled over
  every row (dm), nothing where rho is fixed (sm);
- each row that training changed since the base, with the participation it was last
  trained in (index j: 0 for the base's own training), and its value then.

:meth:`SparseTables.tables` replays this for a chunk: the base tables, the overlay of
index 0, then for j = 1, 2, ... equation 10 on the clients with a j-th merge (the loop's
``remerge``, the same function on the same inputs as the round that made it) and the
overlay of index j. Each step is rounded to the state dtype as ``kept`` rounds each stored
table, so the result is the kept table (up to the order of float operations inside a
batched product of a different batch shape). A row trained again keeps only its latest
value, so in the replay an earlier merge sees the base's value on that row, not the
value it had then; the merge's output there is overwritten by the later training, and no
other row's output depends on it: rho on a row depends on that row alone (sr, sm, em,
``--merge-rows seen``) or is the stored pooled value (dm).

Under merge ``sr`` every participation starts from the sent table, so a client stores only
the rows it trained in its last round. Under ``--merge-rows seen`` equation 10 takes the
sent row outside the client's training items I_u, so after a merge the stored rows
outside I_u are dropped (``merged_rows``). With a learned or fixed rho on every row, the
stored rows are the union of the rows trained since the base (positives and every round's
sampled negatives) and one adapter per merge: it grows with the client's participations,
up to m rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fedem_private.client.adapter import MergeState

#: how a participant's start table was formed (the loop's ``origin`` per client)
OWN, SENT, MERGED = 0, 1, 2

#: equation 10 for clients (numpy ids) from their tables (k, m, d), the tables sent to
#: them (k, m, d) and what the merge used then: their adapters, their pooled rho (k,), or
#: None (a fixed rho)
Remerge = Callable[[np.ndarray, Tensor, Tensor, MergeState | Tensor | None], Tensor]
#: the rows (k, m) bool a merge takes from each client's own table (None: every row)
MergedRows = Callable[[np.ndarray], Tensor | None]


class SparseTables:
    """The item tables of n clients as base rounds, merges and trained rows (module
    docstring); :meth:`tables` rebuilds a chunk's (k, m, d), :meth:`keep` records a
    round's training.

    ``q0`` (m, d) is every client's table before it first takes part (the initial table,
    in the compute dtype); ``store`` the dtype the rows are kept in (``train.state_dtype``;
    a replayed table is rounded to it as ``kept`` rounds its stored tables). ``remerge``
    and ``merged_rows`` come from the loop (:meth:`Simulation._remerge`,
    :meth:`Simulation._merged_rows`).
    """

    def __init__(self, n: int, q0: Tensor, store: torch.dtype, remerge: Remerge,
                 merged_rows: MergedRows) -> None:
        self.n = n
        self.m, self.dim = int(q0.shape[0]), int(q0.shape[1])
        self.dtype = q0.dtype  # the compute dtype
        self.store = store
        self.device = q0.device
        self.remerge = remerge
        self.merged_rows = merged_rows
        #: round -> the table the server sent that round (m, d); 0: the initial table
        self.sent: dict[int, Tensor] = {0: q0.clone()}
        #: how many clients refer to each round's sent table (as base or merge)
        self.refs: Counter[int] = Counter({0: n})
        self.base = np.zeros(n, dtype=np.int64)
        # per client: [(round, flat adapter or None)] of the merges since its base
        self.merges: list[list[tuple[int, Tensor | None]] | None] = [None] * n
        # per client: the rows training changed since its base (r,) int32, the
        # participation index they were last trained in (r,) int32 and their values then
        # (r, d) in the state dtype
        self.items: list[Tensor | None] = [None] * n
        self.steps: list[Tensor | None] = [None] * n
        self.rows: list[Tensor | None] = [None] * n
        self._shapes: list[tuple[int, ...]] | None = None  # the adapter's tensors' shapes
        self._n_weights = 0
        self._pooled = False  # whether merges record a pooled rho, not an adapter

    # ------------------------------------------------------------------ reading
    def tables(self, idx: Tensor) -> Tensor:
        """Clients idx's tables (k, m, d) in the compute dtype: the base tables, then
        each merge and the rows trained after it, in order (module docstring)."""
        clients = idx.cpu().numpy()
        k = clients.shape[0]
        q = torch.empty((k, self.m, self.dim), dtype=self.dtype, device=self.device)
        for b in np.unique(self.base[clients]).tolist():
            pos = np.nonzero(self.base[clients] == b)[0]
            q[torch.from_numpy(pos).to(self.device)] = self.sent[b]
        q = self._rounded(q)
        self._overlay(q, clients, np.arange(k), 0)
        depth = np.array([len(self.merges[u] or ()) for u in clients.tolist()],
                         dtype=np.int64)
        for j in range(1, int(depth.max(initial=0)) + 1):
            pos = np.nonzero(depth >= j)[0]
            at = torch.from_numpy(pos).to(self.device)
            merges = [self.merges[u][j - 1] for u in clients[pos].tolist()]  # type: ignore[index]
            sent = torch.stack([self.sent[t] for t, _ in merges])
            adapters = self._adapters([a for _, a in merges])
            q[at] = self._rounded(self.remerge(clients[pos], q.index_select(0, at), sent,
                                               adapters))
            self._overlay(q, clients, pos, j)
        return q

    def _overlay(self, q: Tensor, clients: np.ndarray, pos: np.ndarray, j: int) -> None:
        """Write into q (k, m, d) the rows that clients[pos] last trained in participation
        j (their stored values)."""
        where, items, rows = [], [], []
        for p in pos.tolist():
            u = int(clients[p])
            steps = self.steps[u]
            if steps is None:
                continue
            hit = steps == j
            items.append(self.items[u][hit])  # type: ignore[index]
            rows.append(self.rows[u][hit])  # type: ignore[index]
            where.append(torch.full((items[-1].shape[0],), p, dtype=torch.long,
                                    device=self.device))
        if items:
            q[torch.cat(where), torch.cat(items).long()] = torch.cat(rows).to(self.dtype)

    def _rounded(self, q: Tensor) -> Tensor:
        """q rounded through the state dtype (as ``kept`` stores every table)."""
        return q if self.store == self.dtype else q.to(self.store).to(self.dtype)

    # ------------------------------------------------------------------ writing
    def keep(self, round_: int, idx: Tensor, origin: np.ndarray, start: Tensor, new: Tensor,
             sent: Tensor | None, adapters: MergeState | Tensor | None) -> None:
        """Record round ``round_``'s training of clients idx: ``origin`` (k,) says how each
        start was formed (:data:`OWN`, :data:`SENT`, :data:`MERGED`), ``start`` (k, m, d)
        is the table training started from and ``new`` (k, m, d) the trained one; ``sent``
        (k, m, d) the one table the server sent this round (None where it sent none) and
        ``adapters`` what the merge used: the chunk's adapters, its pooled rho (k,), or
        None. The rows of ``new`` that
        differ from ``start`` are stored (all others are the start's, which the replay
        rebuilds)."""
        clients = idx.cpu().numpy()
        changed = (new != start).any(dim=-1)  # (k, m); a NaN row counts as changed
        if (origin != OWN).any() and round_ not in self.sent:
            assert sent is not None
            self.sent[round_] = sent[int(np.nonzero(origin != OWN)[0][0])].clone()
        merged = np.nonzero(origin == MERGED)[0]
        drop = (self.merged_rows(clients[merged]) if merged.size else None)
        for j, u in enumerate(clients.tolist()):
            rows = changed[j].nonzero().squeeze(1)
            values = new[j].index_select(0, rows).to(self.store)
            if origin[j] == SENT:
                self._forget(u)
                self.base[u] = round_
                self.refs[round_] += 1
                self._put(u, rows.to(torch.int32), torch.zeros_like(rows, dtype=torch.int32),
                          values)
                continue
            history = self.merges[u] or []
            if origin[j] == MERGED:
                history.append((round_, self._flat(adapters, j)))
                self.merges[u] = history
                self.refs[round_] += 1
                if drop is not None:  # rows the merge took whole from the sent table
                    own = drop[int(np.searchsorted(merged, j))]
                    self._keep_only(u, own)
            self._update(u, rows.to(torch.int32), len(history), values)

    def _put(self, u: int, items: Tensor, steps: Tensor, values: Tensor) -> None:
        """Set client u's stored rows (None when there are none)."""
        if items.numel() == 0:
            self.items[u] = self.steps[u] = self.rows[u] = None
        else:
            self.items[u], self.steps[u], self.rows[u] = items, steps, values

    def _update(self, u: int, items: Tensor, step: int, values: Tensor) -> None:
        """Client u's rows ``items`` trained in participation ``step`` (values (r, d)): they
        replace what was stored for them; its other stored rows stay."""
        old = self.items[u]
        if old is None:
            self._put(u, items, torch.full_like(items, step), values)
            return
        stay = ~torch.isin(old, items)
        self._put(u, torch.cat((old[stay], items)),
                  torch.cat((self.steps[u][stay], torch.full_like(items, step))),  # type: ignore[index]
                  torch.cat((self.rows[u][stay], values)))  # type: ignore[index]

    def _keep_only(self, u: int, own: Tensor) -> None:
        """Drop client u's stored rows where ``own`` (m,) bool is False: a merge replaced
        them by the sent table's rows."""
        old = self.items[u]
        if old is None:
            return
        stay = own.to(old.device)[old.long()]
        self._put(u, old[stay], self.steps[u][stay], self.rows[u][stay])  # type: ignore[index]

    def _forget(self, u: int) -> None:
        """Drop client u's base and merges (it starts afresh from a sent table); a sent
        table no client refers to any more is freed."""
        rounds = [int(self.base[u])] + [t for t, _ in self.merges[u] or ()]
        for t in rounds:
            self.refs[t] -= 1
            if self.refs[t] <= 0 and t != 0:
                del self.refs[t]
                self.sent.pop(t, None)
        self.merges[u] = None

    # ------------------------------------------------------------------ adapters
    def _flat(self, adapters: MergeState | Tensor | None, j: int) -> Tensor | None:
        """Client j of the chunk's adapter as one flat vector, or its pooled rho (1,)
        (None: neither)."""
        if adapters is None:
            return None
        if isinstance(adapters, Tensor):
            self._pooled = True
            return adapters[j:j + 1].clone()
        parts = (*adapters.weights, *adapters.biases)
        if self._shapes is None:
            self._shapes = [tuple(t.shape[1:]) for t in parts]
            self._n_weights = len(adapters.weights)
        return torch.cat([t[j].reshape(-1) for t in parts])

    def _adapters(self, flats: list[Tensor | None]) -> MergeState | Tensor | None:
        """The adapters of :meth:`_flat`'s vectors, stacked, or the pooled rho (k,) (None
        where there are none)."""
        if not flats or flats[0] is None:
            return None
        stacked = torch.stack(flats)  # type: ignore[arg-type]
        if self._pooled:
            return stacked.view(-1)
        assert self._shapes is not None
        sizes = [int(np.prod(s)) for s in self._shapes]
        parts = [p.reshape(-1, *s) for p, s in
                 zip(torch.split(stacked, sizes, dim=1), self._shapes, strict=True)]
        return MergeState(tuple(parts[:self._n_weights]), tuple(parts[self._n_weights:]))

    # ------------------------------------------------------------------ size
    def stored_rows(self) -> np.ndarray:
        """(n,) how many rows each client stores."""
        return np.array([0 if t is None else int(t.shape[0]) for t in self.items],
                        dtype=np.int64)

    def nbytes(self) -> int:
        """Bytes of tensor data held: rows, their items and indices, adapters and the sent
        tables referred to (Python's own per-object overhead not counted)."""
        total = sum(t.numel() * t.element_size() for t in self.sent.values())
        for group in (self.items, self.steps, self.rows):
            total += sum(t.numel() * t.element_size() for t in group if t is not None)
        for history in self.merges:
            total += sum(a.numel() * a.element_size() for _, a in history or ()
                         if a is not None)
        return total


def estimate_bytes(counts: np.ndarray, m: int, dim: int, store_size: int, negatives: int,
                   rounds: int, rate: float, adapter_size: int, every_row: bool) -> int:
    """An estimate of :class:`SparseTables`' bytes by the end of a run, for refusing one
    that cannot fit (``loop._check_state_fits``); an upper bound in expectation.

    ``counts`` (n,): each client's training positives; a participation trains at most
    ``counts (1 + negatives)`` rows. A client takes part in P rounds, E[P] = ``rounds``
    ``rate`` (the round's sampling rate). ``every_row``: a merge mixes every row (learned
    or fixed rho on all rows), so a client keeps the union of the rows it trained since
    its base, at most min(m, counts (1 + negatives) P), and min(m, a E[P]) bounds its
    mean (the minimum is concave); otherwise (merge sr, ``--merge-rows seen``) only the
    last participation's rows, at most min(m, counts (1 + negatives)) times P(P >= 1) <=
    min(1, E[P]). Each stored row costs ``dim`` x ``store_size`` bytes and 8 for its item
    and index; each merge an adapter of ``adapter_size`` bytes (0: none); each round's
    sent table m x dim x 4 bytes.
    """
    parts = rounds * rate
    per_round = np.asarray(counts, dtype=np.float64) * (1 + negatives)
    if every_row:
        rows = np.minimum(m, per_round * parts).sum()
    else:
        rows = np.minimum(m, per_round).sum() * min(1.0, parts)
    total = rows * (dim * store_size + 8) + len(counts) * parts * adapter_size
    return int(total + (rounds + 1) * m * dim * 4)
