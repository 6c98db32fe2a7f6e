"""Server-side aggregation: FedAvg, uniform, and FedEM's similarity aggregation.

Similarity aggregation follows equation 13 of the FedEM paper: for each client
u the server picks weights w_u on the probability simplex minimising

    sum_v (w_uv - p_v)^2 + alpha (w_uv - s_uv)^2,  s_uv = 1 / (1 + ||Q_u - Q_v||_F^2),

over the uploaded tables Q_v, and client u receives Q_g[u] = sum_v w_uv Q_v.
Completing the square gives (1 + alpha) ||w_u - c_u||^2 + const with
c_uv = (p_v + alpha s_uv) / (1 + alpha), so w_u is the Euclidean projection of
c_u onto the simplex (Held, Wolfe and Crowder 1974; Duchi et al., ICML 2008),
computed exactly by sorting. cvxpy solving the QP itself is the reference
(:mod:`fedem_private.reference.aggregation`).

Weights are float64 tensors; tables keep their own dtype and device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from fedem_private.errors import UserError
from fedem_private.finite import finite_rows
from fedem_private.server.options import SIMILARITIES

DEFAULT_CHUNK_ROWS = 256
DEFAULT_CHUNK_CLIENTS = 256
GRAM_BLOCK = 256  # client block of the symmetric Gram products on the CPU
#: the same on an accelerator: there each block pair costs a handful of kernel launches
#: and their Python dispatch (at ML-1M size 256-client blocks made 4,500 products a
#: round, about 0.33 s on an H200 against 5 ms for ML-100K's 70), while halving the
#: multiply-adds saves little; so whole tables up to this many clients go in one product
GRAM_BLOCK_DEVICE = 8192
#: float32 distances below this fraction of the two centred squared norms are recomputed
#: in float64 (cancellation; see :func:`cross_sq_distances`)
CANCELLATION = 1e-3


# ---------------------------------------------------------------- fixed weights


def _participants(n: int, participating: Tensor | None, device: torch.device) -> Tensor:
    """Boolean (n,) participant mask; everybody when participating is None."""
    if participating is None:
        return torch.ones(n, dtype=torch.bool, device=device)
    mask = participating.to(device=device, dtype=torch.bool)
    if mask.shape != (n,):
        raise ValueError(f"participating mask has shape {tuple(mask.shape)}, expected ({n},)")
    if not bool(mask.any()):
        raise ValueError("no client participates in this round")
    return mask


def fedavg_weights(sizes: Tensor, participating: Tensor | None = None) -> Tensor:
    """FedAvg weights p_v = |D_v| / sum_{participants} |D| (FedMF; paper eq. 13's p).

    sizes: (n,) local data-set sizes. Returns (n,) float64, zero for
    non-participants, summing to one over the participants.
    """
    sizes = sizes.to(torch.float64)
    mask = _participants(sizes.shape[0], participating, sizes.device)
    if bool((sizes < 0).any()) or not bool(torch.isfinite(sizes).all()):
        raise ValueError("data-set sizes must be finite and non-negative")
    kept = torch.where(mask, sizes, torch.zeros_like(sizes))
    total = kept.sum()
    if not total > 0:
        raise ValueError("participating clients hold no data: FedAvg weights are undefined")
    return kept / total


def uniform_weights(sizes: Tensor, participating: Tensor | None = None) -> Tensor:
    """Uniform weights 1 / n_participants (sizes only fixes n); zero for non-participants."""
    mask = _participants(sizes.shape[0], participating, sizes.device)
    return mask.to(torch.float64) / mask.sum().to(torch.float64)


def _check_finite_rows(tables: Tensor, clients: Tensor | None, chunk: int = 256) -> None:
    """Raise UserError naming the first client whose table holds NaN or Inf (chunked scan)."""
    for start in range(0, tables.shape[0], chunk):
        part = tables[start:start + chunk].reshape(min(chunk, tables.shape[0] - start), -1)
        bad = ~finite_rows(part)
        if bool(bad.any()):
            row = start + int(torch.nonzero(bad)[0, 0])
            client = row if clients is None else int(clients[row])
            raise UserError(f"the upload of client {client} contains NaN or Inf")


def fedavg_aggregate(uploads: Tensor, weights: Tensor) -> Tensor:
    """Weighted average sum_v w_v Q_v of (n, m, d) uploads: one (m, d) global table.

    Clients with zero weight are skipped, so their rows may hold anything.
    """
    n = uploads.shape[0]
    if weights.shape != (n,):
        raise ValueError(f"weights have shape {tuple(weights.shape)}, expected ({n},)")
    used = torch.nonzero(weights != 0).flatten()
    rows = uploads if used.numel() == n else uploads.index_select(0, used)
    w = weights if used.numel() == n else weights.index_select(0, used)
    _check_finite_rows(rows, None if used.numel() == n else used)
    flat = rows.reshape(rows.shape[0], -1)
    return (w.to(uploads.dtype) @ flat).reshape(uploads.shape[1:])


# ---------------------------------------------------------------- distances


def _block(tables: Tensor, clients: Tensor | None, start: int, stop: int,
           dtype: torch.dtype) -> Tensor:
    """Item rows start:stop of the chosen clients' tables, flattened, as a new ``dtype`` copy."""
    part = tables[:, start:stop] if clients is None else tables[clients, start:stop]
    return part.reshape(part.shape[0], -1).to(dtype, copy=True)


def gram_block(device: torch.device) -> int:
    """The client block of :func:`_add_symmetric_gram` on ``device``: ``GRAM_BLOCK`` on
    the CPU, ``GRAM_BLOCK_DEVICE`` elsewhere."""
    return GRAM_BLOCK if torch.device(device).type == "cpu" else GRAM_BLOCK_DEVICE


def _add_symmetric_gram(gram: Tensor, x: Tensor, block: int = GRAM_BLOCK) -> None:
    """gram += x x^T (float64 accumulator), multiplying only the blocks on and above the
    diagonal; each block below gets its mirror's transpose (half the multiply-adds)."""
    n = x.shape[0]
    for a in range(0, n, block):
        xa = x[a:a + block]
        for b in range(a, n, block):
            part = (xa @ x[b:b + block].T).to(torch.float64)
            gram[a:a + block, b:b + block] += part
            if b != a:
                gram[b:b + block, a:a + block] += part.T


def cross_sq_distances(tables: Tensor, rows_a: Tensor | None, rows_b: Tensor | None,
                       chunk_rows: int = DEFAULT_CHUNK_ROWS,
                       precision: str = "float32") -> Tensor:
    """||Q_a - Q_b||_F^2 for a in rows_a, b in rows_b (None = all clients): float64 (na, nb).

    Built from the Gram matrix of the flattened tables, accumulated in float64
    over chunks of chunk_rows item rows (peak extra memory about
    (na + nb) * chunk_rows * d values). Each chunk is centred on the mean of
    the b tables first (distances do not change; cancellation does); with all
    clients on both sides only the Gram blocks on and above the diagonal are
    multiplied, and the squared norms are the Gram matrix's diagonal (the
    same products, so no second pass over the tables). Tiny negatives from
    rounding are clamped to 0 and a client's distance to itself is exactly 0.

    ``precision`` is the dtype of each chunk's products. "float32" (the
    default; the uploads are float32 already; float64 tables are still
    multiplied in float64) multiplies in float32 and adds
    the chunks and the squared norms in float64; a pair whose distance came
    out below CANCELLATION x (||Q_a||^2 + ||Q_b||^2) (centred), where float32
    products could have cancelled most of their bits, is recomputed in
    float64 from the difference of the two tables. "float64" does every
    product in float64 (the slow path the tests compare with: on ML-100K
    uploads the two differ by at most 1e-7 relative in the distances and
    2e-11 in the similarity weights; BENCHMARKS.md "Speed").
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be float32 or float64, got {precision!r}")
    work = torch.float32 if precision == "float32" and tables.dtype != torch.float64 else (
        torch.float64)
    n, m = tables.shape[0], tables.shape[1]
    na = n if rows_a is None else rows_a.numel()
    nb = n if rows_b is None else rows_b.numel()
    same = rows_a is None and rows_b is None
    dev = tables.device
    gram = torch.zeros((na, nb), dtype=torch.float64, device=dev)
    sq_a = torch.zeros(na, dtype=torch.float64, device=dev)
    sq_b = torch.zeros(nb, dtype=torch.float64, device=dev)
    for start in range(0, m, chunk_rows):
        stop = min(start + chunk_rows, m)
        xb = _block(tables, rows_b, start, stop, work)
        centre = xb.mean(dim=0, keepdim=True)
        xb -= centre
        xa = xb if same else _block(tables, rows_a, start, stop, work).sub_(centre)
        if same:
            _add_symmetric_gram(gram, xb, gram_block(dev))
        else:
            gram += (xa @ xb.T).to(torch.float64)
            sq_b += xb.to(torch.float64).square().sum(dim=1)
            sq_a += xa.to(torch.float64).square().sum(dim=1)
    if same:
        gram = (gram + gram.T).mul_(0.5)  # diagonal blocks: exactly symmetric despite GEMM
        sq_a = sq_b = gram.diagonal().clone()  # the norms from the same products
    dist = (sq_a[:, None] + sq_b[None, :] - 2.0 * gram).clamp_(min=0.0)
    _zero_self_distances(dist, rows_a, rows_b, n)
    if work == torch.float32 and not _recompute_cancelled(dist, tables, rows_a, rows_b, sq_a,
                                                           sq_b, n):
        return cross_sq_distances(tables, rows_a, rows_b, chunk_rows, "float64")
    return dist


def _recompute_cancelled(dist: Tensor, tables: Tensor, rows_a: Tensor | None,
                         rows_b: Tensor | None, sq_a: Tensor, sq_b: Tensor, n: int) -> bool:
    """Recompute in float64, from the tables' difference, every pair of two different
    clients whose float32-product distance is small against their centred norms.

    Returns False, recomputing nothing, when there are more such pairs than
    clients (then the whole matrix is cheaper in float64)."""
    dev = dist.device
    ids_a = torch.arange(n, device=dev) if rows_a is None else rows_a.to(dev)
    ids_b = torch.arange(n, device=dev) if rows_b is None else rows_b.to(dev)
    risky = dist < CANCELLATION * (sq_a[:, None] + sq_b[None, :])
    risky &= ids_a[:, None] != ids_b[None, :]
    if int(risky.sum()) > n:
        return False
    for i, j in torch.nonzero(risky).tolist():
        diff = tables[ids_a[i]].to(torch.float64) - tables[ids_b[j]].to(torch.float64)
        dist[i, j] = diff.square().sum()
    return True


def _zero_self_distances(dist: Tensor, rows_a: Tensor | None, rows_b: Tensor | None,
                         n: int) -> None:
    """Set dist[i, j] = 0 exactly wherever rows_a[i] and rows_b[j] are the same client."""
    dev = dist.device
    ids_a = torch.arange(n, device=dev) if rows_a is None else rows_a.to(dev)
    ids_b = torch.arange(n, device=dev) if rows_b is None else rows_b.to(dev)
    pos_in_b = torch.full((n,), -1, dtype=torch.int64, device=dev)
    pos_in_b[ids_b] = torch.arange(ids_b.numel(), device=dev)
    cols = pos_in_b[ids_a]
    hit = torch.nonzero(cols >= 0).flatten()
    dist[hit, cols[hit]] = 0.0


def pairwise_sq_distances(tables: Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                          precision: str = "float32") -> Tensor:
    """All pairwise ||Q_u - Q_v||_F^2 of (n, m, d) tables: float64 (n, n), zero diagonal
    (``precision`` as in :func:`cross_sq_distances`)."""
    return cross_sq_distances(tables, None, None, chunk_rows, precision)


# ---------------------------------------------------------------- simplex and eq. 13


def project_to_simplex(c: Tensor, mask: Tensor | None = None) -> Tensor:
    """Euclidean projection of each row of c (k, n) onto the probability simplex.

    Exact sort-based algorithm (Duchi et al. 2008, Fig. 1), vectorised over
    rows: w = max(c - theta, 0) with theta chosen so the kept entries sum to 1.
    mask ((n,) or (k, n) bool) restricts each row's simplex to the True
    entries; the others get weight exactly 0. Returns float64 (k, n).
    """
    c = c.to(torch.float64)
    if c.dim() != 2:
        raise ValueError(f"expected a (k, n) matrix, got shape {tuple(c.shape)}")
    k, n = c.shape
    valid = torch.ones_like(c, dtype=torch.bool) if mask is None else (
        mask.to(device=c.device, dtype=torch.bool).expand(k, n))
    if not bool(valid.any(dim=1).all()):
        raise ValueError("every row needs at least one entry on its simplex")
    if not bool(torch.isfinite(c[valid]).all()):
        raise ValueError("cannot project NaN or Inf onto the simplex")
    lowest = torch.tensor(-math.inf, dtype=torch.float64, device=c.device)
    # the projection is shift-invariant per row; shifting the top entry to 0 keeps
    # c - theta free of cancellation when every entry is large in magnitude
    c = c - torch.where(valid, c, lowest).amax(dim=1, keepdim=True)
    u, _ = torch.sort(torch.where(valid, c, lowest), dim=1, descending=True)
    u_valid = torch.isfinite(u)  # the masked-out entries sorted to the end as -inf
    cssv = torch.cumsum(torch.where(u_valid, u, torch.zeros_like(u)), dim=1) - 1.0
    ranks = torch.arange(1, n + 1, dtype=torch.float64, device=c.device)
    support = u_valid & (u - cssv / ranks > 0)
    count = torch.where(support, ranks, torch.zeros_like(ranks)).amax(dim=1)
    count = count.clamp(min=1.0)  # defensive: the largest entry is always kept
    theta = cssv.gather(1, (count.to(torch.int64) - 1)[:, None]) / count[:, None]
    w = (c - theta).clamp_(min=0.0)
    return torch.where(valid, w, torch.zeros_like(w))


def _check_alpha(alpha: float) -> None:
    if not (math.isfinite(alpha) and alpha >= 0.0):
        raise UserError(f"similarity coefficient alpha must be finite and >= 0, got {alpha}")


def similarity_targets(p: Tensor, sq_dists: Tensor, alpha: float) -> Tensor:
    """c_uv = (p_v + alpha s_uv) / (1 + alpha), s_uv = 1 / (1 + ||Q_u - Q_v||^2) (eq. 13)."""
    _check_alpha(alpha)
    s = 1.0 / (1.0 + sq_dists.to(torch.float64))
    return (p.to(torch.float64)[None, :] + alpha * s) / (1.0 + alpha)


def similarity_weights(p: Tensor, sq_dists: Tensor, alpha: float,
                       participating: Tensor | None = None) -> Tensor:
    """Closed-form minimiser of equation 13 on the simplex, for k clients at once.

    p: (n,) backbone weights (FedAvg's |D_v| / sum |D|); sq_dists: (k, n)
    squared Frobenius distances from each of the k clients to the n uploads;
    participating: optional (n,) mask of the uploads that may get weight.
    Returns float64 (k, n): rows on the simplex, zero off the participants.
    """
    return project_to_simplex(similarity_targets(p, sq_dists, alpha), participating)


# ----------------------------------------- the authors' code's similarity (docs/design.md 2a)

# similarities above this are set to 1 in the FedEM code
PCA_SIM_CAP = 0.9


def pca_codes(tables: Tensor, chunk_clients: int = DEFAULT_CHUNK_CLIENTS) -> Tensor:
    """Each client's item table (n, m, d) reduced to one dimension by PCA: (n, m) float64.

    Row u is the projection of u's centred table Q_u - mean_i(Q_u) on its first
    principal direction (the top eigenvector of the d x d scatter matrix), as
    ``sklearn.decomposition.PCA(n_components=1).fit_transform`` in the FedEM
    code (docs/design.md 2a). A principal direction has no sign; the distance between
    two clients' codes depends on it, so it is fixed as sklearn's ``svd_flip``
    fixes it (u-based): the entry of largest magnitude of each code is positive.
    """
    n, m, d = tables.shape
    out = torch.empty((n, m), dtype=torch.float64, device=tables.device)
    for start in range(0, n, chunk_clients):
        x = tables[start: start + chunk_clients].to(torch.float64)
        x = x - x.mean(dim=1, keepdim=True)
        _, vecs = torch.linalg.eigh(torch.bmm(x.transpose(1, 2), x))  # ascending eigenvalues
        codes = torch.bmm(x, vecs[:, :, -1:]).squeeze(2)
        top = codes.abs().argmax(dim=1, keepdim=True)
        out[start: start + chunk_clients] = codes * torch.sign(codes.gather(1, top))
    return out


def pca_similarity(codes_a: Tensor, codes_b: Tensor) -> Tensor:
    """s_uv = 1 / (1 + ||c_u - c_v||_2) between 1-D PCA codes, values above 0.9 set to 1
    (the FedEM code, docs/design.md 2a): (k, m) x (n, m) -> (k, n) float64."""
    dist = torch.cdist(codes_a.to(torch.float64), codes_b.to(torch.float64))
    s = 1.0 / (1.0 + dist)
    return torch.where(s > PCA_SIM_CAP, torch.ones_like(s), s)


def pca_similarity_weights(p: Tensor, sim: Tensor, alpha: float,
                           participating: Tensor | None = None) -> Tensor:
    """The FedEM code's QP on the simplex: minimise x'x - 2 (p + alpha s_u)'x, i.e. the
    projection of p + alpha s_u (not divided by 1 + alpha as in equation 13; docs/design.md 2a).

    p: (n,); sim: (k, n) from :func:`pca_similarity`. Returns float64 (k, n).
    """
    _check_alpha(alpha)
    return project_to_simplex(p.to(torch.float64)[None, :] + alpha * sim.to(torch.float64),
                              participating)


# ---------------------------------------------------------------- similarity aggregation


def _anchor_clients(n: int, part: Tensor, anchored: Tensor | None) -> Tensor:
    """Boolean (n,): clients whose similarity weights come from equation 13."""
    if anchored is None:
        return part
    anchored = anchored.to(device=part.device, dtype=torch.bool)
    if anchored.shape != (n,):
        raise ValueError(f"anchored mask has shape {tuple(anchored.shape)}, expected ({n},)")
    return part | anchored


def _fallback_weights(p_part: Tensor) -> Tensor:
    """Weights for clients the server cannot compare: p over participants, renormalised."""
    total = p_part.sum()
    if not total > 0:
        return torch.full_like(p_part, 1.0 / p_part.numel())
    return p_part / total


def similarity_aggregate(uploads: Tensor, p: Tensor, alpha: float,
                         participating: Tensor | None = None,
                         chunk_clients: int = DEFAULT_CHUNK_CLIENTS,
                         anchored: Tensor | None = None,
                         chunk_rows: int = DEFAULT_CHUNK_ROWS,
                         precision: str = "float32", similarity: str = "eq13") -> Tensor:
    """Personalised global tables Q_g[u] = sum_v w_uv Q_v for every client u (eq. 13).

    uploads: (n, m, d) tables the server holds; row v is client v's upload
    this round when v participates. Only participants' tables are aggregated
    (w_uv = 0 for non-participating v). p: (n,) backbone weights, normally
    fedavg_weights(sizes, participating).

    Which weights a client u receives:
    - participant: equation 13 with s_uv from its own upload uploads[u];
    - non-participant with anchored[u] True: equation 13 with uploads[u]
      taken as u's last upload kept by the server (the caller must have left
      it there);
    - any other non-participant (nothing to compare with): p restricted to
      the participants and renormalised, i.e. FedAvg weights.

    Works in chunks of chunk_clients receivers; peak extra memory is the
    (n_anchor, n_participants) float64 distance matrix plus one chunk's weights,
    besides the (n, m, d) output. ``precision``: of the distances' products (see
    :func:`cross_sq_distances`). ``similarity``: ``eq13`` (the paper) or ``pca`` (the
    FedEM code, docs/design.md 2a: :func:`pca_similarity` and :func:`pca_similarity_weights`).
    Returns a new tensor in uploads' dtype.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r}")
    _check_alpha(alpha)
    if chunk_clients < 1:
        raise ValueError(f"chunk_clients must be positive, got {chunk_clients}")
    n = uploads.shape[0]
    if p.shape != (n,):
        raise ValueError(f"p has shape {tuple(p.shape)}, expected ({n},)")
    part = _participants(n, participating, uploads.device)
    anchors = _anchor_clients(n, part, anchored)
    everyone = bool(part.all())
    part_ids = None if everyone else torch.nonzero(part).flatten()
    anchor_ids = None if bool(anchors.all()) else torch.nonzero(anchors).flatten()
    sources = uploads if everyone else uploads.index_select(0, part_ids)
    _check_finite_rows(sources, part_ids)
    if similarity == "pca":
        codes = pca_codes(uploads)
        dists = pca_similarity(codes if anchor_ids is None else codes.index_select(0, anchor_ids),
                               codes if part_ids is None else codes.index_select(0, part_ids))
    else:
        dists = cross_sq_distances(uploads, anchor_ids, part_ids, chunk_rows, precision)
    p_part = p.to(torch.float64).to(uploads.device)
    p_part = p_part if everyone else p_part.index_select(0, part_ids)
    dist_row = torch.full((n,), -1, dtype=torch.int64, device=uploads.device)
    dist_row[anchors] = torch.arange(int(anchors.sum()), device=uploads.device)
    fallback = _fallback_weights(p_part)
    flat_src = sources.reshape(sources.shape[0], -1)
    out = torch.empty(uploads.shape, dtype=uploads.dtype, device=uploads.device)
    flat_out = out.view(n, -1)
    rule = pca_similarity_weights if similarity == "pca" else similarity_weights
    chunks = [(start, min(start + chunk_clients, n)) for start in range(0, n, chunk_clients)]
    if uploads.dtype in NARROW:  # every receiver's weights (float32, beside the distances),
        # then one pass over the source's column blocks, each widened once
        w = torch.cat([_chunk_weights(p_part, dists, dist_row[a:b], fallback, alpha, rule)
                       .to(torch.float32) for a, b in chunks])
        _narrow_mm(w, flat_src, flat_out)
        return out
    for a, b in chunks:
        w = _chunk_weights(p_part, dists, dist_row[a:b], fallback, alpha, rule)
        torch.mm(w.to(uploads.dtype), flat_src, out=flat_out[a:b])
    return out


#: storage dtypes (``train.state_dtype``) whose tables are multiplied in float32
NARROW = (torch.bfloat16, torch.float16)


def _narrow_mm(w: Tensor, src: Tensor, out: Tensor, block_bytes: int = 1 << 26) -> None:
    """out = w @ src for narrow-dtype ``src`` and ``out``, multiplied and summed in
    float32: with the CPU's bfloat16 matrix units where it has them
    (:func:`_split_bf16_mm`), else :func:`_widened_mm`. Each output entry is rounded
    once, on storing."""
    if src.dtype == torch.bfloat16 and src.device.type == "cpu" and cpu_bf16_matmul():
        _split_bf16_mm(w, src, out, block_bytes)
    else:
        _widened_mm(w, src, out, block_bytes)


def _widened_mm(w: Tensor, src: Tensor, out: Tensor, block_bytes: int = 1 << 26) -> None:
    """out = w @ src in float32, a block of columns (about ``block_bytes`` of float32
    source) widened at a time: a float32 copy of the whole (n, m d) source is what a narrow
    state dtype is there to avoid. The reference :func:`_split_bf16_mm` is tested against."""
    w32 = w.to(torch.float32)
    for cols in _column_blocks(src, block_bytes):
        out[:, cols] = torch.mm(w32, src[:, cols].to(torch.float32))


def _split_bf16_mm(w: Tensor, src: Tensor, out: Tensor, block_bytes: int = 1 << 26) -> None:
    """out = w @ src for bfloat16 ``src`` and ``out`` on the CPU, as bfloat16 matrix
    products (oneDNN: AMX or AVX-512 BF16; on LastFM-2K's FedEM mix about 3x the float32
    product, docs/speed.md).

    The weights are split into two bfloat16 parts, w_hi = bf16(w) and
    w_lo = bf16(w - w_hi), which carry w to about 2^-17 relative, and each column block
    is the single product [w_hi  w_lo] @ [src; src]: every product of two bfloat16
    numbers is exact in float32, the sum over 2n terms is accumulated in float32, and
    the entry is rounded to bfloat16 once, on storing. So the result is
    :func:`_widened_mm`'s up to the order of the float32 sum and w's residual (on
    random LastFM-2K-size tables 7e-5 of entries land one bfloat16 step apart)."""
    w32 = w.to(torch.float32)
    hi = w32.to(torch.bfloat16)
    lo = (w32 - hi.to(torch.float32)).to(torch.bfloat16)
    both = torch.cat([hi, lo], dim=1)
    for cols in _column_blocks(src, block_bytes):
        block = src[:, cols]
        out[:, cols] = torch.mm(both, torch.cat([block, block], dim=0))


def _column_blocks(src: Tensor, block_bytes: int) -> Iterator[slice]:
    """The column slices of the (n, c) ``src`` a narrow mix takes at a time: about
    ``block_bytes`` of float32 source each."""
    step = max(1, block_bytes // (4 * max(1, src.shape[0])))
    for c in range(0, src.shape[1], step):
        yield slice(c, c + step)


@functools.cache
def cpu_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (the Linux flags
    ``amx_bf16`` or ``avx512_bf16``), read once. Elsewhere (no such flag, no
    ``/proc/cpuinfo``) bfloat16 products are emulated and slower than float32, so
    :func:`_narrow_mm` widens instead."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        flags = []
    return bool({"amx_bf16", "avx512_bf16"} & set(flags)) and torch.backends.mkldnn.is_available()


def _chunk_weights(p_part: Tensor, dists: Tensor, dist_rows: Tensor, fallback: Tensor,
                   alpha: float, weights: Callable[[Tensor, Tensor, float], Tensor]
                   = similarity_weights) -> Tensor:
    """Weights (c, n_participants) for one chunk of receivers; dist_rows -1 = no anchor.

    ``dists``: squared distances (``similarity_weights``) or the ``pca`` similarities."""
    has = dist_rows >= 0
    w = fallback.expand(dist_rows.numel(), -1).clone()
    if bool(has.any()):
        w[has] = weights(p_part, dists[dist_rows[has]], alpha)
    return w
