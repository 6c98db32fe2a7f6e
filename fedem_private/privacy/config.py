"""Validated configuration of the privacy layer (docs/design.md section 5).

Budget fields, at most one of which may be set (an ldp mode needs one):

- ``epsilon``: total target over the planned rounds, met by calibration with
  ``accountant`` at ``delta`` (the worst case: a client taking part in every
  planned round).
- ``epsilon_round``: per-round budget. Laplace: b = 2C / epsilon_round.
  Gaussian: the noise multiplier z for which ONE round is
  (epsilon_round, delta)-DP (analytic Gaussian mechanism).
- ``noise_multiplier``: z = noise scale / sensitivity, with sensitivity 2C.
  Laplace: b = 2Cz (per-round eps = 1/z); Gaussian: sigma = 2Cz.

``epsilon = inf`` or ``epsilon_round = inf`` (or ``noise_multiplier = 0``)
means: clip the update but add no noise. The clipped upload then has no
finite privacy guarantee and every accountant reports eps = inf.

``cdp-gaussian`` (user-level central DP, docs/design.md section 5) differs: the
sensitivity of one client's clipped delta in the sum is C (add/remove one
client), so ``noise_multiplier`` is z = sigma / C; ``epsilon`` is the total
against observers of the released models, calibrated for T rounds of the
Poisson-subsampled Gaussian at ``sample_rate`` q with ``accountant`` (pld or
rdp); ``epsilon_round`` is refused. ``sample_rate`` applies to it only.

``ldp-dpsgd`` (interaction-level local DP, docs/design.md section 5) noises local
training instead of the upload: ``clip`` is C_e, the L2 bound of each
positive's gradient on all the client's trained parameters, the sensitivity
of a step's gradient sum under add/remove of one interaction;
``noise_multiplier`` is sigma (noise sigma C_e on every entry of every
step's sum); ``epsilon`` is the total per client over the planned rounds,
calibrated for rounds x ``dpsgd_steps`` Poisson-subsampled Gaussian steps at
rate ``dpsgd_rate``; ``epsilon_round`` is refused. The ``dpsgd_*`` fields
apply to it only (see :mod:`fedem_private.privacy.dpsgd`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedem_private.errors import UserError
from fedem_private.privacy import registry
from fedem_private.privacy.mech.base import DDP_OPTIONS, DPSGD_OPTIONS, FTRL_OPTIONS, Mechanism

# the settings of ldp-dpsgd alone (refused at a non-default value under any other mode)
DPSGD_FIELDS: tuple[str, ...] = DPSGD_OPTIONS
# the settings of dp-ftrl alone (refused at a non-default value under any other mode)
FTRL_FIELDS: tuple[str, ...] = FTRL_OPTIONS
# the settings of ddp-skellam alone (the same: refused at a non-default value elsewhere)
DDP_FIELDS: tuple[str, ...] = DDP_OPTIONS


def ddp_option_refused(name: str, mode: str) -> str:
    """The one-line refusal of ddp-skellam's option ``name`` under privacy ``mode``."""
    flag = "--" + name.replace("_", "-")
    return (f"{flag} (privacy.{name}) is for --privacy ddp-skellam (distributed DP under "
            f"secure aggregation), not privacy {mode!r}; drop it or choose ddp-skellam")

# What the server may know of each client's data size |D_u| (docs/design.md section 5, "What the
# server may use"): "private" (the default) keeps it from the server, whose weights are then
# uniform under every mode but none; "public" declares the sizes public, which lets FedAvg's
# |D_u| / sum |D| and the p_v term of equation 13 use them and narrows the relation printed
# (the mechanism's relation gains SIZES_PUBLIC_CLAUSE).
SIZES: tuple[str, ...] = ("private", "public")
ACCOUNTANTS: tuple[str, ...] = ("basic", "advanced", "rdp", "pld")
# accountants that handle Poisson subsampling (cdp-gaussian's calibration)
CENTRAL_ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")

# Views of the registry (docs/design.md section 5), built on first use: the mode names, the
# one-line description of each, and what each protects against whom (the neighbouring
# relation, the trust model and the amplification; every run writes its mode's entry into
# summary.json and results.csv). The mechanism classes in privacy/mech/ declare them.
_VIEWS = ("MODES", "MODE_DESCRIPTIONS", "THREAT_MODELS")


def __getattr__(name: str) -> Any:
    if name == "MODES":
        return registry.names()
    if name == "MODE_DESCRIPTIONS":
        return {n: registry.mechanism_for(n).description for n in registry.names()}
    if name == "THREAT_MODELS":
        return {n: registry.mechanism_for(n).describe() for n in registry.names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _number(name: str, value: Any) -> float:
    """Return value as a float; UserError unless it is a real number (not bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"privacy.{name} must be a number, got {value!r}")
    out = float(value)
    if math.isnan(out):
        raise UserError(f"privacy.{name} must be a number, got NaN")
    return out


@dataclass(frozen=True)
class PrivacyConfig:
    """Privacy settings of a run; validated on construction (raises UserError)."""

    mode: str = "none"
    epsilon: float | None = None
    epsilon_round: float | None = None
    delta: float = 1e-5
    clip: float = 1.0
    noise_multiplier: float | None = None
    paper_clip: float = 1.0
    paper_lambda: float = 0.1
    accountant: str = "pld"
    # --clip auto: C from a DP warm-up round (see fedem_private.privacy.clip_auto)
    clip_auto: bool = False
    clip_auto_epsilon: float | None = None  # None: 10% of a total epsilon
    clip_auto_min: float = 0.1
    clip_auto_max: float = 1e5
    # cdp-gaussian: each client takes part in a round independently with probability q
    sample_rate: float = 1.0
    # cdp-gaussian adaptive clipping (Andrew et al. 2021): the clip follows the target
    # quantile gamma of the participants' delta norms, C <- C exp(-clip_lr (b - gamma)),
    # b the noisy fraction unclipped; None keeps C fixed. clip_count_noise: std sigma_b of
    # the noise on the count (None: q n / 20, the paper's suggestion)
    clip_quantile: float | None = None
    clip_lr: float = 0.2
    clip_count_noise: float | None = None
    # cdp-gaussian private row selection (docs/design.md section 18): each round the
    # participants also add their normalised item indicators to the secure sum, released with
    # Gaussian noise; only the select_rows item rows with the largest noisy counts so far are
    # uploaded, noised and updated (0: every row). select_share: the counts' share of the
    # round's 1 / z^2 (the rest goes to the table)
    select_rows: int = 0
    select_share: float = 0.1
    # ... and at ranking: items never selected rank below the selected, by their noisy counts
    # (the two-stage recommender); False ranks every item by the model alone
    select_prior: bool = True
    # ... and within the selected rows, each item's score plus select_blend * log(1 + c_i)
    # for its running noisy count c_i (clamped at 0): private popularity blended into the
    # personalised re-ranker (0: the model alone among the selected)
    select_blend: float = 0.0
    # cdp-gaussian: canary clients of the one-shot audit (Andrew et al. 2024), this many
    # inserted and as many held out (0: no audit; see fedem_private.privacy.canaries)
    canaries: int = 0
    # ldp-dpsgd (see fedem_private.privacy.dpsgd): the Poisson rate q_e of a client's
    # positives per local step, local steps per round, negatives per step (uniform over the
    # catalogue, data-independent) and the local SGD learning rate
    dpsgd_rate: float = 0.1
    dpsgd_steps: int = 20
    dpsgd_negatives: int = 64
    dpsgd_lr: float = 4.0
    # ldp-dpsgd with merge em: DP-SGD steps of the merge adapter per round (charged like the
    # training's; 0 refuses em, see RunConfig.validate)
    dpsgd_adapter_steps: int = 0
    # the clients' data sizes: "private" (uniform server weights under any mode but none) or
    # "public" (declared public: size weights, and the printed relation says so); SIZES
    sizes: str = "private"
    # ddp-skellam (fedem_private/privacy/ddp.py): bits b of the modular sum, the scale gamma
    # (None: the largest that bounds wrap-around), the dropout fraction its noise tolerates
    # (each client adds noise for floor((1 - tolerance) K) clients) and the simulated
    # probability that a participant drops after selection
    ddp_bits: int = 16
    ddp_scale: float | None = None
    ddp_tolerance: float = 0.1
    dropout: float = 0.0
    # ddp-skellam: the clients' secrets (key pairs, mask seeds, rounding, noise shares) from
    # HKDF of this seed, which the simulated server is never given (a reproducible run);
    # None: from the OS (fedem_private/privacy/client_secrets.py)
    client_secret_seed: int | None = None
    # central mechanisms: the population size N of the server's public divisor q N (the
    # expected cohort), fixed before any data is seen; None: the run's number of users,
    # which the add/remove guarantee then takes as public
    public_population: int | None = None
    # dp-ftrl (fedem_private/privacy/ftrl.py, mf.py): the factorisation of the prefix sums,
    # "tree", "banded" or "blt" (dp_ftrl.STRATEGIES), a banded one's b (0: min(G, T)) and a
    # BLT's d buffers (0: blt.DEFAULT_BUFFERS); the participation, "cyclic" cohorts or
    # "poisson" (banded only: Poisson sampling within b-min-sep groups, amplified,
    # dp_ftrl.SAMPLINGS)
    ftrl_strategy: str = "tree"
    ftrl_bands: int = 0
    ftrl_buffers: int = 0
    ftrl_sampling: str = "cyclic"
    # local mechanisms (ldp-laplace, ldp-gaussian, ldp-touched-rows): each client uploads at
    # most this many times and declines later rounds (it enforces its own budget: the count
    # is public, a function of the keyed schedule, not of its data), so a total eps is
    # calibrated over min(T, k) releases, not T (0: no cap, every round)
    max_uploads: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def mechanism(self) -> type[Mechanism]:
        """The mechanism class of ``mode`` (UserError if no mechanism has that name)."""
        return registry.mechanism_for(self.mode)

    def validate(self) -> None:
        """Raise UserError with a one-line message if the settings are inconsistent."""
        mech = self.mechanism
        if self.accountant not in ACCOUNTANTS:
            raise UserError(
                f"unknown privacy accountant {self.accountant!r} "
                f"(choose one of {', '.join(ACCOUNTANTS)})"
            )
        for name in ("epsilon", "epsilon_round"):
            value = getattr(self, name)
            if value is not None and not _number(name, value) > 0:
                raise UserError(f"privacy.{name} must be > 0 (inf means no noise), got {value}")
        if self.noise_multiplier is not None:
            z = _number("noise_multiplier", self.noise_multiplier)
            if not (0 <= z < math.inf):
                raise UserError(f"privacy.noise_multiplier must be finite and >= 0, got {z}")
        delta = _number("delta", self.delta)
        if not 0 <= delta < 1:
            raise UserError(f"privacy.delta must be in [0, 1), got {delta}")
        for name in ("clip", "paper_clip", "paper_lambda"):
            value = _number(name, getattr(self, name))
            if not 0 < value < math.inf:
                raise UserError(f"privacy.{name} must be finite and > 0, got {value}")
        if self.sizes not in SIZES:
            raise UserError(f"unknown --sizes (privacy.sizes) {self.sizes!r}; choose one of "
                            f"{', '.join(SIZES)}")
        if self.sizes == "public" and mech.in_training:
            raise UserError(f"--sizes public: under privacy {self.mode!r} neighbours differ by "
                            f"one interaction, so |D_u| is what the relation protects; the "
                            f"server weights uniformly (drop --sizes)")
        if self.sizes == "public" and mech.central:
            raise UserError(f"--sizes public: privacy {self.mode!r} sums unweighted clipped "
                            f"deltas, so the sizes are never used (drop --sizes)")
        self._validate_budget()
        self._validate_clip_auto()
        self._validate_central()
        self._validate_dpsgd()
        self._validate_ddp_fields()
        self._validate_population()
        self._validate_ftrl_fields()
        self._validate_max_uploads()
        mech.validate(self)

    def _validate_max_uploads(self) -> None:
        k = self.max_uploads
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise UserError(f"--max-uploads (privacy.max_uploads) must be an integer >= 0, "
                            f"got {k!r}")
        if k and not self.mechanism.accepts("max_uploads"):
            raise UserError(f"--max-uploads is for the local mechanisms (a client enforcing "
                            f"its own budget), not privacy {self.mode!r}")

    def _validate_population(self) -> None:
        """``public_population``: a positive integer, for the mechanisms with a public
        divisor (cdp-gaussian, dp-ftrl, ddp-skellam)."""
        n = self.public_population
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"--public-population must be a positive integer, got {n!r}")
        if not self.mechanism.accepts("public_population"):
            raise UserError(f"--public-population is for the central mechanisms (cdp-gaussian, "
                            f"dp-ftrl, ddp-skellam), not privacy {self.mode!r}")

    def _validate_ftrl_fields(self) -> None:
        """dp-ftrl's strategy options: refused at a non-default value under another mode
        (their ranges are DpFtrl.validate's)."""
        changed = self._set_elsewhere(FTRL_FIELDS)
        if changed:
            flag = "--" + changed.replace("_", "-")
            raise UserError(f"{flag} (privacy.{changed}) is for --privacy dp-ftrl, not "
                            f"privacy {self.mode!r}")

    def _set_elsewhere(self, fields: tuple[str, ...] | list[str]) -> str | None:
        """The first of ``fields`` this mode's mechanism does not accept but which is set
        away from its default (it would silently do nothing), or None."""
        defaults = PrivacyConfig.__dataclass_fields__
        return next((n for n in fields if not self.mechanism.accepts(n)
                     and getattr(self, n) != defaults[n].default), None)

    def _validate_ddp_fields(self) -> None:
        """ddp-skellam's options set under another mode: refused in one line (they would
        silently do nothing; the command line also refuses them given at their default)."""
        changed = self._set_elsewhere(DDP_FIELDS)
        if changed:
            raise UserError(ddp_option_refused(changed, self.mode))

    def _validate_dpsgd(self) -> None:
        _number("dpsgd_rate", self.dpsgd_rate)
        _number("dpsgd_lr", self.dpsgd_lr)
        for name in ("dpsgd_steps", "dpsgd_negatives", "dpsgd_adapter_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"privacy.{name} must be an integer, got {value!r}")
        changed = None if self.mechanism.in_training else self._set_elsewhere(DPSGD_FIELDS)
        if changed:
            flag = "--" + changed.replace("_", "-")
            raise UserError(f"{flag} (privacy.{changed}) is for ldp-dpsgd, not privacy "
                            f"{self.mode!r}")
        # ldp-dpsgd's own ranges and budget: LdpDpsgd.validate, run last by validate()

    def validate_sampled_gaussian_budget(self, budget: str) -> None:
        """A subsampled-Gaussian mode (cdp-gaussian, ldp-dpsgd): calibrated from ``budget``
        (a total epsilon, or a noise multiplier), delta > 0, an accountant of sampling."""
        if self.epsilon_round is not None:
            raise UserError(f"privacy {self.mode!r} is calibrated from {budget}: give "
                            "privacy.epsilon or privacy.noise_multiplier, not epsilon_round")
        if self.epsilon is None and self.noise_multiplier is None:
            raise UserError(f"privacy mode {self.mode!r} needs a budget: set privacy.epsilon "
                            "or privacy.noise_multiplier")
        if not self.delta > 0:
            raise UserError(f"privacy mode {self.mode!r} needs delta > 0 (Gaussian noise gives "
                            "no pure DP)")
        if self.accountant not in CENTRAL_ACCOUNTANTS:
            raise UserError(f"privacy mode {self.mode!r} accounts Poisson subsampling with "
                            f"{' or '.join(CENTRAL_ACCOUNTANTS)}, not {self.accountant!r}")

    def _validate_adaptive_clip(self) -> None:
        if self.clip_quantile is None:
            return
        if not self.mechanism.accepts("clip_quantile"):
            raise UserError(f"--clip-quantile (adaptive clipping) is for cdp-gaussian, not "
                            f"privacy {self.mode!r}")
        gamma = _number("clip_quantile", self.clip_quantile)
        if not 0 < gamma < 1:
            raise UserError(f"--clip-quantile (privacy.clip_quantile) must be in (0, 1), "
                            f"got {gamma}")
        eta = _number("clip_lr", self.clip_lr)
        if not 0 < eta < math.inf:
            raise UserError(f"--clip-lr (privacy.clip_lr) must be finite and > 0, got {eta}")
        if self.clip_count_noise is not None:
            sb = _number("clip_count_noise", self.clip_count_noise)
            if not 0 < sb < math.inf:
                raise UserError(f"--clip-count-noise (privacy.clip_count_noise) must be finite "
                                f"and > 0, got {sb}")

    def _validate_select_rows(self) -> None:
        k = self.select_rows
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise UserError(f"--select-rows (privacy.select_rows) must be an integer >= 0, "
                            f"got {k!r}")
        share = _number("select_share", self.select_share)
        if not 0 < share < 1:
            raise UserError(f"--select-share (privacy.select_share) must be in (0, 1), "
                            f"got {share}")
        blend = _number("select_blend", self.select_blend)
        if not 0 <= blend < math.inf:
            raise UserError(f"--select-blend (privacy.select_blend) must be finite and >= 0, "
                            f"got {blend}")
        if blend and not (k and self.select_prior):
            raise UserError("--select-blend blends the row selection's noisy counts into the "
                            "ranking: it needs --select-rows K > 0 (and privacy.select_prior)")
        if k == 0:
            return
        if not self.mechanism.accepts("select_rows"):
            raise UserError(f"--select-rows (private row selection) is for cdp-gaussian, not "
                            f"privacy {self.mode!r}")
        if self.clip_quantile is not None or self.canaries:
            raise UserError("--select-rows is built for a fixed clip without the canary audit; "
                            "drop --clip-quantile and --canaries")

    def _validate_canaries(self) -> None:
        n = self.canaries
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise UserError(f"--canaries (privacy.canaries) must be an integer >= 0, got {n!r}")
        if n == 0:
            return
        if not self.mechanism.accepts("canaries"):
            raise UserError(f"--canaries audits the noisy aggregate of cdp-gaussian, not privacy "
                            f"{self.mode!r}")
        if n < 2:
            raise UserError("--canaries needs at least 2 (a Gaussian fit per group)")
        if self.clip_quantile is not None:
            raise UserError("--canaries is built for a fixed clip; drop --clip-quantile")

    def _validate_central(self) -> None:
        self._validate_canaries()
        q = _number("sample_rate", self.sample_rate)
        if not 0 < q <= 1:
            raise UserError(f"--sample-rate (privacy.sample_rate) must be in (0, 1], got {q}")
        self._validate_adaptive_clip()
        self._validate_select_rows()
        if not self.mechanism.central:
            if q != 1:
                raise UserError(f"--sample-rate (privacy.sample_rate) is the Poisson rate of "
                                f"cdp-gaussian; privacy {self.mode!r} does not sample (use "
                                f"--client-fraction)")
            return
        self.validate_sampled_gaussian_budget("a total budget")

    def _validate_clip_auto(self) -> None:
        if self.clip_auto_epsilon is not None:
            eps_w = _number("clip_auto_epsilon", self.clip_auto_epsilon)
            if not 0 < eps_w < math.inf:
                raise UserError(f"privacy.clip_auto_epsilon must be finite and > 0, got {eps_w}")
        low = _number("clip_auto_min", self.clip_auto_min)
        high = _number("clip_auto_max", self.clip_auto_max)
        if not 0 < low < high < math.inf:
            raise UserError(f"privacy.clip_auto_min and clip_auto_max must satisfy "
                            f"0 < min < max < inf, got {low:g} and {high:g}")
        if not self.clip_auto:
            return
        if not self.mechanism.accepts("clip_auto"):
            raise UserError(f"--clip auto (privacy.clip_auto) needs privacy mode ldp-laplace or "
                            f"ldp-gaussian, not {self.mode!r}")
        total = self.epsilon
        if self.clip_auto_epsilon is None and (total is None):
            raise UserError("--clip auto with a per-round budget needs "
                            "privacy.clip_auto_epsilon (the warm-up's own epsilon)")
        if total is not None and math.isfinite(total) and not self.warmup_epsilon < total:
            raise UserError(f"privacy.clip_auto_epsilon ({self.warmup_epsilon:g}) must be below "
                            f"the total epsilon ({total:g}): the warm-up is paid from it")

    @property
    def warmup_epsilon(self) -> float | None:
        """eps_w of the --clip auto warm-up: given, else 10% of a finite total epsilon,
        else 1 (a clip-only run: noised, but the run guarantees nothing anyway)."""
        if not self.clip_auto:
            return None
        if self.clip_auto_epsilon is not None:
            return float(self.clip_auto_epsilon)
        assert self.epsilon is not None
        return 0.1 * self.epsilon if math.isfinite(self.epsilon) else 1.0

    def _validate_budget(self) -> None:
        given = [n for n in ("epsilon", "epsilon_round", "noise_multiplier")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise UserError(
                f"privacy: give only one of epsilon, epsilon_round, noise_multiplier "
                f"(got {' and '.join(given)})"
            )
        mech = self.mechanism
        if not mech.takes_budget and given:
            what = mech.no_budget_reason
            raise UserError(
                f"privacy mode {self.mode!r} {what}: remove privacy.{given[0]} "
                "or choose an ldp mode"
            )
        if mech.ldp_upload and not given:
            raise UserError(
                f"privacy mode {self.mode!r} needs a budget: set privacy.epsilon, "
                "privacy.epsilon_round or privacy.noise_multiplier"
            )
        if mech.ldp_upload and self.adds_noise and self.delta == 0:
            if mech.noise_kind == "gaussian":
                raise UserError(
                    f"privacy mode {self.mode!r} needs delta > 0 (Gaussian noise gives no pure "
                    f"DP)"
                )
            if self.epsilon is not None and self.accountant != "basic":
                raise UserError(
                    f"privacy.delta = 0 (pure DP) needs accountant 'basic', "
                    f"not {self.accountant!r}"
                )

    @property
    def adds_noise(self) -> bool:
        """True when the mode adds noise (an ldp mode with a finite budget, or paper)."""
        if self.mechanism.fixed_noise:
            return True
        if not self.mechanism.takes_budget:
            return False
        if self.noise_multiplier is not None:
            return self.noise_multiplier > 0
        budget = self.epsilon if self.epsilon is not None else self.epsilon_round
        return budget is not None and math.isfinite(budget)

    @property
    def noise_kind(self) -> str | None:
        """"laplace", "gaussian" or None (mode none)."""
        return self.mechanism.noise_kind

    @property
    def sizes_visible(self) -> bool:
        """Whether the server may weight by the clients' true data sizes: with no mechanism,
        or when they are declared public (``sizes = "public"``)."""
        return not self.mechanism.perturbs or self.sizes == "public"

    def threat_model(self) -> dict[str, str]:
        """The mechanism's threat model (:meth:`Mechanism.describe`), its relation narrowed
        when the data sizes are declared public under a mechanism (the server then learns
        |D_u|)."""
        return self.mechanism.describe(sizes_public=self.sizes == "public")

    @property
    def description(self) -> str:
        """One-line description of the mode (says INSECURE / heuristic where it applies)."""
        return self.mechanism.description
