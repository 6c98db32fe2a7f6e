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
from fedem_private.privacy.mech.base import (
    ADD_REMOVE_CLIENT,
    ADD_REMOVE_INTERACTION,
    ZERO_OUT_CLIENT,
)
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
    if relation in (ADD_REMOVE_CLIENT, ZERO_OUT_CLIENT):
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
                agg_ratio: float = 1.0, seed: int = 0,
                settings: dict[str, Any] | None = None) -> RunConfig:
    """One composition on the tiny split, validated and resolved (UserError if refused).

    ``settings``: the privacy options of ``mode`` (None: :data:`MODE_SETTINGS`'s, which
    lists the built-ins'; a mechanism from a plugin brings its own: small clips so clipping
    binds, noise present)."""
    settings = dict(MODE_SETTINGS[mode] if settings is None else settings)
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
    counts: dict[int, torch.Tensor] = field(default_factory=dict)


def _hook_counts(layer: Any, record: _Record, replay: _Record | None, findings: Findings,
                 checked: bool) -> None:
    """Private row selection's second release, the round's noisy item counts: recorded,
    replayed from world B, and (``checked``) its gap held to its L2 sensitivity 1."""
    release_counts = layer.release_counts

    def _release_counts() -> torch.Tensor:
        out = release_counts()
        t = layer.round
        record.counts[t] = out.detach().clone()
        if replay is None:
            return out
        ref = replay.counts[t]
        if checked:
            ratio = float((out.double() - ref.double()).norm(p=2))
            findings.target_gap = max(findings.target_gap, ratio)
            if ratio > 1 + BOUND_SLACK:
                findings.violations.append(
                    f"round {t}: the item counts' gap {ratio:.3g}x their sensitivity 1")
        return ref.to(out.dtype)

    layer.release_counts = _release_counts


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
        own = getattr(layer.secure, "claimed_gap", None)  # a run's own bound (ddp-skellam)
        if bound is not None:
            norm, allowed = own() if own is not None else bound
            # the noisy sum is the aggregate times the public divisor q n (shared noise)
            gap = (out.double() - ref.double()).flatten() * layer.expected_count
            ratio = float(gap.norm(p=norm)) / allowed
            findings.target_gap = max(findings.target_gap, ratio)
            if ratio > 1 + BOUND_SLACK:
                findings.violations.append(
                    f"round {t}: the aggregate's gap {ratio:.3g}x its sensitivity")
        return ref.to(out.dtype)

    zeroes = drop_target and layer.mechanism.relation == ZERO_OUT_CLIENT

    def _participants(round_: int) -> np.ndarray | None:
        chosen = participants(round_)
        if chosen is None or not drop_target or zeroes:
            return chosen
        return chosen[chosen != TARGET]

    if zeroes:  # the target takes part with its contribution replaced by zero (ddp-skellam)
        contribute = layer.contribute

        def _contribute(sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                        *rest: Any) -> None:
            local = local.clone()
            rows = np.flatnonzero(np.asarray(clients) == TARGET)
            local[rows] = sent[rows].to(local.dtype)
            contribute(sent, local, clients, *rest)

        layer.contribute = _contribute  # type: ignore[method-assign]

    layer.release = _release  # type: ignore[method-assign]
    layer.release_aggregate = _release_aggregate  # type: ignore[method-assign]
    layer.participants = _participants  # type: ignore[method-assign]
    if layer.central and layer.selects_rows:
        _hook_counts(layer, record, replay, findings, bound is not None)


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


def split_without(split: Split, user: int) -> Split:
    """``split`` with ``user`` removed from the data (add/remove by removal): every other
    user keeps its rows, its validation and test items and its identity key; the users after
    ``user`` move down one index (none when ``user`` is the last)."""
    keep = np.delete(np.arange(split.n_users), int(user))
    per_user = [split.train_of(u) for u in keep.tolist()]
    indptr = np.zeros(keep.shape[0] + 1, dtype=split.train_indptr.dtype)
    indptr[1:] = np.cumsum([p.shape[0] for p in per_user])
    items = (np.concatenate(per_user) if per_user
             else np.zeros(0, dtype=split.train_items.dtype))
    return replace(split, n_users=int(keep.shape[0]), train_indptr=indptr, train_items=items,
                   val_items=split.val_items[keep], test_items=split.test_items[keep],
                   users=split.users[keep], source_users=split.source_users[keep])


def removal_pair(cfg: RunConfig, split: Split, user: int | None = None) -> Findings:
    """Add/remove by removal (issue 77): world B is world A's data without ``user`` (default
    the last, so that no other user's index moves), both run under one seed and the same
    configuration; a central mechanism's released aggregates are compared round by round
    (B's replayed into A) against its sensitivity. Unlike :func:`run_pair`, which keeps the
    target out of the participants, this catches a sampler or divisor that depends on the
    population: a cohort cut from the whole list of clients moves others when one leaves.
    ``cfg`` should fix the public divisor (``privacy.public_population``), else the two
    worlds divide by different counts."""
    if not cfg.privacy.mechanism.central:
        raise ValueError("removal_pair checks a central mechanism's released aggregates")
    user = split.n_users - 1 if user is None else int(user)
    findings = Findings()
    world_b = Simulation(cfg, split_without(split, user))
    seen = _Record()
    _hook(world_b, seen, None, findings, None, drop_target=False)
    world_b.run()
    world_a = Simulation(cfg, split)
    _hook(world_a, _Record(), seen, findings, sensitivity(cfg), drop_target=False)
    world_a.run()
    return findings


def population_split(n_users: int = 200, n_items: int = 80, seed: int = 3) -> Split:
    """The audit's world of issue 77: 200 synthetic users over 80 items."""
    data = generate(SyntheticConfig(n_users=n_users, n_items=n_items, n_clusters=4,
                                    mean_activity=10, activity_sigma=0.3), seed=seed)
    return leave_one_out(data, seed)


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



# ----------------------------------------------------------------- DP-MostPop's releases
# (imported here, with the part they serve: DP-MostPop's check needs the data room's
# re-indexing and the baselines room, which the simulation harness above does not)
from fedem_private.baselines import popularity  # noqa: E402
from fedem_private.data.interactions import Interactions, from_raw, without_rows  # noqa: E402

#: DP-MostPop's architectures (``baselines/popularity.py:dp_counts``) by the relation each
#: states: user-level (one user's data removed) or interaction-level (one interaction removed)
MOSTPOP_USER_LEVEL = ("central", "local")
MOSTPOP_INTERACTION_LEVEL = ("interaction", "interaction-local")
# float slack of the release check, relative to the largest released count: the noise is
# shared, so it cancels up to rounding
MOSTPOP_SLACK = 1e-9


@dataclass
class MostPopFindings:
    """What :func:`dp_mostpop_pair` saw: the released estimates' gap (aligned by source item
    id; ``local``: the largest deviation from the target's debiased report) and the bound
    it must stay within, how many other users were compared, and every violation (empty:
    sound)."""

    architecture: str
    gap: float = 0.0
    bound: float = 0.0
    others: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        return not self.violations


def mostpop_data(seed: int = 3, coarse: float = 3.0) -> Interactions:
    """A small synthetic dataset (40 users, 30 items) with a public catalogue (its 30 item
    ids, whether or not anyone rated them) and timestamps coarsened to ``coarse`` steps, so
    most users have ties among their latest interactions (the split's tie-break matters)."""
    cfg = SyntheticConfig(n_users=40, n_items=30, n_clusters=2, mean_activity=9,
                          activity_sigma=0.3)
    data = generate(cfg, seed=seed)
    assert data.timestamps is not None  # the generator always stamps its interactions
    demo = {a: dict(zip(data.user_ids.tolist(), v.tolist(), strict=True))
            for a, v in data.demographics.items()}
    return from_raw(data.name, data.user_ids[data.users], data.item_ids[data.items],
                    np.floor(data.timestamps / coarse), demo, catalogue=np.arange(cfg.n_items))


def dp_mostpop_pair(architecture: str, data: Interactions | None = None, *, k: int = 4,
                    epsilon: float = 1.0, delta: float = 1e-5, seed: int = 0,
                    target: Any = None) -> MostPopFindings:
    """DP-MostPop's ``architecture`` on two neighbouring datasets under one seed.

    World A is ``data`` (default :func:`mostpop_data`). World B is the dataset the loader
    would have built from the same source without every interaction of the user whose
    source id is ``target`` (user-level: ``central``, ``local``), or without that user's
    interaction with its first training item (interaction-level: ``interaction``,
    ``interaction-local``). The re-indexing and
    :func:`~fedem_private.data.split.leave_one_out` run again on B
    (:func:`~fedem_private.data.interactions.without_rows`), so users' and items' positions
    may move and only source ids align the worlds. ``target`` None picks the first user
    with more than ``k`` training items (the k-clip binds for it).

    Every random draw is shared (one seed), so the checks are exact:

    1. every other user (by source id) has the same validation and test items, training
       set, k-subset (user-level) and local report (``local``, ``interaction-local``),
       items by source id;
    2. the released estimates, aligned by source item id, differ as the stated
       sensitivity allows: ``central`` by the target's k-clipped one-hot vector (L2 <=
       sqrt(k); the noise cancels), ``local`` by the target's debiased report alone
       (every other report being equal), ``interaction`` and ``interaction-local`` by at
       most 1 in L1 (one count);
    3. the item catalogue is the same (the relations assume a public catalogue).
    """
    world_a = data if data is not None else mostpop_data()
    split_a = leave_one_out(world_a, seed)
    if target is None:
        over = np.flatnonzero(split_a.train_counts > k)
        target = world_a.user_ids[split_a.users[over[0] if over.shape[0] else 0]].item()
    t_index = int(np.flatnonzero(world_a.user_ids == target)[0])
    t_split = int(np.flatnonzero(split_a.users == t_index)[0])
    if architecture in MOSTPOP_USER_LEVEL:
        drop = world_a.users == t_index
    elif architecture in MOSTPOP_INTERACTION_LEVEL:
        item = split_a.train_of(t_split)[0]
        drop = (world_a.users == t_index) & (world_a.items == item)
    else:
        raise ValueError(f"unknown architecture {architecture!r}")
    split_b = leave_one_out(without_rows(world_a, drop), seed)
    found = MostPopFindings(architecture)
    if not np.array_equal(split_a.source_items, split_b.source_items):
        found.violations.append(
            f"the catalogue changed ({split_a.n_items} items -> {split_b.n_items}): the "
            f"relations assume a public catalogue")
    key = int(split_a.source_users[t_split])
    mine = _mostpop_contributions(architecture, split_a, k, epsilon, delta, seed)
    theirs = _mostpop_contributions(architecture, split_b, k, epsilon, delta, seed)
    for user, parts in mine.items():
        if user == key:
            continue
        found.others += 1
        other = theirs.get(user)
        if other is None:
            found.violations.append(f"user {user} is missing from world B")
            continue
        differ = [part for part, value in parts.items() if not _same(value, other[part])]
        if differ:
            found.violations.append(f"user {user}: its {', '.join(differ)} differ(s) "
                                    f"between the worlds")
    if set(theirs) - set(mine):
        found.violations.append(f"users {sorted(set(theirs) - set(mine))} are in world B only")
    release_a = popularity.dp_counts(split_a, architecture, k, epsilon, delta, seed)
    release_b = popularity.dp_counts(split_b, architecture, k, epsilon, delta, seed)
    _, at_a, at_b = np.intersect1d(split_a.source_items, split_b.source_items,
                                   return_indices=True)
    gap = release_a.estimate[at_a] - release_b.estimate[at_b]
    slack = MOSTPOP_SLACK * (1.0 + float(np.abs(release_a.estimate).max()))
    if architecture == "central":
        found.gap, found.bound = float(np.linalg.norm(gap)), math.sqrt(k)
    elif architecture == "local":
        # the release is post-processing of the reports: A's estimate less B's must be the
        # target's debiased report (y_t - q) / (p - q), whatever the other users hold
        p, q = popularity.oue_probabilities(epsilon / k)
        keys, y_t = mine[key]["report"]
        expected = dict(zip(keys.tolist(), ((y_t - q) / (p - q)).tolist(), strict=True))
        wanted = np.array([expected[i] for i in split_a.source_items[at_a].tolist()])
        found.gap, found.bound = float(np.abs(gap - wanted).max(initial=0.0)), 0.0
    else:
        found.gap, found.bound = float(np.abs(gap).sum()), 1.0
    if found.gap > found.bound + slack:
        found.violations.append(
            f"{architecture}: the released estimates differ by {found.gap:.6g}, beyond the "
            f"stated {found.bound:.6g}")
    return found


def _mostpop_contributions(architecture: str, split: Split, k: int, epsilon: float,
                           delta: float, seed: int) -> dict[int, dict[str, Any]]:
    """Per user (by source key): its held-out items, training set and, by architecture, its
    k-subset and local report, items as source keys (a report as (source item keys, its
    values over them))."""
    out: dict[int, dict[str, Any]] = {}
    owners = split.source_users.tolist()
    for u, user in enumerate(owners):
        out[user] = {"validation item": int(split.source_items[split.val_items[u]]),
                     "test item": int(split.source_items[split.test_items[u]]),
                     "training set": np.sort(split.source_items[split.train_of(u)])}
    if architecture in MOSTPOP_USER_LEVEL:
        indptr, items = popularity.k_subsets(split, k, seed)
        for u, user in enumerate(owners):
            out[user]["k-subset"] = np.sort(split.source_items[items[indptr[u]:indptr[u + 1]]])
    if architecture == "local":
        blocks = popularity.oue_reports(split, k, epsilon, seed)
    elif architecture == "interaction-local":
        b = popularity.noise_multiplier_for("laplace", epsilon, delta, 1, "basic")
        blocks = popularity.interaction_reports(split, b, seed)
    else:
        return out
    rows = (row for block in blocks for row in block)
    for user, row in zip(owners, rows, strict=True):
        out[user]["report"] = (split.source_items, row.astype(np.float64))
    return out


def _same(a: Any, b: Any) -> bool:
    """Two contributions are equal: numbers, arrays, or (source item keys, values) reports
    compared on the keys both hold (a catalogue change is reported on its own)."""
    if isinstance(a, tuple):
        _, ia, ib = np.intersect1d(a[0], b[0], return_indices=True)
        return bool(np.array_equal(a[1][ia], b[1][ib]))
    return bool(np.array_equal(a, b))


# ---------------------------------------------------------- dp-ftrl (issue 66, item 3)
# central DP-FTRL (add/remove one client, like cdp-gaussian: TARGET never takes part in
# world B): two cyclic cohorts of the ten users take turns, so TARGET takes part within the
# three rounds; each round's released increment is checked against C (the tree's noise is
# keyed by (seed, node), shared by the worlds, and cancels). Added here, after the table
# above, and the axes recomputed so that the cover meets it.
MODE_SETTINGS["dp-ftrl"] = {"clip": 0.05, "noise_multiplier": 1.0, "sample_rate": 0.5}
AXES = _axes()


# ------------------------------------------------------- ddp-skellam (issue 68, item 4)
# distributed Skellam under simulated secure aggregation: TARGET stays in the cohort of
# world B with its contribution replaced by zero (it still adds its noise share, which the
# worlds share through one client-secret seed, and which cancels with every other client's);
# the decoded aggregate's gap is checked against the run's own bound Delta_2 / gamma (the
# secure sum's claimed_gap). The clients' secrets come from the OS unless a client-secret
# seed is given; the harness gives one so that the two worlds' noise shares agree.
MODE_SETTINGS["ddp-skellam"] = {"clip": 0.05, "noise_multiplier": 1.0, "sample_rate": 0.8,
                                "ddp_bits": 16, "client_secret_seed": 7}
AXES = _axes()
