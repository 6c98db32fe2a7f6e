"""Adam over batched per-client parameters with per-client step counts.

Every parameter tensor has the client axis first, shape (k, ...). A lock-step
training step touches only the clients that have a batch in that step: their
moments, parameters and step counters advance; every other client is left
bitwise untouched. For each client the update is exactly torch.optim.Adam's
(Kingma and Ba, "Adam: a method for stochastic optimization", ICLR 2015,
Algorithm 1, in the formulation of torch's single-tensor implementation), so a
plain per-client loop with one torch.optim.Adam per client is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedem_private.errors import UserError


@dataclass(frozen=True)
class AdamConfig:
    """Hyper-parameters of Adam (torch.optim.Adam's defaults except lr)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not (self.lr > 0.0 and self.lr != float("inf")):
            raise UserError(f"Adam learning rate must be a positive number, got {self.lr}")
        b1, b2 = self.betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise UserError(f"Adam betas must lie in [0, 1), got {self.betas}")
        if not self.eps > 0.0:
            raise UserError(f"Adam eps must be positive, got {self.eps}")


def _per_client(values: Tensor, like: Tensor) -> Tensor:
    """Reshape a (a,) vector so it broadcasts over a (a, ...) tensor, in like's dtype."""
    return values.to(like.dtype).reshape((-1,) + (1,) * (like.dim() - 1))


class MaskedAdam:
    """Adam for tensors of shape (k, ...) where each of the k clients steps on its own.

    The parameters are updated in place. Moments and step counts start at
    zero (a fresh optimiser per round, as torch.optim.Adam would be).
    """

    def __init__(self, params: Sequence[Tensor], config: AdamConfig) -> None:
        if not params:
            raise ValueError("MaskedAdam needs at least one parameter tensor")
        k = params[0].shape[0]
        if any(p.dim() == 0 or p.shape[0] != k for p in params):
            raise ValueError("all parameters must share the leading client axis")
        self.params = list(params)
        self.config = config
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = torch.zeros(k, dtype=torch.int64, device=params[0].device)

    @property
    def n_clients(self) -> int:
        """Number of clients k on the leading axis."""
        return int(self.steps.shape[0])

    def step(self, grads: Sequence[Tensor], rows: Tensor | None = None) -> None:
        """One Adam step for the clients in rows (all clients when rows is None).

        grads[j] has shape (len(rows), ...) and is aligned with rows: grads[j][i]
        is the gradient of client rows[i]'s parameter j. rows must not repeat.
        """
        if len(grads) != len(self.params):
            raise ValueError("one gradient per parameter tensor is required")
        if rows is None:
            self._step_all(grads)
        elif rows.numel() > 0:
            self._step_rows(grads, rows.to(torch.int64))

    def _bias_terms(self, steps: Tensor) -> tuple[Tensor, Tensor]:
        """Step size lr / (1 - b1^t) and sqrt(1 - b2^t), per client, in float64."""
        b1, b2 = self.config.betas
        t = steps.to(torch.float64)
        step_size = self.config.lr / (1.0 - torch.pow(b1, t))
        bc2_sqrt = torch.sqrt(1.0 - torch.pow(b2, t))
        return step_size, bc2_sqrt

    def _update(self, p: Tensor, m: Tensor, v: Tensor, g: Tensor,
                step_size: Tensor, bc2_sqrt: Tensor) -> None:
        """Adam moment and parameter update in place on (a, ...) tensors."""
        b1, b2 = self.config.betas
        m.lerp_(g, 1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        denom = (v.sqrt() / _per_client(bc2_sqrt, v)).add_(self.config.eps)
        p.sub_(_per_client(step_size, p) * m / denom)

    def _step_all(self, grads: Sequence[Tensor]) -> None:
        self.steps += 1
        step_size, bc2_sqrt = self._bias_terms(self.steps)
        for p, m, v, g in zip(self.params, self.exp_avg, self.exp_avg_sq, grads, strict=True):
            self._update(p, m, v, g, step_size, bc2_sqrt)

    def _step_rows(self, grads: Sequence[Tensor], rows: Tensor) -> None:
        """``rows`` on any device: checked where they are (CPU rows need no wait for the
        parameters' device), then moved to the parameters'."""
        if rows.numel() == self.n_clients and bool(
            (rows == torch.arange(self.n_clients, device=rows.device)).all()
        ):
            self._step_all(grads)
            return
        rows = rows.to(self.steps.device)
        self.steps[rows] += 1
        step_size, bc2_sqrt = self._bias_terms(self.steps[rows])
        for p, m, v, g in zip(self.params, self.exp_avg, self.exp_avg_sq, grads, strict=True):
            p_r, m_r, v_r = p[rows], m[rows], v[rows]
            self._update(p_r, m_r, v_r, g, step_size, bc2_sqrt)
            p[rows], m[rows], v[rows] = p_r, m_r, v_r
