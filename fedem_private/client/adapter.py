"""The merge adapter's tensors (equation 9) and the merge itself (equation 10): the records
and arithmetic that the merges (:mod:`fedem_private.client.merges`) and the client's merge
step (:mod:`fedem_private.client.merging`) share.

It imports nothing else of the client room, so both may import it (docs/design.md
section 1: no import circles): the merges' classes stay light at import and load this
module when a merge runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MergeState:
    """Adapters of k clients: weights[j] (k, fan_in, fan_out), biases[j] (k, fan_out)."""

    weights: tuple[Tensor, ...]
    biases: tuple[Tensor, ...]

    @property
    def n_clients(self) -> int:
        """Number of clients k held."""
        return int(self.weights[0].shape[0])


def adapter_shapes(dim: int, layers: tuple[int, ...]) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of each linear layer: input 2 * dim, then the given widths."""
    fans = (2 * dim, *layers)
    return list(zip(fans[:-1], fans[1:], strict=True))


def take_clients(state: MergeState, rows: Tensor) -> MergeState:
    """A copy of the adapters of the clients at rows (int64 indices)."""
    return MergeState(tuple(w.index_select(0, rows) for w in state.weights),
                      tuple(b.index_select(0, rows) for b in state.biases))


def put_clients(state: MergeState, rows: Tensor, part: MergeState) -> MergeState:
    """A new state equal to state with the adapters at rows replaced by part's."""
    return MergeState(
        tuple(w.index_copy(0, rows, pw) for w, pw in zip(state.weights, part.weights, strict=True)),
        tuple(b.index_copy(0, rows, pb) for b, pb in zip(state.biases, part.biases, strict=True)),
    )


def adapter_input(q_local: Tensor, q_global: Tensor) -> Tensor:
    """Q_cat = [Q_g - Q_l, Q_l] along the last axis: (..., 2d) (paper, section 4)."""
    return torch.cat((q_global - q_local, q_local), dim=-1)


def adapter_forward(weights: tuple[Tensor, ...], biases: tuple[Tensor, ...], x: Tensor,
                    inplace: bool = False) -> Tensor:
    """Equation 9 for k clients at once: x (k, r, 2d) -> rho (k, r) in [0, 1].

    ``inplace`` applies the activations in place (same values; only without autograd).
    """
    h = x
    last = len(weights) - 1
    for j, (w, b) in enumerate(zip(weights, biases, strict=True)):
        h = torch.baddbmm(b.unsqueeze(1), h, w)
        if inplace:
            h = h.sigmoid_() if j == last else h.relu_()
        else:
            h = torch.sigmoid(h) if j == last else torch.relu(h)
    return h.squeeze(-1)


def require_state(strategy: str, state: MergeState | None, k: int) -> MergeState:
    """``state``, checked to hold the adapters of k clients (merge ``strategy`` needs them)."""
    if state is None:
        raise ValueError(f"strategy {strategy!r} needs adapters; call init_merge_state")
    if state.n_clients != k:
        raise ValueError(f"adapters for {state.n_clients} clients, tables for {k}")
    return state


def adapter_rho(strategy: str, state: MergeState | None, q_local: Tensor,
                q_global: Tensor) -> Tensor:
    """Equation 9 on every item of the k clients' tables, detached: rho (k, m)."""
    adapters = require_state(strategy, state, q_local.shape[0])
    with torch.no_grad():
        return adapter_forward(adapters.weights, adapters.biases,
                               adapter_input(q_local, q_global), inplace=True)


def mean_rho(rho: Tensor, k: int) -> Tensor:
    """Each of k clients' mean merge weight (k,) float64, from rho 0-d, (k, 1) or (k, m)."""
    return (rho.double().expand(k) if rho.dim() == 0
            else rho.reshape(k, -1).mean(dim=1, dtype=torch.float64))


def took_all(q_global: Tensor) -> Tensor:
    """rho = 1 for each of the k clients of q_global (k, m, d): (k,) float64."""
    return torch.ones(q_global.shape[0], dtype=torch.float64, device=q_global.device)


def merge_tables(q_local: Tensor, q_global: Tensor, rho: Tensor) -> Tensor:
    """Equation 10, Q_l + rho (.) (Q_g - Q_l), exact at the ends: rho = 1 gives Q_g, 0 gives Q_l.

    rho broadcasts against (k, m): 0-d, (k, 1) or (k, m). torch.lerp evaluates
    Q_g - (Q_g - Q_l)(1 - rho) for rho >= 0.5, hence the exact endpoints.
    """
    weight = rho.unsqueeze(-1) if rho.dim() > 0 else rho
    return torch.lerp(q_local, q_global, weight.to(q_local.dtype))
