"""Privacy mechanisms as registered classes (docs/design.md sections 5 and 15).

A new mechanism is one class and one registry line: the toy below adds Gaussian
noise of a fixed sigma to every upload, is run through a tiny synthetic
simulation, and is checked to have been applied. The built-in mechanisms'
self-descriptions are checked against the text the runs printed before the
mechanisms became classes (summary.json, results.csv, the report, the CLI).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedem_private.errors import UserError
from fedem_private.privacy import registry
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.mech.base import NO_RELATION, Mechanism
from fedem_private.privacy.mechanisms import RoundPrivacyStats, draw_noise
from fedem_private.privacy.params import MechanismParams

TOY_SIGMA = 0.25


class ToyGaussian(Mechanism):
    """Toy: local + N(0, TOY_SIGMA^2) on every entry of the upload; no clip, no claim."""

    name = "toy-gaussian"
    description = "toy: Gaussian noise of a fixed sigma on every upload; no guarantee"
    neighbouring = "none: a toy, no guarantee"
    trust_model = "local: each client noises its upload"
    amplification = "none"
    relation = NO_RELATION
    noise_kind = "gaussian"
    no_budget_reason = "has a fixed sigma"
    # what each call of the client hook saw: (round, clients, released - local)
    seen: list[tuple[int, np.ndarray, torch.Tensor]] = []

    @classmethod
    def calibrate(cls, cfg: PrivacyConfig, rounds: int,
                  n_clients: int | None = None) -> MechanismParams:
        return MechanismParams(mode=cfg.mode, delta=cfg.delta, norm=None, clip=None,
                               sensitivity=None, noise_kind="gaussian", noise_scale=TOY_SIGMA,
                               noise_multiplier=None, epsilon_round=math.inf)

    @classmethod
    def release(cls, params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        out = local.detach().to(torch.float64, copy=True)
        noise = draw_noise(params, out.shape, seed=seed, round_=round_, clients=clients,
                           device=out.device)
        assert noise is not None
        out = (out + noise).to(torch.float32)
        cls.seen.append((round_, np.asarray(clients).copy(), (out - local).detach().cpu()))
        stats = RoundPrivacyStats(mode=params.mode, n_clients=local.shape[0], norm=None,
                                  clip=None, fraction_clipped=None, mean_pre_clip_norm=None,
                                  noise_kind="gaussian", noise_scale=TOY_SIGMA,
                                  noised_fraction=1.0)
        return out, stats


@pytest.fixture
def toy():
    ToyGaussian.seen = []
    registry.register(ToyGaussian)  # the one registry line
    yield ToyGaussian
    registry.unregister(ToyGaussian.name)


def _cfg(mode: str):
    from fedem_private.simulation.config import RunConfig, with_overrides

    return with_overrides(RunConfig(), {
        "data.dataset": "synthetic", "train.rounds": 2, "train.local_epochs": 1,
        "train.batch_size": 32, "train.dim": 4, "privacy.mode": mode})


def test_a_toy_mechanism_registers_and_runs_in_a_simulation(toy, small_split):
    from fedem_private.simulation.loop import Simulation

    assert "toy-gaussian" in registry.names()
    assert registry.names()[:len(registry.BUILTIN)] == tuple(registry.BUILTIN)
    sim = Simulation(_cfg("toy-gaussian"), small_split)
    plain = Simulation(_cfg("none"), small_split)
    for _ in range(2):
        sim.step()
        plain.step()
    rounds = sorted({r for r, _, _ in toy.seen})
    assert rounds == [1, 2]
    for r in rounds:  # every client released once per round, through the toy's hook
        ids = np.concatenate([c for rr, c, _ in toy.seen if rr == r])
        assert sorted(ids.tolist()) == list(range(small_split.n_users))
    noise = torch.cat([d.reshape(-1) for _, _, d in toy.seen]).double()
    assert abs(float(noise.std()) - TOY_SIGMA) < 0.05 * TOY_SIGMA
    assert abs(float(noise.mean())) < 0.01
    assert not torch.equal(sim.state.q_global, plain.state.q_global)
    # the run states the toy's own relation, and claims nothing
    assert sim.privacy.summary()["neighbouring"] == "none: a toy, no guarantee"
    assert not sim.privacy.params.guarantee


def test_registry_refuses_unknown_names_and_duplicates(toy):
    with pytest.raises(UserError, match="unknown privacy mode 'nope'"):
        PrivacyConfig(mode="nope")

    class Other(ToyGaussian):
        pass

    with pytest.raises(ValueError, match="already registered"):
        registry.register(Other)
    registry.register(ToyGaussian)  # the same class again is harmless
    with pytest.raises(UserError, match="has a fixed sigma"):
        PrivacyConfig(mode="toy-gaussian", epsilon=1.0)


# What every run printed before the mechanisms were classes (config.py's THREAT_MODELS and
# MODE_DESCRIPTIONS, and cli.privacy_text), kept here verbatim.
OLD_THREAT_MODELS: dict[str, dict[str, str]] = {
    "none": {
        "neighbouring": "none: no mechanism, no guarantee",
        "trust_model": "none: the server sees every upload exactly",
        "amplification": "none",
    },
    "ldp-laplace": {
        "neighbouring": "user-level, replace-one: the client's whole dataset replaced by any other",
        "trust_model": "local: each client clips (L1) and noises its whole upload; the server "
                       "is not trusted",
        "amplification": "none: the server sees who took part",
    },
    "ldp-gaussian": {
        "neighbouring": "user-level, replace-one: the client's whole dataset replaced by any other",
        "trust_model": "local: each client clips (L2) and noises its whole upload; the server "
                       "is not trusted",
        "amplification": "none: the server sees who took part",
    },
    "paper": {
        "neighbouring": "none: the FedEM paper's heuristic eps bounds one SGD step, not a "
                        "client's E epochs; not a DP guarantee",
        "trust_model": "local: gradient clipping in training, Laplace noise on the upload",
        "amplification": "none",
    },
    "ldp-touched-rows": {
        "neighbouring": "none: INSECURE, the set of rows a client trained on is released in "
                        "the clear; no DP guarantee",
        "trust_model": "local: noise only on the rows the client trained",
        "amplification": "none",
    },
    "cdp-gaussian": {
        "neighbouring": "user-level: add/remove one client's whole data",
        "trust_model": "central: clipped deltas summed under secure aggregation (or by a "
                       "trusted server), Gaussian noise added once to the sum",
        "amplification": "Poisson sampling at rate q, claimed only against observers of the "
                         "released models; none against the aggregator",
    },
    "ldp-dpsgd": {
        "neighbouring": "interaction-level: add/remove one training interaction (a positive) "
                        "of one client",
        "trust_model": "local: each client trains with DP-SGD (per-positive clipping, Gaussian "
                       "noise on every entry of every step's gradient); the server is not "
                       "trusted and sees every upload",
        "amplification": "Poisson sampling of the client's own positives at each local step "
                         "(the server never sees which); none over clients: the server sees "
                         "who took part",
    },
}
OLD_SIZES_PUBLIC_CLAUSE = ("; each client's number of training interactions is declared public "
                           "(--sizes public) and not protected")
# what a guarantee's relation has said since the catalogue was declared public (issue 65)
CATALOGUE_CLAUSE = "; the item catalogue is public (fixed before any user's data is seen)"
GUARANTEED = ("ldp-laplace", "ldp-gaussian", "cdp-gaussian", "ldp-dpsgd")
OLD_DESCRIPTIONS: dict[str, str] = {
    "none": "no clipping, no noise: no privacy guarantee",
    "ldp-laplace": (
        "local DP (replace-one): L1-clip the delta to C, Laplace noise b = 2C/eps_round "
        "on every entry; eps_round-DP per round"
    ),
    "ldp-gaussian": (
        "local DP (replace-one): L2-clip the delta to C, Gaussian noise sigma = 2Cz "
        "on every entry; (eps, delta)-DP by accounting"
    ),
    "paper": (
        "FedEM paper's recipe: gradient clip Z in training, Laplace(lambda) on the upload; "
        "its eps = 2 p_u eta Z / lambda is the paper's HEURISTIC, not a DP guarantee"
    ),
    "ldp-touched-rows": (
        "INSECURE: like ldp-laplace but noise only on touched rows; the set of touched "
        "rows leaks, so there is no DP guarantee at any noise level"
    ),
    "cdp-gaussian": (
        "user-level central DP (DP-FedAvg, add/remove one client's data): Poisson sampling at "
        "rate q, L2-clip each delta to C, N(0, z^2 C^2) added once to the sum under secure "
        "aggregation, divided by q n; amplified eps for observers of the released models, "
        "unamplified eps for the aggregator"
    ),
    "ldp-dpsgd": (
        "interaction-level local DP (add/remove one positive): local DP-SGD, Poisson sample of "
        "positives at rate q_e per step, each positive's gradient L2-clipped to C, N(0, "
        "sigma^2 C^2) on every entry of every step's sum, data-independent negatives; "
        "(eps, delta) per client over all its steps by accounting"
    ),
}
# cli.privacy_text's old line for a run that spent eps 1.5 at delta 1e-5
OLD_CLI = {
    "ldp-laplace": "privacy: ldp-laplace (user-level local DP, replace-one; no amplification "
                   "claimed)  eps spent (worst client) 1.5 at delta 1e-05",
    "ldp-gaussian": "privacy: ldp-gaussian (user-level local DP, replace-one; no amplification "
                    "claimed)  eps spent (worst client) 1.5 at delta 1e-05",
    "ldp-dpsgd": "privacy: ldp-dpsgd (interaction-level local DP: one positive added or "
                 "removed; amplified only by sampling a client's own positives)  eps spent "
                 "(worst client) 1.5 at delta 1e-05",
    "ldp-touched-rows": "privacy: ldp-touched-rows  eps spent (worst client) 1.5 at delta "
                        "1e-05 (INSECURE: the touched rows leak at any eps)",
}


def test_builtins_are_registered_in_order():
    assert registry.names()[:7] == tuple(OLD_THREAT_MODELS)
    # mechanisms added since (dp-ftrl) come after the first seven, in BUILTIN's order
    assert tuple(registry.BUILTIN)[:7] == tuple(OLD_THREAT_MODELS)
    assert registry.names()[:len(registry.BUILTIN)] == tuple(registry.BUILTIN)


@pytest.mark.parametrize("mode", list(OLD_THREAT_MODELS))
def test_every_mechanism_describes_itself_as_before(mode):
    from fedem_private.privacy.config import MODE_DESCRIPTIONS, THREAT_MODELS

    mech = registry.mechanism_for(mode)
    assert mech.name == mode
    stated = dict(OLD_THREAT_MODELS[mode])
    if mode in GUARANTEED:  # a guarantee's relation now states the public catalogue
        stated["neighbouring"] += CATALOGUE_CLAUSE
    assert mech.describe() == stated
    assert THREAT_MODELS[mode] == stated
    assert mech.description == OLD_DESCRIPTIONS[mode] == MODE_DESCRIPTIONS[mode]
    public = dict(stated)
    if mode != "none":
        public["neighbouring"] += OLD_SIZES_PUBLIC_CLAUSE
    assert mech.describe(sizes_public=True) == public


@pytest.mark.parametrize("mode", list(OLD_CLI))
def test_the_cli_line_is_as_before(mode):
    from fedem_private.cli import privacy_text

    line = privacy_text({"mode": mode, "epsilon": {"reported": 1.5}, "delta": 1e-5})
    assert line == OLD_CLI[mode]


@pytest.mark.parametrize("mode", list(OLD_THREAT_MODELS))
def test_capabilities_match_the_old_mode_sets(mode):
    """The flags reproduce the old tuples (LDP_MODES, CENTRAL_MODES, DPSGD_MODES, the
    guarantee set, the no-budget set and --clip auto's modes)."""
    mech = registry.mechanism_for(mode)
    assert mech.ldp_upload == (mode in ("ldp-laplace", "ldp-gaussian", "ldp-touched-rows"))
    assert mech.central == (mode == "cdp-gaussian")
    assert mech.in_training == (mode == "ldp-dpsgd")
    assert mech.claims_guarantee == (mode in ("ldp-laplace", "ldp-gaussian", "cdp-gaussian",
                                              "ldp-dpsgd"))
    assert mech.takes_budget == (mode not in ("none", "paper"))
    assert mech.perturbs == (mode != "none")
    assert mech.accepts("clip_auto") == (mode in ("ldp-laplace", "ldp-gaussian"))
    assert mech.accepts("sample_rate") == (mode == "cdp-gaussian")
    assert mech.accepts("dpsgd_rate") == (mode == "ldp-dpsgd")


# the neighbour-world harness's old table: (norm, gap) per mode at clip C = 0.5, Z = 0.25
OLD_GAPS = {"none": None, "ldp-laplace": (1, 1.0), "ldp-gaussian": (2, 1.0), "paper": (1, 0.5),
            "ldp-touched-rows": (1, 1.0), "cdp-gaussian": (2, 0.5), "ldp-dpsgd": None}


@pytest.mark.parametrize("mode", list(OLD_GAPS))
def test_claimed_gap_is_the_old_sensitivity(mode):
    cfg = PrivacyConfig(mode=mode, clip=0.5, paper_clip=0.25,
                        **({} if mode in ("none", "paper") else {"noise_multiplier": 1.0}))
    assert registry.mechanism_for(mode).claimed_gap(cfg) == OLD_GAPS[mode]
