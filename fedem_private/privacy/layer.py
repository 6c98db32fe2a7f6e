"""The privacy layer as the simulation sees it: release uploads, keep the ledger.

One object per run. Per round: ``begin_round(t)``, then ``release`` for each
chunk of participating clients, then ``end_round(clients)``, which charges
exactly those clients in the ledger and returns the round's log fields.

Under a central mechanism (``central`` True: cdp-gaussian, docs/design.md section 5)
the layer also picks the round's participants (:meth:`participants`,
Poisson sampling), and instead of ``release`` takes each chunk's encoded
(sent, local) tables through :meth:`contribute` into a secure sum that no
one reads; :meth:`release_aggregate` then gives the ONE noisy aggregate of
the round, the only thing the server's aggregator receives.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .accounting import CentralBounds, RoundMechanism, compose, dpfedavg_bounds
from .central import SecureSum, SumPart, poisson_participants
from .config import PrivacyConfig
from .ledger import PrivacyLedger
from .mech.base import Mechanism
from .mechanisms import noise_std, release
from .params import MechanismParams, resolve_params

if TYPE_CHECKING:
    from fedem_private.models.base import Backbone, ClientParams


LDP_NSR = "noise std per entry / mean |clipped delta| on the entries of trained rows"
CDP_NSR = ("noise std per entry of the secure sum (z C) / mean |entry| of the participants' "
           "clipped sum on its non-zero entries")
DPSGD_NSR = ("noise std per entry of a local step's gradient sum (sigma C) / mean |entry| of a "
             "sampled positive's clipped gradient on its row")


def server_sizes(counts: np.ndarray, cfg: PrivacyConfig) -> np.ndarray:
    """The clients' data sizes as the server may use them, float64 (n,).

    docs/design.md section 5, "What the server may use": under a mechanism |D_u| is private
    data that none of them releases (under ldp-dpsgd neighbours differ in it by one,
    under the user-level modes arbitrarily), so unless it is declared public
    (``sizes = "public"``, which the printed relation then says) every client counts
    as 1 and FedAvg's |D_v| / sum |D| and equation 13's p_v become uniform over the
    aggregated uploads. With no mechanism the true sizes are used, as published.
    """
    counts = np.asarray(counts, dtype=np.float64)
    return counts.copy() if cfg.sizes_visible else np.ones_like(counts)


class PrivacyLayer:
    """Applies the configured mechanism to every upload and accounts for it.

    ``seed`` keys the noise (with round and client id); ``sizes`` are the
    clients' training-set sizes |D_u| and ``lr`` the learning rate eta, used
    only for the paper mode's heuristic eps.
    """

    def __init__(self, cfg: PrivacyConfig, *, rounds: int, n_clients: int, lr: float,
                 sizes: np.ndarray, seed: int = 0,
                 client_keys: np.ndarray | None = None) -> None:
        self.cfg = cfg
        self.rounds = rounds
        self.round = 0
        self.seed = int(seed)
        self.lr = float(lr)
        self.sizes = np.asarray(sizes, dtype=np.float64)
        self.params: MechanismParams = resolve_params(cfg, max(int(rounds), 1), int(n_clients))
        self.ledger = PrivacyLedger(self.params)
        self.auto_clip: dict[str, Any] | None = None
        self.n_clients = int(n_clients)
        # each client's identity (the stable key of its source id, Split.source_users): the
        # participation draws are keyed by it, so removing one user moves no other client
        self.client_keys = (np.arange(self.n_clients, dtype=np.int64) if client_keys is None
                            else np.asarray(client_keys, dtype=np.int64))
        if self.client_keys.shape != (self.n_clients,):
            raise ValueError(f"client_keys has shape {self.client_keys.shape}, expected "
                             f"({self.n_clients},)")
        self.rounds_released = 0
        self._nsr: list[float] = []  # noise-to-signal per round (modes with noise)
        # the server-side hook: a secure sum noised once (central mechanisms), else None
        self.secure: SecureSum | None = self.mechanism.server_sum(
            self.params, cfg, self.seed, self.expected_count)
        configure = getattr(self.secure, "configure", None)
        if configure is not None:  # a secure sum that calibrates itself (ddp-skellam)
            configure(rounds=max(int(rounds), 1))
        self._reset_round()

    @property
    def mechanism(self) -> type[Mechanism]:
        """The run's mechanism class (docs/design.md section 5): capabilities and hooks."""
        return self.cfg.mechanism

    @property
    def central(self) -> bool:
        """Whether the mechanism acts on the aggregate (cdp-gaussian), not on each upload."""
        return self.params.central

    @property
    def _own_sampler(self) -> Any:
        """A central mechanism's own participation sampler (dp-ftrl: ``participants(params,
        seed, round, client_keys)``, the indices of the round's clients), or None: Poisson
        sampling at q, whose amplification cdp-gaussian's observer view claims
        (:meth:`_observer_bounds`)."""
        return getattr(self.mechanism, "participants", None)

    @property
    def population(self) -> int:
        """N of the public divisor q N: ``--public-population``, else the run's users."""
        fixed = self.cfg.public_population
        return int(fixed) if fixed is not None else self.n_clients

    @property
    def expected_count(self) -> float:
        """q N, the public divisor of the central mean (cdp-gaussian; dp-ftrl's N / G);
        N without sampling. N = :attr:`population`, a constant both neighbouring worlds
        share when it is given (``--public-population``)."""
        q = self.params.sample_rate if self.params.sample_rate is not None else 1.0
        return q * self.population

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
        self.params = resolve_params(derived, max(int(self.rounds), 1), self.n_clients)
        self.ledger = PrivacyLedger(self.params)
        self.ledger.record_round(WARMUP_ROUND, clients, params=warmup_params(
            self.params, eps_w, cfg.clip_auto_min, cfg.clip_auto_max))
        self.auto_clip = {"clip": float(clip), "epsilon": eps_w,
                          "range": [cfg.clip_auto_min, cfg.clip_auto_max],
                          "rounds_epsilon_target": rounds_eps, "rule": RULE}

    @property
    def dpsgd(self) -> bool:
        """Whether local training itself is the mechanism (ldp-dpsgd): the loop trains through
        :meth:`train_local` and the upload is released as is."""
        return self.params.dpsgd

    def train_local(self, backbone: Backbone, start: ClientParams, clients: np.ndarray,
                    pos_indptr: np.ndarray, pos_items: np.ndarray, num_negatives: int
                    ) -> tuple[ClientParams, torch.Tensor]:
        """ldp-dpsgd: a chunk's local DP-SGD (:func:`.dpsgd.train_chunk`) in this round.

        Returns (trained parameters, touched (k, m) all True: every row moves)."""
        assert self.dpsgd, "train_local() is for ldp-dpsgd"
        new, stats = self.mechanism.train_chunk(self.params, backbone, start, clients,
                                                pos_indptr, pos_items, num_negatives,
                                                self.seed, self.round)
        self._dpsgd.merge(stats)
        k, m = start.items.shape[:2]
        return new, torch.ones((k, m), dtype=torch.bool, device=start.items.device)

    def train_adapter(self, backbone: Backbone, private: dict[str, torch.Tensor],
                      weights: tuple[torch.Tensor, ...], biases: tuple[torch.Tensor, ...],
                      q_local: torch.Tensor, q_global: torch.Tensor, clients: np.ndarray,
                      pos_indptr: np.ndarray, pos_items: np.ndarray, num_negatives: int
                      ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """ldp-dpsgd with merge em: the chunk's adapters trained by DP-SGD
        (:func:`.dpsgd.train_adapter_chunk`, ``dpsgd_adapter_steps`` steps, charged in
        every round by :meth:`end_round`)."""
        p = self.params
        assert self.dpsgd and p.dpsgd_adapter_steps, "train_adapter() is for ldp-dpsgd + em"
        w, b, stats = self.mechanism.train_adapter(p, backbone, private, weights, biases,
                                                   q_local, q_global, clients, pos_indptr,
                                                   pos_items, num_negatives, self.seed,
                                                   self.round)
        self._dpsgd_adapter.merge(stats)
        return w, b

    def _reset_round(self) -> None:
        from .dpsgd import DpsgdStats

        self._dpsgd = DpsgdStats()
        self._dpsgd_adapter = DpsgdStats()
        self._n = 0
        self._n_clipped = 0.0
        self._norm_sum = 0.0
        self._noised = 0.0
        self._signal_sum = 0.0
        self._signal_n = 0

    @property
    def perturbs(self) -> bool:
        """Whether an upload can differ from the client's trained table."""
        return self.mechanism.perturbs

    @property
    def centres_release(self) -> bool:
        """Whether an upload is released around a table the client started from (every local
        mode but ldp-dpsgd, whose upload is its DP-SGD-trained table as is): that centre must
        be public, what the server last sent the client (docs/design.md section 5)."""
        return self.perturbs and not self.dpsgd and not self.central

    @property
    def local_grad_clip(self) -> float | None:
        """Gradient clip Z for local training (mode paper only)."""
        return self.mechanism.local_grad_clip(self.cfg)

    def begin_round(self, round_: int) -> None:
        self.round = round_
        self._reset_round()
        if self.secure is not None:
            self.secure.begin_round(round_)

    def participants(self, round_: int) -> np.ndarray | None:
        """cdp-gaussian: the round's clients by Poisson sampling at q (see :mod:`.central`);
        a central mechanism with a sampler of its own (a class method ``participants``:
        dp-ftrl's cyclic cohorts, which its accounting assumes) decides them itself;
        None for the other modes (the loop picks the participants itself)."""
        if not self.central:
            return None
        sampler = self._own_sampler
        if sampler is not None:
            return sampler(self.params, self.seed, round_, self.client_keys)
        assert self.params.sample_rate is not None
        return poisson_participants(self.seed, round_, self.client_keys,
                                    self.params.sample_rate)

    def admit(self, clients: np.ndarray) -> np.ndarray:
        """The round's cohort less the clients that already uploaded ``--max-uploads`` k
        times (a local mechanism whose clients enforce their own budget; each declines
        once its k releases are spent). Whether a client declines depends only on its
        past participation, a function of the keyed public schedule, not of its data, so
        under replace-one a neighbour declines in the same rounds, and each client's eps
        composes over at most k releases (the ledger's count). ``clients`` unchanged
        without a cap."""
        k = int(self.cfg.max_uploads)
        if not k:
            return clients
        clients = np.asarray(clients)
        return clients[self.ledger.uploads(clients) < k]

    def contribute(self, sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                   rows: torch.Tensor | None = None,
                   items: tuple[np.ndarray, np.ndarray, int] | None = None) -> None:
        """cdp-gaussian: add one chunk's clipped deltas (encoded tables (k, ...)) to the
        round's secure sum; nothing is returned (no per-client value leaves). ``rows``
        (k, n) bool, where given, marks the only rows in which each upload differs from
        what it was sent: the sum is then formed from those rows alone (the same sum,
        :func:`~fedem_private.privacy.central.sparse_sum_part`). ``items`` (the clients'
        distinct training items in CSR, and the catalogue size) feeds private row
        selection where the mechanism has it (:attr:`selects_rows`)."""
        assert self.secure is not None, "contribute() is for central mechanisms"
        if np.asarray(clients).shape != (local.shape[0],):
            raise ValueError("clients must align with the tables' leading axis")
        keyed = getattr(self.secure, "add_keyed", None)
        if keyed is not None:  # per-client encoding keyed by the client's id (ddp-skellam)
            keyed(sent, local, clients)
        else:
            self.secure.add(sent, local, rows, items)

    def contribute_part(self, part: SumPart, clients: np.ndarray) -> None:
        """A central mechanism: add one chunk's share of the secure sum formed elsewhere (a
        shard of the round, :mod:`fedem_private.simulation.shards`) at :attr:`sum_clip`;
        parts added in the round's chunk order give the sum :meth:`contribute` would."""
        assert self.secure is not None, "contribute_part() is for central mechanisms"
        if np.asarray(clients).shape != (part.k,):
            raise ValueError("clients must align with the part's clients")
        self.secure.add_part(part)

    @property
    def selects_rows(self) -> bool:
        """Whether the secure sum selects the item rows it releases (``--select-rows``)."""
        return getattr(self.secure, "selection", None) is not None

    def selection_prior(self, scores: torch.Tensor) -> torch.Tensor:
        """Private row selection, at ranking: the two-stage recommender of docs/design.md
        section 19. Items whose rows were never selected (never trained by the server) rank
        below every selected item, among themselves by their running noisy counts (private
        popularity as the candidate generator, the personalised model re-ranking its top K).
        With ``privacy.select_blend`` beta > 0 a selected item i scores
        s_ui + beta log(1 + max(c_i, 0)) for its running noisy count c_i, popularity blended
        into the re-ranker. ``scores`` (k, m); unchanged before the first counts.
        Post-processing of released values only (the counts and the selection), so it
        spends no privacy."""
        selection = self.secure.selection if self.secure is not None else None  # type: ignore[attr-defined]
        if selection is None or selection.counts is None:
            return scores
        counts = selection.counts.to(scores.device)
        chosen = selection.ever.to(scores.device)
        if self.cfg.select_blend:
            scores = scores + self.cfg.select_blend * torch.log1p(
                counts.clamp(min=0.0)).to(scores.dtype)
        m = counts.shape[0]
        order = torch.argsort(torch.argsort(-counts, stable=True), stable=True)
        prior = 1.0 - order.to(scores.dtype) / m  # in (0, 1], larger for larger counts
        low = torch.where(chosen, scores, torch.full_like(scores, math.inf)).amin(
            dim=1, keepdim=True)
        low = torch.where(torch.isfinite(low), low, torch.zeros_like(low))
        return torch.where(chosen, scores, low - 2.0 + prior)

    def released_rows(self, n_rows: int) -> int:
        """Private row selection: how many of the n_rows encoded rows this round releases."""
        secure = self.secure
        assert secure is not None and self.selects_rows
        mask = secure.selection.row_mask(n_rows, secure.n_items, torch.device("cpu"))  # type: ignore[attr-defined]
        return int(mask.sum())

    @property
    def sum_clip(self) -> float:
        """A central mechanism: the clip C this round's contributions are clipped at (it
        moves between rounds under adaptive clipping)."""
        assert self.secure is not None, "sum_clip is for central mechanisms"
        return self.secure.clip

    def release_aggregate(self, base: torch.Tensor) -> torch.Tensor:
        """cdp-gaussian: the round's new encoded global, ``base`` (the encoded table every
        client was sent) + (sum of clipped deltas + N(0, z^2 C^2)) / (q n)."""
        assert self.secure is not None, "release_aggregate() is for central mechanisms"
        stats = self.secure.stats
        self._n, self._n_clipped, self._norm_sum = (stats.n_clients, stats.n_clipped,
                                                    stats.norm_sum)
        self._noised = 1.0 if self.params.noise_scale > 0 else 0.0
        out = self.secure.release(base)
        if self.selects_rows:  # the round's noisy counts, which choose the next rows
            self.secure.selection.take(self.release_counts())  # type: ignore[union-attr]
        # the log's noise-to-signal (CDP_NSR), read after the release: a diagnostic for the
        # run's reader, which nothing in the round uses
        self._signal_sum, self._signal_n = stats.signal_abs_sum, stats.signal_entries
        return out

    def release_counts(self) -> torch.Tensor:
        """Private row selection (``--select-rows``): the round's noisy item counts, released
        beside the aggregate (:meth:`~fedem_private.privacy.central.SecureSum.release_counts`;
        L2 sensitivity 1 under add/remove of one client)."""
        assert self.secure is not None and self.selects_rows
        return self.secure.release_counts()  # type: ignore[attr-defined]

    def release(self, sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                touched: torch.Tensor | None) -> torch.Tensor:
        """The uploads of one chunk of clients (see :mod:`mechanisms`); local modes only."""
        if self.central:
            raise RuntimeError("a central mechanism releases no upload: use contribute()")
        # each client's noise keyed by its identity, not its index (issue 77): removing
        # another user from the data moves no one's noise
        keys = self.client_keys[np.asarray(clients, dtype=np.int64)]
        out, stats = release(self.params, sent, local, seed=self.seed, round_=self.round,
                             clients=keys, touched=touched)
        k = stats.n_clients
        self._n += k
        self._noised += stats.noised_fraction * k
        if stats.fraction_clipped is not None and stats.mean_pre_clip_norm is not None and k:
            self._n_clipped += stats.fraction_clipped * k
            self._norm_sum += stats.mean_pre_clip_norm * k
        if stats.mean_abs_delta_trained is not None and k:
            self._signal_sum += stats.mean_abs_delta_trained * k
            self._signal_n += k
        return out

    def end_round(self, clients: np.ndarray) -> dict[str, float]:
        """Charge ``clients`` for this round; the round's privacy log fields (floats)."""
        heuristic = self.mechanism.heuristic_epsilon(self.cfg, self.sizes, self.lr, clients)
        entry = self.ledger.record_round(self.round, clients, heuristic_epsilon=heuristic)
        out: dict[str, float] = {"noise_scale": float(self.params.noise_scale)}
        if self.params.clip is not None:
            n = max(self._n, 1)
            out["clip"] = float(self.params.clip)
            if self.secure is not None and self.secure.adaptive is not None:
                # adaptive clipping: this round's clip, its noise, and the noisy unclipped
                # fraction that set the next round's clip
                out["clip"] = self.secure.round_clip
                out["noise_scale"] = self.secure.noise_multiplier * self.secure.round_clip
                est = self.secure.unclipped_estimate
                out["unclipped_estimate"] = math.nan if est is None else est
            out["frac_clipped"] = self._n_clipped / n
            out["mean_pre_clip_norm"] = self._norm_sum / n if self._n else math.nan
        if self.dpsgd:
            # per sampled positive over the round's local steps (docs/design.md section 5)
            ex = self._dpsgd
            out["frac_clipped"] = ex.clipped / ex.examples if ex.examples else math.nan
            out["mean_pre_clip_norm"] = ex.norm_sum / ex.examples if ex.examples else math.nan
            # noise std per entry of a step's sum / mean |entry| of a positive's clipped
            # gradient on its row
            self._signal_sum, self._signal_n = ex.signal_sum, ex.signal_entries
            ad = self._dpsgd_adapter
            if ad.examples:
                out["adapter_frac_clipped"] = ad.clipped / ad.examples
        per_entry = out["noise_scale"] if self.central else noise_std(self.params)
        if self._signal_n and per_entry > 0:
            # docs/design.md section 5: noise std per entry over the mean |entry| of what it
            # covers (LDP_NSR, DPSGD_NSR, CDP_NSR); >> 1 explains a flat curve
            signal = self._signal_sum / self._signal_n
            out["noise_to_signal"] = per_entry / signal if signal > 0 else math.inf
            self._nsr.append(out["noise_to_signal"])
        self.rounds_released += 1
        if self.perturbs:
            reported = entry["epsilon"]["reported"]
            # a mechanism accounted as one release over the rounds (dp-ftrl's tree) states
            # the eps of that release so far instead of the per-client composition
            whole = getattr(self.mechanism, "release_epsilon", None)
            own: dict[str, Any] | None = None
            if whole is not None:
                own = whole(self.params, self.round)
                reported = own["reported"]
            spent = getattr(self.secure, "epsilon_spent", None)
            if spent is not None:  # a secure sum that accounts its own rounds (ddp-skellam)
                reported = spent()
                own = {"reported": None if math.isinf(reported) else reported,
                       "rdp": None if math.isinf(reported) else reported}
            if own is not None:  # the ledger's log states the run's figure (issue 77)
                entry["epsilon_ledger"] = entry["epsilon"]
                entry["epsilon"] = dict(own)
            out["eps_spent"] = math.inf if reported is None else float(reported)
        if self.central:
            out["participants_expected"] = self.expected_count
            if self._own_sampler is None:  # Poisson: the amplified observer view too
                out["eps_spent_observer"] = self._observer_bounds().reported
        if heuristic is not None:
            out["paper_heuristic_eps_max"] = float(heuristic.max()) if heuristic.size else 0.0
        return out

    def _observer_bounds(self) -> CentralBounds:
        """DP-FedAvg's amplified eps over the rounds released so far (cdp-gaussian)."""
        p = self.params
        assert p.sample_rate is not None and p.noise_multiplier is not None
        return dpfedavg_bounds(p.sample_rate, p.noise_multiplier, self.rounds_released, p.delta)

    def _central_summary(self, out: dict[str, Any]) -> dict[str, Any]:
        """cdp-gaussian: both guarantees of docs/design.md section 5, and what each assumes.

        ``epsilon`` (what tables read) is the observer's, amplified by Poisson
        sampling; ``epsilon_aggregator`` is the per-client ledger's worst
        client, unamplified, over the rounds it actually took part in.
        """
        p = self.params
        assert p.noise_multiplier is not None
        rounds = self.rounds_released
        observer = self._observer_bounds().as_dict()
        every = (compose(RoundMechanism("gaussian", p.noise_multiplier), rounds, p.delta)
                 .as_dict() if p.noise_multiplier > 0 else {"reported": None})
        aggregator = out["epsilon"]
        neighbouring = self.cfg.threat_model()["neighbouring"]
        out.update({
            "epsilon": observer,
            "epsilon_view": "observer",
            "epsilon_aggregator": aggregator,
            "sample_rate": p.sample_rate,
            "expected_participants": self.expected_count,
            "adaptive_clip": None if not p.adaptive_clip else {
                "rule": ("Andrew et al. 2021, geometric: C <- C exp(-lr (b - quantile)), b the "
                         "noisy fraction of participants left unclipped"),
                "quantile": p.clip_quantile, "lr": p.clip_lr, "initial_clip": p.clip,
                "final_clip": self.secure.clip if self.secure is not None else None,
                "count_noise_std": p.count_noise,
                "sum_noise_multiplier": p.sum_noise_multiplier,
                "accounting": ("the sum (sensitivity C_t, noise z_sum C_t) and the centred count "
                               "(sensitivity 1/2, noise sigma_b) form one Gaussian mechanism of "
                               "multiplier z, z^-2 = z_sum^-2 + (2 sigma_b)^-2; the "
                               "guarantees below are for z"),
            },
            "row_selection": None if not p.select_rows else {
                "rule": ("each round the participants' indicators 1[D_u] / sqrt(|D_u|) join the "
                         "secure sum with noise z_c; the next round releases only the K item "
                         "rows with the largest running noisy counts (docs/design.md 18)"),
                "rows": p.select_rows, "share": self.cfg.select_share,
                "counts_noise_multiplier": p.select_noise_multiplier,
                "table_noise_multiplier": p.sum_noise_multiplier,
                "rows_ever_selected": (int(self.secure.selection.ever.sum())  # type: ignore[union-attr]
                                       if self.secure is not None
                                       and self.secure.selection.ever is not None  # type: ignore[union-attr]
                                       else 0),
                "ranking": ("by the model alone" if not self.cfg.select_prior
                            else "items never selected rank below the selected, by noisy count"
                            + (f"; the selected by score + {self.cfg.select_blend:g} "
                               "log(1 + noisy count)" if self.cfg.select_blend else "")),
                "accounting": ("the table (sensitivity C, noise z_s C) and the counts "
                               "(sensitivity 1, noise z_c) form one Gaussian mechanism of "
                               "multiplier z, z^-2 = z_s^-2 + z_c^-2; the guarantees below are "
                               "for z"),
            },
            "aggregation_weights": ("uniform: sum of clipped deltas over the expected count "
                                    "q n (FedAvg's data-size weights are not used: they would "
                                    "raise the sensitivity)"),
            "guarantees": {
                "observer": {
                    "against": "observers of the released global models, not told who took part",
                    "neighbouring": neighbouring,
                    "amplification": f"Poisson subsampling, q = {p.sample_rate:g}",
                    "rounds": rounds,
                    "accountant": "dp-accounting PLD (pessimistic) and RDP; reported = min",
                    "epsilon": observer,
                },
                "aggregator": {
                    "against": ("the aggregator under secure aggregation: sees only the noisy "
                                "sums, knows who took part"),
                    "neighbouring": neighbouring,
                    "amplification": "none",
                    "rounds": ("the rounds each client actually took part in (ledger); the "
                               "worst client's figure"),
                    "worst_client_rounds": out.get("worst_client_rounds"),
                    "epsilon": aggregator,
                    "epsilon_if_every_round": every,
                },
            },
        })
        audit = self.secure.canaries if self.secure is not None else None
        if audit is not None and audit.projections:
            rounds = audit.statistics()["aggregator"][2][audit.members]  # the inserted
            worst = int(rounds.max(initial=0))
            agg = (compose(RoundMechanism("gaussian", p.noise_multiplier), worst, p.delta)
                   .reported if p.noise_multiplier > 0 and worst else math.inf)
            obs = observer.get("reported")
            out["canary_audit"] = audit.report(p.delta, {
                "aggregator": None if math.isinf(agg) else agg,
                "observer": obs})
        return out

    def summary(self) -> dict[str, Any]:
        """The ledger's summary (worst client), JSON-ready; plus the --clip auto estimate.

        Under cdp-gaussian both guarantees, see :meth:`_central_summary`."""
        out = self.ledger.summary()
        out.update(self.cfg.threat_model())
        out["sizes"] = self.cfg.sizes
        if self.perturbs and not self.central:
            out["aggregation_weights"] = (
                "data sizes declared public: the aggregator may weight by |D_u|"
                if self.cfg.sizes_visible else
                "uniform over the aggregated uploads: data sizes are private (the server "
                "uses only released values)")
        if self.cfg.max_uploads:
            out["upload_cap"] = {
                "max_uploads": int(self.cfg.max_uploads),
                "note": ("each client uploads at most this many times and declines later "
                         "rounds; the budget is calibrated over min(rounds, cap) releases and "
                         "the cap reads only the client's past participation, not its data")}
        if self.central:
            # a central mechanism may state its own guarantees (dp-ftrl: one, no amplification)
            own = getattr(self.mechanism, "central_summary", None)
            out = own(self, out) if own is not None else self._central_summary(out)
        if self.dpsgd:
            p = self.params
            out["dpsgd"] = {
                "sample_rate": p.dpsgd_rate, "steps_per_round": p.dpsgd_steps,
                "adapter_steps_per_round": p.dpsgd_adapter_steps,
                "negatives_per_step": p.dpsgd_negatives, "lr": p.dpsgd_lr,
                "clip_per_positive": p.clip, "noise_std_per_entry": p.noise_scale,
                "worst_client_steps": ((out.get("worst_client_rounds") or 0)
                                       * (p.dpsgd_steps + (p.dpsgd_adapter_steps or 0))),
                "accounting": ("each local step is the Poisson-subsampled Gaussian mechanism "
                               "(rate q_e, multiplier sigma) under add/remove of one positive; "
                               "a client's rounds x steps composed with dp-accounting's PLD "
                               "and RDP, reported = min"),
            }
        if self._nsr:
            out["noise_to_signal"] = {"mean_over_rounds": float(np.mean(self._nsr)),
                                      "last_round": self._nsr[-1],
                                      "definition": (DPSGD_NSR if self.dpsgd else
                                                     CDP_NSR if self.central else LDP_NSR)}
        if self.auto_clip is not None:
            out["clip_auto"] = {k: (None if isinstance(v, float) and math.isinf(v) else v)
                                for k, v in self.auto_clip.items()}
        # issue 77: the guarantee per adversary, computed from the figures above, and what
        # the simulated server holds; the figures no guarantee covers are named
        out["adversaries"] = self.mechanism.adversaries(out)
        out["simulated_server_knows"] = self.mechanism.server_knows
        private_free = [k for k in ("noise_to_signal",) if k in out]
        if (out.get("ddp_skellam") or {}).get("wrapped_entries_total") is not None:
            private_free.append("ddp_skellam.wrapped_entries_total")
        if private_free:
            out["not_private"] = {
                "fields": private_free,
                "note": ("diagnostics the simulator computes from the true clipped values "
                         "(not released by the mechanism, not covered by its guarantee); "
                         "read them as the experimenter, never as the server")}
        return out

    def ledger_dict(self) -> dict[str, Any]:
        """The whole ledger, JSON-ready (written as privacy_ledger.json).

        Its summary states the run's reported eps, the same as ``summary.json``'s (issue 77),
        and each adversary's; where a mechanism accounts outside the per-client Gaussian
        ledger (dp-ftrl's tree, cdp-gaussian's observer view, ddp-skellam's Skellam RDP)
        the ledger's own composition stays beside it as ``epsilon_ledger``."""
        out = self.ledger.to_dict()
        run = self.summary()
        ledger = out["summary"]
        if ledger.get("epsilon") != run.get("epsilon"):
            ledger["epsilon_ledger"] = ledger.get("epsilon")
            ledger["epsilon"] = run.get("epsilon")
        for key in ("epsilon_round", "worst_client_rounds"):
            if key in run and run[key] != ledger.get(key):
                ledger[key] = run[key]
        ledger["adversaries"] = run["adversaries"]
        return out
