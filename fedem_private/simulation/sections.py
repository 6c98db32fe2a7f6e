"""The sections of a run's configuration, each checking its own values (docs/design.md §9).

``[data]`` (:class:`DataConfig`), ``[train]`` (:class:`TrainConfig`), ``[federation]``
(:class:`FederationConfig`: the parts and their composition rules), ``[baseline]``
(:class:`BaselineConfig`) and ``[record]`` (:class:`RecordConfig`), plus the names each
accepts. :class:`~fedem_private.simulation.config.RunConfig` holds one of each and checks
what spans sections. Importing this module is light (no torch or pandas).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from fedem_private.client.codec_kinds import REGISTRY as CODEC_REGISTRY
from fedem_private.client.codec_kinds import codec_class, codecs_where
from fedem_private.client.codec_options import (  # noqa: F401  (names re-exported)
    PEFT_PRETRAINS,
    PeftConfig,
)
from fedem_private.client.merges import (  # noqa: F401  (names re-exported)
    ADAPTER_OBJECTIVES,
    AdapterOptions,
    StaticOptions,
)
from fedem_private.client.strategies import REGISTRY as MERGE_REGISTRY
from fedem_private.client.strategies import merge_class, strategies_where
from fedem_private.client.variant_options import (
    MergeEveryOptions,
    MergeRowsOptions,
    ProxOptions,
)
from fedem_private.data import (
    DATASETS,
    PROTOCOLS,
    RATED_DATASETS,
    SyntheticConfig,
    source_problem,
)
from fedem_private.device import check_name as check_device
from fedem_private.errors import UserError
from fedem_private.models import REGISTRY, backbone_class, backbones_where
from fedem_private.models.options import OPTIONS as PART_OPTIONS
from fedem_private.models.options import FedRAPOptions, GPFedRecOptions
from fedem_private.privacy.registry import mechanism_for
from fedem_private.server.options import (  # noqa: F401  (names re-exported)
    SIMILARITIES,
    FedMergeOptions,
    GraphOptions,
    ServerStepOptions,
    SimilarityOptions,
)
from fedem_private.server.registry import REGISTRY as AGGREGATOR_REGISTRY
from fedem_private.server.registry import aggregator_class, aggregators_where

FEDERATED_METHODS = ("fedmf", "fedsim", "fedem", "local", "fedncf", "pfedrec", "gpfedrec",
                     "fedrap", "fedmerge")
# non-federated references on the same split, protocol and evaluation (docs/design.md section 14,
# fedem_private.baselines): no rounds, no uploads; each scores every (user, item) at once.
# Name -> what it is, one line (`fedem-private list`)
BASELINES = {
    "mostpop": "the training data's most popular items, ties broken by a seeded order",
    "dp-mostpop": "popularity released once under DP ([baseline] architecture, epsilon, k): "
                  "the private floor",
    "centralised": "FedMF's model and loss trained on the pooled data (no federation)",
    "ease": "EASE (Steck 2019), a closed-form item-item model ([baseline] ease_lambda)",
    "als": "implicit-feedback ALS (Hu, Koren and Volinsky 2008); needs pip install "
           "'fedem-private[baselines]'",
}
BASELINE_METHODS = tuple(BASELINES)
METHODS = (*FEDERATED_METHODS, *BASELINE_METHODS)
# dp-mostpop's privacy architectures: user-level central (Gaussian on the secure sum),
# user-level local (optimal unary encoding), interaction-level (Laplace on each count, once
# centrally, or by every client on its own counts)
DP_MOSTPOP_ARCHITECTURES = ("central", "local", "interaction", "interaction-local")
# the codecs: the codec registry's names (each class declares what it can do: peft, senet;
# fedem_private.client.codec_kinds); FedPEFT's initial tables (PEFT_PRETRAINS):
# client.codec_options
CODECS = tuple(CODEC_REGISTRY)
# the aggregations: the server registry's names (each class declares what it can do:
# one_table, needs_each_upload, sampled; fedem_private.server.registry)
AGGREGATIONS = tuple(AGGREGATOR_REGISTRY)
MERGES = tuple(MERGE_REGISTRY)  # fedem_private.client.strategies: names and capabilities
# what the adapter trains on (ADAPTER_OBJECTIVES): client.merges
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
SELECT_ROUNDS = ("last", "best-test", "best-val", "best-val-full", "auto")
# the similarity aggregation's rules (SIMILARITIES): server.options
# datasets with timestamps: --first-seen-order does not apply to them
TIMED_DATASETS = ("ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "synthetic")
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


MIN_POPULATION = 10  # the fewest users a calibrated population may have (--users)


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
    # docs/design.md section 17: dataset synthetic drawn from the population fitted to this real
    # dataset (its files in data_dir or the download cache), ``users`` users (default: as
    # many as the source has)
    calibrate_to: str | None = None
    users: int | None = None
    # the population's user-item score (data/population.py TASTES): "bilinear", MF's own
    # model (P.2), or "max", a user's best of several taste vectors (P.2')
    population_taste: str = "bilinear"

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
        self._check_population()

    def _check_population(self) -> None:
        """``calibrate_to`` names a real dataset whose files can be found, with dataset
        synthetic; ``users`` is at least :data:`MIN_POPULATION` and needs ``calibrate_to``."""
        from fedem_private.data.population import TASTES

        if self.population_taste not in TASTES:
            raise UserError(f"--population-taste (data.population_taste) must be one of "
                            f"{', '.join(TASTES)}, got {self.population_taste!r}")
        if self.calibrate_to is None:
            if self.population_taste != "bilinear":
                raise UserError("--population-taste (data.population_taste) shapes a "
                                "calibrated population; give --calibrate-to too")
            if self.users is not None:
                raise UserError("--users (data.users) sizes a calibrated population; give "
                                "--calibrate-to too (the default generator's size is "
                                "data.synthetic.n_users)")
            return
        if self.dataset != "synthetic":
            raise UserError(f"--calibrate-to (data.calibrate_to) calibrates the synthetic "
                            f"generator; use it with --dataset synthetic, not {self.dataset}")
        problem = source_problem(self.calibrate_to, self.data_dir)
        if problem is not None:
            raise UserError(problem)
        if self.users is not None and (isinstance(self.users, bool)
                                       or self.users < MIN_POPULATION):
            raise UserError(f"--users (data.users) must be an integer >= {MIN_POPULATION}, "
                            f"got {self.users}")


#: train.client_tables: what a client keeps of its item table between rounds: all of it,
#: none (the server's table stands in), or the rows it trained (the rest rebuilt from the
#: tables the server sent: simulation/sparse_tables.py)
CLIENT_TABLES = ("kept", "global", "sparse")

#: seeds and nonces lie in [0, SEED_LIMIT); a run seed derived from a nonce lies in
#: [SEED_LIMIT, 2 SEED_LIMIT), so it never equals a plain seed (and fits an int64 key)
SEED_LIMIT = 1 << 62


def run_seed(seed: int, nonce: int) -> int:
    """The key of a run's training and mechanism streams (``train.nonce``).

    nonce 0 gives ``seed`` (every run before nonces existed). Otherwise SEED_LIMIT plus the
    low 62 bits of BLAKE2b-64 over (seed, nonce): distinct (seed, nonce) pairs give
    distinct keys but for a 2^-62 chance per pair, and none equals a plain seed, so a
    search's trials never share randomness with each other or with the final run at
    nonce 0 (:mod:`fedem_private.experiments.tune`). Pure Python: validation never loads
    torch. Not a cryptographic commitment: the key only separates random streams."""
    if nonce == 0:
        return int(seed)
    digest = hashlib.blake2b(f"fedem-private run seed {int(seed)} {int(nonce)}".encode(),
                             digest_size=8).digest()
    return SEED_LIMIT | (int.from_bytes(digest, "big") & (SEED_LIMIT - 1))


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
    # the data's and the evaluation sets' key (the synthetic draw, the split's tie-break,
    # the evaluation candidates) and, with nonce 0, every other stream's (:attr:`run_seed`)
    seed: int = 0
    # a run's own key, mixed into every training and mechanism stream (initialisation,
    # participation, negatives, shuffles, noise) but not into the data's: two runs with one
    # seed and different nonces see the same split and evaluation sets and independent
    # randomness. 0 (the default): those streams are keyed by the seed alone. A private
    # search gives each trial its own (experiments/tune.py, docs/design.md section 14).
    nonce: int = 0
    eval_every: int = 1
    memory_budget_mb: int = 2048
    # where the heavy tensors live: cpu, cuda, or auto (cuda when available);
    # :meth:`RunConfig.resolved` turns auto into what it means on this machine
    device: str = "cpu"
    # docs/design.md 2a, option 4: which evaluated round summary.json / results.csv also report
    # (the last round stays the headline): "last" (off), "best-test" (best sampled test
    # HR@10: the FedEM and FedRAP code), "best-val" (best validation HR@10: PFedRec,
    # GPFedRec), "best-val-full" (best validation HR@10 in full ranking), "auto" (the
    # backbone's own code's rule)
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
    # issue 66 (populations): a fixed expected cohort of K clients per round (0: off): the
    # Poisson rate q = K / n under a mechanism that samples (cdp-gaussian's sample_rate,
    # dp-ftrl's cohort fraction), else exactly K clients a round (client_fraction K / n)
    cohort_size: int = 0
    # evaluate a keyed random sample of this many users (0: every user); each metric is
    # reported with its standard error over them
    eval_users: int = 0
    # "kept": every client keeps its trained item table between rounds and is evaluated
    # with it; "global": clients keep no item table (memory grows with the cohort, not n):
    # each starts a round from, and is evaluated with, the server's current table plus its
    # own private groups (p_u, a head); merge sr with one shared table only
    client_tables: str = "kept"
    # with client_tables "global": each evaluated user first trains this many local epochs
    # from the server's table on its own training data (nothing uploaded) and is evaluated
    # with what it trained (0: with the server's table and its kept private groups)
    eval_finetune: int = 0
    # issue 43, item 4: the dtype the per-client item tables are kept in between rounds
    # (each client's Q_l, and the server's per-client copies: last uploads, personalised
    # tables): "float32", or "bfloat16" (half the memory; every round still trains, merges
    # and aggregates in float32, and the trained table is rounded to nearest on storing)
    state_dtype: str = "float32"

    @property
    def run_seed(self) -> int:
        """The key of the run's training and mechanism streams: the seed itself under nonce
        0, else :func:`run_seed` of (seed, nonce), which is never a plain seed."""
        return run_seed(self.seed, self.nonce)

    def validate(self) -> None:
        for name in ("seed", "nonce"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    0 <= value < SEED_LIMIT):
                raise UserError(f"--{name} (train.{name}) must be an integer in [0, 2^62), "
                                f"got {value}")
        for name in ("cohort_size", "eval_users", "eval_finetune"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"--{name.replace('_', '-')} (train.{name}) must be a "
                                f"non-negative integer (0: off), got {value!r}")
        if self.client_tables not in CLIENT_TABLES:
            raise UserError(f"unknown --client-tables (train.client_tables) "
                            f"{self.client_tables!r}; choose one of {', '.join(CLIENT_TABLES)}")
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
        if self.state_dtype not in STATE_DTYPES:
            raise UserError(f"unknown --state-dtype (train.state_dtype) {self.state_dtype!r}; "
                            f"choose one of {', '.join(STATE_DTYPES)}")
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


#: the dtypes train.state_dtype may keep the per-client item tables in (torch dtype names)
STATE_DTYPES = ("float32", "bfloat16")
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
    # each part's own options, under their flat [federation] keys (TOML and command line);
    # the defaults, the meaning and the checks are the part's options class's
    # (docs/design.md section 15): the graph's (server.options.GraphOptions), GPFedRec's and
    # FedRAP's (models.options), FedMerge's, the server step's, the similarity's
    # (server.options), FedPEFT's (client.codec_options.PeftConfig), SM's rho and the
    # merge adapter's (client.merges.StaticOptions, AdapterOptions)
    graph_threshold: float = GraphOptions.threshold
    graph_topk: int = GraphOptions.topk
    graph_layers: int = GraphOptions.layers
    gpfedrec_reg: float = GPFedRecOptions.reg
    fedrap_lambda: float = FedRAPOptions.lambda_
    fedrap_mu: float = FedRAPOptions.mu
    merge_k: int = FedMergeOptions.k
    fedmerge_steps: int = FedMergeOptions.steps
    fedmerge_lr: float = FedMergeOptions.lr
    server_lr: float = ServerStepOptions.lr
    server_momentum: float = ServerStepOptions.momentum
    peft_warmup: int = PeftConfig.warmup
    peft_pretrain: str = PeftConfig.pretrain
    lora_rank: int = PeftConfig.lora_rank
    hash_size: int = PeftConfig.hash_size
    hash_functions: int = PeftConfig.hash_functions
    hash_senet: int = PeftConfig.hash_senet
    rq_levels: int = PeftConfig.rq_levels
    rq_codebook: int = PeftConfig.rq_codebook
    peft_init: str = PeftConfig.init
    alpha: float = SimilarityOptions.alpha
    rho: float = StaticOptions.rho
    adapter_lr: float = AdapterOptions.lr
    adapter_epochs: int = AdapterOptions.epochs
    adapter_objective: str = AdapterOptions.objective
    adapter_folds: int = AdapterOptions.folds
    # docs/design.md 2a, option 5: similarity aggregation over a random share of the round's uploads
    # (the authors' code: agg_clients_ratio = 0.1); only those clients get a new table
    agg_clients_ratio: float = 1.0
    # docs/design.md 2a, option 6: "eq13" (the paper's equation 13) or "pca" (the authors' code:
    # 1-D PCA of each table, 1 / (1 + L2), > 0.9 -> 1, projection of p + alpha s)
    similarity: str = SimilarityOptions.similarity
    # docs/design.md 2a, option 7: merge on every local batch and evaluate the merged table
    merge_every_batch: bool = False
    # issue 69 (client.variant_options): equation 10 on the client's own items only ("seen"),
    # and the proximal weight mu of (mu / 2) ||Q_l - Q_g||^2 in local training
    merge_rows: str = MergeRowsOptions.rows
    prox_mu: float = ProxOptions.mu
    # issue 69: rounds from one merge to the next (a client starts from its own table between)
    merge_every: int = MergeEveryOptions.every

    def validate(self) -> None:
        """Check the parts' names, then every part's own options (each refuses a bad value
        with its own line), then what spans parts."""
        if self.method is not None and self.method not in METHODS:
            raise UserError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.backbone is not None and self.backbone not in REGISTRY:  # live: a test may add
            raise UserError(f"unknown backbone {self.backbone!r}; choose one of "
                            f"{', '.join(REGISTRY)}")
        if self.method is None and self.backbone not in (None, *BACKBONE_METHOD):
            raise UserError(f"backbone {self.backbone!r} has no preset method (one registered "
                            f"since, e.g. by a plugin): give --method too, e.g. fedmf")
        if self.codec not in CODEC_REGISTRY:  # live: a test or a plugin may add one
            raise UserError(f"unknown codec {self.codec!r}; available: "
                            f"{', '.join(CODEC_REGISTRY)}")
        if self.aggregation is not None and self.aggregation not in AGGREGATOR_REGISTRY:
            raise UserError(f"unknown aggregation {self.aggregation!r}; choose one of "
                            f"{', '.join(AGGREGATOR_REGISTRY)}")
        if self.merge is not None and self.merge not in MERGE_REGISTRY:
            raise UserError(f"unknown merge {self.merge!r}; choose one of "
                            f"{', '.join(MERGE_REGISTRY)}")
        for options in PART_OPTIONS:
            options.from_config(self).check()
        if self.hash_senet and not codec_class(self.codec).senet:
            raise UserError(f"--hash-senet weights the hash codec's vectors; it needs --codec "
                            f"{_either(codecs_where('senet'))}, not {self.codec!r}")
        if not 0 < self.agg_clients_ratio <= 1:
            raise UserError(f"--agg-clients-ratio (federation.agg_clients_ratio) must be in "
                            f"(0, 1], got {self.agg_clients_ratio}")

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
        """Refuse a combination of parts that cannot work, with one line naming why.

        Every rule asks the parts for what they declare (the capabilities of the backbone,
        merge, codec and aggregator classes, docs/design.md section 15), never for their
        names, so a part registered by a test or a plugin is held to the same rules."""
        agg, merge = self.resolved_aggregation, self.resolved_merge
        codec = codec_class(self.codec)
        full = codecs_where("peft", False)  # the codecs that upload the item table itself
        if merge_class(merge).merges and not aggregator_class(agg).sends_table:
            raise UserError(f"merge {merge!r} merges the server's table into the client's, but "
                            f"aggregation {agg!r} (local) sends no table; use --merge "
                            f"{', '.join(strategies_where('merges', False))}")
        if self.peft_pretrain != PeftConfig.pretrain and not codec.peft:
            raise UserError(f"--peft-pretrain {self.peft_pretrain} initialises FedPEFT's item "
                            f"table; it needs a FedPEFT codec (--codec "
                            f"{_either(codecs_where('peft'))}), not {self.codec}")
        if self.adapter_objective == "holdout" and not merge_class(merge).learned:
            raise UserError(f"--adapter-objective holdout trains the merge adapter, but merge "
                            f"{merge!r} has none; use --merge "
                            f"{' or '.join(reversed(strategies_where('learned')))}")
        if self.agg_clients_ratio != 1.0:
            if not aggregator_class(agg).sampled:
                raise UserError(f"--agg-clients-ratio samples the uploads an aggregation "
                                f"takes; aggregation {agg!r} cannot; use one of "
                                f"{', '.join(aggregators_where('sampled'))}")
            if codec.peft:
                raise UserError(f"--agg-clients-ratio samples item-table uploads only; codec "
                                f"{self.codec!r} uploads other parameters; use codec "
                                f"{_either(full)}")
        if (self.similarity != SimilarityOptions.similarity
                and not aggregator_class(agg).similarity_weights):
            raise UserError(f"--similarity {self.similarity} is a similarity aggregation's; "
                            f"aggregation {agg!r} has none; use --aggregation "
                            f"{_either(aggregators_where('similarity_weights'))}")
        if self.merge_every_batch and not merge_class(merge).batch_merge:
            raise UserError(f"--merge-every-batch merges with the adapter on every batch (the "
                            f"FedEM code's EM), but merge is {merge!r}; use --merge "
                            f"{', '.join(strategies_where('batch_merge'))}")
        if self.merge_every_batch and not backbone_class(self.resolved_backbone).batch_merge:
            raise UserError(f"--merge-every-batch is built for backbone "
                            f"{', '.join(backbones_where('batch_merge'))} (the FedEM code's "
                            f"FCF), not {self.resolved_backbone!r}")
        if self.merge_every_batch and codec.peft:
            raise UserError(f"--merge-every-batch trains the item table through the merge; "
                            f"codec {self.codec!r} trains its own parameters; use --codec "
                            f"{_either(full)}")
        if self.merge_every_batch and self.adapter_objective != "train":
            raise UserError("--merge-every-batch trains the adapter on the training batches "
                            "themselves; it cannot use --adapter-objective holdout")
        if self.merge_rows != "all":
            if not merge_class(merge).merges or self.merge_every_batch:
                raise UserError(f"--merge-rows {self.merge_rows} chooses the rows equation 10 "
                                f"mixes; merge {merge!r}"
                                f"{' on every batch' if self.merge_every_batch else ''} has "
                                f"none to choose; use --merge "
                                f"{', '.join(strategies_where('merges'))} without "
                                f"--merge-every-batch")
        if self.merge_every != 1:
            if not merge_class(merge).merges or self.merge_every_batch or codec.peft:
                raise UserError(f"--merge-every {self.merge_every} spaces the merges of "
                                f"equation 10; merge {merge!r}"
                                f"{' on every batch' if self.merge_every_batch else ''} "
                                f"{'with codec ' + repr(self.codec) + ' ' if codec.peft else ''}"
                                f"has none to space; use --merge "
                                f"{', '.join(strategies_where('merges'))} with a full table")
        if self.prox_mu > 0:
            if not backbone_class(self.resolved_backbone).trains_item_rows:
                raise UserError(f"--prox-mu pulls the trained item rows toward the received "
                                f"table; backbone {self.resolved_backbone!r} trains whole "
                                f"tables; use one of "
                                f"{', '.join(backbones_where('trains_item_rows'))}")
            if codec.peft or self.merge_every_batch:
                raise UserError("--prox-mu trains the item table's own rows; it is not built "
                                "for a FedPEFT codec or --merge-every-batch")
        if (self.server_lr != ServerStepOptions.lr
                or self.server_momentum != ServerStepOptions.momentum):
            if not aggregator_class(agg).one_table:
                raise UserError(f"--server-lr / --server-momentum step the one global table of a "
                                f"sum aggregator; aggregation {agg!r} has none; use "
                                f"{_either(aggregators_where('one_table'))}")
            if codec.peft:
                raise UserError(f"--server-lr / --server-momentum with codec {self.codec!r} is "
                                f"not built (the step would act on theta and on its decoded "
                                f"table); use --codec {_either(full)}")
        if codec.peft:
            if not backbone_class(self.resolved_backbone).trains_item_rows:
                raise UserError(f"codec {self.codec!r} trains its own parameters in place of "
                                f"the item table, which backbone {self.resolved_backbone!r} "
                                f"regularises as a whole; use one of "
                                f"{', '.join(backbones_where('trains_item_rows'))}")
            if not aggregator_class(agg).one_table:
                raise UserError(f"codec {self.codec!r} uploads parameters the server averages "
                                f"into one global table; aggregation {agg!r} keeps per-client "
                                f"tables; use {_either(aggregators_where('one_table'))}")


def _either(names: tuple[str, ...]) -> str:
    """The names as a choice: ``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, (", ".join(names[:-1]), *names[-1:])))


def refuse_central(aggregation: str, mode: str) -> None:
    """Refuse, in one line, an aggregation that needs each upload under a central mechanism.

    Similarity, graph and FedMerge (section 12) aggregation read every
    client's upload, which a central mechanism (cdp-gaussian: noise on the
    aggregate, under secure aggregation) never releases.
    """
    if mechanism_for(mode).central and aggregator_class(aggregation).needs_each_upload:
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

