"""The configuration of a whole run: :class:`RunConfig`, what spans its sections, resolution
and the one check of a run (docs/design.md sections 9 and 15).

Every part the checks concern is asked for its capabilities (the registries' classes:
backbones, merges, codecs, aggregators, privacy mechanisms); no part is named here.
:mod:`~fedem_private.simulation.config` re-exports everything. This module imports the
sections and the presets and neither imports it back; the TOML reader
(:mod:`~fedem_private.simulation.config_io`) imports it (docs/design.md section 1: no import
circles). Importing it is light (no torch or pandas).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fedem_private.client.codec_kinds import codec_class, codecs_where
from fedem_private.client.strategies import merge_class, strategies_where
from fedem_private.data.attributes import ATTRIBUTE_DATASETS
from fedem_private.device import resolve as resolve_device
from fedem_private.errors import UserError
from fedem_private.models import backbone_class, backbones_where
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.registry import names, no_privacy
from fedem_private.server.registry import aggregator_class, aggregators_where
from fedem_private.simulation.presets import (
    PAPER_CODE_OPTIONS,
    UNBUILT_OPTIONS,
    auto_select_round,
    paper_code,
)
from fedem_private.simulation.sections import (
    BASELINE_METHODS,
    DEFAULT_RECORD_CLIENTS,
    METHOD_BACKBONE,
    METHOD_DEFAULTS,
    PROTOCOL_PRESETS,
    BaselineConfig,
    DataConfig,
    FederationConfig,
    RecordConfig,
    TrainConfig,
    _either,
    refuse_central,
)


def _full_codecs() -> str:
    """The codecs that upload the item table itself (no FedPEFT parameters), as a choice."""
    return _either(codecs_where("peft", False))


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run."""

    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)

    def validate(self) -> RunConfig:
        """Check every value and the composition of parts; returns self.

        A config from :meth:`resolved` was checked when it was resolved and is returned as
        is, so a run validates its configuration once, where it is built (the CLI, the API
        or a sweep), and everything downstream accepts it without checking again.
        """
        if _is_checked(self):
            return self
        self.data.validate()
        self.train.validate()
        self.federation.validate()
        self.privacy.validate()
        self.record.validate(self.train.rounds)
        self.baseline.validate(self.federation.resolved_method)
        if self.federation.resolved_method in BASELINE_METHODS:
            self._check_baseline()
        self.federation.check_composition()
        if self.train.early_stop_tol > 0:
            backbone = self.federation.resolved_backbone
            if not backbone_class(backbone).early_stop:
                raise UserError(f"--early-stop-tol is built for backbone "
                                f"{', '.join(backbones_where('early_stop'))}, not {backbone!r}")
            if codec_class(self.federation.codec).peft:
                raise UserError(f"--early-stop-tol stops training of the item table itself; "
                                f"codec {self.federation.codec!r} trains its own parameters; "
                                f"use --codec {_full_codecs()}")
        if self.train.optimizer != "adam":
            backbone = self.federation.resolved_backbone
            if self.train.optimizer not in backbone_class(backbone).optimizers:
                raise UserError(f"--optimizer {self.train.optimizer} is built for backbone "
                                f"{', '.join(backbones_where('optimizers', self.train.optimizer))}"
                                f", not {backbone!r}")
            if self.train.lr_user is not None and not backbone_class(backbone).user_embedding:
                raise UserError(f"--lr-user is the rate of a user embedding; backbone "
                                f"{backbone!r} has none")
            if codec_class(self.federation.codec).peft:
                raise UserError(f"--optimizer {self.train.optimizer} trains the item table "
                                f"itself; codec {self.federation.codec!r} trains its own "
                                f"parameters with Adam; use --codec {_full_codecs()}")
            if self.privacy.mechanism.in_training:
                raise UserError(f"privacy {self.privacy.mode!r} trains by its own DP-SGD "
                                f"steps; --optimizer {self.train.optimizer} is not built for "
                                f"it; drop --optimizer")
        if self.federation.merge_every != 1 and self.privacy.mode != "none":
            raise UserError(f"--merge-every is an ablation built without privacy; drop it or "
                            f"--privacy {self.privacy.mode}")
        if self.federation.prox_mu > 0 or self.federation.merge_rows != "all":
            if self.privacy.mechanism.in_training:
                raise UserError(f"privacy {self.privacy.mode!r} trains by its own DP-SGD steps "
                                f"from a start that must not depend on the client's data; "
                                f"--prox-mu and --merge-rows seen are not built for it")
            if self.federation.prox_mu > 0 and self.train.optimizer != "adam":
                raise UserError(f"--prox-mu is built for --optimizer adam, not "
                                f"{self.train.optimizer!r}")
        for token, section, name, _, default in PAPER_CODE_OPTIONS:
            if token in UNBUILT_OPTIONS and getattr(getattr(self, section), name) != default:
                raise UserError(f"{section}.{name}: the option is not built yet "
                                "(docs/design.md 2a)")
        mech = self.privacy.mechanism
        agg = self.federation.resolved_aggregation
        if mech.perturbs and not aggregator_class(agg).takes_uploads:
            raise UserError(f"privacy {self.privacy.mode!r} protects uploads, but aggregation "
                            f"{agg!r} (local) uploads nothing; use --privacy "
                            f"{_either(tuple(n for n in names() if no_privacy(n)))}")
        refuse_central(self.federation.resolved_aggregation, self.privacy.mode)
        if self.federation.agg_clients_ratio != 1 and mech.central:
            raise UserError(f"privacy {self.privacy.mode!r} adds its noise to the aggregate of "
                            f"all sampled clients; --agg-clients-ratio below 1 is not built "
                            f"for it")
        if (self.federation.peft_pretrain == "attributes"
                and self.data.dataset not in ATTRIBUTE_DATASETS):
            raise UserError(f"--peft-pretrain attributes: dataset {self.data.dataset} has no "
                            f"item attributes; they exist for {', '.join(ATTRIBUTE_DATASETS)}")
        if self.privacy.clip_auto and codec_class(self.federation.codec).peft:
            raise UserError(f"--clip auto measures full-table deltas before round 1, not codec "
                            f"{self.federation.codec!r}'s parameters; give --clip a number")
        if mech.in_training:
            self._check_dpsgd()
        if mech.central:
            if self.train.client_fraction != 1:
                raise UserError(f"privacy {self.privacy.mode!r} samples clients itself (Poisson, "
                                f"--sample-rate); leave --client-fraction at 1, got "
                                f"{self.train.client_fraction:g}")
        self._check_cohort()
        return self

    def _check_cohort(self) -> None:
        """``train.cohort_size`` sets the round's rate from the population's size; it
        stands in for ``--sample-rate`` or ``--client-fraction``, never beside them.
        ``train.client_tables = "global"`` needs a merge and an aggregator that read no
        client's own table (merge sr, one shared table, every upload's owner receives it);
        ``"sparse"`` keeps each client's table as its rows that differ from tables the
        server sent, so it needs one shared table that every participant receives, and
        full tables on the wire (no FedPEFT codec)."""
        tr, fed = self.train, self.federation
        if tr.cohort_size:
            if tr.client_fraction != 1:
                raise UserError("--cohort-size sets the round's share of clients; drop "
                                "--client-fraction")
            if self.privacy.sample_rate != 1 and "sample_rate" in self.privacy.mechanism.options:
                raise UserError("--cohort-size K sets the sampling rate K / n; drop "
                                "--sample-rate")
        if tr.client_tables == "global":
            agg = aggregator_class(fed.resolved_aggregation)
            if (merge_class(fed.resolved_merge).merges or not agg.one_table
                    or fed.agg_clients_ratio != 1):
                raise UserError(
                    f"--client-tables global: clients keep no item table, so they need merge "
                    f"sr and an aggregation that sends every client one shared table (got "
                    f"merge {fed.resolved_merge!r}, aggregation {fed.resolved_aggregation!r}, "
                    f"--agg-clients-ratio {fed.agg_clients_ratio:g})")
            if codec_class(fed.codec).peft:
                raise UserError(f"--client-tables global keeps full item tables on the server "
                                f"only; codec {fed.codec!r} is not built for it")
        if tr.client_tables == "sparse":
            agg = aggregator_class(fed.resolved_aggregation)
            if not agg.one_table or fed.agg_clients_ratio != 1:
                raise UserError(
                    f"--client-tables sparse keeps each client's rows that differ from the one "
                    f"table the server sends every participant, so it needs --aggregation "
                    f"{_either(aggregators_where('one_table'))} and --agg-clients-ratio 1 (got "
                    f"aggregation {fed.resolved_aggregation!r}, --agg-clients-ratio "
                    f"{fed.agg_clients_ratio:g})")
            if codec_class(fed.codec).peft:
                raise UserError(f"--client-tables sparse rebuilds full item tables from their "
                                f"rows; codec {fed.codec!r} trains its own parameters; use "
                                f"--codec {_full_codecs()}")

    def _check_baseline(self) -> None:
        """A baseline (docs/design.md §14) trains no federation: the parts that shape uploads,
        privacy modes of uploads and recording do not apply to it."""
        fed, method = self.federation, self.federation.resolved_method
        aggregation, merge = METHOD_DEFAULTS[method]  # the baseline's preset: no federation
        for name, value, default in (("--aggregation", fed.resolved_aggregation, aggregation),
                                     ("--merge", fed.resolved_merge, merge),
                                     ("--codec", fed.codec, FederationConfig.codec),
                                     ("--backbone", fed.resolved_backbone,
                                      METHOD_BACKBONE[method])):
            if value != default:
                raise UserError(f"method {method!r} is a non-federated baseline; {name} "
                                f"{value} does not apply to it")
        if self.privacy.mechanism.perturbs:
            what = ("set its budget with baseline.epsilon and baseline.architecture"
                    if method == "dp-mostpop" else "use --method dp-mostpop for a private one")
            raise UserError(f"method {method!r} uploads nothing; privacy {self.privacy.mode!r} "
                            f"does not apply ({what})")
        if self.record.rounds is not None:
            raise UserError(f"method {method!r} has no rounds or uploads to record; drop "
                            f"--record-rounds")

    def _check_dpsgd(self) -> None:
        """ldp-dpsgd's preconditions (:mod:`fedem_private.privacy.dpsgd`): everything that
        shapes the upload besides the noisy steps must be public or post-processing."""
        fed, mode = self.federation, self.privacy.mode
        if not backbone_class(fed.resolved_backbone).per_example_grads:
            raise UserError(f"privacy {mode!r} is built for backbone "
                            f"{', '.join(backbones_where('per_example_grads'))} (per-example "
                            f"gradients), not {fed.resolved_backbone!r}")
        merge, adapter_steps = fed.resolved_merge, self.privacy.dpsgd_adapter_steps
        part = merge_class(merge)
        if part.learned and not part.dpsgd_adapter:
            fit = (*strategies_where("learned", False), *strategies_where("dpsgd_adapter"))
            raise UserError(f"privacy {mode!r}: merge {merge!r} trains its adapter on the "
                            f"client's data without DP (no DP-SGD adapter for it), so the upload "
                            f"would not be DP; use --merge {', '.join(fit[:-1])} or {fit[-1]}")
        if part.dpsgd_adapter and adapter_steps < 1:
            raise UserError(f"privacy {mode!r} with merge {merge!r} trains the adapter by DP-SGD "
                            f"too: give --dpsgd-adapter-steps N (its steps are charged like the "
                            f"training's)")
        if not part.dpsgd_adapter and adapter_steps:
            raise UserError(f"--dpsgd-adapter-steps is for merge "
                            f"{', '.join(map(repr, strategies_where('dpsgd_adapter')))}, "
                            f"not {merge!r}")
        if part.dpsgd_adapter and fed.adapter_objective != "train":
            raise UserError(f"privacy {mode!r}: the DP-SGD adapter trains on Poisson samples of "
                            f"all positives; --adapter-objective holdout is not built for it")
        if part.dpsgd_adapter and fed.agg_clients_ratio != 1:
            raise UserError(f"privacy {mode!r} with merge {merge!r} is not built for "
                            f"--agg-clients-ratio below 1")
        if fed.merge_every_batch:
            raise UserError(f"privacy {mode!r} trains the adapter by its own DP-SGD steps; "
                            f"--merge-every-batch is not built for it")
        if codec_class(fed.codec).peft:
            raise UserError(f"privacy {mode!r} trains the item table itself; codec "
                            f"{fed.codec!r} is not built for it; use --codec {_full_codecs()}")
        if self.train.early_stop_tol > 0:
            raise UserError(f"privacy {mode!r} takes a fixed number of steps "
                            f"(--dpsgd-steps); a data-dependent early stop would leak; drop "
                            f"--early-stop-tol")

    def resolved(self) -> RunConfig:
        """Fill method-dependent defaults so the written config says what ran; the result
        is validated and marked checked (:meth:`validate` then returns it as is).

        ``train.device`` ``auto`` becomes ``cpu`` or ``cuda`` (the device that runs);
        ``cuda`` on a machine without one is a UserError (this imports torch, which
        a ``cpu`` config never does here).
        """
        if _is_checked(self):
            return self
        train = replace(self.train, device=resolve_device(self.train.device))
        fed = replace(self.federation, method=self.federation.resolved_method,
                      backbone=self.federation.resolved_backbone,
                      aggregation=self.federation.resolved_aggregation,
                      merge=self.federation.resolved_merge)
        data = self.data
        if data.protocol in PROTOCOL_PRESETS:
            data, train, fed = paper_code(data, train, fed)
        if train.select_round == "auto":
            train = replace(train, select_round=auto_select_round(fed.resolved_backbone))
        record = self.record
        if record.rounds is not None:
            rounds = ",".join(str(r) for r in record.parsed_rounds())
            record = replace(record, rounds=rounds,
                             clients=record.clients or DEFAULT_RECORD_CLIENTS)
        out = replace(self, data=data, train=train, federation=fed, record=record).validate()
        object.__setattr__(out, _CHECKED, True)  # not a field: dataclasses.replace drops it
        return out


# a resolved, checked RunConfig carries this attribute (not a dataclass field, so neither
# to_dict nor the run's identity sees it, and a copy changed by dataclasses.replace is new
# and unchecked)
_CHECKED = "_resolved_and_checked"


def _is_checked(cfg: RunConfig) -> bool:
    return bool(getattr(cfg, _CHECKED, False))


def with_cohort(cfg: RunConfig, n: int) -> RunConfig:
    """A resolved, checked ``cfg`` with ``train.cohort_size`` K turned into the rate the
    round's sampler uses over ``n`` clients: the Poisson rate (or cohort fraction)
    q = K / n of a mechanism that samples its own participants (its options include
    ``sample_rate``), else exactly K clients a round (``client_fraction`` K / n; the loop
    takes K itself). K 0: ``cfg`` itself. The result stays checked: the rate is derived,
    not a second setting beside the cohort."""
    k = cfg.train.cohort_size
    if not k:
        return cfg
    if k > n:
        raise UserError(f"--cohort-size {k} is more than the {n} clients")
    if "sample_rate" in cfg.privacy.mechanism.options:
        out = replace(cfg, privacy=replace(cfg.privacy, sample_rate=k / n))
    else:
        out = replace(cfg, train=replace(cfg.train, client_fraction=k / n))
    object.__setattr__(out, _CHECKED, True)
    return out
