"""The neighbour-world harness (docs/design.md section 5, "What the server may use").

Used by the tests (``tests/test_neighbour_worlds.py``) and by
``python -m benchmarks.neighbour_worlds``; a new mechanism, aggregator or
composition is not done until it passes.

Two worlds that differ by the mechanism's neighbouring relation run the same
configuration under the same seed (so every random draw is shared):

- user-level modes (ldp-laplace, ldp-gaussian, paper, ldp-touched-rows): client
  ``TARGET``'s whole training set is replaced by another;
- ldp-dpsgd (interaction-level): one positive of ``TARGET`` is removed;
- cdp-gaussian (add/remove one client): ``TARGET`` never takes part in world B.

World B runs first and its releases (each upload as the privacy layer returns
it, or under a central mechanism the round's released aggregate) are recorded.
World A then runs with a hook on the privacy layer that, round after round,

1. compares what A would release with what B released: for every other client
   the two must be equal (the server's view so far is identical, and the
   server may use only released values and public parameters, so nothing of
   TARGET's data may reach another client's release); for TARGET, or for the
   aggregate, the gap must lie within the mechanism's sensitivity (the noise is
   shared, so it cancels and the gap is exactly the difference of the clipped
   contributions);
2. substitutes B's releases for A's, so both worlds share the attacker's whole
   view of the round and the next round starts from the same public state.

Whatever the server computes (weights, similarities, graphs, fits, what it
sends whom) is then checked implicitly: if it used anything but releases and
public parameters, some other client's release in a later round differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedem_private.client.strategies import merge_class
from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.data.split import Split
from fedem_private.privacy import registry
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.mech.base import ADD_REMOVE_CLIENT, ADD_REMOVE_INTERACTION
from fedem_private.simulation.config import (
    DataConfig,
    FederationConfig,
    RunConfig,
    TrainConfig,
)
from fedem_private.simulation.loop import Simulation

TARGET = 0
ROUNDS = 3
# other clients' releases agree to this (relative to the release's scale): the engine's
# chunks may pad differently when a client's size changes, float32 rounding of the order
# of 1e-7; a leak through the server moves them by orders of magnitude more
OTHER_TOL = 1e-4
# the sensitivity check's float slack (clipping runs in float64, the release is float32)
BOUND_SLACK = 1e-4

# privacy settings per mode: small clips so clipping binds, noise present and shared
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "ldp-laplace": {"clip": 0.05, "epsilon_round": 1.0},
    "ldp-gaussian": {"clip": 0.05, "noise_multiplier": 1.0},
    "paper": {"paper_clip": 1.0, "paper_lambda": 0.05},
    "ldp-touched-rows": {"clip": 0.05, "epsilon_round": 1.0},
    "cdp-gaussian": {"clip": 0.05, "noise_multiplier": 1.0, "sample_rate": 0.8},
    "ldp-dpsgd": {"clip": 0.5, "noise_multiplier": 1.0, "dpsgd_steps": 2,
                  "dpsgd_rate": 0.5, "dpsgd_negatives": 4, "dpsgd_lr": 0.5},
}
# the mechanisms whose claimed gap (Mechanism.claimed_gap) the harness checks; those that
# perturb but claim no guarantee (paper and ldp-touched-rows) the harness must find leaking;
# ldp-dpsgd's guarantee is on its noisy steps, not a bounded gap between uploads, so only the
# other clients' equality is checked for it
NO_GUARANTEE = tuple(n for n in registry.names()
                     if registry.capability(n, "perturbs")
                     and not registry.capability(n, "claims_guarantee"))


@dataclass
class Findings:
    """What the harness saw: the largest gaps, and every violation (empty: sound)."""

    target_gap: float = 0.0  # largest TARGET (or aggregate) gap / the allowed bound
    other_gap: float = 0.0  # largest relative gap of another client's release
    violations: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        return not self.violations


def base_split(seed: int = 3) -> Split:
    """A tiny synthetic split: 10 users, 24 items."""
    data = generate(SyntheticConfig(n_users=10, n_items=24, n_clusters=2, mean_activity=7,
                                    activity_sigma=0.3), seed=seed)
    return leave_one_out(data, seed)


def _with_items(split: Split, user: int, items: np.ndarray) -> Split:
    """``split`` with ``user``'s training positives replaced by ``items`` (sorted)."""
    per_user = [split.train_of(u) for u in range(split.n_users)]
    per_user[user] = np.sort(np.asarray(items, dtype=split.train_items.dtype))
    indptr = np.zeros(split.n_users + 1, dtype=split.train_indptr.dtype)
    indptr[1:] = np.cumsum([p.shape[0] for p in per_user])
    return replace(split, train_indptr=indptr, train_items=np.concatenate(per_user))


def neighbour_split(split: Split, mode: str, sizes: str = "private") -> Split | None:
    """World B's split under ``mode``'s relation; None when B differs by participation only
    (cdp-gaussian: add/remove one client). With the sizes declared public the relation
    keeps |D_u|: the replacement has as many items."""
    own = split.train_of(TARGET)
    relation = registry.mechanism_for(mode).relation
    if relation == ADD_REMOVE_CLIENT:
        return None
    if relation == ADD_REMOVE_INTERACTION:  # one interaction removed
        return _with_items(split, TARGET, own[1:])
    # user-level replace-one: another set of items, of another size, none of the old ones
    taken = set(own.tolist()) | {int(split.val_items[TARGET]), int(split.test_items[TARGET])}
    free = np.array([i for i in range(split.n_items) if i not in taken])
    count = own.shape[0] if sizes == "public" else max(2, own.shape[0] // 2 + 1)
    return _with_items(split, TARGET, free[:count])


def make_config(mode: str, *, method: str = "fedmf", backbone: str | None = None,
                aggregation: str | None = None, merge: str | None = None,
                codec: str = "full", protocol: str = "strict", sizes: str = "private",
                agg_ratio: float = 1.0, seed: int = 0) -> RunConfig:
    """One composition on the tiny split, validated and resolved (UserError if refused)."""
    settings = dict(MODE_SETTINGS[mode])
    fed: dict[str, Any] = {"method": method, "backbone": backbone, "aggregation": aggregation,
                           "merge": merge, "codec": codec, "peft_warmup": 1, "lora_rank": 2,
                           "hash_size": 8, "rq_levels": 2, "rq_codebook": 4,
                           "agg_clients_ratio": agg_ratio, "merge_k": 2,
                           "fedmerge_steps": 2}
    resolved_merge = FederationConfig(method=method, backbone=backbone, merge=merge
                                      ).resolved_merge
    if registry.mechanism_for(mode).in_training and merge_class(resolved_merge).dpsgd_adapter:
        settings["dpsgd_adapter_steps"] = 1
    cfg = RunConfig(
        data=DataConfig(dataset="synthetic", protocol=protocol),
        train=TrainConfig(rounds=ROUNDS, dim=4, local_epochs=1, batch_size=8,
                          num_negatives=1, eval_every=ROUNDS, seed=seed),
        federation=FederationConfig(**fed),
        privacy=PrivacyConfig(mode=mode, sizes=sizes, **settings),
    )
    return cfg.validate().resolved().validate()  # the resolved preset must stand too


@dataclass
class _Record:
    releases: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    aggregates: dict[int, torch.Tensor] = field(default_factory=dict)


def _hook(sim: Simulation, record: _Record, replay: _Record | None, findings: Findings,
          bound: tuple[int, float] | None, drop_target: bool) -> None:
    """Wrap the privacy layer's release points (see the module docstring)."""
    layer = sim.privacy
    release, release_aggregate, participants = (layer.release, layer.release_aggregate,
                                                layer.participants)

    def _release(sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                 touched: torch.Tensor | None) -> torch.Tensor:
        out = release(sent, local, clients, touched)
        t = layer.round
        mine = record.releases.setdefault(t, {})
        for j, c in enumerate(np.asarray(clients).tolist()):
            mine[c] = out[j].detach().clone()
        if replay is None:
            return out
        theirs = replay.releases.get(t, {})
        rows = []
        for j, c in enumerate(np.asarray(clients).tolist()):
            ref = theirs.get(c)
            if ref is None:
                findings.violations.append(f"round {t}: client {c} released in A only")
                rows.append(out[j])
                continue
            gap = (out[j].double() - ref.double()).flatten()
            if c == TARGET:
                if bound is not None:
                    norm, allowed = bound
                    ratio = float(gap.norm(p=norm)) / allowed
                    findings.target_gap = max(findings.target_gap, ratio)
                    if ratio > 1 + BOUND_SLACK:
                        findings.violations.append(
                            f"round {t}: target's release gap {ratio:.3g}x its sensitivity")
            else:
                scale = 1.0 + float(ref.double().abs().max())
                rel = float(gap.abs().max()) / scale
                findings.other_gap = max(findings.other_gap, rel)
                if rel > OTHER_TOL:
                    findings.violations.append(
                        f"round {t}: client {c}'s release depends on the target's data "
                        f"(gap {rel:.3g})")
            rows.append(ref.to(out.dtype))
        return torch.stack(rows)

    def _release_aggregate(base: torch.Tensor) -> torch.Tensor:
        out = release_aggregate(base)
        t = layer.round
        record.aggregates[t] = out.detach().clone()
        if replay is None:
            return out
        ref = replay.aggregates[t]
        if bound is not None:
            norm, allowed = bound
            # the noisy sum is the aggregate times the public divisor q n (shared noise)
            gap = (out.double() - ref.double()).flatten() * layer.expected_count
            ratio = float(gap.norm(p=norm)) / allowed
            findings.target_gap = max(findings.target_gap, ratio)
            if ratio > 1 + BOUND_SLACK:
                findings.violations.append(
                    f"round {t}: the aggregate's gap {ratio:.3g}x its sensitivity")
        return ref.to(out.dtype)

    def _participants(round_: int) -> np.ndarray | None:
        chosen = participants(round_)
        if chosen is None or not drop_target:
            return chosen
        return chosen[chosen != TARGET]

    layer.release = _release  # type: ignore[method-assign]
    layer.release_aggregate = _release_aggregate  # type: ignore[method-assign]
    layer.participants = _participants  # type: ignore[method-assign]


def sensitivity(cfg: RunConfig) -> tuple[int, float] | None:
    """(norm, allowed gap) of one release under the mode's relation; None: not checked."""
    return cfg.privacy.mechanism.claimed_gap(cfg.privacy)


def run_pair(cfg: RunConfig, split: Split | None = None) -> Findings:
    """Run world B, then world A against it (module docstring); the findings."""
    return _pair(cfg, split)[0]


def validation_ranks_pair(cfg: RunConfig, split: Split | None = None
                          ) -> tuple[np.ndarray, np.ndarray, Findings]:
    """Each user's validation rank (its validation item among its candidates) in world A
    and in world B after :func:`run_pair`'s rounds, and the findings.

    A private search releases the count of validation hits (rank < 10) over users
    (:mod:`fedem_private.privacy.tuning`): with the releases shared, every user but
    ``TARGET`` must rank the same in both worlds, so the count moves by at most one.
    ``cfg`` must rank the validation item (``train.select_round = "best-val"``)."""
    findings, world_a, world_b = _pair(cfg, split)
    return world_a.ranks().val.numpy(), world_b.ranks().val.numpy(), findings


def _pair(cfg: RunConfig, split: Split | None) -> tuple[Findings, Simulation, Simulation]:
    split = split or base_split()
    mode = cfg.privacy.mode
    other = neighbour_split(split, mode, cfg.privacy.sizes)
    findings = Findings()
    world_b = Simulation(cfg, other if other is not None else split)
    seen = _Record()
    _hook(world_b, seen, None, findings, None, drop_target=other is None)
    world_b.run()
    world_a = Simulation(cfg, split)
    _hook(world_a, _Record(), seen, findings, sensitivity(cfg), drop_target=False)
    world_a.run()
    return findings, world_a, world_b


@dataclass
class TrialsFindings:
    """Two trials of one search on the same data (:func:`trials_pair`): per released value,
    the standard deviation of the difference of their releases in units of one release's
    noise (sqrt(2) for independent noise, 0 when the noise is shared and cancels)."""

    spreads: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        return not self.violations


#: two trials' noise counts as independent when the difference of their releases spreads
#: at least this many noise standard deviations (sqrt(2) expected; more where their
#: signals differ too; 0 when the noise is shared)
INDEPENDENT_SPREAD = 1.0


def trials_pair(cfg: RunConfig, nonces: tuple[int, int] = (1, 2),
                split: Split | None = None) -> TrialsFindings:
    """Two trials of a private search (:mod:`fedem_private.experiments.tune`) at the same
    setting on the same data, told apart only by ``train.nonce``: an observer who sees
    both subtracts their releases, and if they shared their noise the difference would be
    the noise-free difference of their clipped sums (it is exactly 0 here: same setting,
    same data). Every released value the two runs share, less the public table it is
    centred on (under a central mechanism the round's aggregate, under a local one each
    upload of a client in both runs' round), must differ by noise of about sqrt(2) times
    one release's scale: a spread below :data:`INDEPENDENT_SPREAD` is a violation.
    ``cfg`` must perturb with a stated scale (``cdp-gaussian``, ``ldp-gaussian``,
    ``ldp-laplace``)."""
    split = split or base_split()
    records = []
    for nonce in nonces:
        sim = Simulation(replace(cfg, train=replace(cfg.train, nonce=nonce)), split)
        record = _record_updates(sim)
        sim.run()
        records.append((sim, record))
    (sim_a, rec_a), (_, rec_b) = records
    findings = TrialsFindings()
    p = sim_a.privacy.params
    # one released entry's noise standard deviation (Laplace b has sd b sqrt(2))
    scale = float(p.noise_scale) * (math.sqrt(2.0) if p.noise_kind == "laplace" else 1.0)
    if sim_a.privacy.central:
        scale /= sim_a.privacy.expected_count  # the sum's noise, divided by q n
        pairs = [(t, "aggregate", rec_a.aggregates[t], rec_b.aggregates[t])
                 for t in sorted(rec_a.aggregates)]
    else:
        pairs = [(t, f"client {c}", rel, rec_b.releases[t][c])
                 for t, mine in sorted(rec_a.releases.items())
                 for c, rel in sorted(mine.items()) if c in rec_b.releases.get(t, {})]
    for t, what, a, b in pairs:
        spread = float((a.double() - b.double()).std()) / scale
        findings.spreads.append(spread)
        if spread < INDEPENDENT_SPREAD:
            findings.violations.append(
                f"round {t}: {what}'s releases in two trials differ by {spread:.3g} noise "
                f"standard deviations: their noise is shared")
    if not pairs:
        findings.violations.append("the two trials released nothing in common to compare")
    return findings


def _record_updates(sim: Simulation) -> _Record:
    """Record each release minus the public table it is centred on (the sent table of a
    local upload, the broadcast table of a central aggregate): the noisy clipped delta, or
    the noisy mean of the clipped deltas, which is what two trials' noise must tell apart
    (their public tables differ already, through their initialisations)."""
    layer, record = sim.privacy, _Record()
    release, release_aggregate = layer.release, layer.release_aggregate

    def _release(sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                 touched: torch.Tensor | None) -> torch.Tensor:
        out = release(sent, local, clients, touched)
        mine = record.releases.setdefault(layer.round, {})
        for j, c in enumerate(np.asarray(clients).tolist()):
            mine[c] = (out[j].double() - sent[j].double()).detach().clone()
        return out

    def _release_aggregate(base: torch.Tensor) -> torch.Tensor:
        out = release_aggregate(base)
        record.aggregates[layer.round] = (out.double() - base.double()).detach().clone()
        return out

    layer.release = _release  # type: ignore[method-assign]
    layer.release_aggregate = _release_aggregate  # type: ignore[method-assign]
    return record


def describe(cfg: RunConfig) -> str:
    fed = cfg.federation
    return (f"{cfg.privacy.mode}/{fed.backbone}/{fed.aggregation}/{fed.merge}/{fed.codec}/"
            f"{cfg.data.protocol}" + (f"/agg{fed.agg_clients_ratio:g}"
                                      if fed.agg_clients_ratio < 1 else "")
            + ("/sizes-public" if cfg.privacy.sizes == "public" else ""))


# ------------------------------------------------------------ the space of compositions
def _axes() -> dict[str, tuple[Any, ...]]:
    from fedem_private.models import BACKBONES
    from fedem_private.simulation.config import (
        AGGREGATIONS,
        CODECS,
        MERGES,
        PROTOCOLS_ALL,
    )

    return {"mode": tuple(MODE_SETTINGS), "aggregation": AGGREGATIONS, "merge": MERGES,
            "codec": CODECS, "backbone": BACKBONES, "protocol": PROTOCOLS_ALL,
            "agg_ratio": (1.0, 0.5), "sizes": ("private", "public")}


AXES = _axes()


def accepted() -> list[dict[str, Any]]:
    """Every composition of :data:`AXES` the configuration accepts."""
    import itertools

    from fedem_private.errors import UserError

    out = []
    names = list(AXES)
    for values in itertools.product(*AXES.values()):
        combo = dict(zip(names, values, strict=True))
        try:
            make_config(combo["mode"], method=None, backbone=combo["backbone"],
                        aggregation=combo["aggregation"], merge=combo["merge"],
                        codec=combo["codec"], protocol=combo["protocol"],
                        agg_ratio=combo["agg_ratio"], sizes=combo["sizes"])
        except UserError:
            continue
        out.append(combo)
    return out


def covering(combos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A small deterministic subset of ``combos`` in which every value of every axis meets
    every privacy mode it can meet, and every (aggregation, merge), (aggregation, codec),
    (backbone, merge) and (backbone, codec) pair that is accepted occurs (greedy cover)."""
    crossed = [("mode", a) for a in AXES if a != "mode"] + [
        ("aggregation", "merge"), ("aggregation", "codec"), ("backbone", "merge"),
        ("backbone", "codec"), ("aggregation", "agg_ratio")]

    def pairs(c: dict[str, Any]) -> set[tuple[Any, ...]]:
        return {(a, c[a], b, c[b]) for a, b in crossed}

    todo = set().union(*(pairs(c) for c in combos))
    chosen = []
    while todo:
        best = max(combos, key=lambda c: len(pairs(c) & todo))
        chosen.append(best)
        todo -= pairs(best)
    return chosen


def config_of(combo: dict[str, Any]) -> RunConfig:
    return make_config(combo["mode"], method=None, backbone=combo["backbone"],
                       aggregation=combo["aggregation"], merge=combo["merge"],
                       codec=combo["codec"], protocol=combo["protocol"],
                       agg_ratio=combo["agg_ratio"], sizes=combo["sizes"])
