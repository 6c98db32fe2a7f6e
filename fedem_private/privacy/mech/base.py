"""The base class of a privacy mechanism (docs/design.md sections 5 and 15).

A mechanism is a class: what it is (its name, neighbouring relation, trust model,
claimed amplification and one-line description, printed in summary.json,
results.csv, the report and the CLI), what it can do (capability flags read by
the loop, the configuration and the tables instead of the mode's name), which
privacy options it accepts, and its hooks:

- :meth:`Mechanism.validate`: its own checks of a
  :class:`~fedem_private.privacy.config.PrivacyConfig` (the shared ones stay there);
  :meth:`Mechanism.notes`: what valid settings do that their user may not expect;
- :meth:`Mechanism.calibrate`: the config to its per-round
  :class:`~fedem_private.privacy.params.MechanismParams`;
- the client-side hook, on the upload (:meth:`Mechanism.release`) or inside local
  training (:meth:`Mechanism.train_chunk`, :meth:`Mechanism.train_adapter`);
- the server-side hook on the aggregate (:meth:`Mechanism.server_sum`, a secure sum
  that adds the noise once);
- :meth:`Mechanism.ledger_event`: what one round charges each participant.

Every hook is a class method: a mechanism holds no state of its own; the run's
state lives in :class:`~fedem_private.privacy.layer.PrivacyLayer`.

The configuration and the parameters ask the registry for their mechanism, so this module
names them by the protocols of :mod:`fedem_private.privacy.types` and imports neither
(docs/design.md section 1: no import circles); a mechanism's module may name them itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

if TYPE_CHECKING:
    import numpy as np
    import torch

    from fedem_private.privacy.bounds import RoundMechanism
    from fedem_private.privacy.central import SecureSum
    from fedem_private.privacy.types import PrivacySettings, RoundParams, RoundPrivacyStats

# The training hooks' backbone, parameters and DP-SGD statistics are typed Any here: naming
# models.base or privacy.dpsgd, even for the type checker, would put the models room on the
# attacks' import path (pyproject.toml's contracts); privacy/mech/ldp_dpsgd.py types them.
Backbone: TypeAlias = Any
ClientParams: TypeAlias = Any
DpsgdStats: TypeAlias = Any

# the clause every printed relation gains when the data sizes are declared public
SIZES_PUBLIC_CLAUSE = ("; each client's number of training interactions is declared public "
                       "(--sizes public) and not protected")
# the clause every stated relation carries (docs/design.md section 5, "public catalogue"):
# the item table, the negatives and every count vector are indexed by the catalogue, so the
# guarantees assume it does not depend on any user's data
CATALOGUE_PUBLIC_CLAUSE = "; the item catalogue is public (fixed before any user's data is seen)"


def stated_relation(neighbouring: str, *, guarantee: bool = True,
                    sizes_public: bool = False) -> str:
    """A neighbouring relation as printed: ``neighbouring``, plus
    :data:`CATALOGUE_PUBLIC_CLAUSE` when it backs a guarantee (``guarantee``; a mechanism
    without one states no relation to qualify), plus :data:`SIZES_PUBLIC_CLAUSE` when the
    data sizes are declared public. The one place the assumptions are appended, for every
    mechanism (:meth:`Mechanism.describe`) and DP-MostPop's four releases
    (:mod:`fedem_private.baselines.popularity`)."""
    out = neighbouring
    if guarantee:
        out += CATALOGUE_PUBLIC_CLAUSE
    if sizes_public:
        out += SIZES_PUBLIC_CLAUSE
    return out


# neighbouring relations (what two neighbouring datasets differ by)
NO_RELATION = "none"
REPLACE_ONE = "replace-one"  # user-level: one client's whole dataset replaced
ADD_REMOVE_CLIENT = "add-remove-client"  # user-level: one client's data present or absent
# user-level: one client's contribution present or replaced by zero, the client still
# taking part (its participation is public: ddp-skellam's fixed-size cohorts)
ZERO_OUT_CLIENT = "zero-out-client"
ADD_REMOVE_INTERACTION = "add-remove-interaction"  # one positive of one client

# privacy options, grouped by what they set (PrivacyConfig's field names)
SHARED_OPTIONS: tuple[str, ...] = ("delta", "accountant", "sizes")
UPLOAD_BUDGET: tuple[str, ...] = ("epsilon", "epsilon_round", "noise_multiplier")
UPLOAD_CAP: tuple[str, ...] = ("max_uploads",)
SAMPLED_BUDGET: tuple[str, ...] = ("epsilon", "noise_multiplier")
CLIP_AUTO_OPTIONS: tuple[str, ...] = ("clip_auto", "clip_auto_epsilon", "clip_auto_min",
                                      "clip_auto_max")
PAPER_OPTIONS: tuple[str, ...] = ("paper_clip", "paper_lambda")
CENTRAL_OPTIONS: tuple[str, ...] = ("sample_rate", "clip_quantile", "clip_lr",
                                    "clip_count_noise", "canaries")
DPSGD_OPTIONS: tuple[str, ...] = ("dpsgd_rate", "dpsgd_steps", "dpsgd_negatives", "dpsgd_lr",
                                  "dpsgd_adapter_steps")
FTRL_OPTIONS: tuple[str, ...] = ("ftrl_strategy", "ftrl_bands", "ftrl_buffers",
                                  "ftrl_sampling")
DDP_OPTIONS: tuple[str, ...] = ("ddp_bits", "ddp_scale", "ddp_tolerance", "dropout",
                                 "client_secret_seed")


def adversary_views(observer: tuple[str, float | None, str],
                    aggregator: tuple[str, float | None, str]) -> dict[str, dict[str, Any]]:
    """``summary.json``'s ``adversaries`` block (issue 77): for the observer of the released
    models and for the aggregator, (whom it is against, its eps or None, the basis)."""
    return {name: {"against": against, "epsilon": eps, "basis": basis}
            for name, (against, eps, basis) in (("observer", observer),
                                                 ("aggregator", aggregator))}


class Mechanism:
    """A privacy mechanism: self-description, capabilities, options and hooks.

    Subclasses set the class attributes below and override the hooks that apply
    to them; :func:`fedem_private.privacy.registry.register` makes one known by
    its ``name``.
    """

    # -- self-description (printed; docs/design.md section 5) --------------------------------
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    neighbouring: ClassVar[str] = ""
    trust_model: ClassVar[str] = ""
    amplification: ClassVar[str] = ""
    relation: ClassVar[str] = NO_RELATION
    # what the CLI's one line adds after the name, and appends at its end
    cli_clause: ClassVar[str] = ""
    cli_warning: ClassVar[str] = ""

    # -- capabilities ------------------------------------------------------------------------
    perturbs: ClassVar[bool] = True  # an upload (or the aggregate) can differ from training's
    central: ClassVar[bool] = False  # noise on the aggregate, under a secure sum
    in_training: ClassVar[bool] = False  # local training itself is the mechanism (DP-SGD)
    claims_guarantee: ClassVar[bool] = False  # a DP guarantee, whenever it adds noise
    nominal_only: ClassVar[bool] = False  # an eps it would give, not a guarantee (INSECURE)
    takes_budget: ClassVar[bool] = False  # noise calibrated from a budget and accounted
    ldp_upload: ClassVar[bool] = False  # clips and noises each upload (budget needed)
    fixed_noise: ClassVar[bool] = False  # noise set by an option of its own, always added
    paper_heuristic: ClassVar[bool] = False  # the FedEM paper's heuristic eps is reported
    noise_kind: ClassVar[str | None] = None  # "laplace", "gaussian" or None
    norm: ClassVar[str | None] = None  # the clip's norm, "l1" or "l2"; None: no delta clip
    no_budget_reason: ClassVar[str] = ""  # why a budget is refused (takes_budget False)
    options: ClassVar[tuple[str, ...]] = SHARED_OPTIONS  # the privacy options it accepts
    # the private floor it is judged against: dp-mostpop's architecture of the same
    # neighbouring relation and trust model (docs/baselines.md); None: no guarantee, no floor
    floor: ClassVar[str | None] = None
    # whether a private hyper-parameter search (fedem-private tune with [tune.private]) is
    # accounted under it: its relation and trust model are the ones privacy/tuning.py's
    # bounds compose with
    private_tuning: ClassVar[bool] = False

    # -- how the canary audit tests it (attacks/canary.py; docs/audits.md) -----------------
    audit_canaries: ClassVar[int] = 0  # canaries per audit (0: no canary design for it)
    audit_confidence: ClassVar[float] = 0.95  # the confidence its audit is stated at
    audit_gdp: ClassVar[bool] = False  # one Gaussian release per round: a GDP claim
    audit_at_delta: ClassVar[bool] = False  # audited at the run's delta (else pure eps)
    # what its audit's lower bound is compared with ("": the per-round eps it claims)
    audit_claim_kind: ClassVar[str] = ""

    @classmethod
    def audit_claim(cls, params: RoundParams) -> float | None:
        """The eps its canary audit's lower bound is held to when that is not the per-round
        claim (``audit_claim_kind`` says what it is); None: the per-round claim."""
        return None

    @classmethod
    def restore_params(cls, values: dict[str, Any]) -> dict[str, Any]:
        """A run log's parameter values (``MechanismParams.as_log``) with its own plan
        rebuilt from its log entry, for the audit to read them back; unchanged here."""
        return values

    @classmethod
    def listed(cls) -> list[tuple[str, str, str]]:
        """Rows ``fedem-private list`` prints for its own choices (kind, name, note), e.g.
        dp-ftrl's strategies; none here."""
        return []

    @classmethod
    def accepts(cls, option: str) -> bool:
        """Whether the privacy option ``option`` (a PrivacyConfig field) applies to it."""
        return option in cls.options

    @classmethod
    def describe(cls, sizes_public: bool = False) -> dict[str, str]:
        """The printed threat model: neighbouring relation, trust model, amplification.

        A mechanism that claims a guarantee states its relation with the assumption that
        the item catalogue is public (:data:`CATALOGUE_PUBLIC_CLAUSE`, via
        :func:`stated_relation`); one without a guarantee states none to qualify. With the
        data sizes declared public under a mechanism that perturbs, the relation gains
        :data:`SIZES_PUBLIC_CLAUSE` (the server then learns |D_u|).
        """
        neighbouring = stated_relation(cls.neighbouring, guarantee=cls.claims_guarantee,
                                       sizes_public=cls.perturbs and sizes_public)
        return {"neighbouring": neighbouring, "trust_model": cls.trust_model,
                "amplification": cls.amplification}

    @classmethod
    def description_for(cls, params: RoundParams) -> str:
        """The one-line description of a run with ``params``: :attr:`description` unless
        its settings change what the mechanism is (dp-ftrl's Poisson sampling)."""
        return cls.description

    @classmethod
    def run_clause(cls, privacy: dict[str, Any]) -> str:
        """The CLI's clause after the name for a finished run's privacy block (``privacy``:
        its ``summary.json`` entry); :attr:`cli_clause` unless a run's settings change it."""
        return cls.cli_clause

    # -- configuration -----------------------------------------------------------------------
    @classmethod
    def validate(cls, cfg: PrivacySettings) -> None:
        """Its own checks of ``cfg`` beyond the shared ones (UserError, one line)."""

    @classmethod
    def notes(cls, cfg: PrivacySettings, rounds: int) -> list[tuple[str, str]]:
        """What valid settings do that their user may not expect, as ("warning" | "note",
        one line) pairs, said before the run (the CLI prints them on stderr); none here."""
        return []

    @classmethod
    def calibrate(cls, cfg: PrivacySettings, rounds: int,
                  n_clients: int | None = None) -> RoundParams:
        """Its per-round parameters for ``rounds`` planned rounds (docs/design.md section 5)."""
        raise NotImplementedError(f"mechanism {cls.name!r} has no calibration")

    @classmethod
    def claimed_gap(cls, cfg: PrivacySettings) -> tuple[int, float] | None:
        """(norm p, bound) its claim puts on the L_p gap between one client's releases in
        two neighbouring worlds (what the neighbour-world harness checks); None: none."""
        return None

    # -- client-side hooks -------------------------------------------------------------------
    @classmethod
    def release(cls, params: RoundParams, sent: torch.Tensor, local: torch.Tensor, *,
                seed: int, round_: int, clients: np.ndarray,
                touched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoundPrivacyStats]:
        """The client-side hook on the upload: (k, ...) released tables and the stats."""
        raise RuntimeError(f"mechanism {cls.name!r} releases no upload")

    @classmethod
    def local_grad_clip(cls, cfg: PrivacySettings) -> float | None:
        """A gradient clip for ordinary local training (None: none)."""
        return None

    @classmethod
    def train_chunk(cls, params: RoundParams, backbone: Backbone, start: ClientParams,
                    clients: np.ndarray, pos_indptr: np.ndarray, pos_items: np.ndarray,
                    num_negatives: int, seed: int, round_: int
                    ) -> tuple[ClientParams, DpsgdStats]:
        """The client-side hook inside local training (``in_training`` mechanisms)."""
        raise RuntimeError(f"mechanism {cls.name!r} does not train")

    @classmethod
    def train_adapter(cls, params: RoundParams, backbone: Backbone,
                      private: dict[str, torch.Tensor], weights: tuple[torch.Tensor, ...],
                      biases: tuple[torch.Tensor, ...], q_local: torch.Tensor,
                      q_global: torch.Tensor, clients: np.ndarray, pos_indptr: np.ndarray,
                      pos_items: np.ndarray, num_negatives: int, seed: int, round_: int
                      ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], DpsgdStats]:
        """The client-side hook inside the EM adapter's training (``in_training``)."""
        raise RuntimeError(f"mechanism {cls.name!r} does not train an adapter")

    # -- server-side hook --------------------------------------------------------------------
    @classmethod
    def server_sum(cls, params: RoundParams, cfg: PrivacySettings, seed: int,
                   expected_count: float) -> SecureSum | None:
        """The server-side hook: the secure sum that noises the aggregate (central
        mechanisms); None for a mechanism on each upload."""
        return None

    # -- accounting --------------------------------------------------------------------------
    @classmethod
    def guaranteed_event(cls, params: RoundParams) -> RoundMechanism:
        """One round's accounted mechanism when it guarantees something: the noise of
        ``params`` at its multiplier."""
        from fedem_private.privacy.bounds import RoundMechanism

        assert params.noise_kind is not None and params.noise_multiplier is not None
        return RoundMechanism(params.noise_kind, params.noise_multiplier)

    @classmethod
    def nominal_event(cls, params: RoundParams) -> RoundMechanism | None:
        """The mechanism it would be were its leak public (``nominal_only``); else None."""
        return None

    @classmethod
    def ledger_event(cls, params: RoundParams) -> RoundMechanism | None:
        """What one round charges each participant in the ledger: the guaranteed
        mechanism, else the nominal one, else None (nothing claimed)."""
        return params.round_mechanism() or cls.nominal_event(params)

    @classmethod
    def heuristic_epsilon(cls, cfg: PrivacySettings, sizes: np.ndarray, lr: float,
                          clients: np.ndarray) -> np.ndarray | None:
        """A per-client heuristic eps of the round, reported beside the ledger (None)."""
        return None

    # -- the guarantee per adversary (summary.json's ``adversaries``; issue 77) ---------------
    #: what the simulated server holds beyond the released values (docs/privacy.md's table)
    server_knows: ClassVar[str] = (
        "the run seed (so every key of the server's randomness), the public parameters, who "
        "took part, and every upload it receives")

    @classmethod
    def adversaries(cls, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The guarantee against each adversary, computed from the run's ``summary`` (its
        accounted figures): the observer of the released models, and the aggregator (the
        server that receives the uploads). A local mechanism gives both the same: the
        aggregator sees exactly the released uploads. No guarantee: both None."""
        eps = (summary.get("epsilon") or {}).get("reported") if cls.claims_guarantee else None
        reason = ("" if cls.claims_guarantee else
                  "no guarantee: the mechanism claims none (a nominal or heuristic figure at "
                  "most, reported beside)")
        return adversary_views(
            ("observers of the released models and uploads", eps,
             reason or "the accounted per-client eps (worst client; no amplification over "
             "clients)"),
            ("the aggregator: receives every client's released upload, knows who took part",
             eps, reason or "local DP: it sees only the noised uploads, so its guarantee is "
             "the observer's"))
