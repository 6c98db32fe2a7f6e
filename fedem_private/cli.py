"""The ``fedem-private`` command.

User errors (bad files, bad values, unknown names) print one line on stderr
and exit with code 2; nothing already written is lost or half-written.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from fedem_private.errors import UserError

PROG = "fedem-private"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _clip(text: str) -> float | str:
    if text.strip().lower() == "auto":
        return "auto"
    return _number(text)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


# flag -> (config key, type, help)
RUN_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--dataset", "data.dataset", str, "{datasets}"),
    ("--data-dir", "data.data_dir", str, "directory (or CSV file) holding the dataset"),
    ("--calibrate-to", "data.calibrate_to", str,
     "dataset synthetic: draw the users from a population fitted to this real dataset, whose "
     "files --data-dir names (or the download cache); fitted once and cached "
     "(docs/design.md section 17)"),
    ("--users", "data.users", _integer,
     "--calibrate-to: how many users to draw (default: as many as the source has)"),
    ("--population-taste", "data.population_taste", str,
     "--calibrate-to: the population's user-item score: bilinear (MF's own model, the "
     "default) or max (a user's best of 4 taste vectors; docs/design.md section 17)"),
    ("--protocol", "data.protocol", str,
     "strict, paper, or paper-code (paper with every option of the authors' code below that "
     "applies to the dataset and method; docs/design.md section 2a)"),
    ("--min-user-ratings", "data.min_user_ratings", _integer,
     "users with fewer positives are dropped (authors' code: 10)"),
    ("--select-round", "train.select_round", str,
     "also report a selected round: last (off), best-test (best sampled test HR@10: FedEM, "
     "FedRAP code), best-val (best validation HR@10: PFedRec, GPFedRec code), best-val-full "
     "(best validation HR@10 in full ranking) or auto"),
    ("--agg-clients-ratio", "federation.agg_clients_ratio", _number,
     "aggregate this random share of the round's uploads; only those clients get a new "
     "table (authors' code: 0.1, FedEM's similarity aggregation; also fedavg, uniform, "
     "graph)"),
    ("--similarity", "federation.similarity", str,
     "similarity aggregation: eq13 (the paper) or pca (the authors' code: 1-D PCA, "
     "1 / (1 + L2), > 0.9 -> 1, no 1 / (1 + alpha))"),
    ("--early-stop-tol", "train.early_stop_tol", _number,
     "stop a client's local training when its epoch loss changes by less than this, "
     "relatively (0: off; authors' code: 1e-4)"),
    ("--optimizer", "train.optimizer", str,
     "local optimiser: adam (default) or sgd (plain SGD, the published PFedRec, FedRAP and "
     "GPFedRec codes'; backbones pfedrec, fedrap, gpfedrec); --lr is then the item tables' "
     "rate"),
    ("--lr-head", "train.lr_head", _number,
     "sgd: learning rate of the private head or MLP (default: --lr; FedRAP code: "
     "lr_network)"),
    ("--lr-user", "train.lr_user", _number,
     "sgd: learning rate of the user embedding (default: --lr; backbone gpfedrec)"),
    ("--weight-decay", "train.weight_decay", _number,
     "sgd: L2 weight decay on every trained tensor, whole tables included (FedRAP code: "
     "l2_regularization)"),
    ("--lr-batch-decay", "train.lr_batch_decay", _number,
     "sgd: the rates' factor after every local step (FedRAP code: 0.95)"),
    ("--lr-round-decay", "train.lr_round_decay", _number,
     "sgd: the rates' factor per round (FedRAP code: 0.97)"),
    ("--min-rating", "data.min_rating", _number,
     "positives are the pairs rated >= this (default: every rated pair; datasets with "
     "ratings only)"),
    ("--method", "federation.method", str,
     "preset: fedmf, fedsim, fedem, local, fedncf, pfedrec, gpfedrec, fedrap or fedmerge "
     "(default: the backbone's own); or a non-federated baseline: mostpop, dp-mostpop, "
     "centralised, ease, als (settings in [baseline]; docs/baselines.md)"),
    ("--dp-architecture", "baseline.architecture", str,
     "dp-mostpop: central (Gaussian on the secure sum of k-clipped one-hot vectors), local "
     "(optimal unary encoding), interaction (Laplace on each count, once) or "
     "interaction-local (each client noises its own counts: ldp-dpsgd's relation)"),
    ("--baseline-epsilon", "baseline.epsilon", _number,
     "dp-mostpop: the release's total epsilon"),
    ("--baseline-k", "baseline.k", _integer,
     "dp-mostpop central and local: the most items one user contributes"),
    ("--ease-lambda", "baseline.ease_lambda", _number, "ease: the L2 weight lambda"),
    ("--backbone", "federation.backbone", str,
     "score model: mf, ncf, pfedrec, gpfedrec or fedrap"),
    ("--aggregation", "federation.aggregation", str,
     "fedavg, uniform, similarity, graph, fedmerge or none"),
    ("--merge", "federation.merge", str, "sr, sm, dm or em"),
    ("--codec", "federation.codec", str,
     "upload codec: full, or FedPEFT's lora, hash, rqvae (P-: over a frozen base table E0) "
     "and c-lora, c-hash, c-rqvae (compressed only)"),
    ("--server-lr", "federation.server_lr", _number,
     "fedavg / uniform: the server's step on each round's aggregate (1: adopt it)"),
    ("--server-momentum", "federation.server_momentum", _number,
     "fedavg / uniform: momentum beta of that step (FedAvgM; 0: none)"),
    ("--peft-warmup", "federation.peft_warmup", _integer,
     "FedPEFT: rounds of full-table training before E0 is frozen"),
    ("--peft-pretrain", "federation.peft_pretrain", str,
     "FedPEFT: the initial item table, none (random) or attributes (a server-side "
     "autoencoder over item attributes: ML-100K, ML-1M)"),
    ("--lora-rank", "federation.lora_rank", _integer, "lora: rank k_L"),
    ("--hash-size", "federation.hash_size", _integer, "hash: table rows d_H"),
    ("--hash-functions", "federation.hash_functions", _integer, "hash: number h of functions"),
    ("--hash-senet", "federation.hash_senet", _integer,
     "hash: 0 pools the h vectors by their mean; r > 0 weights them by a SENet of hidden "
     "width r * h, trained and uploaded with the table (the paper's Hash(S): r = 16)"),
    ("--rq-levels", "federation.rq_levels", _integer, "rqvae: code length l"),
    ("--rq-codebook", "federation.rq_codebook", _integer, "rqvae: codebook size d_R"),
    ("--peft-init", "federation.peft_init", str,
     "hash / rqvae start: normal (theta ~ N(0, s^2), the paper's) or zero (start at E0)"),
    ("--alpha", "federation.alpha", _number, "similarity weight alpha (equation 13)"),
    ("--rho", "federation.rho", _number, "fixed merge weight for --merge sm"),
    ("--adapter-lr", "federation.adapter_lr", _number, "adapter learning rate (equation 11)"),
    ("--merge-rows", "federation.merge_rows", str,
     "which rows equation 10 mixes: all (as published) or seen (the client's own training "
     "items; every other row takes the received table, rho = 1)"),
    ("--merge-every", "federation.merge_every", int,
     "rounds from one merge (equation 10) to the next; between them a client starts from its "
     "own table (1: every round, as published)"),
    ("--prox-mu", "federation.prox_mu", _number,
     "local training adds (mu / 2) ||Q_l - Q_g||^2 over the rows a client trains, Q_g the "
     "table it received (Ditto style); 0: off"),
    ("--adapter-objective", "federation.adapter_objective", str,
     "what the merge adapter trains on (equation 11; em and dm only): train (the round's "
     "training samples, as published) or holdout (a rotating fold of the client's positives, "
     "withheld from that round's local training)"),
    ("--adapter-folds", "federation.adapter_folds", _integer,
     "holdout: number F of folds of each client's positives (round t withholds fold t mod F)"),
    ("--graph-threshold", "federation.graph_threshold", _number,
     "graph: neighbours above this times the mean cosine similarity"),
    ("--graph-topk", "federation.graph_topk", _integer,
     "graph: the k most similar users instead (0: threshold)"),
    ("--graph-layers", "federation.graph_layers", _integer, "graph: propagation steps"),
    ("--gpfedrec-reg", "federation.gpfedrec_reg", _number,
     "GPFedRec: weight of the MSE toward the personalised table"),
    ("--fedrap-lambda", "federation.fedrap_lambda", _number,
     "FedRAP: weight of -MSE(personal, common)"),
    ("--fedrap-mu", "federation.fedrap_mu", _number, "FedRAP: L1 weight on the common table"),
    ("--merge-k", "federation.merge_k", _integer, "fedmerge: number K of global item tables"),
    ("--fedmerge-steps", "federation.fedmerge_steps", _integer,
     "fedmerge: gradient steps of the server's fit per round"),
    ("--fedmerge-lr", "federation.fedmerge_lr", _number,
     "fedmerge: the fit's step in (0, 1], in units of 1/L (1: K = 1 is exact averaging)"),
    ("--rounds", "train.rounds", _integer, "federated rounds"),
    ("--local-epochs", "train.local_epochs", _integer, "local epochs per round"),
    ("--lr", "train.lr", _number, "local learning rate (Adam)"),
    ("--dim", "train.dim", _integer, "embedding dimension"),
    ("--batch-size", "train.batch_size", _integer, "local batch size"),
    ("--num-negatives", "train.num_negatives", _integer, "negatives per positive"),
    ("--client-fraction", "train.client_fraction", _number, "fraction of clients per round"),
    ("--eval-every", "train.eval_every", _integer, "evaluate every N rounds"),
    ("--seed", "train.seed", _integer, "random seed, in [0, 2^62)"),
    ("--cohort-size", "train.cohort_size", _integer,
     "a fixed expected cohort of K clients a round (0: off): the Poisson rate K / n under "
     "cdp-gaussian (dp-ftrl: its cohort fraction), else exactly K clients"),
    ("--eval-users", "train.eval_users", _integer,
     "evaluate a fixed keyed sample of M users (0: all), each metric with its standard error"),
    ("--eval-finetune", "train.eval_finetune", _integer,
     "each evaluated user first trains E local epochs on its own data from what its next "
     "round would start from (the server's table; under a merge, equation 10's merge of "
     "its own table with it), uploading nothing, and is evaluated with that"),
    ("--client-tables", "train.client_tables", str,
     "kept (each client keeps its trained item table and is evaluated with it), global (no "
     "client keeps one: memory grows with the cohort, not the population; merge sr, one "
     "shared table) or sparse (each client keeps only the rows it trained, the rest rebuilt "
     "from the tables the server sent: the same results as kept, memory growing with the "
     "interactions; one shared table)"),
    ("--nonce", "train.nonce", _integer,
     "the run's own key for its training and noise streams (0, the default: the seed's); "
     "the data and evaluation sets stay keyed by --seed"),
    ("--memory-budget-mb", "train.memory_budget_mb", _integer, "memory budget for chunks"),
    ("--device", "train.device", str,
     "where the heavy tensors live: cpu, cuda, or auto (cuda when one is available); the "
     "keyed draws give the same random numbers on either, so cpu and cuda runs agree within "
     "float tolerance"),
    ("--state-dtype", "train.state_dtype", str,
     "dtype of the per-client item tables kept between rounds: float32 (default) or "
     "bfloat16 (half the memory; arithmetic stays float32)"),
    ("--privacy", "privacy.mode", str, "{mechanisms}"),
    ("--sample-rate", "privacy.sample_rate", _number,
     "cdp-gaussian: each client takes part in a round with this probability (Poisson); "
     "dp-ftrl: the cohort fraction q, clients in G = ceil(1/q) fixed groups taking turns"),
    ("--ftrl-strategy", "privacy.ftrl_strategy", str, "{ftrl_strategies}"),
    ("--ftrl-bands", "privacy.ftrl_bands", _integer,
     "dp-ftrl --ftrl-strategy banded: the number b of bands, 1 <= b <= G = ceil(1/q) "
     "(0: min(G, rounds), the most whose guarantee needs only the cohorts' separation; "
     "under --ftrl-sampling poisson 0 picks the b of least expected error, 1 <= b <= 1/q)"),
    ("--ftrl-buffers", "privacy.ftrl_buffers", _integer,
     "dp-ftrl --ftrl-strategy blt: the number d of buffers, 1 <= d <= 8 (0: 3); the noise "
     "keeps d vectors of the model's size whatever G and the rounds"),
    ("--ftrl-sampling", "privacy.ftrl_sampling", str, "{ftrl_samplings}"),
    ("--max-uploads", "privacy.max_uploads", _integer,
     "local mechanisms (ldp-laplace, ldp-gaussian, ldp-touched-rows): each client uploads "
     "at most k times and declines later rounds, so --epsilon is spread over k releases, "
     "not the rounds (0: no cap)"),
    ("--clip-quantile", "privacy.clip_quantile", _number,
     "cdp-gaussian: adaptive clipping to this quantile of the delta norms (Andrew et al. "
     "2021); --clip is then the first round's clip"),
    ("--clip-lr", "privacy.clip_lr", _number, "cdp-gaussian adaptive clipping: its rate eta"),
    ("--canaries", "privacy.canaries", _integer,
     "cdp-gaussian: one-shot canary audit (Andrew et al. 2024) with this many canary clients "
     "inserted and as many held out; changes the run slightly"),
    ("--clip-count-noise", "privacy.clip_count_noise", _number,
     "cdp-gaussian adaptive clipping: noise std on the unclipped count (default q n / 20)"),
    ("--select-rows", "privacy.select_rows", _integer,
     "cdp-gaussian: private row selection, for large catalogues: train, upload and noise only "
     "the K item rows with the largest noisy counts of the participants' items so far (the "
     "counts ride in the secure sum, accounted in the same budget); 0: every row"),
    ("--select-share", "privacy.select_share", _number,
     "cdp-gaussian --select-rows: the noisy counts' share of each round's budget (default 0.1)"),
    ("--select-blend", "privacy.select_blend", _number,
     "cdp-gaussian --select-rows: at ranking, each selected item's score plus this times "
     "log(1 + its noisy count), private popularity blended into the model (post-processing; "
     "default 0, the model alone)"),
    ("--dpsgd-rate", "privacy.dpsgd_rate", _number,
     "ldp-dpsgd: Poisson rate of a client's positives in each local step"),
    ("--dpsgd-steps", "privacy.dpsgd_steps", _integer, "ldp-dpsgd: local steps per round"),
    ("--dpsgd-negatives", "privacy.dpsgd_negatives", _integer,
     "ldp-dpsgd: negatives per step, uniform over the catalogue (data-independent)"),
    ("--dpsgd-lr", "privacy.dpsgd_lr", _number, "ldp-dpsgd: local SGD learning rate"),
    ("--dpsgd-adapter-steps", "privacy.dpsgd_adapter_steps", _integer,
     "ldp-dpsgd with merge em: DP-SGD steps of the merge adapter per round (charged)"),
    ("--ddp-bits", "privacy.ddp_bits", _integer,
     "ddp-skellam: bits b of the modular sum (each client uploads b bits an entry)"),
    ("--ddp-scale", "privacy.ddp_scale", _number,
     "ddp-skellam: the scale gamma before rounding (default: the largest whose wrap-around "
     "bound is <= 1e-6 a round)"),
    ("--ddp-tolerance", "privacy.ddp_tolerance", _number,
     "ddp-skellam: the fraction of the cohort that may drop (or collude) with the noise "
     "still at its target; rounds with fewer inputs abort"),
    ("--dropout", "privacy.dropout", _number,
     "ddp-skellam: each participant drops after selection with this probability (half "
     "before sending its masked input, half after)"),
    ("--public-population", "privacy.public_population", _integer,
     "cdp-gaussian, dp-ftrl, ddp-skellam: the population N of the server's public divisor "
     "q N, fixed before seeing the data (default: the number of users, then public)"),
    ("--client-secret-seed", "privacy.client_secret_seed", _integer,
     "ddp-skellam: derive the clients' secrets (keys, mask seeds, noise shares) from this "
     "seed, which the simulated server never sees, so the run repeats (default: the OS)"),
    ("--epsilon", "privacy.epsilon", _number, "total epsilon target over the rounds (inf ok)"),
    ("--epsilon-round", "privacy.epsilon_round", _number, "per-round epsilon"),
    ("--delta", "privacy.delta", _number, "delta for accounting"),
    ("--clip", "privacy.clip", _clip,
     "clip bound C of the uploaded delta, or 'auto': C from a DP warm-up round whose "
     "privacy cost is charged to every client (ldp modes; see README)"),
    ("--clip-auto-epsilon", "privacy.clip_auto_epsilon", _number,
     "--clip auto: the warm-up's epsilon (default: 10%% of --epsilon)"),
    ("--noise-multiplier", "privacy.noise_multiplier", _number, "noise scale / sensitivity"),
    ("--accountant", "privacy.accountant", str, "calibrate with basic, advanced, rdp or pld"),
    ("--paper-clip", "privacy.paper_clip", _number, "paper mode: gradient clip Z"),
    ("--paper-lambda", "privacy.paper_lambda", _number, "paper mode: Laplace noise scale"),
    ("--sizes", "privacy.sizes", str,
     "the clients' data sizes under a privacy mode: private (default; the server weights "
     "uploads uniformly) or public (declared public: FedAvg's and equation 13's size "
     "weights, and the printed neighbouring relation says the sizes are not protected)"),
]


# switches: flag -> (config key, help); given, the key is true (docs/design.md section 2a options)
RUN_SWITCHES: list[tuple[str, str, str]] = [
    ("--first-seen-order", "data.first_seen_order",
     "datasets without timestamps: order each user's items by the item's first appearance in "
     "the file, not a seeded random order (authors' code)"),
    ("--shared-eval-negatives", "data.shared_eval_negatives",
     "one set of 99 sampled negatives for validation and test (authors' code)"),
    ("--merge-every-batch", "federation.merge_every_batch",
     "em, backbone mf: an adapter step then a table step through the merge on every local "
     "batch; evaluate the merged table (authors' code)"),
]


def _default_of(key: str) -> Any:
    """The built-in default of a dotted config key, e.g. ``train.rounds`` -> 50."""
    from fedem_private.simulation.config import RunConfig

    node: Any = RunConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node


# the config section of a run flag -> the heading it is listed under in ``run --help``
RUN_GROUPS = {"data": "data and evaluation protocol", "train": "training",
              "federation": "federation: method, parts, aggregation, merging, uploads",
              "privacy": "privacy"}


def _registered() -> dict[str, str]:
    """The help of the flags whose values are registries, from the registries themselves
    (a dataset or mechanism added, a plugin's included, is listed without editing this)."""
    from fedem_private.data import DATASETS
    from fedem_private.privacy.mech.dp_ftrl import sampling_help, strategy_help
    from fedem_private.privacy.registry import capability, names

    mechanisms = ", ".join(n + " (INSECURE)" * capability(n, "nominal_only") for n in names())
    return {"{datasets}": f"{', '.join(DATASETS)} (`{PROG} datasets list`: where each is "
                          f"found)",
            "{mechanisms}": f"{mechanisms} (`{PROG} list` says what each is)",
            "{ftrl_strategies}": strategy_help(), "{ftrl_samplings}": sampling_help()}


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="TOML config file; flags override it. A --dataset other than "
                        "synthetic drops the file's data.calibrate_to and data.users, and a "
                        "baseline --method (mostpop, ...) its [federation] settings and "
                        "train.client_tables, eval_finetune and cohort_size, each with a note "
                        "(the same settings given as flags are still refused)")
    groups = {section: p.add_argument_group(title) for section, title in RUN_GROUPS.items()}
    registered = _registered()
    for flag, key, typ, text in RUN_FLAGS:
        text = registered.get(text, text)
        default = _default_of(key)
        if default is not None:
            text = f"{text} (default: {default:g})" if isinstance(default, float) \
                else f"{text} (default: {default})"
        elif key in ("federation.aggregation", "federation.merge"):
            text += " (default: the method's own)"
        groups.get(key.split(".")[0], p).add_argument(
            flag, dest=key, type=typ, default=None, help=text,
            metavar=flag.removeprefix("--").upper().replace("-", "_"))
    for flag, key, text in RUN_SWITCHES:
        groups.get(key.split(".")[0], p).add_argument(
            flag, dest=key, action="store_const", const=True, default=None, help=text)


# ``run --help`` lists these, under the same headings; ``run --help-all`` every flag
RUN_COMMON = frozenset({
    "-h", "--help-all", "--config",
    "--dataset", "--data-dir", "--protocol",
    "--method", "--backbone", "--aggregation", "--merge", "--codec",
    "--rounds", "--local-epochs", "--lr", "--dim", "--seed", "--eval-every", "--device",
    "--privacy", "--epsilon", "--delta", "--clip", "--sample-rate", "--ftrl-strategy",
    "--out", "--force", "--dry-run", "--record-rounds", "--record-clients",
    "--checkpoint-every",
})


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every flag (``--help`` shows :data:`RUN_COMMON`)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> NoReturn:
        for action, text in getattr(parser, "hidden_help", {}).items():
            action.help = text
        parser.epilog = None
        parser.print_help()
        parser.exit()


def _short_help(p: argparse.ArgumentParser) -> None:
    """Hide from ``--help`` every flag not in :data:`RUN_COMMON` (each keeps working and
    ``--help-all`` shows it), and say how many there are."""
    hidden: dict[argparse.Action, str | None] = {}
    for action in p._actions:
        if action.option_strings and not RUN_COMMON.intersection(action.option_strings):
            hidden[action] = action.help
            action.help = argparse.SUPPRESS
    p.hidden_help = hidden  # type: ignore[attr-defined]
    p.epilog = (f"{len(hidden)} more flags (each part's and mechanism's settings, the "
                f"authors'-code options, Ray, ...): {PROG} run --help-all")


def _add_output_flags(group: Any) -> None:
    """``run``'s own options: where the run directory goes and what is recorded."""
    group.add_argument("--out", metavar="DIR",
                       help="run directory (default: runs/<dataset>-<method>-<time>, with -2, "
                            "-3, ... added when another run has that name)")
    group.add_argument("--force", action="store_true", help="replace a non-empty --out")
    group.add_argument("--dry-run", action="store_true",
                       help="print the resolved configuration (TOML, as config.toml would hold "
                            "it) and stop: nothing is trained or written")
    group.add_argument("--no-progress", action="store_true",
                       help="no progress bar: a plain line on stderr at each evaluation (and "
                            "each tenth of the rounds) with the round, seconds a round and the "
                            "ETA. Either way, while it runs, the run directory holds "
                            "metrics.csv so far and progress.json (the round reached)")
    group.add_argument("--record-rounds", metavar="ROUNDS",
                       help="record what the server saw in these rounds for the attacks, "
                            "e.g. 1,50,last")
    group.add_argument("--record-clients", metavar="N", type=_integer,
                       help="record the first N client ids (default 100; needs "
                            "--record-rounds)")
    group.add_argument("--ray-shards", metavar="K", type=_integer,
                       help="compute each round's clients in K shards on Ray (a local Ray "
                            "with K CPUs, or the cluster of --ray); central mechanisms "
                            "(cdp-gaussian, dp-ftrl) with --client-tables global only; the "
                            "same results bit for bit; needs pip install 'fedem-private[ray]'")
    group.add_argument("--ray", metavar="ADDRESS",
                       help="with --ray-shards: the running Ray cluster to shard on "
                            "(`ray start --head` there, then HOST:6379, or auto)")
    group.add_argument("--checkpoint-every", metavar="N", type=_integer,
                       help="save the run's state every N rounds to <out>.checkpoint; run "
                            "the same command again to resume a killed run from it (needs "
                            "--out; not with --record-rounds)")
    from fedem_private.experiments.sweep_cli import add_mlflow_argument

    add_mlflow_argument(group, "log the finished run to MLflow (resolved config as params, "
                        "per-round metrics, privacy tags, the run directory's files); "
                        "default store sqlite:///<the run directory's folder>/mlflow.db; "
                        "needs pip install 'fedem-private[mlflow]'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Simulate private federated recommendation and "
                     "measure utility, privacy spent and attack success.")
    from fedem_private._version import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="train one configuration and write a run directory",
                         usage="%(prog)s [options]")
    run.add_argument("--help-all", action=_HelpAll, help="show every flag and exit")
    _add_run_flags(run)
    _add_output_flags(run.add_argument_group("output and recording"))
    _short_help(run)
    att = sub.add_parser("attack", help="run the inference attacks on a recorded run directory, "
                         "score them and audit the privacy accounting")
    att.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written with "
                     "--record-rounds")
    att.add_argument("--attacks", default=None,
                     help="comma-separated attacks (default: support,projection,imia,attribute,"
                          "canary; `fedem-private list` names them all)")
    att.add_argument("--attack-option", action="append", default=[], metavar="NAME.KEY=VALUE",
                     help="an option of one attack, e.g. imia.iterations=3 or canary.count=2000 "
                          "(repeatable; each attack's options are its registered dataclass)")
    att.add_argument("--known-fraction", type=_number, default=0.5,
                     help="attribute attack: fraction of recorded clients whose attribute the "
                          "server knows (default 0.5)")
    att.add_argument("--rounds", default=None, metavar="ROUNDS",
                     help="only these recorded rounds, e.g. 1,50 (default: all)")
    att.add_argument("--seed", type=_integer, default=0,
                     help="the attacker's and scorer's own seed (default 0)")
    att.add_argument("--quiet", action="store_true", help="no table, only write attacks.json")
    att.add_argument("--device", default="cpu", metavar="DEVICE",
                     help="where the attacks compute (projection, IMIA's shadow training): cpu, "
                          "cuda or auto (default cpu)")
    from fedem_private.experiments.sweep_cli import (
        REPORT_DESCRIPTION,
        REPORT_HELP,
        SWEEP_DESCRIPTION,
        SWEEP_HELP,
        add_mlflow_argument,
        add_report_arguments,
        add_sweep_arguments,
    )

    add_sweep_arguments(sub.add_parser("sweep", help=SWEEP_HELP, description=SWEEP_DESCRIPTION))
    add_report_arguments(sub.add_parser("report", help=REPORT_HELP,
                                        description=REPORT_DESCRIPTION))
    from fedem_private.experiments.ladder_cli import (
        LADDER_DESCRIPTION,
        LADDER_HELP,
        add_ladder_arguments,
    )

    add_ladder_arguments(sub.add_parser("ladder", help=LADDER_HELP,
                                        description=LADDER_DESCRIPTION))
    sub.add_parser("list", help="the method presets, the non-federated baselines and the "
                   "parts presets compose (backbones, aggregations, merges, codecs, privacy "
                   "modes, datasets, protocols, attacks), one line each")
    tune = sub.add_parser("tune", help="choose hyper-parameters on the validation item "
                          "(Optuna TPE, a resumable SQLite study)")
    tune.add_argument("spec", metavar="TUNE_FILE", help="TOML with [tune] (trials, seed, "
                      "space) and [base] (the run config); see fedem_private.experiments.tune")
    tune.add_argument("--out", metavar="DIR", required=True,
                      help="study folder: study.db, trials/, trials.csv, best.toml")
    tune.add_argument("--trials", type=_integer, default=None,
                      help="finished (completed or diverged) trials wanted in all (default: "
                      "the file's)")
    tune.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                      help="run trials as Ray tasks sharing the study file: on a local Ray "
                      "instance, or on the cluster at ADDRESS (DIR must then be on a shared "
                      "file system); needs pip install 'fedem-private[ray]'")
    tune.add_argument("--workers", type=_integer, default=2,
                      help="with --ray: trials run at once (default 2)")
    tune.add_argument("--best-by", metavar="KEY", default=None,
                      help="also write best-<value>.toml, the best trial for each value of "
                      "this searched choice (e.g. federation.merge: one config per merge)")
    add_mlflow_argument(tune, "log the study to MLflow once it stops: a parent run, one "
                        "nested run per finished trial; trials logged before are skipped; "
                        "default store sqlite:///<DIR's folder>/mlflow.db; needs pip install "
                        "'fedem-private[mlflow]'")
    ds = sub.add_parser("datasets", help="list or download datasets")
    ds_sub = ds.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ls = ds_sub.add_parser("list", help="known datasets and where they are found")
    ls.add_argument("--cache-dir", help="cache directory (default ~/.cache/fedem-private)")
    dl = ds_sub.add_parser("download", help="fetch an official archive into the cache")
    dl.add_argument("name")
    dl.add_argument("--cache-dir", help="cache directory (default ~/.cache/fedem-private)")
    dl.add_argument("--url", help="download from this address instead of the official one")
    dl.add_argument("--sha256", help="expected SHA-256 of the archive")
    return parser


# keys of a settings file that only the synthetic population reads (docs/design.md section
# 17): dropped, with a note, when the command line picks another dataset
POPULATION_KEYS = {"data": ("calibrate_to", "users", "population_taste")}
# keys of a settings file that only federated training reads: dropped, with a note, when the
# command line picks a non-federated baseline (docs/design.md section 14); None: every key
# of the table but the method
FEDERATED_KEYS = {"federation": None,
                  "train": ("client_tables", "eval_finetune", "cohort_size")}


def _fit_file_to_flags(args: argparse.Namespace, values: dict) -> list[str]:
    """Drop from a settings file's ``values`` (in place) the keys the command line made
    inapplicable, and say which: a ``--dataset`` other than synthetic drops
    :data:`POPULATION_KEYS`, a baseline ``--method`` :data:`FEDERATED_KEYS`. A key given as
    a flag too is kept, so the flag is refused as before. Returns the notes, one a cause,
    naming the dropped keys that differ from their built-in default."""
    from fedem_private.simulation.config import BASELINE_METHODS, RunConfig

    notes = []
    dataset, method = getattr(args, "data.dataset"), getattr(args, "federation.method")
    for sections, applies, why in (
            (POPULATION_KEYS, dataset not in (None, "synthetic"),
             f"--dataset {dataset}: they calibrate the synthetic population"),
            (FEDERATED_KEYS, method in BASELINE_METHODS,
             f"--method {method} is a non-federated baseline")):
        if not applies:
            continue
        named = []
        for section, keys in sections.items():
            table = values.get(section)
            if not isinstance(table, dict):
                continue
            default = getattr(RunConfig(), section)
            for key in [k for k in table if k != "method"] if keys is None else keys:
                if key in table and getattr(args, f"{section}.{key}", None) is None:
                    if table.pop(key) != getattr(default, key, None):
                        named.append(f"{section}.{key}")
        if named:
            notes.append(f"ignoring {', '.join(named)} of {args.config} ({why})")
    return notes


def config_from_args(args: argparse.Namespace):
    """Config file (if any) plus command-line overrides, validated. Keys of the file that a
    flag made inapplicable are dropped with a note on stderr (:func:`_fit_file_to_flags`)."""
    from fedem_private.simulation.config import RunConfig, from_dict, read_toml, with_overrides

    base = RunConfig()
    if args.config:
        values = read_toml(args.config)
        for note in _fit_file_to_flags(args, values):
            print(f"{PROG}: note: {note}", file=sys.stderr)
        base = from_dict(values)
    overrides = {key: getattr(args, key) for _, key, _, _ in RUN_FLAGS}
    overrides.update({key: getattr(args, key) for _, key, _ in RUN_SWITCHES})
    if overrides.get("privacy.clip") == "auto":
        overrides.update({"privacy.clip": None, "privacy.clip_auto": True})
    overrides.update({"record.rounds": getattr(args, "record_rounds", None),
                      "record.clients": getattr(args, "record_clients", None)})
    cfg = with_overrides(base, overrides).validate().resolved()
    _check_clip_given(args, cfg)
    _check_ddp_options_given(args, cfg)
    return cfg


def _check_ddp_options_given(args: argparse.Namespace, cfg: Any) -> None:
    """Refuse ddp-skellam's flags given under another mode, even at their default value
    (the config's check sees only values that differ from the default)."""
    from fedem_private.privacy.config import DDP_FIELDS, ddp_option_refused

    mech = cfg.privacy.mechanism
    given = [n for n in DDP_FIELDS
             if getattr(args, f"privacy.{n}", None) is not None and not mech.accepts(n)]
    if given:
        raise UserError(ddp_option_refused(given[0], cfg.privacy.mode))


def _check_clip_given(args: argparse.Namespace, cfg: Any) -> None:
    """Refuse an ldp mode whose clip nobody chose: the built-in C = 1 is far below any
    upload's L1 norm, so it would clip every upload to almost nothing."""
    from fedem_private.simulation.config import read_toml

    mode = cfg.privacy.mode
    if (not cfg.privacy.mechanism.ldp_upload or cfg.privacy.clip_auto
            or getattr(args, "privacy.clip") is not None):
        return
    if args.config and "clip" in (read_toml(args.config).get("privacy") or {}):
        return
    raise UserError(f"--privacy {mode} clips each upload to --clip C, and the built-in C = "
                    f"{cfg.privacy.clip:g} would clip every one to almost nothing; give --clip "
                    f"C near a typical upload's norm (summary.json's clipping reports it) or "
                    f"--clip auto")


def _with_se(metrics: dict[str, Any], name: str, label: str) -> str:
    """``HR@10 0.1234``, or with a sample of users ``HR@10 0.1234 ± 0.0056`` (its SE)."""
    text = f"{label} {metrics[name]:.4f}"
    se = metrics.get(f"{name}_se")
    return text if se is None else f"{text} ± {se:.4f}"


def references_text(refs: dict[str, Any] | None) -> str:
    """The references beside a run's full HR@10 (summary.json's ``references``,
    experiments/outcome.py): ``  [chance 0.0357 ± 0.0059, MostPop 0.1520; same 1,000
    users]``; empty for a summary written without them."""
    if not refs:
        return ""
    chance = (refs.get("chance") or {}).get("full") or {}
    pop = ((refs.get("mostpop") or {}).get("full") or {}).get("hr@10")
    parts = []
    if chance.get("hr@10") is not None:
        parts.append(f"chance {chance['hr@10']:.4f} ± {chance.get('hr@10_se', 0.0):.4f}")
    if pop is not None:
        parts.append(f"MostPop {pop:.4f}")
    return f"  [{', '.join(parts)}; same {refs.get('users', 0):,} users]" if parts else ""


def privacy_text(privacy: dict[str, Any] | None) -> str:
    """One line on the privacy a run spent, for people: rounded, and honest about no DP."""
    from fedem_private.privacy.registry import lookup, no_privacy

    privacy = privacy or {}
    mode = privacy.get("mode", "none")
    mech = lookup(mode)
    if no_privacy(mode):
        return "privacy: none (no clipping, no noise: no privacy guarantee)"
    if mech is not None and mech.paper_heuristic:  # noise, but no accountant: the paper's own
        heuristic = (privacy.get("paper_heuristic") or {}).get("epsilon_summed_worst_client")
        return (f"privacy: paper (the FedEM paper's recipe: gradient clip "
                f"{privacy.get('paper_clip', float('nan')):g} in training, Laplace noise "
                f"{privacy.get('noise_scale', float('nan')):g} on every upload)  its heuristic "
                f"eps (worst client, summed) "
                + ("-" if heuristic is None else f"{float(heuristic):.4g}")
                + ": NOT a DP guarantee")
    eps = (privacy.get("epsilon") or {}).get("reported")
    eps = None if eps is None else float(eps)
    if eps is None or eps == float("inf"):
        clip = privacy.get("clip")
        return (f"privacy: {mode}  eps spent ∞ (no noise: no privacy guarantee)"
                + (f"; clip {clip:.4g}" if clip is not None else ""))
    if mech is not None and mech.central and not mech.cli_clause:  # cdp-gaussian's two views
        return _central_text(privacy, eps)
    clause, warning = ((mech.run_clause(privacy), mech.cli_warning) if mech is not None
                       else ("", ""))
    text = f"privacy: {mode}{clause}  eps spent (worst client) {eps:.4g}"
    if privacy.get("delta"):
        text += f" at delta {privacy['delta']:g}"
    text += warning
    if privacy.get("ddp_skellam"):
        text += _ddp_text(privacy["ddp_skellam"])
    if privacy.get("sizes") == "public":
        text += "; data sizes declared public (not protected)"
    auto = privacy.get("clip_auto")
    if auto:
        text += (f"; clip {auto['clip']:.4g} from --clip auto (DP warm-up, eps "
                 f"{auto['epsilon']:.3g}, included)")
    return text


def _ddp_text(ddp: dict[str, Any]) -> str:
    """ddp-skellam's bits, bytes per client and released rounds, for the summary line."""
    sent = ddp.get("bytes_per_client") or {}
    up = sum(v for k, v in sent.items() if k.startswith("upload_"))
    text = (f"; {ddp['bits']} bits an entry, {sent.get('masked_input', 0) / 1024:.1f} KiB "
            f"masked input per client a round")
    if up:
        text += (f" ({up / 1024:.1f} KiB uploaded a cohort member, mean, with the "
                 f"protocol's keys, shares and unmasking)")
    aborted = len(ddp.get("rounds_aborted") or [])
    text += (f"; dropout {ddp.get('dropout', 0):g}: {ddp.get('rounds_released')} rounds "
             f"released, {aborted} aborted")
    return text


def _central_text(privacy: dict[str, Any], eps: float) -> str:
    """cdp-gaussian's line: both guarantees (docs/design.md §5), each with what it assumes."""
    agg = (privacy.get("epsilon_aggregator") or {}).get("reported")
    agg_text = "∞" if agg is None else f"{float(agg):.4g}"
    return (f"privacy: cdp-gaussian (user-level central DP, secure aggregation)  eps {eps:.4g} "
            f"against observers of the released models (Poisson sampling, q = "
            f"{privacy.get('sample_rate'):g}); eps {agg_text} against the aggregator (no "
            f"amplification, worst client's {privacy.get('worst_client_rounds')} rounds); "
            f"delta {privacy.get('delta'):g}" + _canary_text(privacy.get("canary_audit")))


def _canary_text(audit: dict[str, Any] | None) -> str:
    """The one-shot canary audit's estimates, one clause (empty without canaries)."""
    if not audit:
        return ""
    views = audit.get("views") or {}

    def est(view: str) -> str:
        value = (views.get(view) or {}).get("eps_hat")
        return "n/a" if value is None else f"{float(value):.3g}"

    def bound(view: str) -> str:
        value = (views.get(view) or {}).get("eps_lower_bound")
        return "n/a" if value is None else f"{float(value):.3g}"

    certified = any((v or {}).get("flagged_certified") for v in views.values())
    verdict = ("ok" if audit.get("ok") else
               "FAILED: certified lower bound above the accounted eps" if certified else
               "FLAGGED: noise below the accounted scale")
    return (f"; canary audit eps_hat {est('aggregator')} (aggregator), {est('observer')} "
            f"(observer), certified eps >= {bound('aggregator')} / {bound('observer')} at "
            f"95%: {verdict}")


def _cmd_run(args: argparse.Namespace) -> int:
    from fedem_private import api

    cfg = config_from_args(args)  # validated before anything heavy is imported
    for kind, text in cfg.privacy.mechanism.notes(cfg.privacy, cfg.train.rounds):
        print(f"{PROG}: {kind}: {text}", file=sys.stderr)
    if not args.dry_run:
        from fedem_private.experiments.tracking import check_uri

        check_uri(args.mlflow)  # MLflow missing: said before the run, not after
    if args.dry_run:
        from fedem_private.simulation.config import to_dict, to_toml

        print(to_toml(to_dict(cfg)), end="")
        return 0
    try:
        res = api.run(cfg, args.out, force=args.force,
                      progress="lines" if args.no_progress else True, warn=False,
                      checkpoint_every=args.checkpoint_every, ray=args.ray,
                      ray_shards=args.ray_shards)
    except KeyboardInterrupt as exc:  # main says what was kept, and how to go on
        exc.kept = _kept_of_run(args)  # type: ignore[attr-defined]
        raise
    summary = res.summary
    m = summary["metrics"] or {}
    print(f"wrote {res.run_dir}")
    if args.out is not None and Path(args.out).expanduser() != res.run_dir:
        # two runs into one --out: the other finished first; this one's results are kept
        print(f"{PROG}: note: another run finished into {args.out} while this one ran; this "
              f"run's results are in {res.run_dir}", file=sys.stderr)
    for kind in ("full", "sampled"):
        if kind in m:
            print(f"{kind:>7}: " + "  ".join(_with_se(m[kind], name, label) for name, label in
                                               (("hr@10", "HR@10"), ("ndcg@10", "NDCG@10")))
                  + (f"  ({m[kind]['users']:,} users sampled)" if "users" in m[kind] else "")
                  + (references_text(summary.get("references")) if kind == "full" else ""))
    if summary.get("protocol_options"):  # docs/design.md 2a: the authors' code's options
        opts = ", ".join(f"{k}={v}" for k, v in summary["protocol_options"].items())
        print(f"protocol: {summary['protocol_label']} ({opts})")
    selected = summary.get("selected")
    if selected:
        sm = selected["metrics"].get("sampled", {})
        print(f"selected ({selected['rule']}): round {selected['round']}  sampled HR@10 "
              f"{sm.get('hr@10', float('nan')):.4f}  NDCG@10 {sm.get('ndcg@10', float('nan')):.4f}"
              f"  (the headline above is the last round's)")
    print(privacy_text(summary.get("privacy")))
    resumed = summary.get("checkpoint")
    if resumed:  # a killed run finished from its checkpoint (experiments/checkpoint.py)
        rounds = ", ".join(str(r) for r in resumed["resumed_at"])
        changed = "; the package's code had changed since" if resumed["code_changed"] else ""
        print(f"resumed from the checkpoint after round {rounds}{changed}")
    for part in ("data", "clipping", "cold_items", "sampled_candidates"):
        warning = (summary.get(part) or {}).get("warning")
        if warning:
            print(f"{PROG}: warning: {warning}", file=sys.stderr)
    for warning in summary.get("warnings") or ():  # the outcome's (experiments/outcome.py)
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if summary.get("seconds_per_round") is None:  # a baseline: no rounds
        print(f"seconds: {summary['seconds_total']:.3f}")
    else:
        print(f"seconds per round: {summary['seconds_per_round']:.3f}")
    if args.mlflow is not None:
        from fedem_private.experiments.tracking import log_run

        print(log_run(res.run_dir, args.mlflow).line())
    return 0


def _kept_of_run(args: argparse.Namespace) -> str:
    """What an interrupted ``run`` kept: its checkpoint, then the same command resumes; or
    nothing, and how to keep progress next time."""
    from fedem_private import api

    every = args.checkpoint_every
    if every is not None and args.out is not None:
        path = api.checkpoint_path(args.out)
        if path.exists():
            return f"the checkpoint {path} was kept: run the same command again to resume"
        return (f"nothing of this run was kept (its first checkpoint, after round {every}, "
                f"was not written yet)")
    return ("nothing of this run was kept (no checkpoint: --checkpoint-every N with --out "
            "saves its state every N rounds, and the same command then resumes)")


def _attack_options(items: list[str]) -> dict[str, dict[str, str]]:
    """``["imia.iterations=3"]`` -> {"imia": {"iterations": "3"}} (text; the attack's options
    dataclass converts it)."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        name, dot, key = head.strip().partition(".")
        if not (sep and dot and name and key.strip()):
            raise UserError(f"--attack-option: expected NAME.KEY=VALUE, got {item!r}")
        out.setdefault(name, {})[key.strip()] = value.strip()
    return out


def _cmd_attack(args: argparse.Namespace) -> int:
    from fedem_private import api

    rounds = None
    if args.rounds is not None:
        try:
            rounds = [int(r) for r in args.rounds.split(",") if r.strip()]
        except ValueError:
            raise UserError(f"--rounds: not a list of round numbers: {args.rounds!r}") from None
    names = None
    if args.attacks is not None:
        names = tuple(dict.fromkeys(t.strip() for t in args.attacks.split(",") if t.strip()))
    report = api.attack(args.run_dir, names, seed=args.seed, rounds=rounds,
                        known_fraction=args.known_fraction, device=args.device,
                        options=_attack_options(args.attack_option))
    if not args.quiet:
        from attacks.run import format_table

        print(format_table(report))
    print(f"wrote {report['path']}")
    failed = [r for r in report["records"]
              if r.get("audit_certified") and r.get("audit_ok") is False]
    if failed:  # a certified bound above the accounted eps: a privacy bug, said loudly
        for r in failed:
            print(f"{PROG}: error: certified audit FAILED ({r['attack']}): {r['audit_reason']}",
                  file=sys.stderr)
        return 3
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from fedem_private.data import DATASETS
    from fedem_private.data.download import REGISTRY, cached_dir, default_cache_dir, download

    if args.action == "list":
        cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
        print(f"cache: {cache} (--cache-dir, or $FEDEM_PRIVATE_CACHE)")
        for name in DATASETS:
            if name == "synthetic":
                where = "built in (seeded generator)"
            elif name == "csv":
                where = "any user,item[,rating][,timestamp] file via --data-dir"
            else:
                cached = cached_dir(name, cache)
                where = (f"cached at {cached}" if cached
                         else "not cached; use --data-dir or download")
            print(f"{name:<10} {where}")
        return 0
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if args.name not in REGISTRY:
        raise UserError(f"unknown dataset {args.name!r} for download; choose one of "
                        f"{', '.join(sorted(REGISTRY))}")
    folder, manifest = download(args.name, cache, url=args.url, sha256=args.sha256)
    print(f"{args.name}: {folder}")
    for fname, info in manifest["files"].items():
        state = "verified" if info["verified"] else "UNVERIFIED (no pinned checksum)"
        print(f"  {fname}  sha256 {info['sha256']}  {state}")
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, ``kill``), taken like Ctrl-C: the run in progress
    removes its temporary directory, a sweep writes results.csv, and nothing finished is
    lost."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated


def _tuning_privacy_line(acc: dict, out: str) -> str:
    """One line of a private search's eps (fedem_private.privacy.tuning), observer view."""
    view = acc["views"]["observer"]
    parts = [f"one trial {view['one_trial']['reported']:.3g}",
             f"every trial seen, with a final run {view['every_trial']['reported']:.3g}"]
    if "only_choice" in view:
        parts.append(f"only the choice seen, with a final run "
                     f"{view['only_choice']['reported']:.3g}")
    return (f"privacy of the search (observers of the released models, delta "
            f"{acc['delta']:g}): eps {'; '.join(parts)}; all views in {out}/privacy.json")


def _after_tuning(args: argparse.Namespace, private: bool) -> None:
    """The trials' table and, with ``--mlflow``, the study's logging."""
    from fedem_private.experiments.terminal import show_runs_under

    whose = ("exact, from the trials' run directories: the curator's, not released"
             if private else "each trial's run; chosen by validation, not by these")
    show_runs_under(Path(args.out) / "trials", f"trials in {args.out} (test metrics, {whose})")
    if args.mlflow is not None:
        from fedem_private.experiments.tracking import log_study

        print(log_study(args.out, args.mlflow).line())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2: a user error; 130: Ctrl-C; 143: SIGTERM)."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        return _main(argv)
    except Terminated as exc:
        kept = getattr(exc, "kept", None) or ("finished run directories are intact (run the "
                                              "same command again to resume)")
        print(f"{PROG}: terminated; {kept}", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None) -> int:
    try:
        from fedem_private.plugins import load_all

        load_all()  # other packages' parts, before any flag or name is read (a broken one: exit 2)
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "datasets":
            return _cmd_datasets(args)
        if args.command == "list":
            from fedem_private.experiments.listing import catalogue, format_catalogue

            print(format_catalogue(catalogue()))
            return 0
        if args.command == "attack":
            return _cmd_attack(args)
        if args.command == "sweep":
            from fedem_private.experiments.sweep_cli import run_sweep_from_args

            return run_sweep_from_args(args)
        if args.command == "tune":
            from fedem_private.experiments.tracking import check_uri
            from fedem_private.experiments.tune import run_tuning

            check_uri(args.mlflow)
            result = run_tuning(args.spec, args.out, args.trials, ray=args.ray,
                                    workers=args.workers if args.ray else 1,
                                    best_by=args.best_by)
            diverged = f" ({result['diverged']} more diverged)" if result["diverged"] else ""
            noisy = "noisy " if "privacy" in result else ""
            print(f"{result['completed']} trials{diverged}; best {noisy}{result['objective']} "
                  f"{result['best_value']:.4f} with {result['best_params']}; config in "
                  f"{args.out}/best.toml")
            if "privacy" in result:
                print(_tuning_privacy_line(result["privacy"], args.out))
            _after_tuning(args, private="privacy" in result)
            return 0
        if args.command == "report":
            from fedem_private.experiments.sweep_cli import run_report_from_args

            return run_report_from_args(args)
        if args.command == "ladder":
            from fedem_private.experiments.ladder_cli import run_ladder_from_args

            return run_ladder_from_args(args)
        raise UserError(f"unknown command {args.command!r}")
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            raise
        kept = getattr(exc, "kept", None) or "finished run directories are intact"
        print(f"{PROG}: interrupted; {kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
