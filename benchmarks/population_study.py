"""When does private federated recommendation pay? (issue 66, item 6; docs/design.md
section 17, docs/population.md.)

    python -m benchmarks.population_study --users 1000 10000 100000 --epsilons 1 4 8 \\
        --seeds 0 --out benchmarks/results/population

For each population size N, a population calibrated to ML-100K (``--dataset synthetic
--calibrate-to ml-100k --users N``) runs the study's rungs, each one run directory
``runs/population/N<N>/<rung>-seed<s>`` written through the public API (a finished one is
not run again, a killed one resumes from its checkpoint):

- ``mostpop`` and ``dp-mostpop`` central at every eps and every k of ``--k-grid``: the
  floor is the k with the best validation full HR@10 (:func:`floor_rungs`);
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
(the table, with each private point's verdict against DP-MostPop at its eps: a paired
test on the same evaluated users, Holm's rule over the table's cells; :func:`table`) and
``study.png`` (full HR@10 against N on a log axis, one panel per eps).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.paired import Paired, hits, paired, verdicts

#: DP-MostPop's k (items a user contributes): the reported k at (N, eps) is the one with
#: the best validation full HR@10 over the seeds (``--k-grid``; a non-private choice on the
#: validation item, which can only raise the floor a private model must beat)
K_GRID = (10, 25, 50, 100, 200, 400)
TUNED = "benchmarks/results/ladder/tuning/{method}-cdp4-ml-100k-best.toml"
# the tuned file's keys the study keeps (everything else: the study's own or the defaults)
KEPT = {"train": ("rounds", "local_epochs", "lr", "batch_size", "dim", "num_negatives"),
        "federation": ("method", "server_lr"), "privacy": ("clip",)}
#: one colour per (method, mechanism) in every panel; "none" is the run without noise
COLOURS = {("fedmf", "cdp-gaussian"): "tab:blue", ("fedmf", "dp-ftrl"): "tab:orange",
           ("fedmf", "none"): "tab:green", ("pfedrec", "cdp-gaussian"): "tab:red",
           ("pfedrec", "dp-ftrl"): "tab:purple", ("pfedrec", "none"): "tab:brown",
           ("fedmf", "dp-ftrl-banded"): "tab:olive", ("pfedrec", "dp-ftrl-banded"): "tab:pink",
           ("fedmf", "dp-ftrl-blt"): "tab:cyan", ("fedmf", "dp-ftrl-banded-poisson"): "tab:gray",
           ("fedmf", "dp-ftrl-amplified"): "black"}
NAMES = {"fedmf": "FedMF", "pfedrec": "PFedRec", "fedem": "FedEM",
         "fedem-rho05": "FedEM rho 0.5", "pfedrec-em": "PFedRec+EM",
         "cdp-gaussian": "DP-FedAvg", "dp-ftrl": "DP-FTRL", "dp-ftrl-banded": "DP-FTRL banded",
         "dp-ftrl-blt": "DP-FTRL BLT", "dp-ftrl-banded-poisson": "DP-FTRL amplified banded",
         "dp-ftrl-amplified": "DP-FTRL amplified banded, b by error",
         "ldp-laplace": "LDP Laplace",
         "ldp-laplace-capped": "LDP Laplace, k uploads a client"}
#: a study method -> (the method whose settings it takes, its federation and train keys
#: beyond those): FedEM's elastic merge (learned rho, or rho frozen at 0.5) and PFedRec's
#: with it, over the secure sum's mean (DP-FedAvg needs it), each client keeping only the
#: rows it trained (``--client-tables sparse``, docs/design.md section 17)
MERGING = {"fedem": ("fedmf", {"method": "fedem", "aggregation": "fedavg"}),
           "fedem-rho05": ("fedmf", {"method": "fedem", "aggregation": "fedavg",
                                     "merge": "sm", "rho": 0.5}),
           "pfedrec-em": ("pfedrec", {"method": "pfedrec", "merge": "em"})}
#: a mechanism's name in the study -> its privacy keys (``dp-ftrl``: the tree; ``-banded``:
#: the banded Toeplitz strategy with b = G bands; ``-blt``: buffered linear Toeplitz,
#: docs/privacy.md)
MECHANISMS = {"cdp-gaussian": {"mode": "cdp-gaussian"}, "dp-ftrl": {"mode": "dp-ftrl"},
              "dp-ftrl-banded": {"mode": "dp-ftrl", "ftrl_strategy": "banded"},
              "dp-ftrl-blt": {"mode": "dp-ftrl", "ftrl_strategy": "blt"},
              "dp-ftrl-banded-poisson": {"mode": "dp-ftrl", "ftrl_strategy": "banded",
                                         "ftrl_sampling": "poisson"},
              "dp-ftrl-amplified": {"mode": "dp-ftrl", "ftrl_strategy": "banded",
                                    "ftrl_sampling": "poisson", "ftrl_bands": 0},
              "ldp-laplace": {"mode": "ldp-laplace"},
              "ldp-laplace-capped": {"mode": "ldp-laplace", "max_uploads": 0}}
#: ``ldp-laplace-capped``: the paper's clipped LDP Laplace with each client uploading at
#: most k = max(1, round(K T / N)) times (its expected uploads; ``--max-uploads``), so the
#: budget spans k releases instead of T
#: amplified banded (``dp-ftrl-banded-poisson``): b = min(this, G) bands, each member of
#: round t's group in with probability p = q b (Choquette-Choo et al. 2023; docs/privacy.md);
#: ``dp-ftrl-amplified`` instead takes the b of least expected error (``--ftrl-bands 0``,
#: ``privacy.ftrl.auto_bands``: a function of T, q and eps, chosen before the run)
AMPLIFIED_BANDS = 5


def parse(rung: str) -> tuple[str, str]:
    """(method, mechanism or "none") of a federated rung's name, e.g.
    ``pfedrec-em-cdp-gaussian-eps4`` -> (``pfedrec-em``, ``cdp-gaussian``)."""
    methods = sorted(("fedmf", "pfedrec", *MERGING), key=len, reverse=True)
    method = next(m for m in methods if rung.startswith(m + "-"))
    return method, rung[len(method) + 1:].rsplit("-eps", 1)[0]


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
    val = {**common, "select_round": "best-val-full"}  # its validation HR@10 picks k
    for eps in args.epsilons:
        for k in args.k_grid:
            out.append((f"dp-mostpop-k{k}-eps{eps:g}-seed{seed}", {
                "data": data, "train": val, "federation": {"method": "dp-mostpop"},
                "baseline": {"architecture": "central", "epsilon": eps, "k": k}}))
    for method in args.methods:
        source, merging = MERGING.get(method, (method, None))
        base = tuned(source, args.settings.get(method, args.settings.get(source)))
        tables = "global" if merging is None else "sparse"  # a merge needs the client's own
        train = {"cohort_size": args.cohort, "eval_finetune": args.finetune, **base["train"],
                 **common, "eval_every": base["train"]["rounds"], "client_tables": tables}
        train["cohort_size"] = min(train["cohort_size"], n)
        nonce = f"-nonce{args.nonce}" if args.nonce else ""  # training's own randomness
        if args.nonce:
            train["nonce"] = args.nonce
        fed = {**base["federation"], **(merging or {})}
        if not args.no_reference:
            out.append((f"{method}-none{nonce}-seed{seed}", {"data": data, "train": train,
                                                       "federation": fed}))
        for mech in args.mechanisms:
            for eps in args.epsilons:
                privacy = {**MECHANISMS[mech], "epsilon": eps, "delta": 1e-5, **base["privacy"],
                           **({"clip": args.clip} if args.clip else {})}
                if privacy.get("max_uploads") == 0:  # a client's expected uploads, >= 1
                    privacy["max_uploads"] = max(1, round(
                        train["cohort_size"] * base["train"]["rounds"] / n))
                if privacy.get("ftrl_sampling") == "poisson" and "ftrl_bands" not in privacy:
                    privacy["ftrl_bands"] = max(1, min(AMPLIFIED_BANDS,
                                                       n // train["cohort_size"]))
                out.append((f"{method}-{mech}-eps{eps:g}{nonce}-seed{seed}", {
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
            "seconds_per_round": summary.get("seconds_per_round"),
            "val_hr10_full": (summary["metrics"].get("val_full") or {}).get("hr@10")}


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


def floor_rungs(frame: Any) -> dict[tuple[int, float], str]:
    """(N, eps) -> the DP-MostPop rung that is the floor: of the ``dp-mostpop-k<k>-eps<e>``
    rungs, the one with the best mean validation full HR@10 over its seeds (:data:`K_GRID`);
    a study.csv from before the grid keeps its one ``dp-mostpop-central-eps<e>`` (k = 50)."""
    out: dict[tuple[int, float], tuple[float, str]] = {}
    for (n, rung), d in frame.groupby(["users", "rung"]):
        if rung.startswith("dp-mostpop-central-eps"):
            score = -math.inf
        elif rung.startswith("dp-mostpop-k") and "val_hr10_full" in d:
            score = float(d.val_hr10_full.mean())
        else:
            continue
        key = (int(n), float(rung.rpartition("-eps")[2]))
        if key not in out or score > out[key][0]:
            out[key] = (score, rung)
    return {key: rung for key, (_, rung) in out.items()}


def paired_test(runs: Path | None, n: int, rung: str, floor: str, seeds: list[int]
                ) -> Paired | None:
    """``rung`` against ``floor`` at N = ``n``, paired on the users both ranked at each seed
    of ``seeds`` where both runs wrote ``ranks.csv`` (None where no seed has both). A run of
    the rung with another training nonce (``<rung>-nonce<k>-seed<s>``) is one more
    replicate against its seed's floor, so the replicates' spread holds training's own
    randomness as well as the population's and the users'."""
    if runs is None:
        return None
    pairs = [(runs / f"N{n}" / f"{rung}-seed{s}", runs / f"N{n}" / f"{floor}-seed{s}")
             for s in seeds]
    # another training nonce of a seed (--nonce): one more replicate on the same users
    pairs += [(again, runs / f"N{n}" / f"{floor}-seed{s}") for s in seeds
              for again in sorted((runs / f"N{n}").glob(f"{rung}-nonce*-seed{s}"))]
    pairs = [(a, b) for a, b in pairs if (a / "ranks.csv").is_file()
             and (b / "ranks.csv").is_file()]
    if not pairs:
        return None
    return paired([hits(a) for a, _ in pairs], [hits(b) for _, b in pairs])


def table(frame: Any, epsilons: list[float], runs: Path | None = None) -> str:
    """study.md's table: one row per (N, eps, private rung), its floor and verdict.

    The floor is DP-MostPop central at the rung's eps with k chosen on validation
    (:func:`floor_rungs`). Where both runs of a seed wrote ``ranks.csv`` under ``runs``, the
    verdict is the paired test on the same users (``benchmarks/paired.py``: pooled over
    seeds, two-sided, Holm's rule at 0.05 over every paired cell of the table: "beats",
    "below" or "not shown"); otherwise the older unpaired rule (two standard errors of the
    difference of the means: "beats", "below" or "within noise"), marked "(unpaired)"."""
    g = seed_means(frame)
    cell = {(r.users, r.rung): (r.hr, r.se) for r in g.itertuples()}
    seeds = {(r.users, r.rung): int(r.seeds) for r in g.itertuples()}
    seed_list = {key: sorted(d.seed) for key, d in frame.groupby(["users", "rung"])}
    floors = floor_rungs(frame)
    federated = sorted({r for r in g.rung if r.split("-")[0] in NAMES and "-eps" in r}
                       - {r for r in g.rung if r.startswith("dp-mostpop")})
    rows: list[dict[str, Any]] = []
    for n in sorted(g.users.unique()):
        for eps in epsilons:
            floor = floors.get((int(n), float(eps)))
            for rung in [r for r in federated if r.endswith(f"-eps{eps:g}")]:
                point = cell.get((n, rung))
                if point is None or floor is None:
                    continue
                test = paired_test(runs, int(n), rung, floor, seed_list[(n, rung)])
                rows.append({"n": n, "eps": eps, "rung": rung, "floor": floor, "test": test,
                             "point": point})
    called = iter(verdicts([r["test"] for r in rows if r["test"] is not None]))
    lines = ["| N | eps | MostPop | DP-MostPop central (k by validation) | rung | seeds | "
             "full HR@10 | paired diff ± SE (users; runs) | two-sided p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, floor, point, test = r["n"], r["floor"], r["point"], r["test"]
        pop, low = cell.get((n, "mostpop"), (math.nan, math.nan)), cell[(n, floor)]
        k = floor.split("-k")[1].split("-")[0] if "-k" in floor else "50"
        if test is None:
            diff, p, word = "-", "-", verdict(point, low) + " (unpaired)"
        else:
            two = min(1.0, 2 * min(test.p_greater, test.p_less))
            diff = f"{test.diff:+.4f} ± {test.se:.4f} ({test.users:,}; {test.seeds})"
            p, word = f"{two:.3g}", next(called)
        lines.append(f"| {n:,} | {r['eps']:g} | {pop[0]:.4f} ± {pop[1]:.4f} | "
                     f"{low[0]:.4f} ± {low[1]:.4f} (k {k}) | {r['rung']} | "
                     f"{seeds[(n, r['rung'])]} | {point[0]:.4f} ± {point[1]:.4f} | "
                     f"{diff} | {p} | {word} |")
    for n in sorted(g.users.unique()):
        for rung in sorted({r for r in g.rung if r.endswith("-none")}):
            if (n, rung) not in cell:
                continue
            point = cell[(n, rung)]
            lines.append(f"| {n:,} | none | | | {rung} | {seeds[(n, rung)]} | "
                         f"{point[0]:.4f} ± {point[1]:.4f} | | | |")
    return "\n".join(lines) + "\n"


def plot(frame: Any, epsilons: list[float], path: Path) -> None:
    """study.png: full HR@10 against N (log axis), one panel per eps; the private methods
    as lines with two-standard-error bars, DP-MostPop as a band, the non-private models
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = seed_means(frame)
    floors = floor_rungs(frame)
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.2 * len(epsilons), 4.2),
                             sharey=True, squeeze=False)
    for ax, eps in zip(axes[0], epsilons, strict=True):
        at = [floors.get((int(r.users), float(eps))) == r.rung for r in g.itertuples()]
        floor = g[at].sort_values("users")  # each N's floor: its k chosen on validation
        ax.fill_between(floor.users, floor.hr - 2 * floor.se, floor.hr + 2 * floor.se,
                        color="0.8", label="DP-MostPop (±2 SE)")
        ax.plot(floor.users, floor.hr, color="0.4", lw=1)
        for rung in sorted(r for r in g.rung.unique() if r.endswith(f"-eps{eps:g}")
                           and not r.startswith("dp-mostpop")):  # the private rungs
            d = g[g.rung == rung].sort_values("users")
            method, mech = parse(rung)
            ax.errorbar(d.users, d.hr, yerr=2 * d.se, marker="o", capsize=2,
                        color=COLOURS.get((method, mech)),
                        label=f"{NAMES[method]}, {NAMES.get(mech, mech)}")
        for rung in sorted(r for r in g.rung.unique() if r.endswith("-none")):
            d = g[g.rung == rung].sort_values("users")
            method = parse(rung)[0]
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
    parser.add_argument("--methods", nargs="+", default=["fedmf"],
                        choices=("fedmf", "pfedrec", *MERGING))
    parser.add_argument("--mechanisms", nargs="+", default=["cdp-gaussian"],
                        choices=tuple(MECHANISMS))
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
    parser.add_argument("--k-grid", type=int, nargs="+", default=list(K_GRID),
                        help="DP-MostPop's k values; the best on validation is the floor")
    parser.add_argument("--only", nargs="+", metavar="PREFIX",
                        help="run only the rungs whose name starts with one of these")
    parser.add_argument("--nonce", type=int, default=0,
                        help="the federated runs' training nonce (same population, users and "
                        "evaluation; other training randomness): rungs tagged -nonce<N>, "
                        "measuring training's own noise by a paired test")
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
                if args.only and not any(name.startswith(o) for o in args.only):
                    continue
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
    (out / "study.md").write_text(table(frame, args.epsilons, Path(args.runs)))
    plot(frame, args.epsilons, out / "study.png")
    print((out / "study.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
