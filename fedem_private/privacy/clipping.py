"""Per-client norm clipping of whole update tables, in float64.

clip_p(x, C) = x * min(1, C / ||x||_p), with the norm over a client's whole
table (all m x d entries), applied against the limit L = C * (1 - 2**-30).
Rows whose float64 norm (``torch.linalg.vector_norm``, rescaled where it
would over- or underflow) is <= L are returned bit for bit; rows above L are
scaled to L * (1 - 2**-30) and then re-checked (and shrunk again if needed)
so that their float64 norm is <= L. The 2**-30 margin between L and C exceeds
the worst-case relative error of float64 summation (n * 2**-53) for tables of
up to 2**23 entries, so the exact real-valued norm of every returned row,
clipped or not, is <= C. (Comparing the computed norm with C itself would
let a row whose rounded norm is C, but whose exact norm is above it, through
unclipped.) Clipping is idempotent: a returned row's float64 norm is <= L,
so clipping it again leaves it unchanged.

Norms are computed without overflow or underflow: rows whose plain norm is
not finite or is tiny are re-measured after dividing by their largest
absolute entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedem_private.errors import Diverged, UserError
from fedem_private.finite import finite_rows

SAFETY = 1.0 - 2.0**-30
_TINY = 1e-100  # below this a float64 L2 norm may have lost precision to underflow
_MAX_SHRINK = 8


@dataclass(frozen=True, eq=False)
class ClipStats:
    """What clipping did to k clients' updates.

    ``norms`` are the pre-clip per-client norms (float64, shape (k,), inf if
    the norm exceeds the float64 range); ``fraction_clipped`` is the share of
    clients that were scaled (norm > bound * (1 - 2**-30), see the module
    docstring); ``mean_norm`` is the mean of ``norms`` (NaN for
    k = 0).
    """

    norm: str
    bound: float
    norms: torch.Tensor
    fraction_clipped: float
    mean_norm: float


def _ord(norm: str) -> int:
    return 1 if norm == "l1" else 2


def _row_norms(flat: torch.Tensor, norm: str) -> torch.Tensor:
    """||row||_p for each row of a (k, n) float64 tensor, robust to over/underflow."""
    p = _ord(norm)
    norms = torch.linalg.vector_norm(flat, p, dim=1)
    amax = flat.abs().amax(dim=1) if flat.shape[1] else torch.zeros_like(norms)
    shaky = ~torch.isfinite(norms)
    if p == 2:
        shaky |= (norms < _TINY) & (amax > 0)
    if bool(shaky.any()):
        idx = shaky.nonzero().squeeze(1)
        scale = amax[idx]
        norms[idx] = torch.linalg.vector_norm(flat[idx] / scale[:, None], p, dim=1) * scale
    return norms


def _scale_rows_to(rows: torch.Tensor, bound: float, norm: str) -> torch.Tensor:
    """Rows (all with norm > bound) scaled so their float64 norm is <= bound (here the
    limit L of the module docstring)."""
    p = _ord(norm)
    amax = rows.abs().amax(dim=1)
    unit = rows / amax[:, None]  # entries in [-1, 1], norm in [1, n]: no over/underflow
    unit_norms = torch.linalg.vector_norm(unit, p, dim=1)
    out = unit * (bound * SAFETY / unit_norms)[:, None]
    for _ in range(_MAX_SHRINK):
        after = _row_norms(out, norm)  # the same test clip_rows uses: clipping is idempotent
        bad = after > bound
        if not bool(bad.any()):
            return out
        out[bad] *= (bound * SAFETY / after[bad])[:, None]
    raise RuntimeError(f"clipping to {bound} did not converge")  # pragma: no cover


def _check_bound(bound: float) -> float:
    b = float(bound)
    if not 0 < b < math.inf:
        raise UserError(f"clip bound must be finite and > 0, got {bound}")
    return b


def clip_rows(delta: torch.Tensor, bound: float, norm: str) -> tuple[torch.Tensor, ClipStats]:
    """Clip each client's table (first axis = client) to ``norm`` ("l1" or "l2") <= bound.

    Implements x * min(1, C / ||x||_p) with the safety margin described in the
    module docstring: every returned row's exact norm is <= bound. Returns a
    new float64 tensor of the same shape (the input is not modified) and the
    ClipStats. Raises UserError on NaN or Inf entries
    (the norm, hence any bound, is undefined) and on a bound that is not finite
    and positive.
    """
    if norm not in ("l1", "l2"):
        raise ValueError(f"unknown norm {norm!r}")
    c = _check_bound(bound)
    if delta.dim() < 1:
        raise ValueError("delta needs a leading client axis")
    x = delta.detach().to(torch.float64, copy=True)
    k = x.shape[0]
    flat = x.reshape(k, math.prod(x.shape[1:]))
    finite = finite_rows(flat)
    if not bool(finite.all()):
        rows = (~finite).nonzero().squeeze(1).tolist()
        raise Diverged(f"non-finite value (NaN or Inf) in the update of row(s) {rows[:10]}")
    norms = _row_norms(flat, norm)
    limit = c * SAFETY
    over = norms > limit
    if bool(over.any()):
        idx = over.nonzero().squeeze(1)
        flat[idx] = _scale_rows_to(flat[idx], limit, norm)
    stats = ClipStats(
        norm=norm,
        bound=c,
        norms=norms,
        fraction_clipped=float(over.double().mean()) if k else 0.0,
        mean_norm=float(norms.mean()) if k else math.nan,
    )
    return x, stats


def clip_l1(delta: torch.Tensor, bound: float) -> tuple[torch.Tensor, ClipStats]:
    """L1 clipping per client: x * min(1, C / ||x||_1); see :func:`clip_rows`."""
    return clip_rows(delta, bound, "l1")


def clip_l2(delta: torch.Tensor, bound: float) -> tuple[torch.Tensor, ClipStats]:
    """L2 clipping per client: x * min(1, C / ||x||_2); see :func:`clip_rows`."""
    return clip_rows(delta, bound, "l2")
