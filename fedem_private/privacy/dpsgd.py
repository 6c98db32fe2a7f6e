"""``ldp-dpsgd``: interaction-level local DP from DP-SGD in local training (docs/design.md §5).

**Neighbouring relation.** One training interaction (a positive) of one client
added or removed.

**Trust model.** Local. The honest-but-curious server sees every upload, knows
what it sent, who took part and the public hyper-parameters below. It never
sees which positives a step sampled, a per-example gradient or the noise.

**One local step of client u** (Abadi et al. 2016, one example = one positive):

1. Poisson sampling: each of u's positives is in the step's batch independently
   with probability ``q_e``.
2. Per-example gradients of the BCE loss on *every* parameter the client trains:
   its item table and its private groups (MF: p_u). A positive's gradient is
   clipped to L2 norm ``C`` over all of them, by the factor min(1, C / (norm +
   1e-6)) (opacus's factor: the clipped norm stays below C).
3. N(0, sigma^2 C^2) is added to EVERY entry of the sum, on the table and on the
   private groups. Every row moves, so the touched set is not released. p_u is
   noised too: later steps read it, so a p_u trained without noise would carry
   the data into the next steps' sums.
4. The gradient of ``N`` negatives is added. They are drawn uniformly from the
   whole catalogue, independently of the data (a positive can be drawn). Given
   the current parameters this is a data-independent term, so it gets no clip
   and no noise.
5. The sum is divided by the public constant L = max(N / num_negatives, 1): the
   number of positives at the training's usual 1 : num_negatives ratio. Then
   one SGD step with learning rate ``lr``.

**Sensitivity and accounting.** Before each step the parameters depend only on
public inputs (the table the server sent, the client's start) and on earlier
noisy sums. Adding or removing one positive therefore changes a step's sum by
at most C in L2, and only if that positive was sampled. Each step is thus the
Poisson-subsampled Gaussian mechanism (q_e, sigma). The steps per round
``S`` and every count above are public constants, never the size of the data.
A client that took part in R rounds has composed R * S such steps; the upload
is post-processing. The accounting is
:class:`~fedem_private.privacy.accounting.RoundMechanism` kind
``sampled-gaussian`` (dp-accounting's PLD and RDP), checked in the tests
against opacus's RDP and PRV accountants.

**What the round loop must guarantee** (``RunConfig.validate`` refuses the
rest):

- The starting table is public or post-processing: merge ``sr``, ``sm`` with its
  fixed rho, or ``em`` whose adapter is itself trained by DP-SGD
  (:func:`train_adapter_chunk`, its steps charged). Not ``dm``.
- No upload codec and no early stop.
- A backbone with :meth:`~fedem_private.models.base.Backbone.example_grads` and no
  dense shared groups.

Amplification is claimed only for the sampling of a client's own positives. The
server sees who took part, so there is none over clients.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedem_private import rng
from fedem_private.models.base import Backbone, ClientParams
from fedem_private.privacy.params import MechanismParams

#: opacus's guard in the clip factor C / (norm + CLIP_EPS)
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class DpsgdSettings:
    """The public constants of local DP-SGD (see the module docstring)."""

    sample_rate: float  # q_e
    clip: float  # C
    noise_multiplier: float  # sigma
    steps: int  # S, per round
    negatives: int  # N, per step
    lr: float
    normaliser: float  # L

    @classmethod
    def of(cls, params: MechanismParams, num_negatives: int) -> DpsgdSettings:
        """The settings of a resolved ``ldp-dpsgd`` mechanism; L from N and the training's
        ``num_negatives``."""
        assert params.dpsgd and params.clip is not None and params.noise_multiplier is not None
        assert params.dpsgd_rate is not None and params.dpsgd_steps is not None
        assert params.dpsgd_negatives is not None and params.dpsgd_lr is not None
        norm = max(params.dpsgd_negatives / max(int(num_negatives), 1), 1.0)
        return cls(params.dpsgd_rate, params.clip, params.noise_multiplier, params.dpsgd_steps,
                   params.dpsgd_negatives, params.dpsgd_lr, float(norm))

    @property
    def noise_std(self) -> float:
        """sigma C, the noise std on every entry of a step's sum."""
        return self.noise_multiplier * self.clip


def positive_masks(seed: int, round_: int, client: int, n_pos: int, steps: int,
                   rate: float) -> np.ndarray:
    """(steps, n_pos) bool: which of the client's positives each step samples (Poisson):
    positive i is in step s's sample iff the keyed uniform at counter (s << 32) + i is
    below the rate. The per-client form of :func:`chunk_positive_masks`."""
    k = rng.key(seed, rng.Stream.DPSGD_SAMPLE, round_, client)
    ctr = (np.arange(steps, dtype=np.int64)[:, None] << rng.EPOCH_SHIFT) + np.arange(n_pos)
    return rng.uniform(k, ctr) < rate


def chunk_positive_masks(seed: int, round_: int, clients: np.ndarray, n_pos: np.ndarray,
                         steps: int, rate: float) -> np.ndarray:
    """(k, steps, max n_pos) bool: :func:`positive_masks` of every client in one draw
    (row j's columns beyond n_pos[j] are padding, to be ignored)."""
    width = int(np.max(n_pos, initial=0))
    ctr = ((torch.arange(steps)[:, None] << rng.EPOCH_SHIFT) + torch.arange(width)).reshape(-1)
    masks = rng.bernoulli_t(seed, rng.Stream.DPSGD_SAMPLE, round_, clients, ctr, rate)
    return masks.reshape(len(clients), steps, width).numpy()


def step_negatives(seed: int, round_: int, client: int, steps: int, count: int,
                   n_items: int) -> np.ndarray:
    """(steps, count) item ids, uniform over the whole catalogue (data-independent): the
    keyed uniforms at counters 0 .. steps * count - 1, step-major, scaled to n_items."""
    u = rng.uniform(rng.key(seed, rng.Stream.DPSGD_NEGATIVES, round_, client),
                    np.arange(steps * count))
    return rng.randbelow(u, n_items).reshape(steps, count)


def chunk_step_negatives(seed: int, round_: int, clients: np.ndarray, steps: int, count: int,
                         n_items: int, device: torch.device | None = None) -> Tensor:
    """(k, steps, count) :func:`step_negatives` of every client, one draw on ``device``."""
    u = rng.uniform_t(seed, rng.Stream.DPSGD_NEGATIVES, round_, clients, steps * count, device)
    return (u * n_items).to(torch.int64).clamp_(max=n_items - 1).reshape(len(clients), steps,
                                                                           count)


def noise_generator(seed: int, round_: int, client: int) -> torch.Generator:
    """The generator of a client's noise in a round: each step draws the table's noise
    (m, d), then each private group's, in sorted name order."""
    return rng.generator(seed, rng.Stream.DPSGD_NOISE, round_, client)


@dataclass
class DpsgdStats:
    """What one chunk's local DP-SGD logs: clipping and the noise-to-signal ratio."""

    examples: int = 0  # sampled positives over all steps
    clipped: int = 0  # of which had norm > C
    norm_sum: float = 0.0  # sum of their pre-clip norms
    signal_sum: float = 0.0  # sum of |entries| of the clipped gradients on the rows they hit
    signal_entries: int = 0

    def merge(self, other: DpsgdStats) -> None:
        self.examples += other.examples
        self.clipped += other.clipped
        self.norm_sum += other.norm_sum
        self.signal_sum += other.signal_sum
        self.signal_entries += other.signal_entries


def _positives(indptr: np.ndarray, items: np.ndarray, client: int) -> np.ndarray:
    return items[indptr[client]: indptr[client + 1]]


@dataclass
class _ChunkDraws:
    """A chunk's draws for ``steps`` DP-SGD steps keyed by (seed, round key, client): each
    client's positives, their Poisson masks (steps, n_pos), the negatives (k, steps, N) on
    ``dev`` and one noise generator per client."""

    positives: list[np.ndarray]
    masks: list[np.ndarray]
    negatives: Tensor
    gens: list[torch.Generator]

    @classmethod
    def of(cls, clients: np.ndarray, pos_indptr: np.ndarray, pos_items: np.ndarray,
           settings: DpsgdSettings, steps: int, n_items: int, seed: int, key: int,
           dev: torch.device) -> _ChunkDraws:
        ids = np.asarray(clients, dtype=np.int64)
        positives = [_positives(pos_indptr, pos_items, u) for u in ids.tolist()]
        n_pos = np.array([p.shape[0] for p in positives], dtype=np.int64)
        grid = chunk_positive_masks(seed, key, ids, n_pos, steps, settings.sample_rate)
        masks = [grid[j, :, :n] for j, n in enumerate(n_pos.tolist())]
        negs = chunk_step_negatives(seed, key, ids, steps, settings.negatives, n_items, dev)
        return cls(positives, masks, negs, [noise_generator(seed, key, u) for u in ids.tolist()])

    def picked(self, s: int) -> list[np.ndarray]:
        """Each client's positives sampled at step s."""
        return [pos[mask[s]] for pos, mask in zip(self.positives, self.masks, strict=True)]


def _padded(picked: list[np.ndarray], dev: torch.device) -> tuple[Tensor, Tensor] | None:
    """(item ids (k, W), valid (k, W)) of a step's sampled positives, zero-padded to the
    widest client; None when no client sampled any."""
    width = max(p.shape[0] for p in picked)
    if not width:
        return None
    items = np.zeros((len(picked), width), dtype=np.int64)
    valid = np.zeros((len(picked), width), dtype=bool)
    for j, p in enumerate(picked):
        items[j, : p.shape[0]] = p
        valid[j, : p.shape[0]] = True
    return torch.from_numpy(items).to(dev), torch.from_numpy(valid).to(dev)


class _LazyTableNoise:
    """The table's noise added when a row is read, not at every step (same distribution).

    SGD is linear in the noise: after s steps row r holds its signal updates minus
    step_size times the sum of s independent N(0, sigma^2 C^2 I) draws. A step reads
    only its batch's rows, so a row's pending sum is drawn just before it is read, as
    ONE Gaussian of variance (s - stamp_r) sigma^2 C^2 (the sum of the steps it missed),
    and every row's remainder after the last step. The joint law of everything the
    steps read and of the final table is that of the eager scheme; the numbers differ.
    Each client's draws come from its own generator, so a client's result does not
    depend on its chunk.
    """

    def __init__(self, flat: Tensor, k: int, m: int, gens: list[torch.Generator],
                 std: float, step_size: float) -> None:
        self.flat, self.k, self.m, self.gens = flat, k, m, gens
        self.scale = std * step_size
        self.stamp = torch.zeros(k * m, dtype=torch.int64, device=flat.device)

    def catch_up(self, where: Tensor, s: int) -> None:
        """Add to rows ``where`` (flat ids, repeats allowed) the noise of steps stamp..s-1."""
        if self.scale == 0:
            return
        rows = torch.unique(where)
        gap = s - self.stamp[rows]
        rows, gap = rows[gap > 0], gap[gap > 0]
        if rows.numel() == 0:
            return
        d = self.flat.shape[1]
        counts = torch.bincount(rows // self.m, minlength=self.k).tolist()
        noise = torch.empty((rows.numel(), d), dtype=self.flat.dtype)
        at = 0
        for j, n in enumerate(counts):
            if n:
                noise[at: at + n].normal_(0.0, 1.0, generator=self.gens[j])
                at += n
        noise = noise.to(self.flat.device)
        noise.mul_((gap.to(noise.dtype).sqrt() * self.scale)[:, None])
        self.flat.index_add_(0, rows, noise, alpha=-1.0)
        self.stamp[rows] = s

    def finish(self, steps: int) -> None:
        """Every row's remaining noise, of the steps after it was last read (dense)."""
        if self.scale == 0:
            return
        d = self.flat.shape[1]
        noise = torch.empty((self.k, self.m, d), dtype=self.flat.dtype)
        for j in range(self.k):
            noise[j].normal_(0.0, 1.0, generator=self.gens[j])
        noise = noise.to(self.flat.device)
        gap = (steps - self.stamp).to(noise.dtype).sqrt_().mul_(self.scale)
        noise.mul_(gap.view(self.k, self.m, 1))
        self.flat.sub_(noise.view(-1, d))
        self.stamp.fill_(steps)


def train_chunk(backbone: Backbone, start: ClientParams, clients: np.ndarray,
                pos_indptr: np.ndarray, pos_items: np.ndarray, settings: DpsgdSettings,
                seed: int, round_: int, lazy_noise: bool = True
                ) -> tuple[ClientParams, DpsgdStats]:
    """S local DP-SGD steps for a chunk of clients at once (the module docstring's step).

    ``start`` holds each client's starting table (k, m, d) and private groups;
    ``pos_indptr`` / ``pos_items`` are the clients' training positives (CSR over
    ALL clients, indexed by client id). Every client takes the same S steps, so
    the chunk moves in lock-step with no ragged tail. Draws are keyed by (seed,
    round, client): the result for a client does not depend on its chunk.
    ``lazy_noise`` (the default) adds the table's noise as rows are read
    (:class:`_LazyTableNoise`, the same distribution, about S times fewer draws);
    False draws it at every step in opacus's order (the tests' exact comparison).
    Returns (trained parameters, clipping and signal statistics).
    """
    if start.dense:
        raise ValueError("ldp-dpsgd trains no dense shared groups")
    table = start.items.clone(memory_format=torch.contiguous_format)
    k, m, d = table.shape
    dev, dtype = table.device, table.dtype
    names = sorted(start.private)
    private = {n: start.private[n].clone(memory_format=torch.contiguous_format) for n in names}
    stats = DpsgdStats()
    if k == 0:
        return ClientParams(table, {}, private), stats
    s_count, c, std = settings.steps, settings.clip, settings.noise_std
    draws = _ChunkDraws.of(clients, pos_indptr, pos_items, settings, s_count, m, seed, round_,
                           dev)
    negs, gens = draws.negatives, draws.gens
    offsets = (torch.arange(k, device=dev) * m)[:, None]
    flat = table.view(-1, d)
    step_size = settings.lr / settings.normaliser
    lazy = _LazyTableNoise(flat, k, m, gens, std, step_size) if lazy_noise else None
    # eager: the whole table's gradient, noise included; lazy: the step's signal rows,
    # written into the table after every gradient of the step is taken, and the noise
    # through ``lazy``
    grad = torch.zeros_like(table) if lazy is None else None
    pending: list[tuple[Tensor, Tensor]] = []

    def add_rows(where: Tensor, values: Tensor) -> None:
        if grad is None:
            pending.append((where, values))
        else:
            grad.view(-1, d).index_add_(0, where, values)

    grad_priv = {n: torch.zeros_like(t) for n, t in private.items()}
    for s in range(s_count):
        if std > 0:  # opacus's order: each parameter's noise in turn, per client
            for j in range(k):
                if grad is not None:
                    grad[j].normal_(0.0, std, generator=gens[j])
                for n in names:
                    grad_priv[n][j].normal_(0.0, std, generator=gens[j])
        else:
            if grad is not None:
                grad.zero_()
            for n in names:
                grad_priv[n].zero_()
        picked = draws.picked(s)
        batch = _padded(picked, dev)
        if lazy is not None:  # the rows this step reads, brought up to date first
            read = [(torch.from_numpy(np.concatenate(
                [pos + j * m for j, pos in enumerate(picked)])).to(dev))]
            if settings.negatives:
                read.append((negs[:, s, :] + offsets).view(-1))
            lazy.catch_up(torch.cat(read), s)
        if batch is not None:
            items_t, valid_t = batch
            width = items_t.shape[1]
            where = (items_t + offsets).view(-1)
            rows = flat.index_select(0, where).view(k, width, d)
            g_rows, g_priv = backbone.example_grads(private, rows, items_t,
                                                    torch.ones((k, width), dtype=dtype,
                                                               device=dev))
            sq = g_rows.pow(2).sum(-1)
            for n in names:
                sq = sq + g_priv[n].pow(2).reshape(k, width, -1).sum(-1)
            norm = sq.sqrt()
            factor = (c / (norm + CLIP_EPS)).clamp(max=1.0) * valid_t
            clipped_rows = g_rows * factor[:, :, None]
            add_rows(where, clipped_rows.reshape(-1, d))
            for n in names:
                grad_priv[n].add_(torch.einsum("ab,ab...->a...", factor, g_priv[n]))
            n_valid = int(valid_t.sum())
            stats.examples += n_valid
            stats.clipped += int(((norm > c) & valid_t).sum())
            stats.norm_sum += float((norm * valid_t).sum())
            stats.signal_sum += float(clipped_rows.abs().sum())
            stats.signal_entries += n_valid * d
        if settings.negatives:
            n_items = negs[:, s, :]
            where = (n_items + offsets).view(-1)
            rows = flat.index_select(0, where).view(k, -1, d)
            g_rows, g_priv = backbone.example_grads(private, rows, n_items,
                                                    torch.zeros(n_items.shape, dtype=dtype,
                                                                device=dev))
            add_rows(where, g_rows.reshape(-1, d))
            for n in names:
                grad_priv[n].add_(g_priv[n].sum(1))
        if grad is not None:
            table.sub_(grad, alpha=step_size)
        for where, values in pending:
            flat.index_add_(0, where, values, alpha=-step_size)
        pending.clear()
        for n in names:
            private[n].sub_(grad_priv[n], alpha=step_size)
    if lazy is not None:  # every row's noise of the steps it has not been read since
        lazy.finish(s_count)
    return ClientParams(table, {}, private), stats


# ------------------------------------------------------------------ reference (MF, PFedRec)
class _Linear(torch.nn.Module):
    """A dot-product backbone as opacus sees it: an embedding (the item table) and a
    Linear(d, 1) over the item vector (MF: p_u, no bias; PFedRec: the head w_u, b_u)."""

    def __init__(self, q: Tensor, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(q.shape[0], q.shape[1])
        self.lin = torch.nn.Linear(q.shape[1], 1, bias=bias is not None)
        with torch.no_grad():
            self.emb.weight.copy_(q)
            self.lin.weight.copy_(weight[None])
            if bias is not None:
                self.lin.bias.copy_(bias.reshape(1))

    def forward(self, items: Tensor) -> Tensor:
        return self.lin(self.emb(items)).squeeze(-1)


def reference_train_client(backbone: str, q_start: Tensor, private: dict[str, Tensor],
                           positives: np.ndarray, settings: DpsgdSettings, seed: int,
                           round_: int, client: int) -> tuple[Tensor, dict[str, Tensor]]:
    """One client's S DP-SGD steps with opacus, the obvious way (the tests' reference).

    ``backbone`` is "mf" (private {"p"}) or "pfedrec" (private {"w", "b"}); ``private``
    holds that client's groups without the client axis. opacus's ``GradSampleModule``
    computes the per-positive gradients. Its ``DPOptimizer`` clips them, adds the noise
    from :func:`noise_generator` and divides by L (``expected_batch_size``). The
    parameters are handed to it in the engine's noise order (table, then private groups
    by name). The negatives' plain gradient over L is then added, and the wrapped SGD
    steps. A step that sampled no positive still adds the noise. The batches and
    negatives are the same draws the vectorised engine makes.
    """
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    if backbone == "mf":
        model = _Linear(q_start, private["p"], None)
        order = [model.emb.weight, model.lin.weight]
    elif backbone == "pfedrec":
        model = _Linear(q_start, private["w"], private["b"])
        order = [model.emb.weight, model.lin.bias, model.lin.weight]  # table, "b", "w"
    else:
        raise ValueError(f"no DP-SGD reference for backbone {backbone!r}")
    with warnings.catch_warnings():
        # opacus's full backward hook on a module whose input (item ids) needs no gradient
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        _reference_steps(model, order, q_start.shape[0], positives, settings,
                         settings.steps, seed, round_, client, GradSampleModule, DPOptimizer)
    out = {"p": model.lin.weight.detach()[0].clone()} if backbone == "mf" else {
        "w": model.lin.weight.detach()[0].clone(), "b": model.lin.bias.detach()[0].clone()}
    return model.emb.weight.detach().clone(), out


def _reference_steps(model: torch.nn.Module, params: list[Tensor], m: int,
                     positives: np.ndarray, settings: DpsgdSettings, steps: int, seed: int,
                     round_: int, client: int, GradSampleModule, DPOptimizer  # noqa: N803
                     ) -> None:
    gsm = GradSampleModule(model, loss_reduction="sum")
    opt = DPOptimizer(torch.optim.SGD(params, lr=settings.lr),
                      noise_multiplier=settings.noise_multiplier, max_grad_norm=settings.clip,
                      expected_batch_size=settings.normaliser, loss_reduction="mean",
                      generator=noise_generator(seed, round_, client))
    masks = positive_masks(seed, round_, client, positives.shape[0], steps,
                           settings.sample_rate)
    negs = step_negatives(seed, round_, client, steps, settings.negatives, m)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for s in range(steps):
        opt.zero_grad()
        batch = torch.from_numpy(positives[masks[s]])
        if batch.numel():
            logits = gsm(batch)
            bce(logits, torch.ones_like(logits), reduction="sum").backward()
            opt.pre_step()
        else:  # nothing sampled: the sum is zero, the noise is still added
            for prm in params:
                prm.summed_grad = torch.zeros_like(prm)
            opt.add_noise()
            for prm in params:
                prm.grad /= settings.normaliser
        if settings.negatives:
            gsm.disable_hooks()
            logits = gsm(torch.from_numpy(negs[s]))
            neg = torch.autograd.grad(bce(logits, torch.zeros_like(logits), reduction="sum"),
                                      params)
            gsm.enable_hooks()
            for prm, g in zip(params, neg, strict=True):
                prm.grad = prm.grad + g / settings.normaliser
        opt.original_optimizer.step()


# ------------------------------------------------------------ the merge adapter (EM) by DP-SGD
def _adapter_forward(weights: tuple[Tensor, ...], biases: tuple[Tensor, ...], x: Tensor
                     ) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """Equation 9 on (k, B, 2d) rows: (layer inputs h_0 .. h_{L-1}, pre-activations
    z_1 .. z_L, rho (k, B))."""
    inputs, pre = [], []
    h = x
    last = len(weights) - 1
    for j, (w, b) in enumerate(zip(weights, biases, strict=True)):
        inputs.append(h)
        z = torch.baddbmm(b.unsqueeze(1), h, w)
        pre.append(z)
        h = torch.sigmoid(z) if j == last else torch.relu(z)
    return inputs, pre, h.squeeze(-1)


def _adapter_example_grads(backbone: Backbone, private: dict[str, Tensor],
                           weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                           ql: Tensor, qg: Tensor, items: Tensor, labels: Tensor
                           ) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """Per-example backpropagation of the BCE loss through EM's merge into the adapter.

    For example b (item i): q_m = q_l + rho (q_g - q_l) with rho the adapter's output on
    [q_g - q_l, q_l] (equations 9, 10); the backbone gives d loss / d q_m. Returns (layer
    inputs h_{j-1} (k, B, fan_in), output deltas d loss / d z_j (k, B, fan_out), per-example
    squared gradient norms (k, B)): example b's gradient on W_j is h_{j-1,b}^T delta_{j,b}
    and on b_j delta_{j,b}, so its squared norm is sum_j |h_{j-1,b}|^2 |delta_{j,b}|^2 +
    |delta_{j,b}|^2, and a weighted sum over examples is one batched product.
    """
    diff = qg - ql
    inputs, pre, rho = _adapter_forward(weights, biases, torch.cat((diff, ql), dim=-1))
    merged = ql + rho[:, :, None] * diff
    g_rows, _ = backbone.example_grads(private, merged, items, labels)
    delta = ((g_rows * diff).sum(-1) * rho * (1 - rho))[:, :, None]  # d loss / d z_L
    deltas = [delta]
    for j in range(len(weights) - 1, 0, -1):
        delta = torch.bmm(delta, weights[j].transpose(1, 2)) * (pre[j - 1] > 0)
        deltas.append(delta)
    deltas.reverse()
    sq = sum((h.pow(2).sum(-1) + 1.0) * dl.pow(2).sum(-1)
             for h, dl in zip(inputs, deltas, strict=True))
    return inputs, deltas, sq


def train_adapter_chunk(backbone: Backbone, private: dict[str, Tensor],
                        weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                        q_local: Tensor, q_global: Tensor, clients: np.ndarray,
                        pos_indptr: np.ndarray, pos_items: np.ndarray, settings: DpsgdSettings,
                        steps: int, seed: int, round_: int
                        ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], DpsgdStats]:
    """EM's adapter (equation 11) trained by ``steps`` DP-SGD steps for a chunk of clients.

    The same mechanism as :func:`train_chunk`, on the adapter's parameters with p_u,
    Q_l and Q_g frozen. Q_l and p_u are the client's state after earlier noisy steps, Q_g
    is public, so each step is again the subsampled Gaussian (q_e, sigma) in one
    positive: a Poisson sample of positives, each clipped to C over all adapter
    parameters, N(0, sigma^2 C^2) on every weight and bias, N data-independent negatives,
    the sum over L, one SGD step. Its draws come from streams of their own (the
    training's round key plus ADAPTER_ROUND), so the two phases never share noise. The
    noise order per client and step is opacus's for nn.Linear layers: for each layer
    its weight, drawn (fan_out, fan_in), then its bias. Returns the trained (weights,
    biases) and the statistics.
    """
    ws = [w.clone() for w in weights]
    bs = [b.clone() for b in biases]
    k, m, d = q_local.shape
    stats = DpsgdStats()
    if k == 0 or steps == 0:
        return tuple(ws), tuple(bs), stats
    dev, dtype = q_local.device, q_local.dtype
    c, std = settings.clip, settings.noise_std
    key = round_ + ADAPTER_ROUND
    draws = _ChunkDraws.of(clients, pos_indptr, pos_items, settings, steps, m, seed, key, dev)
    negs, gens = draws.negatives, draws.gens
    offsets = (torch.arange(k, device=dev) * m)[:, None]
    ql_flat, qg_flat = q_local.reshape(-1, d), q_global.reshape(-1, d)
    step_size = settings.lr / settings.normaliser
    for s in range(steps):
        gw = [torch.zeros_like(w) for w in ws]
        gb = [torch.zeros_like(b) for b in bs]
        if std > 0:
            for j in range(k):
                for w, b, nw, nb in zip(ws, bs, gw, gb, strict=True):
                    noise = torch.empty((w.shape[2], w.shape[1]), dtype=dtype)
                    noise.normal_(0.0, std, generator=gens[j])
                    nw[j] = noise.T.to(dev)
                    nb[j] = torch.empty(b.shape[1], dtype=dtype).normal_(
                        0.0, std, generator=gens[j]).to(dev)
        batch = _padded(draws.picked(s), dev)
        groups: list[tuple[Tensor, Tensor | None, float]] = []
        if batch is not None:
            groups.append((*batch, 1.0))
        if settings.negatives:
            groups.append((negs[:, s, :], None, 0.0))
        for it, valid_t, label in groups:
            where = (it + offsets).view(-1)
            ql = ql_flat.index_select(0, where).view(k, -1, d)
            qg = qg_flat.index_select(0, where).view(k, -1, d)
            lab = torch.full(it.shape, label, dtype=dtype, device=dev)
            inputs, deltas, sq = _adapter_example_grads(backbone, private, tuple(ws), tuple(bs),
                                                        ql, qg, it, lab)
            if valid_t is None:  # negatives: data-independent, no clip
                factor = torch.ones_like(sq)
            else:
                norm = sq.sqrt()
                factor = (c / (norm + CLIP_EPS)).clamp(max=1.0) * valid_t
                stats.examples += int(valid_t.sum())
                stats.clipped += int(((norm > c) & valid_t).sum())
                stats.norm_sum += float((norm * valid_t).sum())
            for j, (h, dl) in enumerate(zip(inputs, deltas, strict=True)):
                scaled = dl * factor[:, :, None]
                gw[j].add_(torch.bmm(h.transpose(1, 2), scaled))
                gb[j].add_(scaled.sum(1))
        for w, b, nw, nb in zip(ws, bs, gw, gb, strict=True):
            w.sub_(nw, alpha=step_size)
            b.sub_(nb, alpha=step_size)
    return tuple(ws), tuple(bs), stats


#: offset of the adapter phase's round key (its draws never meet the training's)
ADAPTER_ROUND = 1 << 20


class _Adapter(torch.nn.Module):
    """EM's adapter as opacus sees it: nn.Linear layers over [q_g - q_l, q_l] of the
    example's item (frozen buffers), rho, the merged row and the frozen score head."""

    def __init__(self, weights: tuple[Tensor, ...], biases: tuple[Tensor, ...], ql: Tensor,
                 qg: Tensor, head: dict[str, Tensor]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList()
        for w, b in zip(weights, biases, strict=True):
            lin = torch.nn.Linear(w.shape[0], w.shape[1])
            with torch.no_grad():
                lin.weight.copy_(w.T)
                lin.bias.copy_(b)
            self.layers.append(lin)
        self.register_buffer("ql", ql.clone())
        self.register_buffer("qg", qg.clone())
        self.head = {n: t.clone() for n, t in head.items()}

    def forward(self, items: Tensor) -> Tensor:
        a, g = self.ql[items], self.qg[items]
        h = torch.cat((g - a, a), dim=-1)
        for j, lin in enumerate(self.layers):
            h = lin(h)
            h = torch.sigmoid(h) if j == len(self.layers) - 1 else torch.relu(h)
        merged = a + h * (g - a)
        logit = merged @ (self.head["p"] if "p" in self.head else self.head["w"])
        return logit + self.head["b"] if "b" in self.head else logit


def reference_train_adapter(weights: tuple[Tensor, ...], biases: tuple[Tensor, ...],
                            q_local: Tensor, q_global: Tensor, private: dict[str, Tensor],
                            positives: np.ndarray, settings: DpsgdSettings, steps: int,
                            seed: int, round_: int, client: int
                            ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """One client's adapter trained by opacus's DPOptimizer (the tests' reference for
    :func:`train_adapter_chunk`); weights (fan_in, fan_out) and biases without the client
    axis, private {"p"} (MF) or {"w", "b"} (PFedRec)."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    model = _Adapter(weights, biases, q_local, q_global, private)
    params = [p for lin in model.layers for p in (lin.weight, lin.bias)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        _reference_steps(model, params, q_local.shape[0], positives, settings, steps, seed,
                         round_ + ADAPTER_ROUND, client, GradSampleModule, DPOptimizer)
    return (tuple(lin.weight.detach().T.clone() for lin in model.layers),
            tuple(lin.bias.detach().clone() for lin in model.layers))
