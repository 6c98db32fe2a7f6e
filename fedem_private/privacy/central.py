"""cdp-gaussian: user-level central DP on the aggregate (DP-FedAvg; docs/design.md section 5).

McMahan, Ramage, Talwar and Zhang, "Learning differentially private
recurrent language models" (ICLR 2018), with fixed clipping. One round t:

1. every client u is included independently with probability q (Poisson
   sampling, :func:`poisson_participants`, keyed by (seed, round, client));
2. each included client's delta Delta_u = U_u - S, its whole encoded upload
   (item table and dense groups as the codec packs them) minus what it was
   sent, is L2-clipped to C in float64: clip_2(Delta_u, C);
3. the clipped deltas are SUMMED (under secure aggregation: no one sees a
   single one), N(0, z^2 C^2) is added ONCE to the sum, on every entry;
4. the sum is divided by the EXPECTED count q n (not the realised count,
   which depends on who took part), and the new global is S + that mean.

Neighbouring relation: user-level add/remove, one client's whole data (hence
its clipped delta) present or absent. Sensitivity: the sum's L2
sensitivity is C. Weights are uniform: FedAvg's data-size weights |D_u| are
NOT used (a weight that depends on the client's data would raise the
sensitivity above C), so under cdp-gaussian ``fedavg`` and ``uniform`` both
form this unweighted mean over the expected count.

Trust model and guarantees (two, both user-level):

- observers of the released global models who do not know who took part:
  T rounds of the Poisson-subsampled Gaussian, amplified by sampling
  (:func:`~fedem_private.privacy.accounting.dpfedavg_event`);
- the aggregator under secure aggregation (or a trusted server), which
  sees only the noisy sums but knows who took part: NO amplification; each
  round a client took part in is the plain Gaussian mechanism with
  multiplier z, composed over the rounds it actually took part in (the
  per-client ledger). Participation itself is data-independent (Poisson)
  and is not protected against the aggregator.

As for the local modes, the guarantees are for the idealised real-valued
mechanism: noise comes from a seeded statistical PRNG in floating point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedem_private import rng
from fedem_private.errors import Diverged
from fedem_private.finite import finite_rows
from fedem_private.privacy.canaries import CanaryAudit
from fedem_private.privacy.clipping import ClipStats, clip_rows

# the client id that keys the server's one noise draw per round (no real client has it)
AGGREGATE_KEY = 1 << 41
# ... and the one that keys the noise on adaptive clipping's count
COUNT_KEY = AGGREGATE_KEY + 1
# ... and the one that keys the noise on private row selection's item counts
SELECT_KEY = AGGREGATE_KEY + 2


@dataclass(frozen=True)
class AdaptiveClip:
    """Adaptive clipping of DP-FedAvg (Andrew, Thakkar, McMahan and Ramaswamy, NeurIPS 2021).

    Each round the participants also add b_u - 1/2, b_u = [||Delta_u||_2 <= C_t],
    to the secure sum; the server receives the centred count with noise
    N(0, sigma_b^2) once, estimates the unclipped fraction
    b = (count + noise) / (q n) + 1/2 and sets C_{t+1} = C_t exp(-eta (b - gamma))
    (geometric update, Algorithm 1's "geometric" rule). Under add/remove one
    client changes the centred count by 1/2. The clip is a function of earlier
    releases only; how the two noises share the round's multiplier z is in
    :func:`~fedem_private.privacy.params.resolve_params`.
    """

    quantile: float  # gamma, the target fraction of participants left unclipped
    lr: float  # eta
    count_noise: float  # sigma_b; 0 only for clip-only runs (no noise anywhere)

    def next_clip(self, clip: float, unclipped_estimate: float) -> float:
        """C_{t+1} = C_t exp(-eta (b - gamma))."""
        return clip * math.exp(-self.lr * (unclipped_estimate - self.quantile))


class RowSelection:
    """Private row selection for large catalogues (docs/design.md section 18).

    The idea of DP-FEST / DP-AdaFEST (Ghazi et al., NeurIPS 2023: train only the embedding
    rows a private frequency count selects) and of private frequent-item selection (Chien et
    al., ICML 2021), in a federated round. Each round every participant u adds, beside its
    clipped delta, its item indicator c_u with c_u[i] = [i in D_u] / sqrt(|D_u|) (L2 norm
    1; zero for a client without items) to the secure sum. The server receives
    sum_u c_u + N(0, z_c^2 I_m) once (noise keyed by (seed, round, :data:`SELECT_KEY`)),
    adds it to its running noisy counts, and from the next round on only the K item rows
    with the largest running counts (ties to the lower index) are uploaded, summed, noised
    and updated; no item row in round 1, before any count. Rows outside stay at their
    public value (the initial table, or what they reached while selected).

    Neighbouring relation: user-level add/remove of one client's whole data. Trust model:
    that of cdp-gaussian (a secure sum, noise added once). Sensitivity: the counts move by
    at most 1 in L2, the table's sum by C; with noise z_c on the counts and z_s C on the
    table the round is the Gaussian mechanism at z with z^-2 = z_s^-2 + z_c^-2 (the
    composition of two Gaussian queries on the same participants), so the accounting of z
    is unchanged (:func:`~fedem_private.privacy.params._central_params`). Which rows are
    selected is a function of earlier releases only, so the set is public.
    """

    def __init__(self, rows: int, noise_multiplier: float) -> None:
        if rows < 1:
            raise ValueError(f"rows to select must be >= 1, got {rows}")
        self.rows = int(rows)
        self.noise_multiplier = float(noise_multiplier)
        self.counts: torch.Tensor | None = None  # (m,) float64 running noisy counts
        self.selected: torch.Tensor | None = None  # (m,) bool this round's rows; None: none
        self.ever: torch.Tensor | None = None  # (m,) bool rows selected in any round so far
        self._sum: torch.Tensor | None = None  # (m,) this round's secure sum of the c_u

    def add(self, indptr: np.ndarray, items: np.ndarray, n_items: int,
            device: torch.device) -> None:
        """Add k clients' indicators c_u (their items in CSR: ``items[indptr[j]:indptr[j+1]]``,
        each client's distinct items) to the round's sum."""
        if self._sum is None:
            self._sum = torch.zeros(n_items, dtype=torch.float64, device=device)
        lengths = np.diff(np.asarray(indptr, dtype=np.int64))
        weight = np.repeat(1.0 / np.sqrt(np.maximum(lengths, 1)), lengths)
        self._sum.index_add_(0, torch.from_numpy(np.asarray(items, dtype=np.int64)).to(device),
                             torch.from_numpy(weight).to(device))

    def row_mask(self, n_rows: int, n_items: int, device: torch.device) -> torch.Tensor:
        """(n_rows,) bool: the encoded rows this round releases, the selected item rows and
        every row past the catalogue (dense groups, always released)."""
        mask = torch.ones(n_rows, dtype=torch.bool, device=device)
        mask[:n_items] = False
        if self.selected is not None:
            mask[:n_items] = self.selected.to(device)
        return mask

    def release(self, seed: int, round_: int, n_items: int) -> torch.Tensor:
        """The round's noisy counts sum_u c_u + N(0, z_c^2 I_m) (float64, (m,), on the CPU),
        the one value of the selection that leaves the secure sum."""
        total = (self._sum if self._sum is not None
                 else torch.zeros(n_items, dtype=torch.float64))
        noisy = total.detach().cpu().clone()
        self._sum = None
        if self.noise_multiplier > 0:
            noisy += rng.client_noise(seed, round_, np.array([SELECT_KEY]), n_items, "gaussian",
                                      self.noise_multiplier,
                                      stream=rng.Stream.CENTRAL_NOISE).reshape(-1).double()
        return noisy

    def take(self, noisy: torch.Tensor) -> None:
        """Post-processing of released counts only: add them to the running counts and
        select the next round's rows, the top K (ties to the lower index)."""
        self.counts = noisy.clone() if self.counts is None else self.counts + noisy
        n_items = int(self.counts.shape[0])
        order = np.lexsort((np.arange(n_items), -self.counts.numpy()))
        selected = torch.zeros(n_items, dtype=torch.bool)
        selected[torch.from_numpy(order[: self.rows])] = True
        self.selected = selected
        self.ever = selected.clone() if self.ever is None else self.ever | selected


def poisson_participants(seed: int, round_: int, clients: int | np.ndarray,
                         sample_rate: float) -> np.ndarray:
    """Clients taking part in ``round_``: each independently with probability q (sorted
    indices).

    ``clients``: each client's identity key (``Split.source_users``), or a count n (the
    keys are then the indices 0..n-1). Client u is in iff its uniform draw keyed by (seed,
    POISSON, round, key_u) is below q, so the count is Binomial(n, q) (mean q n), runs
    repeat, and removing one user moves no other client's draw.
    """
    keys = rng.identities(clients)
    ids = np.arange(keys.shape[0])
    if sample_rate >= 1.0:
        return ids
    u = rng.uniform(rng.key(seed, rng.Stream.POISSON, round_, keys), 0)
    return ids[u < sample_rate]


def clipped_deltas(sent: torch.Tensor, local: torch.Tensor, clip: float
                   ) -> tuple[torch.Tensor, ClipStats]:
    """clip_2(local - sent, C) per client (leading axis), in float64.

    Raises UserError when a client's table holds NaN or Inf. Every returned
    row has float64 L2 norm <= C (:mod:`clipping`).
    """
    if sent.shape != local.shape or local.dim() < 2:
        raise ValueError(f"sent {tuple(sent.shape)} and local {tuple(local.shape)} must match")
    finite = finite_rows(local)
    if not bool(finite.all()):
        rows = (~finite).nonzero().squeeze(1).tolist()
        raise Diverged(f"non-finite value (NaN or Inf) in the upload of chunk row(s) "
                        f"{rows[:10]}")
    delta = local.detach().to(torch.float64, copy=True)
    delta.sub_(sent.detach())
    return clip_rows(delta, clip, "l2")


def aggregate_noise(shape: tuple[int, ...] | torch.Size, scale: float, *, seed: int,
                    round_: int) -> torch.Tensor:
    """N(0, scale^2) float64 noise of ``shape``, one draw per round keyed by (seed, round),
    on the CPU (the same numbers whatever the run's device)."""
    n = math.prod(shape)
    noise = rng.client_noise(seed, round_, np.array([AGGREGATE_KEY]), n, "gaussian",
                             scale, stream=rng.Stream.CENTRAL_NOISE)
    return noise.reshape(tuple(shape))


def noisy_mean_delta(delta_sum: torch.Tensor, *, clip: float, noise_multiplier: float,
                     expected_count: float, seed: int, round_: int) -> torch.Tensor:
    """(sum_u clip_2(Delta_u, C) + N(0, z^2 C^2)) / (q n), float64 (docs/design.md section 5).

    ``expected_count`` is q n, a public constant (dividing by the realised
    count would make the divisor depend on who took part). z = 0: no noise. The
    sum stays on its device; the noise is drawn on the CPU and moved there.
    """
    if not expected_count > 0:
        raise ValueError(f"expected count must be > 0, got {expected_count}")
    out = delta_sum.detach().to(torch.float64, copy=True)
    if noise_multiplier > 0:
        noise = aggregate_noise(out.shape, noise_multiplier * clip, seed=seed, round_=round_)
        out.add_(noise.to(out.device))
    return out.div_(expected_count)


@dataclass
class SumPart:
    """One chunk's share of a round's secure sum: its clients' clipped deltas summed in
    float64 (``total``, (1, ...), shaped like one upload), the clipping figures
    (``stats``, with each client's pre-clip norm) and the clip C they were clipped at.

    It is what a shard of a round (:mod:`fedem_private.simulation.shards`) hands back
    for each of its chunks; :meth:`SecureSum.add_part` adds it. Like the secure sum
    itself it is never released: only the noisy sum of all parts leaves the server.
    """

    total: torch.Tensor
    stats: ClipStats
    clip: float

    @property
    def k(self) -> int:
        """How many clients the part sums."""
        return int(self.stats.norms.shape[0])


def sum_part(sent: torch.Tensor, local: torch.Tensor, clip: float) -> SumPart:
    """k clients' share of the secure sum (encoded tables (k, ...)): sum_u clip_2(local_u -
    sent_u, C) in float64, summed over the client axis by one ``sum`` (as
    :meth:`SecureSum.add` always has)."""
    clipped, stats = clipped_deltas(sent, local, clip)
    return SumPart(clipped.sum(dim=0, keepdim=True), stats, float(clip))


def packed_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (k, R), valid (k, R)): each client's marked rows of ``rows`` (k, n) bool, in
    order, padded to the largest count R (at least 1)."""
    k, n = rows.shape
    counts = rows.sum(dim=1)
    width = max(int(counts.max()) if k else 1, 1)
    j, col = rows.nonzero(as_tuple=True)
    rank = torch.cumsum(rows, dim=1, dtype=torch.int64)[j, col] - 1
    ids = torch.zeros((k, width), dtype=torch.int64, device=rows.device)
    ids[j, rank] = col
    valid = torch.arange(width, device=rows.device)[None, :] < counts[:, None]
    return ids, valid


def sparse_sum_part(sent: torch.Tensor, local: torch.Tensor, rows: torch.Tensor,
                    clip: float) -> SumPart:
    """:func:`sum_part` for uploads that differ from what was sent only on ``rows``.

    ``sent`` and ``local`` are encoded tables (k, n, d); ``rows`` (k, n) bool marks the
    rows each client trained (the codec's touched rows). Where ``local_u`` equals
    ``sent_u`` outside client u's marked rows, its delta is zero there, so its L2 norm
    and its clipped delta are those of the marked rows alone: each client's marked rows
    are packed into a (k, R, d) float64 table (zero padding adds nothing to a norm),
    clipped by the same :func:`~fedem_private.privacy.clipping.clip_rows`, and added
    into the (1, n, d) sum at their rows. The result equals :func:`sum_part`'s up to the
    order of float64 additions (``tests/test_sparse_uploads.py`` checks the two), at a
    cost in touched rows rather than k n d. The caller guarantees the precondition
    (:meth:`~fedem_private.simulation.loop.SecureSumUploads.upload`); what a client
    sends on the wire is unchanged (under secure aggregation a sparse upload would show
    the server which rows it trained).
    """
    if sent.shape != local.shape or local.dim() != 3 or rows.shape != local.shape[:2]:
        raise ValueError(f"sent {tuple(sent.shape)}, local {tuple(local.shape)} and rows "
                         f"{tuple(rows.shape)} do not align")
    k, n, d = local.shape
    ids, valid = packed_rows(rows.to(local.device))
    index = ids[:, :, None].expand(k, ids.shape[1], d)
    delta = torch.gather(local.detach(), 1, index).to(torch.float64)
    delta.sub_(torch.gather(sent.detach(), 1, index).to(torch.float64))
    delta.mul_(valid[:, :, None])
    if not bool(torch.isfinite(delta).all()):
        bad = (~finite_rows(delta.reshape(k, -1))).nonzero().squeeze(1).tolist()
        raise Diverged(f"non-finite value (NaN or Inf) in the upload of chunk row(s) "
                       f"{bad[:10]}")
    clipped, stats = clip_rows(delta, clip, "l2")
    total = torch.zeros((1, n, d), dtype=torch.float64, device=local.device)
    total[0].index_add_(0, ids[valid], clipped[valid])
    return SumPart(total, stats, float(clip))


@dataclass
class CentralRoundStats:
    """Clipping figures of one round's contributions (for the per-round log)."""

    n_clients: int = 0
    n_clipped: float = 0.0
    norm_sum: float = 0.0
    # a diagnostic for the run's log, never released to the server: the clients' clipped
    # sum's sum of |entry| and its count of non-zero entries (before canaries and noise)
    signal_abs_sum: float = 0.0
    signal_entries: int = 0


class SecureSum:
    """One round's secure aggregation of clipped deltas: only the noisy sum leaves it.

    Mechanism cdp-gaussian (see the module docstring). Neighbouring relation:
    user-level add/remove of one client's whole data. Trust model: the sum is
    formed under secure aggregation (or by a trusted server). Sensitivity:
    each term is clipped to L2 norm C, so the sum's L2 sensitivity is C and
    the noise N(0, z^2 C^2) on every entry makes one round the Gaussian
    mechanism with multiplier z (amplified by Poisson sampling only for
    observers who do not know who took part).

    ``add`` takes a chunk of clients' encoded (sent, local) uploads and adds
    their clipped deltas to a float64 sum; ``release`` adds the noise once and
    returns the new encoded global S + noisy mean delta. Between the two no
    per-client value is exposed. With ``adaptive`` (:class:`AdaptiveClip`) the
    secure sum also holds the centred count of unclipped participants, released
    with its own noise to move the clip for the next round; ``noise_multiplier``
    is then the sum's own share z_sum of the round's multiplier.
    """

    def __init__(self, clip: float, noise_multiplier: float, expected_count: float,
                 seed: int, adaptive: AdaptiveClip | None = None,
                 canaries: CanaryAudit | None = None,
                 selection: RowSelection | None = None) -> None:
        self.canaries = canaries  # the one-shot audit's canary clients (fixed clip only)
        self.selection = selection  # private row selection (large catalogues)
        self.n_items: int | None = None  # the catalogue's rows in the encoded table
        self.clip = float(clip)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_count = float(expected_count)
        self.seed = int(seed)
        self.adaptive = adaptive
        self.round = 0
        self._sum: torch.Tensor | None = None
        self._centred_count = 0.0  # adaptive: sum of b_u - 1/2 over the round's participants
        self.stats = CentralRoundStats()
        self.round_clip = self.clip  # the clip the round that ran last used
        self.unclipped_estimate: float | None = None  # adaptive: the last round's noisy b

    def begin_round(self, round_: int) -> None:
        self.round = int(round_)
        self._sum = None
        self._centred_count = 0.0
        self.stats = CentralRoundStats()
        self.round_clip = self.clip

    def add(self, sent: torch.Tensor, local: torch.Tensor,
            rows: torch.Tensor | None = None,
            items: tuple[np.ndarray, np.ndarray, int] | None = None) -> ClipStats:
        """Add the clipped deltas of k clients ((k, ...) encoded tables) to the round's sum:
        :func:`sum_part` of the chunk at the round's clip (:func:`sparse_sum_part` where
        ``rows`` (k, n) marks the only rows in which each upload differs from what it was
        sent), then :meth:`add_part`.

        With private row selection (:class:`RowSelection`) only the round's released rows
        enter (the delta is clipped on them alone), and ``items`` (indptr, items, m: the
        k clients' distinct items in CSR and the catalogue size) adds their indicators to
        the round's counts."""
        if self.selection is not None:
            if items is None:
                raise ValueError("private row selection needs each client's items")
            indptr, item_ids, self.n_items = items
            mask = self.selection.row_mask(local.shape[1], self.n_items, local.device)
            rows = mask.expand(local.shape[0], -1) if rows is None else rows & mask
            self.selection.add(indptr, item_ids, self.n_items, local.device)
        part = (sum_part(sent, local, self.clip) if rows is None
                else sparse_sum_part(sent, local, rows, self.clip))
        self.add_part(part)
        return part.stats

    def add_part(self, part: SumPart) -> None:
        """Add one chunk's :class:`SumPart` (formed here by :meth:`add`, or by a shard of
        the round elsewhere at this round's clip, :attr:`clip`) to the round's sum and
        figures. The float64 sum and the float figures are accumulated chunk by chunk in
        the order the parts arrive, so parts added in the round's chunk order give the
        same bits wherever each was formed (docs/guide.md, "One run across a Ray
        cluster")."""
        if part.clip != self.clip:
            raise ValueError(f"a part clipped at {part.clip} added to a round clipping at "
                             f"{self.clip}")
        stats = part.stats
        if self.adaptive is not None:
            self._centred_count += float((stats.norms <= self.clip).sum()) - 0.5 * len(
                stats.norms)
        self._sum = part.total if self._sum is None else self._sum.add_(part.total)
        k = part.k
        self.stats.n_clients += k
        self.stats.n_clipped += stats.fraction_clipped * k
        if k:
            self.stats.norm_sum += stats.mean_norm * k

    def release(self, base: torch.Tensor) -> torch.Tensor:
        """The new encoded global: ``base`` (what every client was sent) + noisy mean delta.

        With no participant the sum is zero and the noise is still added.
        Returned in ``base``'s dtype (the cast is post-processing).
        """
        delta_sum = self._sum if self._sum is not None else torch.zeros_like(
            base, dtype=torch.float64)
        if delta_sum.shape != base.shape:
            raise ValueError(f"sum {tuple(delta_sum.shape)} and base {tuple(base.shape)} differ")
        if self._sum is not None:  # the log's noise-to-signal (CDP_NSR); not released
            self.stats.signal_abs_sum = float(self._sum.abs().sum())
            self.stats.signal_entries = int(torch.count_nonzero(self._sum))
        if self.canaries is not None:  # inserted canaries join the secure sum
            extra = self.canaries.contribution(self.round, delta_sum.shape)
            delta_sum = delta_sum + extra.to(delta_sum.device)
        if self.selection is None:
            mean = noisy_mean_delta(delta_sum, clip=self.clip,
                                    noise_multiplier=self.noise_multiplier,
                                    expected_count=self.expected_count, seed=self.seed,
                                    round_=self.round)
        else:
            mean = self._selected_mean(delta_sum)
        if self.canaries is not None:  # what the aggregator sees: the noisy sum
            self.canaries.observe(mean * self.expected_count)
        self._sum = None
        if self.adaptive is not None:
            self._adapt_clip()
        return (base.detach().to(torch.float64) + mean).to(base.dtype)

    def _selected_mean(self, delta_sum: torch.Tensor) -> torch.Tensor:
        """Private row selection: the noisy mean delta on the round's released rows only
        (:func:`noisy_mean_delta` of those rows; zero elsewhere). The round's counts are
        released next, by :meth:`release_counts`."""
        assert self.selection is not None
        n_items = self.n_items if self.n_items is not None else delta_sum.shape[1]
        mask = self.selection.row_mask(delta_sum.shape[1], n_items, delta_sum.device)
        mean = torch.zeros_like(delta_sum, dtype=torch.float64)
        if bool(mask.any()):
            mean[:, mask] = noisy_mean_delta(
                delta_sum[:, mask], clip=self.clip, noise_multiplier=self.noise_multiplier,
                expected_count=self.expected_count, seed=self.seed, round_=self.round)
        return mean

    def release_counts(self) -> torch.Tensor:
        """Private row selection: the round's noisy item counts (float64, (m,)); called once
        a round, after :meth:`release`."""
        assert self.selection is not None and self.n_items is not None
        return self.selection.release(self.seed, self.round, self.n_items)

    def _adapt_clip(self) -> None:
        """Adaptive clipping: the noisy unclipped fraction, and the next round's clip."""
        assert self.adaptive is not None
        count = self._centred_count
        if self.adaptive.count_noise > 0:
            count += float(rng.client_noise(self.seed, self.round, np.array([COUNT_KEY]), 1,
                                            "gaussian", self.adaptive.count_noise,
                                            stream=rng.Stream.CENTRAL_NOISE)[0, 0])
        self.unclipped_estimate = count / self.expected_count + 0.5
        self.clip = self.adaptive.next_clip(self.clip, self.unclipped_estimate)
