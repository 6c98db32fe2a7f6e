"""Why does elastic merging fall under ``strict``? Round-by-round diagnostics (issue 69).

A run of a merging config (``--config``, e.g. a tuned FedEM file) is stepped round by round;
every ``--every`` rounds each evaluated client is scored three ways, on its validation item
and its test item (full ranking, the run's own candidates):

- ``own``: its current model, what the run reports (Q_l after the round's local training;
  the client's p_u and private groups);
- ``global``: the same client's p_u with the table the server would send it next (Q_g);
- ``start``: the table it would start the next round from, Q_l + rho (.) (Q_g - Q_l)
  (equation 10) with its adapter as it is now (for SR this is Q_g).

and the drift of Q_l from Q_g is measured per client, relative to Q_g's norm, over all items
and over the client's own training items (the rows its local training moves). One CSV row
per (seed, round, view)::

    python -m benchmarks.probes.em_diagnostics \\
        --config benchmarks/results/ladder/tuning/fedem-filmtrust-best.toml \\
        --data-dir ../shared/datasets/filmtrust --seeds 0 1 2 --every 10 \\
        --set train.local_epochs=4 --label epochs4 --out runs/em-diag/filmtrust.csv

The probe looks inside the simulation on purpose (a probe, benchmarks/README.md): the
views are not released values and nothing here is private.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedem_private.api import resolve_config
from fedem_private.client.merging import merge_with_rho, take_clients
from fedem_private.errors import UserError
from fedem_private.evaluation.metrics import RankAccumulator
from fedem_private.experiments.runner import prepare

VIEWS = ("own", "global", "start")


def _value(text: str) -> Any:
    """A ``--set`` value as TOML reads it (``4``, ``0.1``, ``"em"``, ``true``); bare words
    are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def cli_overrides(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the probe's ``--data-dir``, ``--rounds`` and ``--set KEY=VALUE`` on top
    (the config overrides of one run; shared by the probes that import this one)."""
    overrides = dict(base)
    if args.data_dir:
        overrides["data.data_dir"] = args.data_dir
    if args.rounds:
        overrides["train.rounds"] = args.rounds
    overrides.update({k: _value(v) for k, v in (s.split("=", 1) for s in args.set)})
    return overrides


def view_params(sim: Any, view: str, idx: torch.Tensor) -> Any:
    """Clients ``idx``'s params with the item table of ``view`` (:data:`VIEWS`)."""
    params = sim.state.params(idx)
    if view == "own":
        return params
    sent = sim.aggregator.sent(idx)
    if sent is None:  # an aggregator that sends nothing (local): the own table
        return params
    sent = sent.to(params.items.dtype)
    if view == "global":
        params.items = sent
        return params
    merger = sim.merger
    chunk = take_clients(merger.state, idx) if merger.state is not None else None
    params.items = merge_with_rho(merger.cfg, chunk, params.items, sent)[0]
    return params


def drift(sim: Any, users: np.ndarray, idx: torch.Tensor) -> tuple[float, float, float]:
    """Mean over ``users`` of ||Q_l - Q_g|| / ||Q_g|| over all items, over the user's own
    training items, and the mean rho the adapter would use now (1 for SR)."""
    own = sim.state.params(idx).items
    sent = sim.aggregator.sent(idx)
    if sent is None:
        return float("nan"), float("nan"), float("nan")
    sent = sent.to(own.dtype)
    diff = own - sent
    every = (diff.norm(dim=(1, 2)) / sent.norm(dim=(1, 2)).clamp_min(1e-12)).mean()
    split = sim.split
    ratios = []
    for row, u in enumerate(users):
        items = torch.as_tensor(split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]])
        if items.numel():
            ratios.append(float(diff[row, items].norm() / sent[row, items].norm().clamp_min(1e-12)))
    merger = sim.merger
    chunk = take_clients(merger.state, idx) if merger.state is not None else None
    rho = merge_with_rho(merger.cfg, chunk, own, sent)[1].float().mean()
    return float(every), float(np.mean(ratios)) if ratios else float("nan"), float(rho)


def diagnose(sim: Any) -> list[dict[str, float | str]]:
    """One row per view: validation and test full HR@10 of every evaluated client, and the
    drift figures (the same on every row)."""
    chosen = sim.eval_sample()
    accs = {v: RankAccumulator(sim.split.n_users) for v in VIEWS}
    sums = np.zeros(3)
    size = max(1, sim._chunk_size())
    with torch.no_grad():
        for start in range(0, chosen.shape[0], size):
            users = chosen[start:start + size]
            idx = sim._index(users)
            for view in VIEWS:
                accs[view].add_scores(users, sim.backbone.scores(view_params(sim, view, idx)),
                                      sim.eval_sets)
            sums += np.asarray(drift(sim, users, idx)) * users.shape[0]
    d_all, d_own, rho = sums / chosen.shape[0]
    rows = []
    for view, acc in accs.items():
        res = acc.result()
        rows.append({"view": view, "val_full_hr10": res.get("val_full", {}).get("hr@10"),
                     "test_full_hr10": res["full"]["hr@10"], "drift_all": d_all,
                     "drift_own": d_own, "rho_now": rho})
    return rows


def run_one(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """The rows of one seed (written together, so a killed seed is run again whole)."""
    cfg = resolve_config(args.config, cli_overrides(
        args, {"train.seed": seed, "train.select_round": "best-val-full",
               "train.eval_every": args.every}))
    sim = prepare(cfg)
    t0 = time.perf_counter()
    rows = []
    while sim.state.round < cfg.train.rounds:
        stats = sim.step()
        if stats.round % args.every == 0 or stats.round == 1:
            rows += [{"label": args.label, "seed": seed, "round": stats.round, **r,
                      "rho_mean_round": stats.merge.get("rho_mean"),
                      "seconds": round(time.perf_counter() - t0, 1)} for r in diagnose(sim)]
            own = next(r for r in rows[-len(VIEWS):] if r["view"] == "own")
            print(f"em_diagnostics: {args.label} seed {seed} round {stats.round}: own val "
                  f"{own['val_full_hr10']:.4f} test {own['test_full_hr10']:.4f}, drift "
                  f"{own['drift_all']:.3f}", file=sys.stderr, flush=True)
    return rows


def plot(csv_path: Path, png: Path) -> Path:
    """Test full HR@10 against the round, one line per (label, view) of ``csv_path``
    (mean over its seeds): the own table solid, the server's dashed, one colour per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    frame = pd.read_csv(csv_path)
    frame = frame[frame["view"].isin(("own", "global"))]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for j, (label, g) in enumerate(frame.groupby("label", sort=False)):
        colour = f"C{j}"
        seeds = g["seed"].nunique()
        for view, style in (("own", "-"), ("global", "--")):
            mean = g[g["view"] == view].groupby("round")["test_full_hr10"].mean()
            name = "own table" if view == "own" else "server's table"
            ax.plot(mean.index, mean.values, style, color=colour,
                    label=f"{label}: {name} ({seeds} seed{'s' if seeds > 1 else ''})")
    ax.set_xlabel("round")
    ax.set_ylabel("test full HR@10")
    ax.set_title("Each client's own table against the server's, round by round")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def ablation_table(path: Path) -> str:
    """The Markdown table of one-change ablations in a probe CSV (issue 69): per label, over
    seeds (mean ± standard error), the own table's test full HR@10 at its best-validation
    evaluation, at the last round and their difference (the fall), the server's table's at
    the last round and its lead over the own table there (the gap), and the drift over the
    client's own items at the last round; then the Pearson correlation, over every (label,
    seed), of that drift with the fall and with the gap."""
    import pandas as pd

    frame = pd.read_csv(path)
    runs = []
    for (label, seed), g in frame.groupby(["label", "seed"], sort=False):
        own = g[g["view"] == "own"].sort_values("round")
        last = int(own["round"].max())
        best = own.loc[own["val_full_hr10"].idxmax()]
        glob = g[(g["view"] == "global") & (g["round"] == last)]
        end = own[own["round"] == last].iloc[0]
        runs.append({"label": label, "seed": seed, "peak": float(best["test_full_hr10"]),
                     "peak_round": int(best["round"]), "last": float(end["test_full_hr10"]),
                     "fall": float(best["test_full_hr10"] - end["test_full_hr10"]),
                     "global": float(glob["test_full_hr10"].iloc[0]),
                     "gap": float(glob["test_full_hr10"].iloc[0] - end["test_full_hr10"]),
                     "drift_own": float(end["drift_own"]), "rho": float(end["rho_now"]),
                     "rounds": last})
    per = pd.DataFrame(runs)
    lines = ["| label | seeds | own: best-val test | own: last round | fall | server's table, "
             "last round | gap (server - own), last | drift (own items), last | rho, last |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, g in per.groupby("label", sort=False):
        n = len(g)

        def cell(col: str, g: Any = g, n: int = n) -> str:
            se = g[col].std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
            return f"{g[col].mean():.3f}" + (f" ± {se:.3f}" if np.isfinite(se) else "")

        lines.append(f"| {label} | {n} | {cell('peak')} | {cell('last')} | {cell('fall')} | "
                     f"{cell('global')} | {cell('gap')} | {cell('drift_own')} | "
                     f"{cell('rho')} |")
    if len(per) > 2:
        fall = float(np.corrcoef(per["drift_own"], per["fall"])[0, 1])
        gap = float(np.corrcoef(per["drift_own"], per["gap"])[0, 1])
        lines += ["", f"Pearson correlation of the last round's drift (own items), over "
                  f"{len(per)} runs: with the fall {fall:.2f}, with the gap {gap:.2f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="a merging run's TOML (e.g. tuned FedEM)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one change to the config (repeatable), e.g. train.local_epochs=4")
    ap.add_argument("--label", default="base", help="the ablation's name in the CSV")
    ap.add_argument("--out", type=Path, required=True, help="CSV, appended to")
    ap.add_argument("--plot", type=Path, default=None, metavar="PNG",
                    help="draw --out's rows into PNG and stop (no run)")
    ap.add_argument("--ablation-table", action="store_true",
                    help="print the Markdown table of --out's ablations and stop (no run)")
    args = ap.parse_args(argv)
    if args.ablation_table:
        print(ablation_table(args.out), end="")
        return 0
    if args.plot is not None:
        print(f"wrote {plot(args.out, args.plot)}")
        return 0
    if args.config is None:
        ap.error("--config is required (unless --plot or --ablation-table)")
    fields = ["label", "seed", "round", "view", "val_full_hr10", "test_full_hr10",
              "drift_all", "drift_own", "rho_now", "rho_mean_round", "seconds"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.is_file():
        with args.out.open() as f:
            done = {(r["label"], int(r["seed"])) for r in csv.DictReader(f)}
    new = not args.out.is_file()
    try:
        with args.out.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            if new:
                writer.writeheader()
            for seed in args.seeds:
                if (args.label, seed) in done:
                    print(f"em_diagnostics: {args.label} seed {seed} done", file=sys.stderr)
                    continue
                writer.writerows(run_one(args, seed))
                f.flush()
    except UserError as exc:
        print(f"em_diagnostics: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
