"""Command-line surface of ``fedem-private sweep`` and ``fedem-private report``.

Light on purpose (no torch, pandas or matplotlib at import): building the
parser stays fast; the work is imported when a command runs. Wiring::

    from fedem_private.experiments.sweep_cli import add_report_arguments, add_sweep_arguments, ...
    sw = sub.add_parser("sweep", help=SWEEP_HELP, description=SWEEP_DESCRIPTION)
    add_sweep_arguments(sw)
    rep = sub.add_parser("report", help=REPORT_HELP, description=REPORT_DESCRIPTION)
    add_report_arguments(rep)
    ...
    if args.command == "sweep":
        return run_sweep_from_args(args)
    if args.command == "report":
        return run_report_from_args(args)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedem_private.errors import UserError
from fedem_private.experiments import tracking
from fedem_private.experiments.naming import QUICK_OUT, check_report_sources, default_out
from fedem_private.experiments.ray_tasks import LOCAL as LOCAL_RAY
from fedem_private.experiments.ray_tasks import RAY_MISSING, ray_installed

SWEEP_HELP = "run a grid of runs (resumable), with attacks; no CONFIG: the quick sweep"
SWEEP_DESCRIPTION = (
    "Run a grid of configurations (datasets x methods x privacy modes x epsilons x seeds x "
    "protocols), one run directory each, then attack the recorded uploads. Finished runs "
    "are skipped on restart, so an interrupted sweep resumes where it stopped. Without "
    "CONFIG, runs the built-in quick sweep (4,000 synthetic users, FedMF vs FedEM under "
    "user-level central DP, DP-FedAvg with cohorts of 800, eps in {inf, 8, 1}, 3 seeds, "
    "projection attack, beside MostPop, EASE, centralised MF and DP-MostPop; a few "
    "minutes on 2 cores).")
SWEEP_ARGS_HELP = {
    "config": "sweep file: a [sweep] table of grid axes and a [base] run config "
              "(default: the built-in quick sweep)",
    "out": f"root directory of the run directories (default: {QUICK_OUT}, or "
           "runs/sweep-<CONFIG name>)",
    "jobs": "grid points run in parallel, each in its own process (0: one per CPU core; "
            "default 1; negative numbers are refused); with --ray: the CPUs of a local Ray "
            "instance, or at most N points at once on a cluster (default: all Ray has)",
    "ray": "run the grid points as Ray tasks: on a local Ray instance, or on the running "
           "cluster at ADDRESS (auto, HOST:6379 or ray://HOST:10001; DIR must then be on a "
           "filesystem every node sees at the same path); needs pip install "
           "'fedem-private[ray]'",
    "force": "re-run every grid point, replacing finished run directories",
    "no_progress": "no progress bar",
    "mlflow": "log the finished points to MLflow once the sweep stops: one parent run for "
              "the sweep, one nested run per point (params, per-round metrics, privacy "
              "tags, files); points logged before are skipped; default store "
              "sqlite:///<DIR's folder>/mlflow.db; needs pip install 'fedem-private[mlflow]'",
}

REPORT_HELP = "tables (report.md), results.csv and PNG plots over the runs under DIR"
REPORT_DESCRIPTION = (
    "Summarise every run directory under DIR (a sweep's output, or single runs): write "
    "results.csv, report.md (mean ± std over seeds) and PNG plots of HR@10 vs eps, attack "
    "AUC vs eps and utility vs attack success. Several DIRs and results.csv files from "
    "earlier sweeps can be combined (with --out); a run named twice keeps the last row.")
REPORT_ARGS_HELP = {
    "dir": "folder holding run directories (searched recursively for summary.json), or a "
           "results.csv written by an earlier sweep or report",
    "out": "where to write report.md, results.csv and the plots (default: DIR, whose report "
           "is rewritten; required with several sources or a results.csv)",
    "force": "replace a report already in --out (its old plots are removed)",
}


def jobs_count(text: str) -> int:
    """``--jobs N``: an integer >= 0 (0: one per CPU core)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 for one job per CPU "
                                         "core, or a number of jobs")
    return value


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``sweep`` (see :func:`run_sweep_from_args`)."""
    parser.add_argument("config", nargs="?", default=None, metavar="CONFIG",
                        help=SWEEP_ARGS_HELP["config"])
    parser.add_argument("--out", default=None, metavar="DIR", help=SWEEP_ARGS_HELP["out"])
    parser.add_argument("--jobs", type=jobs_count, default=None, metavar="N",
                        help=SWEEP_ARGS_HELP["jobs"])
    parser.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                        help=SWEEP_ARGS_HELP["ray"])
    parser.add_argument("--force", action="store_true", help=SWEEP_ARGS_HELP["force"])
    parser.add_argument("--no-progress", action="store_true",
                        help=SWEEP_ARGS_HELP["no_progress"])
    add_mlflow_argument(parser, SWEEP_ARGS_HELP["mlflow"])


def add_mlflow_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                        text: str) -> None:
    """``--mlflow [URI]`` (:mod:`~fedem_private.experiments.tracking`; no URI: the SQLite
    store beside the runs)."""
    parser.add_argument("--mlflow", nargs="?", const=tracking.DEFAULT, default=None,
                        metavar="URI", help=text)


def show_finished(root: str, title: str) -> None:
    """The compact table of the runs in ``root``'s results.csv (none: nothing printed)."""
    from fedem_private.experiments.results import RESULTS_FILE, read_results
    from fedem_private.experiments.terminal import show_results

    path = Path(root).expanduser() / RESULTS_FILE
    if path.is_file():
        show_results(read_results(path), title)


def run_sweep_from_args(args: argparse.Namespace) -> int:
    """Run the sweep of parsed :func:`add_sweep_arguments` arguments; the exit code. Then
    the finished points' table, and with ``--mlflow`` their logging."""
    from fedem_private.experiments.sweep_spec import load_spec

    tracking.check_uri(getattr(args, "mlflow", None))  # before anything runs
    load_spec(args.config)  # a bad sweep file fails here, before torch and pandas load
    if args.ray is not None and args.ray.endswith(".toml"):
        raise UserError(f"--ray {args.ray}: that is a sweep file, not a Ray address; put "
                        "CONFIG before --ray (sweep CONFIG --ray [ADDRESS])")
    if args.ray is not None and not ray_installed():
        raise UserError(RAY_MISSING)
    from fedem_private.experiments.sweep import run_sweep

    code = run_sweep(args.config, args.out, jobs=args.jobs, force=args.force,
                     progress=not args.no_progress, ray=args.ray)
    root = args.out or default_out(args.config)
    show_finished(root, f"finished runs in {root} (mean ± std over seeds)")
    if getattr(args, "mlflow", None) is not None:
        print(tracking.log_sweep(Path(root).expanduser(), args.mlflow).line())
    return code


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``report`` (see :func:`run_report_from_args`)."""
    parser.add_argument("dir", metavar="DIR", nargs="+", help=REPORT_ARGS_HELP["dir"])
    parser.add_argument("--out", default=None, metavar="DIR", help=REPORT_ARGS_HELP["out"])
    parser.add_argument("--variants", default=None, metavar="LIST",
                        help="comma-separated method variants to keep (e.g. fedmf,fedem-em); "
                             "default: every run")
    parser.add_argument("--force", action="store_true", help=REPORT_ARGS_HELP["force"])


def run_report_from_args(args: argparse.Namespace) -> int:
    """Write the report of parsed :func:`add_report_arguments` arguments; prints the files."""
    check_report_sources(list(args.dir), args.out)  # before pandas and matplotlib load
    from fedem_private.experiments.report import write_report

    variants = ([v.strip() for v in args.variants.split(",") if v.strip()]
                if args.variants else None)
    for path in write_report(args.dir, args.out, variants=variants,
                             force=args.force):
        print(f"wrote {path}")
    out = args.out or args.dir[0]
    show_finished(out, f"runs reported in {out} (mean ± std over seeds)")
    return 0
