"""Typed, validated run configuration: TOML files plus command-line overrides.

A run is described by one :class:`RunConfig` with sections ``[data]``,
``[data.synthetic]``, ``[train]``, ``[federation]``, ``[privacy]`` and
``[record]`` (what is recorded for the attacks). Every value is checked before
anything runs; a bad value is a :class:`UserError` with one line naming the key.
The resolved config a run writes (``config.toml``) re-creates the run,
recording included.

Importing this module is light (no torch or pandas): the command line checks
its arguments before the heavy libraries load.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

from fedem_private.data import DATASETS, PROTOCOLS, RATED_DATASETS, SyntheticConfig
from fedem_private.data.attributes import ATTRIBUTE_DATASETS
from fedem_private.device import check_name as check_device
from fedem_private.device import resolve as resolve_device
from fedem_private.errors import UserError
from fedem_private.models import REGISTRY, backbone_class, backbones_where
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.registry import mechanism_for

FEDERATED_METHODS = ("fedmf", "fedsim", "fedem", "local", "fedncf", "pfedrec", "gpfedrec",
                     "fedrap", "fedmerge")
# non-federated references on the same split, protocol and evaluation (docs/design.md section 14,
# fedem_private.baselines): no rounds, no uploads; each scores every (user, item) at once
BASELINE_METHODS = ("mostpop", "dp-mostpop", "centralised", "ease", "als")
METHODS = (*FEDERATED_METHODS, *BASELINE_METHODS)
# dp-mostpop's privacy architectures: user-level central (Gaussian on the secure sum),
# user-level local (optimal unary encoding), interaction-level (Laplace on each count, once
# centrally, or by every client on its own counts)
DP_MOSTPOP_ARCHITECTURES = ("central", "local", "interaction", "interaction-local")
CODECS = ("full", "lora", "hash", "rqvae", "c-lora", "c-hash", "c-rqvae")
# FedPEFT's initial item table: random ("none") or an autoencoder over item attributes
PEFT_PRETRAINS = ("none", "attributes")
# aggregations with one global table that a codec's averaged parameters decode to
PEFT_AGGREGATIONS = ("fedavg", "uniform")
AGGREGATIONS = ("fedavg", "uniform", "similarity", "graph", "fedmerge", "none")
# aggregations that need each client's upload, not only a sum: refused under central DP
EACH_UPLOAD_AGGREGATIONS = ("similarity", "graph", "fedmerge")
# aggregations that can aggregate a random share of the uploads (--agg-clients-ratio; the
# FedEM code's agg_clients_ratio, docs/design.md 2a): its similarity aggregation, and (not in any
# published code) the sums and GPFedRec's graph, to ask what the share does to their +EM
SAMPLED_AGGREGATIONS = ("similarity", "fedavg", "uniform", "graph")
MERGES = ("sr", "sm", "dm", "em")
LEARNED_MERGES = ("dm", "em")  # merges with an adapter (equations 9 and 11)
# what the adapter trains on: the round's training samples, or a withheld fold of them
ADAPTER_OBJECTIVES = ("train", "holdout")
# method (a preset) -> (aggregation, merge); FedSim is FedMF with similarity aggregation
# (paper, Table 2). A preset's parts are defaults: --backbone, --merge, --aggregation and
# --codec override them one by one (docs/design.md section 9).
METHOD_DEFAULTS = {
    "fedmf": ("fedavg", "sr"),
    "fedsim": ("similarity", "sr"),
    "fedem": ("similarity", "em"),
    "local": ("none", "sr"),
    "fedncf": ("fedavg", "sr"),
    "pfedrec": ("fedavg", "sr"),
    "gpfedrec": ("graph", "sr"),
    "fedrap": ("uniform", "sr"),  # the published plain mean of the common tables
    "fedmerge": ("fedmerge", "sr"),  # K global tables merged per client (docs/design.md section 12)
    **{name: ("none", "sr") for name in BASELINE_METHODS},  # nothing is uploaded
}
# docs/design.md 2a: the authors' code's facts, each a named option of the `paper` protocol
SELECT_ROUNDS = ("last", "best-test", "best-val", "auto")
SIMILARITIES = ("eq13", "pca")
# datasets with timestamps: --first-seen-order does not apply to them
TIMED_DATASETS = ("ml-100k", "ml-1m", "synthetic")
PROTOCOL_PRESETS = ("paper-code",)
PROTOCOLS_ALL = (*PROTOCOLS, *PROTOCOL_PRESETS)
# method -> its backbone (docs/design.md section 10)
METHOD_BACKBONE = {"fedmf": "mf", "fedsim": "mf", "fedem": "mf", "local": "mf",
                   "fedncf": "ncf", "pfedrec": "pfedrec", "gpfedrec": "gpfedrec",
                   "fedrap": "fedrap", "fedmerge": "mf",
                   **{name: "mf" for name in BASELINE_METHODS}}
# backbone -> the preset named after it, used when --backbone is given without --method
BACKBONE_METHOD = {"mf": "fedmf", "ncf": "fedncf", "pfedrec": "pfedrec",
                   "gpfedrec": "gpfedrec", "fedrap": "fedrap"}


@dataclass(frozen=True)
class DataConfig:
    """Which data and which evaluation protocol (docs/design.md section 2)."""

    dataset: str = "synthetic"
    data_dir: str | None = None
    protocol: str = "strict"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # implicit positives: None keeps every rated pair; R keeps the pairs rated >= R
    min_rating: float | None = None
    # docs/design.md 2a, option 1: users with fewer positives are dropped (the authors' code: 10)
    min_user_ratings: int = 3
    # docs/design.md 2a, option 2: a dataset without timestamps orders each user's interactions by
    # the order in which each item first appears in the file (not a seeded random order)
    first_seen_order: bool = False
    # docs/design.md 2a, option 3: ONE set of 99 sampled negatives ranks both the validation and the
    # test item (instead of a separate draw for validation)
    shared_eval_negatives: bool = False

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise UserError(f"unknown dataset {self.dataset!r}; choose one of "
                            f"{', '.join(DATASETS)}")
        if self.min_rating is not None:
            if not math.isfinite(self.min_rating):
                raise UserError(f"--min-rating (data.min_rating) must be a finite number, "
                                f"got {self.min_rating}")
            if self.dataset not in RATED_DATASETS:
                raise UserError(f"--min-rating (data.min_rating): dataset {self.dataset} has no "
                                f"ratings; it applies to {', '.join(RATED_DATASETS)}")
        if self.protocol not in (*PROTOCOLS, *PROTOCOL_PRESETS):
            raise UserError(f"unknown protocol {self.protocol!r}; choose one of "
                            f"{', '.join((*PROTOCOLS, *PROTOCOL_PRESETS))}")
        if self.min_user_ratings < 3:
            raise UserError(f"--min-user-ratings (data.min_user_ratings) must be an integer "
                            f">= 3 (a test, a validation and a training item), got "
                            f"{self.min_user_ratings}")
        if self.first_seen_order and self.dataset in TIMED_DATASETS:
            raise UserError(f"--first-seen-order orders datasets without timestamps; dataset "
                            f"{self.dataset} has timestamps")
        self.synthetic.validate()


@dataclass(frozen=True)
class TrainConfig:
    """Local training and the round loop (paper defaults: d=16, E=10, B=256, T=100)."""

    rounds: int = 50
    local_epochs: int = 10
    lr: float = 0.1
    batch_size: int = 256
    dim: int = 16
    num_negatives: int = 4
    init_std: float = 0.1
    client_fraction: float = 1.0
    seed: int = 0
    eval_every: int = 1
    memory_budget_mb: int = 2048
    # where the heavy tensors live: cpu, cuda, or auto (cuda when available);
    # :meth:`RunConfig.resolved` turns auto into what it means on this machine
    device: str = "cpu"
    # docs/design.md 2a, option 4: which evaluated round summary.json / results.csv also report
    # (the last round stays the headline): "last" (off), "best-test" (best sampled test
    # HR@10: the FedEM and FedRAP code), "best-val" (best validation HR@10: PFedRec,
    # GPFedRec), "auto" (the backbone's own code's rule)
    select_round: str = "last"
    # docs/design.md 2a, option 8: a client stops local training when the relative change of its
    # epoch loss is below this (0: off; the authors' code: 1e-4)
    early_stop_tol: float = 0.0
    # local training's optimiser: "adam" (the default, every backbone) or "sgd" (plain
    # torch.optim.SGD, no momentum: the published PFedRec, FedRAP and GPFedRec codes';
    # the backbones whose Backbone.optimizers has it). The next five apply to sgd only:
    # the rates of the private head or MLP and of the user embedding (None: lr; lr itself
    # is the item tables'), L2 weight decay on every trained tensor (whole tables
    # included), the rates' factor after every local step (an ExponentialLR stepped per
    # batch) and per round (round t: factor^(t-1))
    optimizer: str = "adam"
    lr_head: float | None = None
    lr_user: float | None = None
    weight_decay: float = 0.0
    lr_batch_decay: float = 1.0
    lr_round_decay: float = 1.0

    def validate(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "dim", "num_negatives",
                     "eval_every", "memory_budget_mb"):
            if getattr(self, name) < 1:
                raise UserError(f"train.{name} must be a positive integer, "
                                f"got {getattr(self, name)}")
        for name in ("lr", "init_std"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"train.{name} must be a positive number, got {value}")
        if not 0 < self.client_fraction <= 1:
            raise UserError(f"train.client_fraction must be in (0, 1], got {self.client_fraction}")
        if self.select_round not in SELECT_ROUNDS:
            raise UserError(f"unknown --select-round (train.select_round) "
                            f"{self.select_round!r}; choose one of {', '.join(SELECT_ROUNDS)}")
        if not (math.isfinite(self.early_stop_tol) and 0 <= self.early_stop_tol < 1):
            raise UserError(f"--early-stop-tol (train.early_stop_tol) must be in [0, 1), "
                            f"got {self.early_stop_tol}")
        check_device(self.device)
        self._validate_optimizer()

    def _validate_optimizer(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"unknown --optimizer (train.optimizer) {self.optimizer!r}; choose "
                            f"one of {', '.join(OPTIMIZERS)}")
        for name in ("lr_head", "lr_user"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UserError(f"--{name.replace('_', '-')} (train.{name}) must be a positive "
                                f"number, got {value}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UserError(f"--weight-decay (train.weight_decay) must be >= 0, got "
                            f"{self.weight_decay}")
        for name in ("lr_batch_decay", "lr_round_decay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise UserError(f"--{name.replace('_', '-')} (train.{name}) must be in (0, 1], "
                                f"got {value}")
        if self.optimizer != "sgd":
            changed = [n for n, d in SGD_FIELDS.items() if getattr(self, n) != d]
            if changed:
                raise UserError(f"--{changed[0].replace('_', '-')} (train.{changed[0]}) is a "
                                f"setting of --optimizer sgd, not {self.optimizer!r}")


#: local optimisers; each backbone builds those of its ``Backbone.optimizers``
OPTIMIZERS = ("adam", "sgd")
#: the settings of --optimizer sgd alone, with their defaults
SGD_FIELDS: dict[str, Any] = {"lr_head": None, "lr_user": None, "weight_decay": 0.0,
                              "lr_batch_decay": 1.0, "lr_round_decay": 1.0}


@dataclass(frozen=True)
class FederationConfig:
    """A method as a composition (docs/design.md §9): preset, backbone, merge, codec, aggregator.

    ``method`` names a preset; every other part left ``None`` takes the
    preset's choice. With only ``backbone`` given, the preset is the one named
    after that backbone (``--backbone pfedrec --merge em`` is PFedRec+EM).
    """

    method: str | None = None  # None: the backbone's own preset (fedmf for mf)
    backbone: str | None = None  # None: the method's backbone
    aggregation: str | None = None  # None: the method's default
    merge: str | None = None  # None: the method's default
    codec: str = "full"
    graph_threshold: float = 1.0  # graph: neighbours above this times the mean similarity
    graph_topk: int = 0  # graph: k most similar users instead (0: threshold mode)
    graph_layers: int = 1  # graph: propagation steps
    gpfedrec_reg: float = 1.0  # GPFedRec: weight of the MSE toward the personalised table
    fedrap_lambda: float = 0.1  # FedRAP: weight of -MSE(personal, common)
    fedrap_mu: float = 0.1  # FedRAP: weight of the L1 sparsity of the common table
    merge_k: int = 4  # fedmerge: number K of global item tables
    fedmerge_steps: int = 10  # fedmerge: gradient steps of the server fit per round
    fedmerge_lr: float = 1.0  # fedmerge: the fit's step, in units of 1/L (section 12)
    server_lr: float = 1.0  # sum aggregators: G += lr * m on the aggregate's pseudo-gradient
    server_momentum: float = 0.0  # m = beta m + (aggregate - G) (FedAvgM)
    peft_warmup: int = 2  # FedPEFT: W rounds of full-table training before E0 freezes
    peft_pretrain: str = "none"  # FedPEFT: "attributes" starts from an AE over item attributes
    lora_rank: int = 4  # lora: k_L
    hash_size: int = 512  # hash: d_H
    hash_functions: int = 2  # hash: h
    hash_senet: int = 0  # hash: 0 mean pooling; r > 0 a SENet of hidden width r * h
    rq_levels: int = 3  # rqvae: l
    rq_codebook: int = 128  # rqvae: d_R
    peft_init: str = "normal"  # hash / rqvae: theta ~ N(0, s^2) ("normal") or 0 ("zero")
    alpha: float = 0.9
    rho: float = 0.5
    adapter_lr: float = 0.1
    adapter_epochs: int = 1
    # what the merge adapter trains on (equation 11): "train", the round's training samples
    # (as published), or "holdout", a rotating fold withheld from local training
    adapter_objective: str = "train"
    adapter_folds: int = 5  # holdout: F folds of each client's positives
    # docs/design.md 2a, option 5: similarity aggregation over a random share of the round's uploads
    # (the authors' code: agg_clients_ratio = 0.1); only those clients get a new table
    agg_clients_ratio: float = 1.0
    # docs/design.md 2a, option 6: "eq13" (the paper's equation 13) or "pca" (the authors' code:
    # 1-D PCA of each table, 1 / (1 + L2), > 0.9 -> 1, projection of p + alpha s)
    similarity: str = "eq13"
    # docs/design.md 2a, option 7: merge on every local batch and evaluate the merged table
    merge_every_batch: bool = False

    def validate(self) -> None:
        if self.method is not None and self.method not in METHODS:
            raise UserError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.backbone is not None and self.backbone not in REGISTRY:  # live: a test may add
            raise UserError(f"unknown backbone {self.backbone!r}; choose one of "
                            f"{', '.join(REGISTRY)}")
        if self.codec not in CODECS:
            raise UserError(f"unknown codec {self.codec!r}; available: {', '.join(CODECS)}")
        for name in ("graph_threshold", "gpfedrec_reg", "fedrap_lambda", "fedrap_mu"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UserError(f"federation.{name} must be a number >= 0, got {value}")
        if self.peft_pretrain not in PEFT_PRETRAINS:
            raise UserError(f"unknown --peft-pretrain (federation.peft_pretrain) "
                            f"{self.peft_pretrain!r}; choose one of {', '.join(PEFT_PRETRAINS)}")
        if not (math.isfinite(self.server_lr) and self.server_lr > 0):
            raise UserError(f"--server-lr (federation.server_lr) must be a positive number, "
                            f"got {self.server_lr}")
        if not 0 <= self.server_momentum < 1:
            raise UserError(f"--server-momentum (federation.server_momentum) must be in [0, 1), "
                            f"got {self.server_momentum}")
        if self.peft_init not in ("normal", "zero"):
            raise UserError(f"--peft-init (federation.peft_init) must be normal or zero, "
                            f"got {self.peft_init!r}")
        if self.peft_warmup < 0:
            raise UserError(f"--peft-warmup (federation.peft_warmup) must be >= 0, "
                            f"got {self.peft_warmup}")
        for name in ("lora_rank", "hash_size", "hash_functions", "rq_levels", "rq_codebook"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} (federation.{name}) must be a "
                                f"positive integer, got {getattr(self, name)}")
        if self.hash_senet < 0:
            raise UserError(f"--hash-senet (federation.hash_senet) must be 0 (mean pooling) "
                            f"or a positive expansion ratio, got {self.hash_senet}")
        if self.hash_senet and self.codec not in ("hash", "c-hash"):
            raise UserError(f"--hash-senet weights the hash codec's vectors; it needs --codec "
                            f"hash or c-hash, not {self.codec!r}")
        if self.graph_topk < 0 or self.graph_layers < 1:
            raise UserError("federation.graph_topk must be >= 0 and graph_layers >= 1")
        if self.merge_k < 1:
            raise UserError(f"--merge-k (federation.merge_k) must be a positive integer, "
                            f"got {self.merge_k}")
        if self.fedmerge_steps < 1:
            raise UserError(f"--fedmerge-steps (federation.fedmerge_steps) must be a positive "
                            f"integer, got {self.fedmerge_steps}")
        if not (math.isfinite(self.fedmerge_lr) and 0 < self.fedmerge_lr <= 1):
            raise UserError(f"--fedmerge-lr (federation.fedmerge_lr) must be in (0, 1] (the "
                            f"step in units of 1/L), got {self.fedmerge_lr}")
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise UserError(f"unknown aggregation {self.aggregation!r}; choose one of "
                            f"{', '.join(AGGREGATIONS)}")
        if self.merge is not None and self.merge not in MERGES:
            raise UserError(f"unknown merge {self.merge!r}; choose one of {', '.join(MERGES)}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise UserError(f"federation.alpha must be >= 0, got {self.alpha}")
        if not 0 <= self.rho <= 1:
            raise UserError(f"federation.rho must be in [0, 1], got {self.rho}")
        if not (math.isfinite(self.adapter_lr) and self.adapter_lr > 0):
            raise UserError(f"federation.adapter_lr must be positive, got {self.adapter_lr}")
        if self.adapter_epochs < 1:
            raise UserError("federation.adapter_epochs must be a positive integer")
        if self.adapter_objective not in ADAPTER_OBJECTIVES:
            raise UserError(f"unknown adapter objective {self.adapter_objective!r}; choose one "
                            f"of {', '.join(ADAPTER_OBJECTIVES)}")
        if not 0 < self.agg_clients_ratio <= 1:
            raise UserError(f"--agg-clients-ratio (federation.agg_clients_ratio) must be in "
                            f"(0, 1], got {self.agg_clients_ratio}")
        if self.similarity not in SIMILARITIES:
            raise UserError(f"unknown --similarity (federation.similarity) "
                            f"{self.similarity!r}; choose one of {', '.join(SIMILARITIES)}")
        if self.adapter_folds < 2:
            raise UserError(f"--adapter-folds (federation.adapter_folds) must be an integer "
                            f">= 2, got {self.adapter_folds}")

    @property
    def resolved_method(self) -> str:
        return self.method or BACKBONE_METHOD[self.backbone or "mf"]

    @property
    def resolved_backbone(self) -> str:
        return self.backbone or METHOD_BACKBONE[self.resolved_method]

    @property
    def resolved_aggregation(self) -> str:
        return self.aggregation or METHOD_DEFAULTS[self.resolved_method][0]

    @property
    def resolved_merge(self) -> str:
        return self.merge or METHOD_DEFAULTS[self.resolved_method][1]

    def check_composition(self) -> None:
        """Refuse a combination of parts that cannot work, with one line naming why."""
        agg, merge = self.resolved_aggregation, self.resolved_merge
        if agg == "none" and merge != "sr":
            raise UserError(f"merge {merge!r} merges the server's table into the client's, but "
                            "aggregation 'none' (local) sends no table; use --merge sr")
        if self.peft_pretrain != "none" and self.codec == "full":
            raise UserError(f"--peft-pretrain {self.peft_pretrain} initialises FedPEFT's item "
                            f"table; it needs a FedPEFT codec (--codec lora, hash, rqvae, "
                            f"c-lora, c-hash or c-rqvae), not full")
        if self.adapter_objective == "holdout" and merge not in LEARNED_MERGES:
            raise UserError(f"--adapter-objective holdout trains the merge adapter, but merge "
                            f"{merge!r} has none; use --merge em or dm")
        if self.agg_clients_ratio != 1.0:
            if agg not in SAMPLED_AGGREGATIONS:
                raise UserError(f"--agg-clients-ratio samples the uploads an aggregation "
                                f"takes; aggregation {agg!r} cannot; use one of "
                                f"{', '.join(SAMPLED_AGGREGATIONS)}")
            if self.codec != "full":
                raise UserError(f"--agg-clients-ratio samples item-table uploads only; codec "
                                f"{self.codec!r} uploads other parameters; use codec full")
        if self.similarity != "eq13" and agg != "similarity":
            raise UserError(f"--similarity {self.similarity} is a similarity aggregation's; "
                            f"aggregation {agg!r} has none; use --aggregation similarity")
        if self.merge_every_batch and merge != "em":
            raise UserError(f"--merge-every-batch merges with the adapter on every batch (the "
                            f"FedEM code's EM), but merge is {merge!r}; use --merge em")
        if self.merge_every_batch and not backbone_class(self.resolved_backbone).batch_merge:
            raise UserError(f"--merge-every-batch is built for backbone "
                            f"{', '.join(backbones_where('batch_merge'))} (the FedEM code's "
                            f"FCF), not {self.resolved_backbone!r}")
        if self.merge_every_batch and self.codec != "full":
            raise UserError(f"--merge-every-batch trains the item table through the merge; "
                            f"codec {self.codec!r} trains its own parameters; use --codec full")
        if self.merge_every_batch and self.adapter_objective != "train":
            raise UserError("--merge-every-batch trains the adapter on the training batches "
                            "themselves; it cannot use --adapter-objective holdout")
        if self.server_lr != 1.0 or self.server_momentum != 0.0:
            if agg not in PEFT_AGGREGATIONS:
                raise UserError(f"--server-lr / --server-momentum step the one global table of a "
                                f"sum aggregator; aggregation {agg!r} has none; use fedavg or "
                                f"uniform")
            if self.codec != "full":
                raise UserError(f"--server-lr / --server-momentum with codec {self.codec!r} is "
                                f"not built (the step would act on theta and on its decoded "
                                f"table); use --codec full")
        if self.codec != "full":
            if not backbone_class(self.resolved_backbone).trains_item_rows:
                raise UserError(f"codec {self.codec!r} trains its own parameters in place of "
                                f"the item table, which backbone {self.resolved_backbone!r} "
                                f"regularises as a whole; use one of "
                                f"{', '.join(backbones_where('trains_item_rows'))}")
            if agg not in PEFT_AGGREGATIONS:
                raise UserError(f"codec {self.codec!r} uploads parameters the server averages "
                                f"into one global table; aggregation {agg!r} keeps per-client "
                                f"tables; use fedavg or uniform")


def refuse_central(aggregation: str, mode: str) -> None:
    """Refuse, in one line, an aggregation that needs each upload under a central mechanism.

    Similarity, graph and FedMerge (section 12) aggregation read every
    client's upload, which a central mechanism (cdp-gaussian: noise on the
    aggregate, under secure aggregation) never releases.
    """
    if aggregation in EACH_UPLOAD_AGGREGATIONS and mechanism_for(mode).central:
        raise UserError(f"aggregation {aggregation!r} needs each client's upload, but privacy "
                        f"{mode!r} is central (noise on the aggregate only); use a local "
                        f"(ldp-*) mode")


@dataclass(frozen=True)
class BaselineConfig:
    """Settings of the non-federated baselines (``--method mostpop|dp-mostpop|centralised|
    ease|als``; docs/design.md section 14, :mod:`fedem_private.baselines`). Ignored by federated
    methods, and refused there when changed."""

    # dp-mostpop: the privacy architecture, its total (epsilon, delta) for the one release,
    # and k, the most items one user contributes (a user with more keeps a seeded random k;
    # k is public). delta is used by the central architecture only.
    architecture: str = "central"
    epsilon: float = 1.0
    delta: float = 1e-5
    k: int = 50
    # ease: the L2 weight lambda of B = I - P diagMat(1 / diag P), P = (X'X + lambda I)^-1
    ease_lambda: float = 500.0
    # als (implicit ALS, Hu, Koren and Volinsky 2008): factors, L2 weight, sweeps, and the
    # confidence 1 + alpha r of an observed pair
    als_factors: int = 64
    als_regularization: float = 0.01
    als_iterations: int = 15
    als_alpha: float = 1.0
    # centralised: passes over the pooled training data (train.lr, dim, batch_size,
    # num_negatives and init_std are the federated run's)
    epochs: int = 20

    def validate(self, method: str) -> None:
        """Check every value; settings of a baseline are refused for a federated method."""
        if self.architecture not in DP_MOSTPOP_ARCHITECTURES:
            raise UserError(f"unknown baseline.architecture {self.architecture!r}; choose one "
                            f"of {', '.join(DP_MOSTPOP_ARCHITECTURES)}")
        if not (self.epsilon > 0 and not math.isnan(self.epsilon)):
            raise UserError(f"baseline.epsilon must be > 0, got {self.epsilon}")
        if math.isinf(self.epsilon) and self.architecture in ("local", "interaction-local"):
            raise UserError(f"baseline.epsilon = inf: the {self.architecture} architecture "
                            "needs a finite epsilon (central or interaction release the "
                            "counts without noise)")
        if not 0 < self.delta < 1:
            raise UserError(f"baseline.delta must be in (0, 1), got {self.delta}")
        for name in ("k", "als_factors", "als_iterations", "epochs"):
            if getattr(self, name) < 1:
                raise UserError(f"baseline.{name} must be a positive integer, "
                                f"got {getattr(self, name)}")
        for name in ("ease_lambda", "als_regularization", "als_alpha"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"baseline.{name} must be a positive number, got {value}")
        if method not in BASELINE_METHODS and self != BaselineConfig():
            raise UserError(f"[baseline] settings apply to the baselines "
                            f"({', '.join(BASELINE_METHODS)}), not method {method!r}")


DEFAULT_RECORD_CLIENTS = 100


@dataclass(frozen=True)
class RecordConfig:
    """What the server saw, recorded for the attacks (``--record-rounds``, ``--record-clients``).

    ``rounds``: comma-separated round numbers or ``last`` (e.g. ``"1,50,last"``;
    a TOML list such as ``[1, "last"]`` is accepted too); None records nothing.
    ``clients``: the first N client ids are recorded (100 when left out).
    """

    rounds: str | None = None
    clients: int | None = None

    def parsed_rounds(self) -> tuple[int | str, ...]:
        """The rounds as ints and ``"last"``; () when nothing is recorded."""
        if self.rounds is None:
            return ()
        items: list[int | str] = []
        for part in str(self.rounds).split(","):
            text = part.strip().lower()
            if not text:
                continue
            if text == "last":
                items.append("last")
                continue
            try:
                value = int(text)
            except ValueError:
                raise UserError(f"--record-rounds: not a round number: {part.strip()!r}"
                                ) from None
            if value < 1:
                raise UserError(f"--record-rounds: rounds are integers >= 1 or 'last', "
                                f"got {value}")
            items.append(value)
        if not items:
            raise UserError("--record-rounds needs at least one round")
        return tuple(items)

    def validate(self, total_rounds: int) -> None:
        if self.rounds is None:
            if self.clients is not None:
                raise UserError("--record-clients needs --record-rounds (record.clients needs "
                                "record.rounds)")
            return
        for r in self.parsed_rounds():
            if r != "last" and int(r) > total_rounds:
                raise UserError(f"--record-rounds: round {r} is beyond the run's "
                                f"{total_rounds} rounds")
        if self.clients is not None and self.clients < 1:
            raise UserError(f"--record-clients must be a positive integer, got {self.clients}")


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
            if self.federation.codec != "full":
                raise UserError(f"--early-stop-tol stops training of the item table itself; "
                                f"codec {self.federation.codec!r} trains its own parameters; "
                                f"use --codec full")
        if self.train.optimizer != "adam":
            backbone = self.federation.resolved_backbone
            if self.train.optimizer not in backbone_class(backbone).optimizers:
                raise UserError(f"--optimizer {self.train.optimizer} is built for backbone "
                                f"{', '.join(backbones_where('optimizers', self.train.optimizer))}"
                                f", not {backbone!r}")
            if self.train.lr_user is not None and not backbone_class(backbone).user_embedding:
                raise UserError(f"--lr-user is the rate of a user embedding; backbone "
                                f"{backbone!r} has none")
            if self.federation.codec != "full":
                raise UserError(f"--optimizer {self.train.optimizer} trains the item table "
                                f"itself; codec {self.federation.codec!r} trains its own "
                                f"parameters with Adam; use --codec full")
            if self.privacy.mechanism.in_training:
                raise UserError(f"privacy {self.privacy.mode!r} trains by its own DP-SGD "
                                f"steps; --optimizer {self.train.optimizer} is not built for "
                                f"it; drop --optimizer")
        for token, section, name, _, default in PAPER_CODE_OPTIONS:
            if token in UNBUILT_OPTIONS and getattr(getattr(self, section), name) != default:
                raise UserError(f"{section}.{name}: the option is not built yet "
                                "(docs/design.md 2a)")
        mech = self.privacy.mechanism
        if self.federation.resolved_aggregation == "none" and mech.perturbs:
            raise UserError(f"privacy {self.privacy.mode!r} protects uploads, but aggregation "
                            "'none' (local) uploads nothing; use --privacy none")
        refuse_central(self.federation.resolved_aggregation, self.privacy.mode)
        if self.federation.agg_clients_ratio != 1 and mech.central:
            raise UserError(f"privacy {self.privacy.mode!r} adds its noise to the aggregate of "
                            f"all sampled clients; --agg-clients-ratio below 1 is not built "
                            f"for it")
        if (self.federation.peft_pretrain == "attributes"
                and self.data.dataset not in ATTRIBUTE_DATASETS):
            raise UserError(f"--peft-pretrain attributes: dataset {self.data.dataset} has no "
                            f"item attributes; they exist for {', '.join(ATTRIBUTE_DATASETS)}")
        if self.federation.codec != "full" and self.privacy.clip_auto:
            raise UserError(f"--clip auto measures full-table deltas before round 1, not codec "
                            f"{self.federation.codec!r}'s parameters; give --clip a number")
        if mech.in_training:
            self._check_dpsgd()
        if mech.central:
            if self.train.client_fraction != 1:
                raise UserError(f"privacy {self.privacy.mode!r} samples clients itself (Poisson, "
                                f"--sample-rate); leave --client-fraction at 1, got "
                                f"{self.train.client_fraction:g}")
        return self

    def _check_baseline(self) -> None:
        """A baseline (docs/design.md §14) trains no federation: the parts that shape uploads,
        privacy modes of uploads and recording do not apply to it."""
        fed, method = self.federation, self.federation.resolved_method
        for name, value, default in (("--aggregation", fed.resolved_aggregation, "none"),
                                     ("--merge", fed.resolved_merge, "sr"),
                                     ("--codec", fed.codec, "full"),
                                     ("--backbone", fed.resolved_backbone, "mf")):
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
        if merge == "dm":
            raise UserError(f"privacy {mode!r}: merge 'dm' trains its adapter on the client's "
                            f"data without DP (no DP-SGD adapter for it), so the upload would "
                            f"not be DP; use --merge sr, sm or em")
        if merge == "em" and adapter_steps < 1:
            raise UserError(f"privacy {mode!r} with merge 'em' trains the adapter by DP-SGD too: "
                            f"give --dpsgd-adapter-steps N (its steps are charged like the "
                            f"training's)")
        if merge != "em" and adapter_steps:
            raise UserError(f"--dpsgd-adapter-steps is for merge 'em', not {merge!r}")
        if merge == "em" and fed.adapter_objective != "train":
            raise UserError(f"privacy {mode!r}: the DP-SGD adapter trains on Poisson samples of "
                            f"all positives; --adapter-objective holdout is not built for it")
        if merge == "em" and fed.agg_clients_ratio != 1:
            raise UserError(f"privacy {mode!r} with merge 'em' is not built for "
                            f"--agg-clients-ratio below 1")
        if fed.merge_every_batch:
            raise UserError(f"privacy {mode!r} trains the adapter by its own DP-SGD steps; "
                            f"--merge-every-batch is not built for it")
        if fed.codec != "full":
            raise UserError(f"privacy {mode!r} trains the item table itself; codec "
                            f"{fed.codec!r} is not built for it; use --codec full")
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


# ---------------------------------------------------------------- docs/design.md 2a: paper-code
# (label token, section, field, value in the paper-code preset, default): each fact of the
# authors' code (docs/design.md section 2a) as a named option, off by default
PAPER_CODE_OPTIONS: tuple[tuple[str, str, str, Any, Any], ...] = (
    ("min10", "data", "min_user_ratings", 10, 3),
    ("firstseen", "data", "first_seen_order", True, False),
    ("sharedneg", "data", "shared_eval_negatives", True, False),
    ("best", "train", "select_round", "auto", "last"),
    ("agg10", "federation", "agg_clients_ratio", 0.1, 1.0),
    ("pcasim", "federation", "similarity", "pca", "eq13"),
    ("batchmerge", "federation", "merge_every_batch", True, False),
    ("earlystop", "train", "early_stop_tol", 1e-4, 0.0),
)
# options not built yet: the preset leaves them off (and the sweep labels refuse them)
UNBUILT_OPTIONS: frozenset[str] = frozenset()
# datasets the preset's first-seen order applies to (no timestamps; csv: the file decides)
UNTIMED_DATASETS = ("filmtrust", "lastfm-2k")


def auto_select_round(backbone: str) -> str:
    """The reported round of the backbone's own code (docs/design.md 2a): best validation HR@10 for
    PFedRec and GPFedRec, best test HR@10 for FedEM (mf, ncf) and FedRAP."""
    return backbone_class(backbone).own_select_round


def option_applies(token: str, data: DataConfig, fed: FederationConfig) -> bool:
    """Whether the option ``token`` of :data:`PAPER_CODE_OPTIONS` means anything for this
    dataset and method (the preset turns on only those; explicitly they are refused)."""
    if token in UNBUILT_OPTIONS:
        return False
    if token == "firstseen":
        return data.dataset in UNTIMED_DATASETS
    if token in ("agg10", "pcasim"):
        return fed.resolved_aggregation == "similarity"
    if token == "earlystop":
        return backbone_class(fed.resolved_backbone).early_stop and fed.codec == "full"
    if token == "batchmerge":
        return (fed.resolved_merge == "em" and backbone_class(fed.resolved_backbone).batch_merge
                and fed.codec == "full" and fed.adapter_objective == "train")
    return True


def paper_code(data: DataConfig, train: TrainConfig, fed: FederationConfig
               ) -> tuple[DataConfig, TrainConfig, FederationConfig]:
    """The ``paper-code`` preset: the ``paper`` protocol with every option of docs/design.md 2a that
    applies to the dataset and method switched on (an option already set keeps its value)."""
    sections = {"data": replace(data, protocol="paper"), "train": train, "federation": fed}
    for token, section, name, value, default in PAPER_CODE_OPTIONS:
        if option_applies(token, data, fed) and getattr(sections[section], name) == default:
            sections[section] = replace(sections[section], **{name: value})
    return sections["data"], sections["train"], sections["federation"]  # type: ignore[return-value]


def protocol_options(cfg: RunConfig) -> dict[str, Any]:
    """The docs/design.md 2a options a config switches on, as ``{field: value}`` ({} for none)."""
    out: dict[str, Any] = {}
    for _, section, name, _, default in PAPER_CODE_OPTIONS:
        value = getattr(getattr(cfg, section), name)
        if value != default:
            out[name] = value
    return out


def _option_token(name: str, value: Any) -> str:
    if name == "min_user_ratings":
        return f"min{value}"
    if name == "select_round":
        return str(value).replace("-", "")
    if name == "agg_clients_ratio":
        return f"agg{value * 100:g}"
    if name == "early_stop_tol":
        return "earlystop" if value == 1e-4 else f"earlystop{value:g}"
    return {"first_seen_order": "firstseen", "shared_eval_negatives": "sharedneg",
            "similarity": f"{value}sim", "merge_every_batch": "batchmerge"}[name]


def protocol_label(cfg: RunConfig) -> str:
    """``strict``, ``paper``, ``paper-code`` (the preset exactly), ``paper-code+<option>``
    (the preset and options it does not switch on here, e.g. ``paper-code+agg10`` for a
    PFedRec+EM given the 10% share), or the protocol and its options, e.g.
    ``paper+min10+sharedneg`` (docs/design.md 2a)."""
    options = protocol_options(cfg)
    if not options:
        return cfg.data.protocol
    if cfg.data.protocol == "paper":
        plain = {"data": cfg.data, "train": cfg.train, "federation": cfg.federation}
        for _, section, name, _, dflt in PAPER_CODE_OPTIONS:
            plain[section] = replace(plain[section], **{name: dflt})
        d, t, f = paper_code(plain["data"], plain["train"], plain["federation"])  # type: ignore
        if t.select_round == "auto":
            t = replace(t, select_round=auto_select_round(f.resolved_backbone))
        preset = protocol_options(RunConfig(data=d, train=t, federation=f))
        if preset == options:
            return "paper-code"
        if all(options.get(k, object()) == v for k, v in preset.items()):
            return "+".join(["paper-code"] + [_option_token(k, v) for k, v in options.items()
                                              if k not in preset])
    return "+".join([cfg.data.protocol] + [_option_token(k, v) for k, v in options.items()])


def parse_protocol_label(label: str) -> tuple[str, dict[str, Any]]:
    """A sweep's protocol label as (protocol, {dotted config key: value}): ``paper-code``,
    ``strict``, ``paper``, ``paper+<option>+...`` or ``paper-code+<option>+...`` (the
    preset and more) with options as :func:`protocol_label` writes them (min10, firstseen,
    sharedneg, besttest, bestval, bestauto, agg10, pcasim, batchmerge, earlystop)."""
    base, *tokens = str(label).split("+")
    if base not in PROTOCOLS_ALL or (tokens and base == "strict"):
        raise UserError(f"unknown protocol {label!r}; write strict, paper, paper-code, "
                        f"paper+<option>+... or paper-code+<option>+... (options: min10, "
                        f"firstseen, sharedneg, besttest, bestval, agg10, pcasim, batchmerge, "
                        f"earlystop)")
    out: dict[str, Any] = {}
    for token in tokens:
        key, value = _parse_token(token, label)
        out[key] = value
    return base, out


def _parse_token(token: str, label: str) -> tuple[str, Any]:
    import re

    fixed = {"firstseen": ("data.first_seen_order", True),
             "sharedneg": ("data.shared_eval_negatives", True),
             "besttest": ("train.select_round", "best-test"),
             "bestval": ("train.select_round", "best-val"),
             "bestauto": ("train.select_round", "auto"),
             "pcasim": ("federation.similarity", "pca"),
             "batchmerge": ("federation.merge_every_batch", True),
             "earlystop": ("train.early_stop_tol", 1e-4)}
    if token in UNBUILT_OPTIONS:
        raise UserError(f"protocol {label!r}: option {token} is not built yet")
    if token in fixed:
        return fixed[token]
    match = re.fullmatch(r"(min|agg)(\d+(?:\.\d+)?)", token)
    if match and match.group(1) == "min" and match.group(2).isdigit():
        return "data.min_user_ratings", int(match.group(2))
    if match and match.group(1) == "agg":
        return "federation.agg_clients_ratio", float(match.group(2)) / 100
    raise UserError(f"protocol {label!r}: unknown option {token!r}; options: min10, firstseen, "
                    f"sharedneg, besttest, bestval, bestauto, agg10, pcasim, batchmerge, "
                    f"earlystop")


# Fields added after version 0.1.0: they enter a config's identity only when set, so run
# directories written before they existed keep their identity (see identity_dict).
LATER_FIELDS: dict[tuple[str, ...], Any] = {
    ("data", "min_rating"): None,
    ("privacy", "clip_auto"): False,
    ("privacy", "clip_auto_epsilon"): None,
    ("privacy", "clip_auto_min"): 0.1,
    ("privacy", "clip_auto_max"): 1e5,
    ("privacy", "sample_rate"): 1.0,
    ("privacy", "clip_quantile"): None,
    ("privacy", "clip_lr"): 0.2,
    ("privacy", "clip_count_noise"): None,
    ("privacy", "canaries"): 0,
    ("privacy", "dpsgd_rate"): 0.1,
    ("privacy", "dpsgd_steps"): 20,
    ("privacy", "dpsgd_negatives"): 64,
    ("privacy", "dpsgd_lr"): 4.0,
    ("privacy", "dpsgd_adapter_steps"): 0,
    ("federation", "backbone"): "mf",
    ("federation", "codec"): "full",
    ("federation", "graph_threshold"): 1.0,
    ("federation", "graph_topk"): 0,
    ("federation", "graph_layers"): 1,
    ("federation", "gpfedrec_reg"): 1.0,
    ("federation", "fedrap_lambda"): 0.1,
    ("federation", "fedrap_mu"): 0.1,
    ("federation", "merge_k"): 4,
    ("federation", "fedmerge_steps"): 10,
    ("federation", "fedmerge_lr"): 1.0,
    ("federation", "server_lr"): 1.0,
    ("federation", "server_momentum"): 0.0,
    ("federation", "peft_warmup"): 2,
    ("federation", "peft_pretrain"): "none",
    ("federation", "lora_rank"): 4,
    ("federation", "hash_size"): 512,
    ("federation", "hash_functions"): 2,
    ("federation", "hash_senet"): 0,
    ("federation", "rq_levels"): 3,
    ("federation", "rq_codebook"): 128,
    ("federation", "peft_init"): "normal",
    ("federation", "adapter_objective"): "train",
    ("federation", "adapter_folds"): 5,
    ("train", "device"): "cpu",
    ("data", "min_user_ratings"): 3,
    ("data", "first_seen_order"): False,
    ("data", "shared_eval_negatives"): False,
    ("train", "select_round"): "last",
    ("train", "early_stop_tol"): 0.0,
    ("federation", "agg_clients_ratio"): 1.0,
    ("federation", "similarity"): "eq13",
    ("federation", "merge_every_batch"): False,
    ("train", "optimizer"): "adam",
    ("train", "lr_head"): None,
    ("train", "lr_user"): None,
    ("train", "weight_decay"): 0.0,
    ("train", "lr_batch_decay"): 1.0,
    ("train", "lr_round_decay"): 1.0,
    **{("baseline", f.name): f.default for f in fields(BaselineConfig)},
}


def identity_dict(cfg: RunConfig) -> dict:
    """What makes two runs the same: the resolved config without ``[record]``.

    Recording does not change what is trained (it only writes what the server
    saw); sweeps fold it into a point's identity themselves. Fields of
    :data:`LATER_FIELDS` are left out while they hold their default, and
    ``privacy.sizes`` without a mechanism.
    """
    values = to_dict(cfg)
    values.pop("record", None)
    if not cfg.privacy.mechanism.perturbs:
        # the sizes setting changes nothing without a mechanism; under one it does (the
        # server's weights became uniform by default), so points from before it do not resume
        values["privacy"].pop("sizes", None)
    for path, default in LATER_FIELDS.items():
        node = values
        for part in path[:-1]:
            node = node[part]
        if node.get(path[-1], default) == default:
            node.pop(path[-1], None)
    if not values.get("baseline"):  # every baseline setting at its default
        values.pop("baseline", None)
    return values


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check/convert a TOML or CLI value to the annotated type."""
    text = str(typ)
    optional = "None" in text
    if value is None or (isinstance(value, str) and value.lower() == "none" and optional):
        if optional:
            return None
        raise UserError(f"{where} must not be empty")
    if "float" in text and "int" not in text.replace("float", ""):
        if isinstance(value, bool):
            raise UserError(f"{where} must be a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be a number, got {value!r}") from None
        if math.isnan(out):
            raise UserError(f"{where} must be a number, got NaN")
        return out
    if "int" in text and "str" not in text:
        if isinstance(value, bool):
            raise UserError(f"{where} must be an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be an integer, got {value!r}") from None
        if not f.is_integer():
            raise UserError(f"{where} must be an integer, got {value!r}")
        return int(f)
    if "bool" in text:
        if isinstance(value, bool):
            return value
        if str(value).lower() in {"true", "1", "yes"}:
            return True
        if str(value).lower() in {"false", "0", "no"}:
            return False
        raise UserError(f"{where} must be true or false, got {value!r}")
    if "str" in text:
        if not isinstance(value, str | int | float):
            raise UserError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, values: dict, where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise UserError(f"unknown key {key!r} in [{where}]; known keys: "
                            f"{', '.join(sorted(known))}")
        hint = hints[key]
        if cls is RecordConfig and key == "rounds" and isinstance(value, list):
            value = ",".join(str(v) for v in value)  # [1, "last"] -> "1,last"
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"[{where}.{key}] must be a table")
            kwargs[key] = _build(hint, value, f"{where}.{key}")
        else:
            kwargs[key] = _coerce(value, hint, f"{where}.{key}")
    return cls(**kwargs)


def from_dict(values: dict) -> RunConfig:
    """Build a config from nested dicts (a parsed TOML file); unknown keys are errors."""
    sections = {f.name: f for f in fields(RunConfig)}
    hints = get_type_hints(RunConfig)
    kwargs = {}
    for name, table in values.items():
        if name not in sections:
            raise UserError(f"unknown section [{name}]; known sections: "
                            f"{', '.join(sections)}")
        if not isinstance(table, dict):
            raise UserError(f"[{name}] must be a table")
        kwargs[name] = _build(hints[name], table, name)
    return RunConfig(**kwargs)


def read_toml(path: str | Path, what: str = "config file") -> dict:
    """Parse a TOML file; a missing or invalid file is a one-line UserError naming ``what``."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{what} {p} is a directory; name a TOML file")
    if not p.is_file():
        raise UserError(f"{what} not found: {p}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} {p} is not valid TOML: {exc}") from None


def load_toml(path: str | Path) -> RunConfig:
    """Read a TOML config file."""
    return from_dict(read_toml(path))


def to_dict(cfg: Any) -> dict:
    """Nested plain dict of a config dataclass."""
    return dataclasses.asdict(cfg)


def flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level with dotted keys: ``{"train": {"rounds": 5}}`` ->
    ``{"train.rounds": 5}``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def with_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """Apply ``{"train.rounds": 5, "data.synthetic.n_users": 100}``-style overrides (a new,
    unchecked config; ``cfg`` itself when there is nothing to apply)."""
    if all(value is None for value in overrides.values()):
        return cfg
    values = to_dict(cfg)
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = values
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return from_dict(values)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def to_toml(values: dict, prefix: str = "") -> str:
    """Write nested dicts as TOML; None values are left out (they mean "default")."""
    lines: list[str] = []
    scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in values.items() if isinstance(v, dict)}
    if prefix and any(v is not None for v in scalars.values()):
        lines.append(f"[{prefix}]")
    for key, value in scalars.items():
        if value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    if scalars:
        lines.append("")
    for key, table in tables.items():
        lines.append(to_toml(table, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines).rstrip() + "\n"
