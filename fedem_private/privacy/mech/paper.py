"""``paper``: the FedEM paper's recipe, a heuristic (docs/design.md section 5).

Gradient clip Z inside local training, Laplace(lambda) on every entry of the
upload. Neighbouring relation: none claimed; its eps_u = 2 p_u eta Z / lambda
bounds one SGD step, not E epochs of Adam, so the sensitivity of the upload under
replace-one is not bounded. Trust model: local.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.privacy.mech.base import NO_RELATION, PAPER_OPTIONS, SHARED_OPTIONS, Mechanism
from fedem_private.privacy.registry import register

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.privacy.config import PrivacyConfig
    from fedem_private.privacy.mechanisms import RoundPrivacyStats
    from fedem_private.privacy.params import MechanismParams


@register
class Paper(Mechanism):
    """local + Lap(lambda) on every entry, item gradients clipped at Z in training."""

    name = "paper"
    description = (
        "FedEM paper's recipe: gradient clip Z in training, Laplace(lambda) on the upload; "
        "its eps = 2 p_u eta Z / lambda is the paper's HEURISTIC, not a DP guarantee"
    )
    neighbouring = ("none: the FedEM paper's heuristic eps bounds one SGD step, not a "
                    "client's E epochs; not a DP guarantee")
    trust_model = "local: gradient clipping in training, Laplace noise on the upload"
    amplification = "none"
    relation = NO_RELATION
    fixed_noise = True
    paper_heuristic = True
    noise_kind = "laplace"
    no_budget_reason = "sets its noise by paper_lambda"
    options = SHARED_OPTIONS + PAPER_OPTIONS

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        """Laplace scale lambda and clip Z as given; eps_round = inf (no guarantee)."""
        from fedem_private.privacy.params import _paper_params

        return _paper_params(cfg)

    @classmethod
    def claimed_gap(cls, cfg: PrivacyConfig) -> tuple[int, float] | None:
        """No clip of the delta: the claim would be 2 x the gradient clip, in L1."""
        return 1, 2.0 * cfg.paper_clip

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """:func:`~fedem_private.privacy.mechanisms.release_paper`."""
        from fedem_private.privacy.mechanisms import release_paper

        return release_paper(params, sent, local, seed=seed, round_=round_, clients=clients,
                             touched=touched)

    @classmethod
    def local_grad_clip(cls, cfg: PrivacyConfig) -> float | None:
        """Z, the item-gradient clip of local training."""
        return cfg.paper_clip

    @classmethod
    def heuristic_epsilon(cls, cfg: PrivacyConfig, sizes: np.ndarray, lr: float,
                          clients: np.ndarray) -> np.ndarray | None:
        """The paper's per-client eps_u = 2 p_u eta Z / lambda of the round's clients,
        p_u their share of the round's data (a printed label, not a guarantee)."""
        import numpy as np

        from fedem_private.privacy.params import paper_heuristic_epsilon

        ids = np.asarray(clients, dtype=np.int64)
        total = float(sizes[ids].sum())
        weights = sizes[ids] / total if total > 0 else np.zeros(ids.size)
        return paper_heuristic_epsilon(weights, lr, cfg.paper_clip, cfg.paper_lambda)
