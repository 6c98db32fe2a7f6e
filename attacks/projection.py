"""The ``projection`` attack: positives and negatives move in opposite directions.

For a dot-product backbone (score sigmoid(p_u . q_i), BCE loss; FedEM paper,
equations 2 and 12) the gradient of client u's loss with respect to item row
q_i is (sigmoid(p_u . q_i) - y_i) p_u: every positive row (y = 1) steps along
+p_u and every sampled negative (y = 0) along -p_u; untouched rows do not
move. The delta D = upload - sent (m x d) is therefore close to rank one,
D ~ a v^T, with a_i > 0 on positives, a_i < 0 on negatives, a_i = 0 elsewhere,
and v the direction of p_u (Adam's per-coordinate scaling turns it into a
fixed diagonal rescaling of p_u, still one shared direction). p_u drifts
during the E local epochs, so this is an approximation, not an identity.

Direction: v is the top right singular vector of D restricted to the active
rows A = {i : ||D_i||_2 > atol}, computed as the top eigenvector of the
d x d Gram matrix D_A^T D_A (batched ``torch.linalg.eigh`` over clients).

Scores: s_i = D_i . v for i in A, 0 outside A, then divided by the client's
root mean square of s over A so that scores are comparable across clients
(pooled AUC and thresholds). The sign of v is arbitrary; it is fixed by:

Orientation rule. Let L = {i in A : s_i != 0 and |s_i| >= median_{j in A} |s_j|}
(the large projections), n_plus = #{i in L : s_i > 0}, n_minus = #{i in L : s_i < 0}.
With ``public.num_negatives >= 2`` each positive is trained with at least two
sampled negatives, so positives are the minority of moved rows: the sign is
chosen so that n_plus < n_minus. With ``num_negatives <= 1`` the sign is
chosen so that n_plus > n_minus: right for ``num_negatives == 0`` (every moved
row is a positive); for ``num_negatives == 1`` the counts are nearly equal and
the orientation is close to a coin flip per client (the projection magnitude
still ranks moved rows above unmoved ones). A tie n_plus == n_minus is broken by the centred third
moment of s over A: the minority side is the long tail, so the + side is
the minority iff that moment is positive (exact zero: sign kept as computed).
The rule can pick the wrong side for a client whose positives outnumber the
distinct items its sampler could draw as negatives (e.g. a user who rated
most of a small catalogue).

Backbones that are not a dot product. PFedRec's score w_u . q_i + b_u is one, and so is
FedRAP's w_u . (P_u[i] + C[i]) + b_u in the uploaded common row C[i] (GPFedRec's, an MLP, is not)
(w_u plays p_u's part). FedNCF's is not: its score is an MLP over
[p_u, q_i], so the gradient with respect to q_i is (sigmoid - y_i) J_i with
J_i the MLP's input Jacobian at item i, which changes with i wherever a ReLU
switches. The attack runs unchanged there: it still takes the top singular
direction of the delta and orients it by the minority rule, which is right
only insofar as the J_i share one direction. Nothing in the method promises
that, so on such a backbone its scores are a heuristic, the attack's record
says so (``assumption``), and its AUC is an empirical finding, not a property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from .base import DEFAULT_CHUNK, blank_nonparticipants, delta_chunks
from .observations import Observation, PublicKnowledge
from .registry import Attack, Capabilities


def assumption_note(public: PublicKnowledge) -> str | None:
    """A one-line caveat when the recorded backbone breaks the rank-one assumption, else None.

    Whether the backbone scores by <vector, q_i> (+ a per-client constant), the case derived
    above, is a public fact the recording states (``extra["dot_product"]``, from the
    backbone's class); a recording without it is treated as not known.
    """
    dot = public.extra.get("dot_product")
    if dot:
        return None
    if dot is None:
        return (f"the recording does not say whether backbone {public.backbone!r} scores by a "
                "dot product: the projection attack's rank-one assumption is not known to hold")
    return (f"backbone {public.backbone!r} does not score by a dot product: the projection "
            "attack's rank-one assumption does not hold, its scores are a heuristic")


def _top_direction(delta: torch.Tensor) -> torch.Tensor:
    """(c, d) top right singular vector of each (m, d) matrix, via the (c, d, d) Gram."""
    gram = delta.mT @ delta
    _, vecs = torch.linalg.eigh(gram)
    return vecs[..., -1]


def _orientation(s: torch.Tensor, active: torch.Tensor, positives_minority: bool
                 ) -> torch.Tensor:
    """(c,) +1/-1 per client implementing the orientation rule of the module docstring."""
    mag = s.abs()
    med = torch.nanmedian(mag.masked_fill(~active, float("nan")), dim=1).values
    large = active & (mag > 0) & (mag >= med[:, None])
    n_plus = (large & (s > 0)).sum(dim=1)
    n_minus = (large & (s < 0)).sum(dim=1)
    count = active.sum(dim=1).clamp(min=1)
    mean = (s * active).sum(dim=1) / count
    third = (((s - mean[:, None]) ** 3) * active).sum(dim=1)
    plus_is_minority = torch.where(n_plus != n_minus, n_plus < n_minus, third > 0)
    tie_zero = (n_plus == n_minus) & (third == 0)
    keep = (plus_is_minority == positives_minority) | tie_zero
    return torch.where(keep, 1.0, -1.0).to(s.dtype)


def _standardise(s: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Divide each client's scores by their root mean square over the active rows."""
    count = active.sum(dim=1).clamp(min=1)
    rms = torch.sqrt((s.square() * active).sum(dim=1) / count)
    return s / torch.where(rms > 0, rms, torch.ones_like(rms))[:, None]


def projection(obs: Observation, public: PublicKnowledge, *, atol: float = 0.0,
               chunk: int = DEFAULT_CHUNK, device: str = "cpu") -> np.ndarray:
    """(k, m) oriented, standardised projection of each delta row on the client's top direction.

    ``atol``: rows whose L2 change is at most ``atol`` are inactive (score 0)
    and do not shape the direction. NaN rows for non-participants. ``device``
    (``cpu`` or ``cuda``): where each chunk's deltas (float64, (chunk, m, d)) and
    their linear algebra live; the scores come back to the CPU.
    """
    if atol < 0:
        raise ValueError("atol must be >= 0")
    positives_minority = public.num_negatives >= 2
    scores = np.empty((obs.n_clients, obs.n_items), dtype=np.float64)
    for sl, delta_np in delta_chunks(obs, chunk):
        delta = torch.from_numpy(delta_np).to(device)
        active = torch.linalg.vector_norm(delta, dim=2) > atol
        delta = delta * active[..., None]
        v = _top_direction(delta)
        s = (delta @ v[..., None]).squeeze(-1)
        s = s * _orientation(s, active, positives_minority)[:, None]
        scores[sl] = _standardise(s, active).cpu().numpy()
    return blank_nonparticipants(scores, obs)


@dataclass(frozen=True)
class ProjectionOptions:
    """``atol``: rows changed by at most this are inactive; ``chunk``: clients per block."""

    atol: float = 0.0
    chunk: int = DEFAULT_CHUNK


class ProjectionAttack(Attack):
    """Registration of :func:`projection`: exact in its rank-one model for dot-product
    backbones, a heuristic elsewhere (:func:`assumption_note`)."""

    options = ProjectionOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        kind="item", observes=("uploads", "released-aggregate"), device=True,
        exact_for="dot-product backbones")
    function = staticmethod(projection)

    @classmethod
    def assumption(cls, public: PublicKnowledge, shadow: object = None,
                   options: object = None) -> str | None:
        """:func:`assumption_note` (the shadow plays no part)."""
        del shadow
        return assumption_note(public)
