"""The ``fedem-private`` command.

User errors (bad files, bad values, unknown names) print one line on stderr
and exit with code 2; nothing already written is lost or half-written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import UserError

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


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


# flag -> (config key, type, help)
RUN_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--dataset", "data.dataset", str, "synthetic, ml-100k, ml-1m, filmtrust, lastfm-2k, csv"),
    ("--data-dir", "data.data_dir", str, "directory (or CSV file) holding the dataset"),
    ("--protocol", "data.protocol", str, "strict (default) or paper"),
    ("--min-rating", "data.min_rating", _number,
     "positives are the pairs rated >= this (default: every rated pair; datasets with "
     "ratings only)"),
    ("--method", "federation.method", str, "fedmf, fedsim, fedem or local"),
    ("--aggregation", "federation.aggregation", str, "fedavg, uniform, similarity, none"),
    ("--merge", "federation.merge", str, "sr, sm, dm or em"),
    ("--alpha", "federation.alpha", _number, "similarity weight alpha (equation 13)"),
    ("--rho", "federation.rho", _number, "fixed merge weight for --merge sm"),
    ("--adapter-lr", "federation.adapter_lr", _number, "adapter learning rate (equation 11)"),
    ("--rounds", "train.rounds", _integer, "federated rounds"),
    ("--local-epochs", "train.local_epochs", _integer, "local epochs per round"),
    ("--lr", "train.lr", _number, "local learning rate (Adam)"),
    ("--dim", "train.dim", _integer, "embedding dimension"),
    ("--batch-size", "train.batch_size", _integer, "local batch size"),
    ("--num-negatives", "train.num_negatives", _integer, "negatives per positive"),
    ("--client-fraction", "train.client_fraction", _number, "fraction of clients per round"),
    ("--eval-every", "train.eval_every", _integer, "evaluate every N rounds"),
    ("--seed", "train.seed", _integer, "random seed"),
    ("--memory-budget-mb", "train.memory_budget_mb", _integer, "memory budget for chunks"),
    ("--privacy", "privacy.mode", str,
     "none, ldp-laplace, ldp-gaussian, paper, ldp-touched-rows (INSECURE)"),
    ("--epsilon", "privacy.epsilon", _number, "total epsilon target over the rounds (inf ok)"),
    ("--epsilon-round", "privacy.epsilon_round", _number, "per-round epsilon"),
    ("--delta", "privacy.delta", _number, "delta for accounting"),
    ("--clip", "privacy.clip", _number, "clip bound C of the uploaded delta"),
    ("--noise-multiplier", "privacy.noise_multiplier", _number, "noise scale / sensitivity"),
    ("--accountant", "privacy.accountant", str, "calibrate with basic, advanced, rdp or pld"),
    ("--paper-clip", "privacy.paper_clip", _number, "paper mode: gradient clip Z"),
    ("--paper-lambda", "privacy.paper_lambda", _number, "paper mode: Laplace noise scale"),
]


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config file; flags override it")
    for flag, key, typ, text in RUN_FLAGS:
        p.add_argument(flag, dest=key, type=typ, default=None, help=text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Simulate private federated recommendation and "
                     "measure utility, privacy spent and attack success.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="train one configuration and write a run directory")
    _add_run_flags(run)
    run.add_argument("--out", help="run directory (default: runs/<dataset>-<method>-<time>)")
    run.add_argument("--force", action="store_true", help="replace a non-empty --out")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--record-rounds", metavar="ROUNDS",
                     help="record what the server saw in these rounds for the attacks, "
                          "e.g. 1,50,last")
    run.add_argument("--record-clients", metavar="N", type=_integer,
                     help="record the first N client ids (default 100; needs --record-rounds)")
    att = sub.add_parser("attack", help="run the inference attacks on a recorded run directory, "
                         "score them and audit the privacy accounting")
    att.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written with "
                     "--record-rounds")
    att.add_argument("--attacks", default=None,
                     help="comma-separated attacks (default: support,projection,imia,attribute,"
                          "canary)")
    att.add_argument("--known-fraction", type=_number, default=0.5,
                     help="attribute attack: fraction of recorded clients whose attribute the "
                          "server knows (default 0.5)")
    att.add_argument("--rounds", default=None, metavar="ROUNDS",
                     help="only these recorded rounds, e.g. 1,50 (default: all)")
    att.add_argument("--seed", type=_integer, default=0,
                     help="the attacker's and scorer's own seed (default 0)")
    att.add_argument("--quiet", action="store_true", help="no table, only write attacks.json")
    from .sweep_cli import (
        REPORT_DESCRIPTION,
        REPORT_HELP,
        SWEEP_DESCRIPTION,
        SWEEP_HELP,
        add_report_arguments,
        add_sweep_arguments,
    )

    add_sweep_arguments(sub.add_parser("sweep", help=SWEEP_HELP, description=SWEEP_DESCRIPTION))
    add_report_arguments(sub.add_parser("report", help=REPORT_HELP,
                                        description=REPORT_DESCRIPTION))
    ds = sub.add_parser("datasets", help="list or download datasets")
    ds_sub = ds.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ds_sub.add_parser("list", help="known datasets and where they are found")
    dl = ds_sub.add_parser("download", help="fetch an official archive into the cache")
    dl.add_argument("name")
    dl.add_argument("--cache-dir", help="cache directory (default ~/.cache/fedem-private)")
    dl.add_argument("--url", help="download from this address instead of the official one")
    dl.add_argument("--sha256", help="expected SHA-256 of the archive")
    return parser


def config_from_args(args: argparse.Namespace):
    """Config file (if any) plus command-line overrides, validated."""
    from .config import RunConfig, load_toml, with_overrides

    base = load_toml(args.config) if args.config else RunConfig()
    overrides = {key: getattr(args, key) for _, key, _, _ in RUN_FLAGS}
    overrides.update({"record.rounds": getattr(args, "record_rounds", None),
                      "record.clients": getattr(args, "record_clients", None)})
    return with_overrides(base, overrides).validate().resolved()


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # validate before the heavy imports
    if cfg.data.data_dir is not None and not Path(cfg.data.data_dir).expanduser().exists():
        what = "file" if cfg.data.dataset == "csv" else "directory"
        raise UserError(f"dataset {cfg.data.dataset}: {what} not found: {cfg.data.data_dir}")
    from .runner import execute, recording_hook

    out = args.out or str(Path("runs") / (f"{cfg.data.dataset}-{cfg.federation.method}-"
                                          f"{_dt.datetime.now():%Y%m%d-%H%M%S}"))
    bar = None

    def on_start(sim) -> None:
        nonlocal bar
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.train.rounds, desc=f"{cfg.federation.method} rounds",
                       unit="round", file=sys.stderr, dynamic_ncols=True)

    def on_round(stats) -> None:
        if bar is None:
            return
        post = {}
        if stats.metrics:
            post["HR@10"] = f"{stats.metrics['full']['hr@10']:.4f}"
            post["NDCG@10"] = f"{stats.metrics['full']['ndcg@10']:.4f}"
        if "eps_spent" in stats.privacy:
            post["eps"] = f"{stats.privacy['eps_spent']:.3g}"
        bar.set_postfix(post, refresh=False)
        bar.update(1)

    try:
        summary = execute(cfg, out, force=args.force, on_round=on_round, on_start=on_start,
                          setup=recording_hook(cfg))
    finally:
        if bar is not None:
            bar.close()
    m = summary["metrics"] or {}
    print(f"wrote {out}")
    for kind in ("full", "sampled"):
        if kind in m:
            print(f"{kind:>7}: HR@10 {m[kind]['hr@10']:.4f}  NDCG@10 {m[kind]['ndcg@10']:.4f}")
    eps = (summary.get("privacy") or {}).get("epsilon")
    if isinstance(eps, dict) and "reported" in eps:
        print(f"privacy: {summary['privacy']['mode']}  eps spent (worst client) "
              f"{eps['reported']}")
    print(f"seconds per round: {summary['seconds_per_round']:.3f}")
    return 0


def check_run_dir(run_dir: str | Path) -> Path:
    """``run_dir`` as a Path when it is a run directory; else a one-line UserError."""
    path = Path(run_dir).expanduser()
    if not path.exists():
        raise UserError(f"run directory not found: {path}")
    if not path.is_dir() or not (path / "summary.json").is_file():
        raise UserError(f"not a run directory: {path} (no summary.json; attack a directory "
                        "written by `fedem-private run --record-rounds ...`)")
    return path


def _cmd_attack(args: argparse.Namespace) -> int:
    from .attack_step import ATTACK_NAMES

    check_run_dir(args.run_dir)  # validate everything before the heavy imports
    names = None
    if args.attacks is not None:
        names = tuple(dict.fromkeys(t.strip() for t in args.attacks.split(",") if t.strip()))
        if not names:
            raise UserError("--attacks: no attack named")
        unknown = [n for n in names if n not in ATTACK_NAMES]
        if unknown:
            raise UserError(f"unknown attack {unknown[0]!r}; known: {', '.join(ATTACK_NAMES)}")
    if not 0.0 < args.known_fraction < 1.0:
        raise UserError(f"--known-fraction must be in (0, 1), got {args.known_fraction}")
    rounds = None
    if args.rounds is not None:
        try:
            rounds = [int(r) for r in args.rounds.split(",") if r.strip()]
        except ValueError:
            raise UserError(f"--rounds: not a list of round numbers: {args.rounds!r}") from None
    from attacks.run import DEFAULT_ATTACKS, format_table, run_attacks

    names = names or DEFAULT_ATTACKS
    report = run_attacks(args.run_dir, names, seed=args.seed, rounds=rounds,
                         known_fraction=args.known_fraction)
    if not args.quiet:
        print(format_table(report))
    print(f"wrote {report['path']}")
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from .data import DATASETS
    from .data.download import REGISTRY, cached_dir, default_cache_dir, download

    if args.action == "list":
        for name in DATASETS:
            if name == "synthetic":
                where = "built in (seeded generator)"
            elif name == "csv":
                where = "any user,item[,rating][,timestamp] file via --data-dir"
            else:
                cached = cached_dir(name)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "datasets":
            return _cmd_datasets(args)
        if args.command == "attack":
            return _cmd_attack(args)
        if args.command == "sweep":
            from .sweep_cli import run_sweep_from_args

            return run_sweep_from_args(args)
        if args.command == "report":
            from .sweep_cli import run_report_from_args

            return run_report_from_args(args)
        raise UserError(f"unknown command {args.command!r}")
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; finished run directories are intact", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
