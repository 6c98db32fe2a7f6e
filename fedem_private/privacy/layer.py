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
        self.auto_clip: dict[str, Any] | None = None
        self._reset_round()

    def set_auto_clip(self, clip: float, clients: np.ndarray) -> None:
        """Adopt the ``--clip auto`` estimate C and charge its warm-up (before round 1).

        ``clients`` all released one warm-up value (see :mod:`.clip_auto`): each
        is charged eps_w in round 0 of a fresh ledger, and a total epsilon is
        re-calibrated for the rounds to ``epsilon - eps_w``.
        """
        from dataclasses import replace

        from .clip_auto import RULE, WARMUP_ROUND, warmup_params

        cfg = self.cfg
        eps_w = cfg.warmup_epsilon
        assert eps_w is not None and self.ledger.log == []
        total = cfg.epsilon
        rounds_eps = total - eps_w if total is not None and math.isfinite(total) else total
        derived = replace(cfg, clip=float(clip), clip_auto=False, clip_auto_epsilon=None,
                          epsilon=rounds_eps)
        self.params = resolve_params(derived, max(int(self.rounds), 1))
        self.ledger = PrivacyLedger(self.params)
        self.ledger.record_round(WARMUP_ROUND, clients, params=warmup_params(
            self.params, eps_w, cfg.clip_auto_min, cfg.clip_auto_max))
        self.auto_clip = {"clip": float(clip), "epsilon": eps_w,
                          "range": [cfg.clip_auto_min, cfg.clip_auto_max],
                          "rounds_epsilon_target": rounds_eps, "rule": RULE}

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
        """The ledger's summary (worst client), JSON-ready; plus the --clip auto estimate."""
        out = self.ledger.summary()
        if self.auto_clip is not None:
            out["clip_auto"] = {k: (None if isinstance(v, float) and math.isinf(v) else v)
                                for k, v in self.auto_clip.items()}
        return out

    def ledger_dict(self) -> dict[str, Any]:
        """The whole ledger, JSON-ready (written as privacy_ledger.json)."""
        return self.ledger.to_dict()
