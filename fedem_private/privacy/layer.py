"""The privacy layer as the simulation sees it: release uploads, keep the ledger.

One object per run. Per round: ``begin_round(t)``, then ``release`` for each
chunk of participating clients, then ``end_round(clients)``, which charges
exactly those clients in the ledger and returns the round's log fields.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .config import PrivacyConfig
from .ledger import PrivacyLedger
from .mechanisms import release
from .params import MechanismParams, paper_heuristic_epsilon, resolve_params


class PrivacyLayer:
    """Applies the configured mechanism to every upload and accounts for it.

    ``seed`` keys the noise (with round and client id); ``sizes`` are the
    clients' training-set sizes |D_u| and ``lr`` the learning rate eta, used
    only for the paper mode's heuristic eps.
    """

    def __init__(self, cfg: PrivacyConfig, *, rounds: int, n_clients: int, lr: float,
                 sizes: np.ndarray, seed: int = 0) -> None:
        self.cfg = cfg
        self.rounds = rounds
        self.round = 0
        self.seed = int(seed)
        self.lr = float(lr)
        self.sizes = np.asarray(sizes, dtype=np.float64)
        self.params: MechanismParams = resolve_params(cfg, max(int(rounds), 1))
        self.ledger = PrivacyLedger(self.params)
        self._reset_round()

    def _reset_round(self) -> None:
        self._n = 0
        self._n_clipped = 0.0
        self._norm_sum = 0.0
        self._noised = 0.0

    @property
    def perturbs(self) -> bool:
        """Whether an upload can differ from the client's trained table."""
        return self.cfg.mode != "none"

    @property
    def local_grad_clip(self) -> float | None:
        """Gradient clip Z for local training (mode paper only)."""
        return self.cfg.paper_clip if self.cfg.mode == "paper" else None

    def begin_round(self, round_: int) -> None:
        self.round = round_
        self._reset_round()

    def release(self, sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                touched: torch.Tensor | None) -> torch.Tensor:
        """The uploads of one chunk of clients (see :mod:`mechanisms`)."""
        out, stats = release(self.params, sent, local, seed=self.seed, round_=self.round,
                             clients=clients, touched=touched)
        k = stats.n_clients
        self._n += k
        self._noised += stats.noised_fraction * k
        if stats.fraction_clipped is not None and stats.mean_pre_clip_norm is not None and k:
            self._n_clipped += stats.fraction_clipped * k
            self._norm_sum += stats.mean_pre_clip_norm * k
        return out

    def end_round(self, clients: np.ndarray) -> dict[str, float]:
        """Charge ``clients`` for this round; the round's privacy log fields (floats)."""
        heuristic = None
        if self.cfg.mode == "paper":
            ids = np.asarray(clients, dtype=np.int64)
            total = float(self.sizes[ids].sum())
            weights = self.sizes[ids] / total if total > 0 else np.zeros(ids.size)
            heuristic = paper_heuristic_epsilon(weights, self.lr, self.cfg.paper_clip,
                                                self.cfg.paper_lambda)
        entry = self.ledger.record_round(self.round, clients, heuristic_epsilon=heuristic)
        out: dict[str, float] = {"noise_scale": float(self.params.noise_scale)}
        if self.params.clip is not None:
            n = max(self._n, 1)
            out["clip"] = float(self.params.clip)
            out["frac_clipped"] = self._n_clipped / n
            out["mean_pre_clip_norm"] = self._norm_sum / n if self._n else math.nan
        if self.perturbs:
            reported = entry["epsilon"]["reported"]
            out["eps_spent"] = math.inf if reported is None else float(reported)
        if heuristic is not None:
            out["paper_heuristic_eps_max"] = float(heuristic.max()) if heuristic.size else 0.0
        return out

    def summary(self) -> dict[str, Any]:
        """The ledger's summary (worst client), JSON-ready."""
        return self.ledger.summary()

    def ledger_dict(self) -> dict[str, Any]:
        """The whole ledger, JSON-ready (written as privacy_ledger.json)."""
        return self.ledger.to_dict()
