"""Command-line surface of ``fedem-private ladder`` (light at import: the work is imported
when the command runs; :mod:`fedem_private.experiments.ladder` has the rules)."""

from __future__ import annotations

import argparse
from typing import Any

LADDER_HELP = ("the accuracy ladder on any dataset: chance, MostPop, DP-MostPop, centralised "
               "ceilings and federated methods, fixed or tuned; resumable; table and plots")
LADDER_DESCRIPTION = (
    "Run the rungs named by --rungs on one dataset, split and evaluation, print the plan "
    "(each rung, its runs, an estimated time) first, skip finished runs, and write "
    "ladder.md, ladder.csv, results.csv, headline.png and panels.png into --out. Rung "
    "syntax: KIND[:WORD,KEY=VALUE,...], e.g. dp-mostpop:central,local, fedmf:cdp-gaussian, "
    "ease:lambda=200. Kinds: chance, mostpop, dp-mostpop, centralised, ease, als and every "
    "federated method (fedmf, pfedrec, fedem, pfedrec-em, ...); words: privacy modes "
    "(federated) or architectures (dp-mostpop).")


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def add_ladder_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ladder`` subcommand's arguments."""
    from fedem_private.experiments.ladder import DEFAULT_RUNGS

    p.add_argument("--dataset", default=None,
                   help="any dataset the loaders accept (ml-100k, filmtrust, lastfm-2k, csv, "
                        "synthetic, ...; default: --config's, else ml-100k)")
    p.add_argument("--data-dir", default=None, metavar="PATH",
                   help="the dataset's folder, or the file for csv")
    p.add_argument("--protocol", default="strict", help="split protocol (default strict)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a run config whose [data] section starts the ladder's (synthetic "
                        "sizes, min_rating, ...); --dataset, --data-dir, --protocol override")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the ladder's folder: runs/, tune/, ladder.md, ladder.csv, plots")
    p.add_argument("--rungs", nargs="+", default=list(DEFAULT_RUNGS), metavar="RUNG",
                   help=f"the rungs, and only these (default: {' '.join(DEFAULT_RUNGS)})")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epsilons", type=_positive, nargs="+", default=[1.0, 4.0, 16.0, 64.0],
                   help="total eps of every private rung and of DP-MostPop (default 1 4 16 64)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of every federated rung, tuned ones too (default: the "
                        "rung's own: 100, 40 under cdp-gaussian, 20 under ldp-dpsgd, a tuned "
                        "file's)")
    p.add_argument("--round", dest="round_rule", choices=("last", "best-val"), default="last",
                   help="the headline round of every federated rung: the last (default) or "
                        "the one chosen on the validation item")
    p.add_argument("--tuned", nargs="+", default=[], metavar="FILE",
                   help="`fedem-private tune` best.toml files, e.g. tuned on another dataset: "
                        "each serves the rung of its method and privacy mode; its [data] "
                        "section is replaced by this command's. Those tuned on ML-100K, "
                        "FilmTrust and LastFM-2K are in a checkout's "
                        "benchmarks/results/ladder/tuning/*-best.toml (not in the wheel)")
    p.add_argument("--tune", nargs="+", default=[], metavar="TUNE_FILE",
                   help="tuning files run here on this dataset first (resumable, in "
                        "<out>/tune/<name>); a private one needs [tune.private] (accounted)")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0, metavar="M",
                   help="a federated run expected to take longer keeps one checkpoint, "
                        "rewritten about every M minutes and removed when it finishes "
                        "(0: none; default 10)")
    p.add_argument("--force", action="store_true",
                   help="run every run again, replacing finished ones")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and stop (tuning files are not run)")
    from fedem_private.experiments.sweep_cli import add_mlflow_argument

    add_mlflow_argument(p, "log the ladder to MLflow once it is written: a parent run "
                        "(ladder.md, ladder.csv, the figures), one nested run per finished "
                        "run; runs logged before are skipped; default store "
                        "sqlite:///<DIR's folder>/mlflow.db; needs pip install "
                        "'fedem-private[mlflow]'")


def ladder_options(args: argparse.Namespace) -> Any:
    """The :class:`~fedem_private.experiments.ladder.LadderOptions` of the arguments."""
    from fedem_private.experiments.ladder import LadderOptions
    from fedem_private.simulation.config import read_toml

    data: dict[str, Any] = {}
    if args.config:
        data = dict(read_toml(args.config, "run config").get("data") or {})
    dataset = args.dataset or data.get("dataset") or "ml-100k"
    if data.get("dataset", dataset) != dataset:  # the file's folder is another dataset's
        data.pop("data_dir", None)
    data.update({"dataset": dataset, "protocol": args.protocol})
    if args.data_dir is not None:
        data["data_dir"] = args.data_dir
    return LadderOptions(data=data, seeds=tuple(args.seeds), epsilons=tuple(args.epsilons),
                         rounds=args.rounds, round_rule=args.round_rule)


def ladder_table(out: str, title: str) -> Any:
    """The terminal table of the ladder just written into ``out``: its ladder.csv's rows
    (ladder.md's rungs, labels and cells), so the terminal and ladder.md show the same
    rungs under the same names, and no run of a rung this call did not ask for."""
    import csv
    from pathlib import Path

    from fedem_private.experiments.ladder import METRICS
    from fedem_private.experiments.terminal import ResultsTable

    with (Path(out) / "ladder.csv").open(newline="") as fh:
        records = list(csv.DictReader(fh))

    def cell(r: dict[str, str], metric: str) -> str:
        mean, sd = float(r[f"{metric}_mean"]), float(r[f"{metric}_sd"])
        return f"{mean:.4f}" if int(r["seeds"]) < 2 else f"{mean:.4f} ± {sd:.4f}"

    def eps(r: dict[str, str]) -> str:
        if r["eps_with_search"]:
            return f"{float(r['eps_reported']):.3g} ({float(r['eps_with_search']):.3g} " \
                   "with the search)"
        return f"{float(r['eps_reported']):.4g}" if r["eps_reported"] else "-"

    header = ("rung", "eps (reported)", "seeds", "HR@10 full", "NDCG@10 full",
              "HR@10 sampled", "NDCG@10 sampled")
    body = tuple((r["label"], eps(r), r["seeds"], *(cell(r, m) for m in METRICS))
                 for r in records)
    return ResultsTable(title, header, body)


def run_ladder_from_args(args: argparse.Namespace) -> int:
    """``fedem-private ladder``; returns the exit code."""
    from fedem_private.errors import UserError
    from fedem_private.experiments import tracking
    from fedem_private.experiments.ladder import run_ladder
    from fedem_private.experiments.terminal import show

    if args.rounds is not None and args.rounds < 1:
        raise UserError(f"--rounds must be a positive integer, got {args.rounds}")
    mlflow = None if args.dry_run else getattr(args, "mlflow", None)
    tracking.check_uri(mlflow)  # MLflow missing: said before any rung runs
    written = run_ladder(args.rungs, args.out, ladder_options(args), tuned_files=args.tuned,
                         tune_files=args.tune, force=args.force,
                         checkpoint_minutes=args.checkpoint_minutes, dry_run=args.dry_run)
    for path in written:
        print(f"wrote {path}")
    if written:  # this ladder's rows, as ladder.md has them (not every run under --out)
        show(ladder_table(args.out, f"ladder in {args.out} (mean ± sd over seeds)"))
    if mlflow is not None:
        print(tracking.log_ladder(args.out, mlflow).line())
    return 0
