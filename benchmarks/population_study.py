"""When does private federated recommendation pay? (issue 66, item 6; docs/design.md
section 17, docs/population.md.)

    python -m benchmarks.population_study --users 1000 10000 100000 --epsilons 1 4 8 \\
        --seeds 0 --out benchmarks/results/population

For each population size N, a population calibrated to ML-100K (``--dataset synthetic
--calibrate-to ml-100k --users N``) runs the study's rungs, each one run directory
``runs/population/N<N>/<rung>-seed<s>`` written through the public API (a finished one is
not run again, a killed one resumes from its checkpoint):

- ``mostpop`` and ``dp-mostpop`` central (k = 50) at every eps: the floor;
- ``--taste max`` draws the users from the misspecified population of (P.2') instead of
  MF's own bilinear model (docs/population.md, "Fidelity");
- each federated method (``--methods``: ``fedmf``, ``pfedrec``) without noise, and under
  each mechanism (``--mechanisms``: ``cdp-gaussian``, DP-FedAvg with Poisson sampling at
  q = K / N; ``dp-ftrl``, tree aggregation over cyclic cohorts of K) at every eps.

Settings fixed in advance, the same at every N: the method's ML-100K settings tuned at
eps 4 under ``cdp-gaussian`` (``benchmarks/results/ladder/tuning/<method>-cdp4-ml-100k-
best.toml``: rounds, local epochs, rates, negatives, dimension, clip, server rate), with the
cohort ``--cohort`` K in place of its sampling rate, clients that keep no item table
(``--client-tables global``), each evaluated user fine-tuning ``--finetune`` local epochs
from the server's table before it is ranked, and ``--eval-users`` users evaluated (full
HR@10 with its standard error). Writes ``<out>/study.csv`` (one row per run), ``study.md``
(the table, with each private point's verdict against DP-MostPop at its eps: beats / below
beyond two standard errors of the difference, else within noise) and ``study.png`` (full
HR@10 against N on a log axis, one panel per eps).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path
from typing import Any

TUNED = "benchmarks/results/ladder/tuning/{method}-cdp4-ml-100k-best.toml"
# the tuned file's keys the study keeps (everything else: the study's own or the defaults)
KEPT = {"train": ("rounds", "local_epochs", "lr", "batch_size", "dim", "num_negatives"),
        "federation": ("method", "server_lr"), "privacy": ("clip",)}
#: one colour per (method, mechanism) in every panel; "none" is the run without noise
COLOURS = {("fedmf", "cdp-gaussian"): "tab:blue", ("fedmf", "dp-ftrl"): "tab:orange",
           ("fedmf", "none"): "tab:green", ("pfedrec", "cdp-gaussian"): "tab:red",
           ("pfedrec", "dp-ftrl"): "tab:purple", ("pfedrec", "none"): "tab:brown"}
NAMES = {"fedmf": "FedMF", "pfedrec": "PFedRec", "cdp-gaussian": "DP-FedAvg",
         "dp-ftrl": "DP-FTRL"}


def tuned(method: str, path: str | None = None) -> dict[str, Any]:
    """The kept keys of ``method``'s settings: its eps-4 ML-100K ones (:data:`TUNED`), or
    those of ``path`` (``--settings``: e.g. a tuning on a calibrated population's validation
    item), whose cohort and fine-tune epochs then replace ``--cohort`` and ``--finetune``."""
    values = tomllib.loads(Path(path or TUNED.format(method=method)).read_text())
    keep = dict(KEPT)
    if path is not None:
        keep["train"] = (*KEPT["train"], "cohort_size", "eval_finetune")
    return {section: {k: values[section][k] for k in keys if k in values.get(section, {})}
            for section, keys in keep.items()}


def rungs(n: int, seed: int, args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(name, config) of every run at population size ``n`` and ``seed``."""
    data = {"dataset": "synthetic", "calibrate_to": "ml-100k", "data_dir": args.data_dir,
            "users": n, "protocol": "strict",
            **({"population_taste": args.taste} if args.taste != "bilinear" else {})}
    common = {"seed": seed, "eval_users": min(args.eval_users, n)}
    out: list[tuple[str, dict[str, Any]]] = [
        (f"mostpop-seed{seed}", {"data": data, "train": common,
                                 "federation": {"method": "mostpop"}})]
    for eps in args.epsilons:
        out.append((f"dp-mostpop-central-eps{eps:g}-seed{seed}", {
            "data": data, "train": common, "federation": {"method": "dp-mostpop"},
            "baseline": {"architecture": "central", "epsilon": eps, "k": 50}}))
    for method in args.methods:
        base = tuned(method, args.settings.get(method))
        train = {"cohort_size": args.cohort, "eval_finetune": args.finetune, **base["train"],
                 **common, "eval_every": base["train"]["rounds"], "client_tables": "global"}
        train["cohort_size"] = min(train["cohort_size"], n)
        fed = base["federation"]
        if not args.no_reference:
            out.append((f"{method}-none-seed{seed}", {"data": data, "train": train,
                                                       "federation": fed}))
        for mech in args.mechanisms:
            for eps in args.epsilons:
                privacy = {"mode": mech, "epsilon": eps, "delta": 1e-5, **base["privacy"],
                           **({"clip": args.clip} if args.clip else {})}
                out.append((f"{method}-{mech}-eps{eps:g}-seed{seed}", {
                    "data": data, "train": train, "federation": fed, "privacy": privacy}))
    return out


def ensure(path: Path, cfg: dict[str, Any], checkpoint_every: int = 20) -> dict[str, Any]:
    """Run ``cfg`` into ``path`` unless it finished there (a checkpoint every
    ``checkpoint_every`` rounds); its summary."""
    import fedem_private as fp

    if not (path / "summary.json").is_file():
        print(f"population_study: {path}", file=sys.stderr, flush=True)
        fp.run(cfg, out=path, force=True, checkpoint_every=checkpoint_every)
    return json.loads((path / "summary.json").read_text())


def row(n: int, name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """One study.csv row: the rung, N, its full HR@10 and standard error, eps, seconds."""
    full = summary["metrics"]["full"]
    users = full.get("users", summary["n_users"])
    se = full.get("hr@10_se")
    if se is None:  # every user ranked: the binomial standard error
        se = math.sqrt(full["hr@10"] * (1 - full["hr@10"]) / max(users - 1, 1))
    privacy = summary.get("privacy") or {}
    rung, _, seed = name.rpartition("-seed")
    return {"users": n, "rung": rung, "seed": int(seed), "hr10_full": full["hr@10"],
            "hr10_full_se": se, "eval_users": users,
            "eps_reported": privacy.get("epsilon_reported", privacy.get("epsilon")),
            "seconds_total": summary.get("seconds_total"),
            "seconds_per_round": summary.get("seconds_per_round")}


def verdict(point: tuple[float, float], floor: tuple[float, float]) -> str:
    """beats / below DP-MostPop beyond two standard errors of the difference, else within
    noise."""
    gap = point[0] - floor[0]
    se = math.hypot(point[1], floor[1])
    if gap > 2 * se:
        return "beats"
    return "below" if gap < -2 * se else "within noise"


def seed_means(frame: Any) -> Any:
    """One row per (N, rung): the mean full HR@10 over seeds, its standard error and the
    number of seeds. The standard error is the larger of the evaluation samples' (their
    root-sum-square over the seeds, divided by the count) and the seeds' spread (standard
    deviation, ddof 1, over sqrt(count)): with one seed only the first exists; each seed
    draws its own population, training and evaluation users, so the spread holds every
    source of noise, but three seeds estimate it loosely, hence the larger of the two."""
    import pandas as pd

    def one(d: Any) -> Any:
        n = len(d)
        se = float(math.sqrt((d.hr10_full_se ** 2).sum())) / n
        if n > 1:
            se = max(se, float(d.hr10_full.std(ddof=1)) / math.sqrt(n))
        return pd.Series({"hr": float(d.hr10_full.mean()), "se": se, "seeds": n})

    return frame.groupby(["users", "rung"])[["hr10_full", "hr10_full_se"]].apply(
        one).reset_index()


def table(frame: Any, epsilons: list[float]) -> str:
    """study.md's table: one row per (N, eps), the floor and every method's point."""
    g = seed_means(frame)
    cell = {(r.users, r.rung): (r.hr, r.se) for r in g.itertuples()}
    seeds = {(r.users, r.rung): int(r.seeds) for r in g.itertuples()}
    federated = sorted({r for r in g.rung if r.split("-")[0] in NAMES and "-eps" in r}
                       - {r for r in g.rung if r.startswith("dp-mostpop")})
    lines = ["| N | eps | MostPop | DP-MostPop central | rung | seeds | full HR@10 | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for n in sorted(g.users.unique()):
        for eps in epsilons:
            floor = cell.get((n, f"dp-mostpop-central-eps{eps:g}"))
            pop = cell.get((n, "mostpop"))
            for rung in [r for r in federated if r.endswith(f"-eps{eps:g}")]:
                point = cell.get((n, rung))
                if point is None or floor is None:
                    continue
                lines.append(f"| {n:,} | {eps:g} | {pop[0]:.4f} ± {pop[1]:.4f} | "
                             f"{floor[0]:.4f} ± {floor[1]:.4f} | {rung} | "
                             f"{seeds[(n, rung)]} | {point[0]:.4f} ± "
                             f"{point[1]:.4f} | {verdict(point, floor)} |")
        for rung in sorted({r for r in g.rung if r.endswith("-none")}):
            if (n, rung) not in cell:
                continue
            point = cell[(n, rung)]
            lines.append(f"| {n:,} | none | | | {rung} | {seeds[(n, rung)]} | "
                         f"{point[0]:.4f} ± {point[1]:.4f} | |")
    return "\n".join(lines) + "\n"


def plot(frame: Any, epsilons: list[float], path: Path) -> None:
    """study.png: full HR@10 against N (log axis), one panel per eps; the private methods
    as lines with two-standard-error bars, DP-MostPop as a band, the non-private models
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = seed_means(frame)
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.2 * len(epsilons), 4.2),
                             sharey=True, squeeze=False)
    for ax, eps in zip(axes[0], epsilons, strict=True):
        floor = g[g.rung == f"dp-mostpop-central-eps{eps:g}"].sort_values("users")
        ax.fill_between(floor.users, floor.hr - 2 * floor.se, floor.hr + 2 * floor.se,
                        color="0.8", label="DP-MostPop (±2 SE)")
        ax.plot(floor.users, floor.hr, color="0.4", lw=1)
        for rung in sorted(r for r in g.rung.unique() if r.endswith(f"-eps{eps:g}")
                           and not r.startswith("dp-mostpop")):
            d = g[g.rung == rung].sort_values("users")
            method, mech = rung.split("-")[0], rung.split("-", 1)[1].rsplit("-eps", 1)[0]
            ax.errorbar(d.users, d.hr, yerr=2 * d.se, marker="o", capsize=2,
                        color=COLOURS.get((method, mech)),
                        label=f"{NAMES[method]}, {NAMES.get(mech, mech)}")
        for rung in sorted(r for r in g.rung.unique() if r.endswith("-none")):
            d = g[g.rung == rung].sort_values("users")
            method = rung.split("-")[0]
            ax.plot(d.users, d.hr, ls="--", marker="x", color=COLOURS.get((method, "none")),
                    label=f"{NAMES[method]}, no noise")  # the marker shows a one-N rung
        ax.set_xscale("log")
        ax.set_title(f"eps {eps:g}")
        ax.set_xlabel("users N (calibrated to ML-100K)")
    axes[0][0].set_ylabel("full HR@10")
    # one legend under the panels, every line any panel draws (a cell may lack a rung)
    named: dict[str, Any] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            named.setdefault(label, handle)
    fig.legend(list(named.values()), list(named), loc="lower center", ncol=4, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merged(frame: Any, path: Path) -> Any:
    """``frame``'s rows over those already in ``path`` (study.csv): a cell this invocation
    measured replaces its old row, every other finished cell is kept (an invocation of one
    N or one eps does not drop the rest of the study)."""
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        frame = pd.concat([pd.read_csv(path), frame], ignore_index=True)
    return frame.drop_duplicates(["users", "rung", "seed"], keep="last").sort_values(
        ["users", "seed"], kind="stable").reset_index(drop=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's options (``--settings`` as a {method: file} dict): what :func:`rungs`
    reads, for this command and for the probes that run one of its cells."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    parser.add_argument("--methods", nargs="+", default=["fedmf"], choices=("fedmf", "pfedrec"))
    parser.add_argument("--mechanisms", nargs="+", default=["cdp-gaussian"],
                        choices=("cdp-gaussian", "dp-ftrl"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--cohort", type=int, default=200)
    parser.add_argument("--finetune", type=int, default=1)
    parser.add_argument("--eval-users", type=int, default=2000)
    parser.add_argument("--data-dir", default="../shared/datasets/ml-100k")
    parser.add_argument("--runs", default="runs/population")
    parser.add_argument("--out", default="benchmarks/results/population")
    parser.add_argument("--settings", nargs="+", default=[], metavar="METHOD=FILE",
                        help="a method's settings from FILE (a tune's best.toml) instead of "
                        "its eps-4 ML-100K ones; its cohort and fine-tune epochs too")
    parser.add_argument("--taste", default="bilinear", choices=("bilinear", "max"),
                        help="the population's user-item score (data.population_taste): "
                        "bilinear, MF's own model, or max, a user's best of 4 taste vectors")
    parser.add_argument("--clip", type=float, default=None,
                        help="every private rung's clip (default: the settings file's)")
    parser.add_argument("--no-reference", action="store_true",
                        help="leave out each method's run without a mechanism (e.g. the extra "
                        "seeds of a private cell; its verdict is against DP-MostPop)")
    parser.add_argument("--checkpoint-every", type=int, default=20,
                        help="rounds between a federated run's checkpoints (a checkpoint holds "
                        "the model and each client's state, not the data: 24 MB for PFedRec "
                        "at 10^5 users)")
    parser.add_argument("--only-table", action="store_true",
                        help="write study.csv, .md and .png from the finished runs")
    args = parser.parse_args(argv)
    args.settings = dict(spec.split("=", 1) for spec in args.settings)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import pandas as pd

    rows = []
    for n in args.users:
        for seed in args.seeds:
            for name, cfg in rungs(n, seed, args):
                path = Path(args.runs) / f"N{n}" / name
                if args.only_table and not (path / "summary.json").is_file():
                    continue
                rows.append(row(n, name, ensure(path, cfg, args.checkpoint_every)))
                frame = merged(pd.DataFrame(rows), Path(args.out) / "study.csv")
                frame.to_csv(Path(args.out) / "study.csv", index=False)  # after every run
    if not rows:
        print("population_study: no finished run", file=sys.stderr)
        return 2
    out = Path(args.out)
    frame = merged(pd.DataFrame(rows), out / "study.csv")
    frame.to_csv(out / "study.csv", index=False)
    (out / "study.md").write_text(table(frame, args.epsilons))
    plot(frame, args.epsilons, out / "study.png")
    print((out / "study.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
