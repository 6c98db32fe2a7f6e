"""The population study on real users: gowalla (issue 78, item 2; docs/population.md).

    python -m benchmarks.gowalla_study --users all --seeds 0 1 2 --epsilons 4
    python -m benchmarks.gowalla_study --users 1000 3000 10000 all --seeds 0 --epsilons 1 4 8
    python -m benchmarks.gowalla_study --report-only

Populations. Gowalla's 29,858 users are put in a public random order (a permutation drawn
from :data:`ORDER_SEED`, which depends on the user ids only). The first :data:`PROXY`
users are the **proxy population**: settings were chosen on it and nothing of it enters
the study, so the study's users spend no privacy on tuning. The study's population
"all" is the other 26,858 users; N = 1,000, 3,000 and 10,000 are the first N of those.
Each is written once as a CSV under ``--cache`` (default ``runs/gowalla-study/data``) and
run with ``--dataset csv`` (strict leave-one-out, the items renumbered per subset).

Rungs at each N and seed (a finished run is not run again; ``runs/gowalla-study/N<n>/``):

- ``mostpop``; ``als`` (the centralised ceiling, implicit ALS); ``centralised`` (FedMF's
  backbone and loss, BCE with sampled negatives, on the pooled data: 20 epochs);
- ``dp-mostpop`` central at each eps, for each k in :data:`K_GRID`; the reported k at a
  (N, eps) is the one with the best validation full HR@10 (the validation item of the
  same users: a non-private choice, which can only raise the floor FedMF must beat);
- ``fedmf-none`` and ``fedmf-cdp-eps<e>``: FedMF under DP-FedAvg with private row
  selection (``--select-rows``), the settings of :data:`SETTINGS` (chosen on the proxy).

Every run ranks the same ``--eval-users`` users at a seed (the sample is keyed by the
seed) and writes ``ranks.csv``; verdicts are paired on those users
(:func:`paired`): per user the difference of the two test hits, its mean and standard
error, pooled over seeds with each seed's mean weighted equally. The seeds' spread (a
run's training randomness and its users) enters as the larger of the pooled paired
standard error and the seeds' standard error of the mean difference. A cell's two-sided
p-value is that of the mean over its standard error (normal); its verdict, "beats" or
"below" by the sign, needs that p-value rejected at 0.05 by Holm's rule over every cell
of the table, else it reads "not shown" (``benchmarks/paired.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.paired import hits, paired, verdicts

SOURCE = Path("../shared/datasets/gowalla/interactions.csv")
ORDER_SEED = 20261202
PROXY = 3000
K_GRID = (10, 25, 50, 100, 200, 400)
#: FedMF's settings: the population study's (benchmarks/results/population/tuned-10k) with
#: the cohort, clip, rows selected and rounds chosen on the proxy population
SETTINGS: dict[str, dict[str, Any]] = {
    "train": {"rounds": 80, "local_epochs": 6, "lr": 0.2325193438902574, "batch_size": 256,
              "dim": 16, "num_negatives": 4, "cohort_size": 1000, "client_tables": "global",
              "eval_finetune": 3, "select_round": "last"},
    "federation": {"method": "fedmf", "server_lr": 2.6164065370985132},
    "privacy": {"clip": 10.0, "select_rows": 1000},
}

#: other FedMF settings, by name (``--variant NAME``; rungs tagged ``-v<NAME>``): overrides
#: of :data:`SETTINGS`' train, federation and (private rungs') privacy keys, each chosen on
#: the proxy population
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    # 32 sampled negatives a positive: on the proxy (3,000 users, cohort 100 so that each
    # takes part about as often as in the study, 80 rounds, no noise, seed 0) FedMF read
    # 0.0235 against 0.0105 with 4 (MostPop 0.0225), the best of 12 settings (negatives 4
    # or 32, client lr 0.01, 0.05 or 0.23, server lr 1.0 or 2.6)
    "n32": {"train": {"num_negatives": 32}},
    # ... and the two-stage recommender's popularity blend (--select-blend 64): among the
    # selected rows a score plus 64 log(1 + noisy count). On the proxy at eps 4 (seed 0,
    # benchmarks/probes/select_blend.py) validation HR@10 rose with beta over 0 ... 64,
    # 0.0110 to 0.0230, and 64 was chosen (the grid's top; blend.md there)
    "n32blend": {"train": {"num_negatives": 32}, "privacy": {"select_blend": 64.0}},
}


def populations(cache: Path, sizes: list[str]) -> dict[str, Path]:
    """The CSV of each population ("proxy", "all", or a size N), written once."""
    import pandas as pd

    frame = pd.read_csv(SOURCE)
    users = np.unique(frame["user"].to_numpy())
    order = users[np.random.default_rng(ORDER_SEED).permutation(users.shape[0])]
    rest = order[PROXY:]
    chosen = {"proxy": order[:PROXY], "all": rest}
    for s in sizes:
        if s not in chosen:
            chosen[s] = rest[:int(s)]
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, ids in chosen.items():
        path = cache / f"gowalla-{name}.csv"
        if not path.is_file():
            frame[frame["user"].isin(ids)].to_csv(path.with_suffix(".tmp"), index=False)
            path.with_suffix(".tmp").rename(path)
        out[name] = path
    return out


def rungs(data: Path, seed: int, epsilons: list[float], eval_users: int,
          rounds: int | None = None, select: int | None = None, variant: str | None = None
          ) -> list[tuple[str, dict[str, Any]]]:
    """(name, config) of every run on population ``data`` at ``seed``; ``rounds`` or
    ``select`` (rows selected, 0: none) other than :data:`SETTINGS`' give FedMF rungs tagged
    ``-r<T>`` / ``-k<K>`` (``fedmf-none-r300``, ``fedmf-cdp-k0-eps4``)."""
    d = {"dataset": "csv", "data_dir": str(data), "protocol": "strict"}
    common = {"seed": seed, "eval_users": eval_users}
    val = {**common, "select_round": "best-val-full"}  # dp-mostpop: its k by validation
    out: list[tuple[str, dict[str, Any]]] = [
        (f"mostpop-seed{seed}", {"data": d, "train": common, "federation": {"method": "mostpop"}}),
        (f"als-seed{seed}", {"data": d, "train": common, "federation": {"method": "als"}}),
        (f"centralised-seed{seed}", {  # FedMF's backbone and loss on the pooled data
            "data": d, "federation": {"method": "centralised"}, "baseline": {"epochs": 20},
            "train": {**common, **{k: SETTINGS["train"][k] for k in
                                   ("lr", "batch_size", "dim", "num_negatives")}}})]
    for eps in epsilons:
        for k in K_GRID:
            out.append((f"dp-mostpop-k{k}-eps{eps:g}-seed{seed}", {
                "data": d, "train": val, "federation": {"method": "dp-mostpop"},
                "baseline": {"architecture": "central", "epsilon": eps, "k": k}}))
    t = rounds or SETTINGS["train"]["rounds"]
    k = SETTINGS["privacy"]["select_rows"] if select is None else select
    tag = "" if t == SETTINGS["train"]["rounds"] else f"-r{t}"
    ktag = "" if k == SETTINGS["privacy"]["select_rows"] else f"-k{k}"
    over = VARIANTS[variant] if variant else {}
    tag += f"-v{variant}" if variant else ""
    fed = {**SETTINGS["federation"], **over.get("federation", {})}
    train = {**SETTINGS["train"], **over.get("train", {}), **common, "rounds": t,
             "eval_every": t}
    out.append((f"fedmf-none{tag}-seed{seed}", {"data": d, "train": train,
                                               "federation": fed}))
    for eps in epsilons:
        out.append((f"fedmf-cdp{tag}{ktag}-eps{eps:g}-seed{seed}", {
            "data": d, "train": train, "federation": fed,
            "privacy": {"mode": "cdp-gaussian", "epsilon": eps, "delta": 1e-5,
                        **SETTINGS["privacy"], "select_rows": k,
                        **over.get("privacy", {})}}))
    return out


def ensure(path: Path, cfg: dict[str, Any]) -> None:
    """Run ``cfg`` into ``path`` unless it finished there."""
    import fedem_private as fp

    if not (path / "summary.json").is_file():
        print(f"gowalla_study: {path}", file=sys.stderr, flush=True)
        fp.run(cfg, out=path, force=True, checkpoint_every=20)


def summary_of(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def report(root: Path, out: Path) -> str:
    """study.csv (a row per run) and study.md (a row per (N, eps) with the paired verdict)."""
    import pandas as pd

    rows = []
    for run in sorted(root.glob("N*/*-seed*")):
        if not (run / "summary.json").is_file():
            continue
        s = summary_of(run)
        full = s["metrics"]["full"]
        rung, _, seed = run.name.rpartition("-seed")
        val = (s["metrics"].get("val_full") or {}).get("hr@10")
        rows.append({"population": run.parent.name[1:], "users": s["n_users"],
                     "items": s["n_items"], "rung": rung, "seed": int(seed),
                     "hr10_full": full["hr@10"], "hr10_full_se": full.get("hr@10_se"),
                     "val_hr10_full": val, "seconds_per_round": s.get("seconds_per_round"),
                     "eps": (s.get("privacy") or {}).get("epsilon", {}).get("reported")
                     if isinstance((s.get("privacy") or {}).get("epsilon"), dict) else None,
                     "run": str(run)})
    frame = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    frame.drop(columns=["run"]).to_csv(out / "study.csv", index=False)
    cells = []
    for pop, g in frame.groupby("population"):
        for rung in sorted(r for r in g.rung.unique() if r.startswith("fedmf-cdp")):
            tag, _, eps = rung[len("fedmf-cdp"):].rpartition("-eps")
            parts = dict((p[0], p[1:]) for p in tag.split("-")[1:])
            none = "fedmf-none" + "".join(f"-{x}{parts[x]}" for x in ("r", "v") if x in parts)
            seeds = sorted(g[g.rung == rung].seed)
            floors = g[g.rung.str.startswith("dp-mostpop-k") & g.rung.str.endswith(f"-eps{eps}")]
            if floors.empty:
                continue
            best_k = floors.groupby("rung").val_hr10_full.mean().idxmax()
            seeds = [s for s in seeds if s in set(floors[floors.rung == best_k].seed)]
            runs = {r: {int(x.seed): Path(x.run) for x in g[g.rung == r].itertuples()}
                    for r in (rung, best_k, "mostpop", "als", "centralised", none)}
            fed = [hits(runs[rung][s]) for s in seeds]
            dpm = [hits(runs[best_k][s]) for s in seeds]
            test = paired(fed, dpm)

            def mean(r: str, seeds: list[int] = seeds, runs: dict = runs) -> str:
                vals = [summary_of(runs[r][s])["metrics"]["full"]["hr@10"]
                        for s in seeds if s in runs.get(r, {})]
                return f"{np.mean(vals):.4f}" if vals else "-"

            cells.append({"population": pop, "N": int(g.users.iloc[0]), "eps": float(eps),
                          "seeds": len(seeds), "chance": 10 / int(g["items"].iloc[0]),
                          "mostpop": mean("mostpop"),
                          "dp_mostpop": f"{mean(best_k)} (k {best_k.split('-k')[1].split('-')[0]})",
                          "rounds": int(parts.get("r", SETTINGS["train"]["rounds"])),
                          "rows": int(parts.get("k", SETTINGS["privacy"]["select_rows"])),
                          "variant": parts.get("v", ""),
                          "fedmf_cdp": mean(rung), "fedmf_none": mean(none),
                          "als": mean("als"), "central_mf": mean("centralised"),
                          "test": test, "paired_diff": test.diff, "se": test.se,
                          "users": test.users,
                          "p": min(1.0, 2 * min(test.p_greater, test.p_less))})
    called = verdicts([c["test"] for c in cells])
    lines = ["| N | eps | settings | rounds | rows K | seeds | chance | MostPop | "
             "DP-MostPop (k by validation) | "
             "FedMF DP-FedAvg + row selection | FedMF no noise | MF central (same loss) | "
             "ALS (central) | "
             "paired diff ± SE (users) | two-sided p | verdict (Holm, 0.05) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, verdict in sorted(zip(cells, called, strict=True),
                         key=lambda x: (x[0]["N"], x[0]["eps"], x[0]["variant"], x[0]["rounds"],
                                        x[0]["rows"])):
        lines.append(f"| {c['N']:,} | {c['eps']:g} | {c['variant'] or 'study'} | {c['rounds']} | "
                     f"{c['rows'] or 'all'} | "
                     f"{c['seeds']} | "
                     f"{c['chance']:.5f} | "
                     f"{c['mostpop']} | {c['dp_mostpop']} | {c['fedmf_cdp']} | "
                     f"{c['fedmf_none']} | {c['central_mf']} | {c['als']} | "
                     f"{c['paired_diff']:+.4f} ± "
                     f"{c['se']:.4f} ({c['users']:,}) | {c['p']:.3g} | {verdict} |")
    text = "\n".join(lines) + "\n"
    (out / "study.md").write_text(
        "# The population study on gowalla (benchmarks/gowalla_study.py)\n\n" + text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", nargs="+", default=["all"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--epsilons", nargs="+", type=float, default=[4.0])
    ap.add_argument("--eval-users", type=int, default=2000)
    ap.add_argument("--rounds", type=int, help="FedMF's rounds (default SETTINGS')")
    ap.add_argument("--select", type=int, help="rows selected (0: none; default SETTINGS')")
    ap.add_argument("--variant", choices=sorted(VARIANTS), help="other FedMF settings")
    ap.add_argument("--only", nargs="+", help="run only rungs whose name starts so")
    ap.add_argument("--runs", type=Path, default=Path("runs/gowalla-study"))
    ap.add_argument("--cache", type=Path, default=Path("runs/gowalla-study/data"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/population/gowalla"))
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    if not a.report_only:
        if not SOURCE.is_file():
            print(f"gowalla_study: {SOURCE} not found (../shared/datasets is not part of the "
                  f"project)", file=sys.stderr)
            return 2
        paths = populations(a.cache, [u for u in a.users if u != "all"])
        for name in a.users:
            for seed in a.seeds:
                for rung, cfg in rungs(paths[name], seed, a.epsilons, a.eval_users, a.rounds,
                                       a.select, a.variant):
                    if a.only and not any(rung.startswith(o) for o in a.only):
                        continue
                    ensure(a.runs / f"N{name}" / rung, cfg)
    print(report(a.runs, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
