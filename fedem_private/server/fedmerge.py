"""FedMerge on the server: K global item tables merged per client (docs/design.md section 12).

The server keeps K global item tables G_1..G_K and per-client logits a_u with
weights w_u = softmax(a_u). It sends client u one table,

    Q_sent[u] = sum_k w_uk G_k                                         (12.1)

and after the round fits the tables and the participants' logits to their
uploads U_u by minimising

    F(G, a) = sum_{u in round} || U_u - sum_k w_uk G_k ||_F^2          (12.2)

warm-started from the last round. Each of the fit's ``steps`` is one
gradient step on each block, with the step scaled to the block's curvature
so that ``lr`` has the same meaning on every dataset:

1. tables, for fixed weights (F is quadratic in G with Hessian
   2 (W^T W) (x) I, W the (n_t, K) weights of the participants):

       G <- G + lr * W^T R / lambda_max(W^T W),   R_u = U_u - sum_k w_uk G_k

   i.e. the step lr / L with L = 2 lambda_max(W^T W), the gradient's
   Lipschitz constant: F never increases for 0 < lr <= 1. With K = 1 (w = 1,
   W^T W = n_t) and lr = 1 the first step lands on G = (1/n_t) sum_u U_u, the
   exact minimiser, and every later step stays there: K = 1 is uniform
   averaging;
2. logits, for fixed tables (per client a quadratic in w_u with Gram matrix
   H = [<G_k, G_j>]; gradient of (12.2) w.r.t. w_u: g_u = -2 [<G_k, R_u>]_k,
   and through the softmax, d/da_u = w_u * (g_u - <w_u, g_u>)):

       a_u <- a_u - s_u * lr * d/da_u / L_a,   L_a = 2 lambda_max(P H P)

   with P = I - 11^T / K (the curvature of (12.2) along the simplex); s_u
   starts at 1 and is halved (at most :data:`MAX_HALVINGS` times) while the
   step would raise client u's term, so F never increases. Only the
   participants' logits move.

The simplex constraint holds by construction (softmax). :func:`fit` works
from the sufficient statistics of (12.2) (two float64 GEMM passes over the
uploads per step, chunks of :data:`CHUNK` clients);
:func:`fedem_private.reference.fedmerge.fit_reference` is the plain loop over
clients and tables (autograd for the logits' gradient) the tests compare it with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedem_private import rng

CHUNK = 128  # clients per float64 pass over the uploads
#: the fit keeps a float64 copy of the uploads (instead of converting a chunk per pass)
#: when it takes at most this many bytes
CACHE_BYTES = 1 << 30
MAX_HALVINGS = 30  # backtracking of a client's logit step
PERTURBATION = 0.1  # std of the initial perturbations, relative to the initial table's std


@dataclass(frozen=True)
class FitConfig:
    """The server fit of (12.2): ``steps`` gradient steps per round at rate ``lr`` (in 1/L)."""

    steps: int = 10
    lr: float = 1.0


@dataclass
class FitResult:
    """The fitted tables (K, m, d) and logits (n_t, K), and F along the fit.

    ``objective`` holds F at the start, after each step's table update and
    after each step's logit update: 2 * steps + 1 values, never increasing.
    """

    tables: Tensor
    logits: Tensor
    objective: list[float]


def initial_tables(q0: Tensor, k: int, seed: int) -> Tensor:
    """G_1..G_K (K, m, d) float64: the initial table plus K centred small perturbations.

    Perturbation k is Gaussian with std :data:`PERTURBATION` times the std of
    ``q0``, drawn from the run's counter-based generator keyed by
    (seed, FEDMERGE_INIT, 0, k); the K perturbations are centred (their mean
    is subtracted), so uniform weights send exactly ``q0`` (12.1) and K = 1
    starts from ``q0`` itself. The perturbations are drawn on the CPU and moved to
    ``q0``'s device, where the tables live.
    """
    base = q0.double()
    scale = PERTURBATION * float(base.std()) if base.numel() > 1 else 0.0
    noise = torch.empty((k, *q0.shape), dtype=torch.float64)
    for j in range(k):
        noise[j].normal_(0.0, 1.0, generator=rng.generator(seed, rng.Stream.FEDMERGE_INIT, 0, j))
    noise = noise.to(q0.device)
    noise -= noise.mean(dim=0, keepdim=True)
    return base.unsqueeze(0) + scale * noise


def merged_tables(logits: Tensor, tables: Tensor) -> Tensor:
    """Q_sent (12.1) for every row of ``logits`` (c, K): (c, m, d) float64."""
    w = torch.softmax(logits.double(), dim=1)
    return torch.einsum("uk,kmd->umd", w, tables.double())


def weight_entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of each client's weights softmax(a_u): (n,); log K is uniform, 0 one table."""
    logp = torch.log_softmax(logits.double(), dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def _lambda_max(sym: Tensor) -> float:
    """The largest eigenvalue of a small symmetric matrix (float64)."""
    return float(torch.linalg.eigvalsh(sym)[-1])


def _centred(h: Tensor) -> Tensor:
    """P H P with P = I - 11^T / K."""
    k = h.shape[0]
    p = torch.eye(k, dtype=torch.float64, device=h.device) - 1.0 / k
    return p @ h @ p


def _uploads_sq(uploads: Tensor, chunk: int) -> float:
    """sum_u ||U_u||_F^2 in float64, one pass over chunks of clients."""
    n = uploads.shape[0]
    return float(sum(float(uploads[a:a + chunk].double().square().sum())
                     for a in range(0, n, chunk)))


def _weighted_uploads(uploads: Tensor, w: Tensor, chunk: int) -> Tensor:
    """W^T U (K, m d) in float64: sum_u w_uk U_u, one pass over chunks of clients."""
    n = uploads.shape[0]
    out = torch.zeros((w.shape[1], uploads[0].numel()), dtype=torch.float64, device=w.device)
    for a in range(0, n, chunk):
        out.addmm_(w[a:a + chunk].T, uploads[a:a + chunk].reshape(-1, out.shape[1]).double())
    return out


def _upload_products(uploads: Tensor, g: Tensor, chunk: int) -> Tensor:
    """C = [<U_u, G_k>] (n_t, K) in float64, one pass over chunks of clients."""
    n = uploads.shape[0]
    out = torch.empty((n, g.shape[0]), dtype=torch.float64, device=g.device)
    for a in range(0, n, chunk):
        torch.mm(uploads[a:a + chunk].reshape(-1, g.shape[1]).double(), g.T, out=out[a:a + chunk])
    return out


def _objective(sq: float, w: Tensor, c: Tensor, h: Tensor) -> float:
    """(12.2) from its sufficient statistics: sum ||U||^2 - 2 sum w (.) C + sum_u w_u^T H w_u."""
    return sq - 2.0 * float((w * c).sum()) + float(((w @ h) * w).sum())


def logit_step(logits: Tensor, gr: Tensor, gram: Tensor, rate: float) -> Tensor:
    """One gradient step on every client's logits (n_t, K) for fixed tables, with backtracking.

    ``gr`` (n_t, K) holds <G_k, R_u> and ``gram`` (K, K) H = [<G_k, G_j>]. The
    gradient of client u's term of (12.2) w.r.t. w_u is g_u = -2 gr_u, and
    w.r.t. a_u it is w_u * (g_u - <w_u, g_u>); the step is ``rate`` times that,
    halved for a client (at most :data:`MAX_HALVINGS` times, after which it
    keeps its logits) while its term would rise. The change of the term is
    exact for a quadratic: 2 delta . (H w_u - b_u) + delta^T H delta with
    delta the change of w_u and H w_u - b_u = -gr_u.
    """
    w = torch.softmax(logits, dim=1)
    grad_w = -2.0 * gr
    grad_a = w * (grad_w - (w * grad_w).sum(dim=1, keepdim=True))
    step = torch.full((logits.shape[0], 1), rate, dtype=torch.float64, device=logits.device)
    pending = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
    out = logits.clone()
    for _ in range(MAX_HALVINGS + 1):
        trial = logits - step * grad_a
        delta = torch.softmax(trial, dim=1) - w
        change = -2.0 * (delta * gr).sum(dim=1) + ((delta @ gram) * delta).sum(dim=1)
        ok = pending & (change <= 0)
        out[ok] = trial[ok]
        pending &= ~ok
        if not bool(pending.any()):
            break
        step[pending] *= 0.5
    return out


def fit(uploads: Tensor, tables: Tensor, logits: Tensor, cfg: FitConfig,
        chunk: int = CHUNK) -> FitResult:
    """Fit G and a to the uploads (n_t, m, d) by ``cfg.steps`` steps on (12.2), batched.

    ``tables`` (K, m, d) and ``logits`` (n_t, K) are the warm start (not
    modified). Steps as in the module docstring, computed from the
    sufficient statistics of (12.2), so each step reads the uploads twice
    (float64 GEMMs over chunks of ``chunk`` clients):

    - W^T R = W^T U - (W^T W) G, from the pass W^T U (K, m d);
    - C = [<U_u, G_k>] (n_t, K), one pass after the tables move, gives
      [<G_k, R_u>] = C - W H with H = G G^T (K, K), and the objective
      sum ||U_u||^2 - 2 sum_uk w_uk C_uk + sum_u w_u^T H w_u.
    """
    k = tables.shape[0]
    shape = tables.shape
    g = tables.double().reshape(k, -1).clone()
    a = logits.double().clone()
    if uploads.numel() * 8 <= CACHE_BYTES:
        uploads = uploads.double()  # chunks of it are then views, not conversions
    sq = _uploads_sq(uploads, chunk)
    c = _upload_products(uploads, g, chunk)
    h = g @ g.T
    trace: list[float] = []
    for _ in range(cfg.steps):
        w = torch.softmax(a, dim=1)
        trace.append(_objective(sq, w, c, h))
        wtw = w.T @ w
        lam = _lambda_max(wtw)
        if lam > 0:
            wtr = _weighted_uploads(uploads, w, chunk) - wtw @ g
            g = g + (cfg.lr / lam) * wtr
            c = _upload_products(uploads, g, chunk)
            h = g @ g.T
        trace.append(_objective(sq, w, c, h))
        la = 2.0 * _lambda_max(_centred(h)) if k > 1 else 0.0
        if la > 0:
            a = logit_step(a, c - w @ h, h, cfg.lr / la)
    w = torch.softmax(a, dim=1)
    trace.append(_objective(sq, w, c, h))
    return FitResult(g.reshape(shape), a, trace)
