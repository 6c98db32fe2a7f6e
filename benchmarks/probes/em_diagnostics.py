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
and over the client's own training items (the rows its local training moves). The adapter's
rho is logged by item class (issue 79, :func:`rho_by_class`): the mean over clients of the
mean rho on the client's own training items, on its validation item, on its test item, on
the other full-ranking candidates in each popularity tercile (training counts), and the
share of its candidate rows with rho < 0.25. One CSV row per (seed, round, view)::

    python -m benchmarks.probes.em_diagnostics \\
        --config benchmarks/results/ladder/tuning/fedem-filmtrust-best.toml \\
        --data-dir ../shared/datasets/filmtrust --seeds 0 1 2 --every 10 \\
        --set train.local_epochs=4 --label epochs4 --out runs/em-diag/filmtrust.csv

With ``--runs-out RUNS.csv`` the run also evaluates as a run does every ``--eval-every``
rounds and writes one row per (label, seed) there: full HR@10 at the round
``train.select_round = "best-val"`` picks (:data:`~fedem_private.experiments.runner.
SELECTION_KEYS`) and at the last round, with the probe's command (``--runs-table`` prints
them, with each label's paired difference from ``--reference``).

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
from fedem_private.client.variants import merge_seen_rows
from fedem_private.errors import UserError
from fedem_private.evaluation.metrics import RankAccumulator
from fedem_private.experiments.runner import prepare, selected_round

VIEWS = ("own", "global", "start")
#: the item classes rho is averaged over (:func:`rho_by_class`), CSV columns
RHO_CLASSES = ("rho_own", "rho_val", "rho_test", "rho_pop_low", "rho_pop_mid", "rho_pop_high",
               "rho_cand_lt25")
FIELDS = ["label", "seed", "round", "view", "val_full_hr10", "test_full_hr10", "drift_all",
          "drift_own", "rho_now", *RHO_CLASSES, "rho_mean_round", "seconds"]
RUN_FIELDS = ["label", "seed", "rounds", "eval_every", "selected_round", "hr10_full_selected",
              "ndcg10_full_selected", "val_hr10_selected", "hr10_full_last", "rho_mean_last",
              "seconds", "command"]


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
    if getattr(sim, "merge_seen", False):  # --merge-rows seen: rho' = 1 off the own rows
        params.items = merge_seen_rows(params.items, sent, sim._merged_rows(idx.cpu().numpy()))
    return params


def popularity_terciles(train_items: np.ndarray, n_items: int) -> np.ndarray:
    """(n_items,) 0, 1 or 2: each item's popularity tercile by its training count (the
    least popular third of the items 0, the most popular 2; ties by item id)."""
    counts = np.bincount(np.asarray(train_items, dtype=np.int64), minlength=n_items)
    order = np.argsort(counts, kind="stable")
    tercile = np.empty(n_items, dtype=np.int64)
    tercile[order] = np.arange(n_items) * 3 // max(n_items, 1)
    return tercile


def rho_by_class(rho: np.ndarray, own: np.ndarray, excluded: np.ndarray, val: int | None,
                 test: int, tercile: np.ndarray) -> dict[str, float]:
    """One client's mean rho (``rho`` (m,), per item) over each class of :data:`RHO_CLASSES`.

    ``own``: its training items; ``excluded``: the items full ranking leaves out (training
    and validation); ``val`` (None: no validation item) and ``test``: its held-out items.
    The candidates are every item not excluded (the test item among them); the popularity
    classes are the candidates but the test item, by ``tercile``
    (:func:`popularity_terciles`). An empty class is nan."""
    cand = np.ones(rho.shape[0], dtype=bool)
    cand[excluded] = False
    cand[test] = True
    others = cand.copy()
    others[test] = False

    def mean(mask: np.ndarray | slice) -> float:
        vals = rho[mask]
        return float(vals.mean()) if vals.size else float("nan")

    out = {"rho_own": mean(np.asarray(own, dtype=np.int64)),
           "rho_val": float(rho[val]) if val is not None and val >= 0 else float("nan"),
           "rho_test": float(rho[test])}
    for t, name in enumerate(("rho_pop_low", "rho_pop_mid", "rho_pop_high")):
        out[name] = mean(others & (tercile == t))
    out["rho_cand_lt25"] = float((rho[cand] < 0.25).mean())
    return out


def item_rho(sim: Any, idx: torch.Tensor) -> torch.Tensor:
    """(k, m) the rho the merge's rule gives clients ``idx`` now, per item (their own table
    after training against the server's next one; a scalar or per-client rho broadcast;
    under ``--merge-rows seen`` the adapter's rho, before rho' = 1 off the own rows)."""
    own = sim.state.params(idx).items
    sent = sim.aggregator.sent(idx)
    if sent is None:
        return own.new_zeros(own.shape[:2])
    merger = sim.merger
    chunk = take_clients(merger.state, idx) if merger.state is not None else None
    rho = merger.cfg.rule.weights(chunk, own, sent.to(own.dtype))
    return rho.to(own.dtype).expand(own.shape[0], own.shape[1])


def rho_classes(sim: Any, users: np.ndarray, idx: torch.Tensor,
                tercile: np.ndarray) -> list[dict[str, float]]:
    """:func:`rho_by_class` of each of ``users`` (one dict a user)."""
    rho = item_rho(sim, idx).double().cpu().numpy()
    split, sets = sim.split, sim.eval_sets
    out = []
    for row, u in enumerate(users):
        own = split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]]
        val = None if sets.val_items is None else int(sets.val_items[u])
        out.append(rho_by_class(rho[row], own, sets.exclusions(int(u)), val,
                                int(sets.test_items[u]), tercile))
    return out


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
    drift and rho-by-class figures (means over the clients, the same on every row)."""
    chosen = sim.eval_sample()
    accs = {v: RankAccumulator(sim.split.n_users) for v in VIEWS}
    sums = np.zeros(3)
    tercile = popularity_terciles(sim.split.train_items, sim.split.n_items)
    per_user: list[dict[str, float]] = []
    size = max(1, sim._chunk_size())
    with torch.no_grad():
        for start in range(0, chosen.shape[0], size):
            users = chosen[start:start + size]
            idx = sim._index(users)
            for view in VIEWS:
                accs[view].add_scores(users, sim.backbone.scores(view_params(sim, view, idx)),
                                      sim.eval_sets)
            sums += np.asarray(drift(sim, users, idx)) * users.shape[0]
            per_user += rho_classes(sim, users, idx, tercile)
    d_all, d_own, rho = sums / chosen.shape[0]
    classes = {c: _nanmean([r[c] for r in per_user]) for c in RHO_CLASSES}
    rows = []
    for view, acc in accs.items():
        res = acc.result()
        rows.append({"view": view, "val_full_hr10": res.get("val_full", {}).get("hr@10"),
                     "test_full_hr10": res["full"]["hr@10"], "drift_all": d_all,
                     "drift_own": d_own, "rho_now": rho, **classes})
    return rows


def _nanmean(xs: list[float]) -> float:
    """The mean of the finite values of ``xs`` (nan when none)."""
    a = np.asarray(xs, dtype=float)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else float("nan")


def run_summary(history: list[Any], rule: str) -> dict[str, Any]:
    """Full HR@10 (and NDCG@10, sampled validation HR@10) at the evaluated round ``rule``
    selects (:func:`~fedem_private.experiments.runner.selected_round`) and full HR@10 and
    the mean rho at the last round of ``history`` (the run's RoundStats)."""
    sel = selected_round(history, rule)
    last = history[-1]
    metrics = sel["metrics"] if sel is not None else {}
    return {"selected_round": sel["round"] if sel is not None else None,
            "hr10_full_selected": metrics.get("full", {}).get("hr@10"),
            "ndcg10_full_selected": metrics.get("full", {}).get("ndcg@10"),
            "val_hr10_selected": metrics.get("val", {}).get("hr@10"),
            "hr10_full_last": (last.metrics or {}).get("full", {}).get("hr@10"),
            "rho_mean_last": last.merge.get("rho_mean")}


def run_one(args: argparse.Namespace, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of one seed (written together, so a killed seed is run again whole) and its
    run row (:data:`RUN_FIELDS`)."""
    eval_every = args.eval_every or args.every
    cfg = resolve_config(args.config, cli_overrides(
        args, {"train.seed": seed, "train.select_round": "best-val",
               "train.eval_every": eval_every}))
    sim = prepare(cfg)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    history = []
    while sim.state.round < cfg.train.rounds:
        stats = sim.step()
        history.append(stats)
        if stats.round % args.every == 0 or stats.round == 1:
            rows += [{"label": args.label, "seed": seed, "round": stats.round, **r,
                      "rho_mean_round": stats.merge.get("rho_mean"),
                      "seconds": round(time.perf_counter() - t0, 1)} for r in diagnose(sim)]
            own = next(r for r in rows[-len(VIEWS):] if r["view"] == "own")
            print(f"em_diagnostics: {args.label} seed {seed} round {stats.round}: own val "
                  f"{own['val_full_hr10']:.4f} test {own['test_full_hr10']:.4f}, drift "
                  f"{own['drift_all']:.3f}, rho own {own['rho_own']:.3f} test "
                  f"{own['rho_test']:.3f}", file=sys.stderr, flush=True)
    run = {"label": args.label, "seed": seed, "rounds": cfg.train.rounds,
           "eval_every": eval_every, **run_summary(history, cfg.train.select_round),
           "seconds": round(time.perf_counter() - t0, 1),
           "command": "python -m benchmarks.probes.em_diagnostics " + " ".join(args.argv)}
    return rows, run


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


def _cell(values: Any) -> str:
    """``mean ± standard error`` of a pandas Series over seeds (the mean alone for one)."""
    n = int(values.count())
    if n == 0:
        return "-"
    se = values.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    return f"{values.mean():.3f}" + (f" ± {se:.3f}" if np.isfinite(se) else "")


def class_table(path: Path) -> str:
    """The Markdown table of rho by item class (:data:`RHO_CLASSES`) in a probe CSV: per
    (label, round), mean ± standard error over seeds of the clients' mean rho on each class
    (the own view's rows; the figures are the same on every view)."""
    import pandas as pd

    frame = pd.read_csv(path)
    frame = frame[(frame["view"] == "own") & (frame["round"] > 1)]
    lines = ["| label | round | seeds | own training items | validation item | test item | "
             "candidates, least popular third | middle third | most popular third | "
             "candidate rows with rho < 0.25 | mean rho, all rows |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (label, rnd), g in frame.groupby(["label", "round"], sort=False):
        cells = " | ".join(_cell(g[c]) for c in (*RHO_CLASSES, "rho_now"))
        lines.append(f"| {label} | {rnd} | {g['seed'].nunique()} | {cells} |")
    return "\n".join(lines) + "\n"


def runs_table(path: Path, reference: str | None) -> str:
    """The Markdown table of a ``--runs-out`` CSV: per label, full HR@10 at the
    best-validation round and at the last round (mean ± standard error over seeds), and
    each label's paired difference from ``reference`` (same seeds): mean ± standard error of
    the per-seed differences, marked * where |mean| exceeds twice its standard error."""
    import pandas as pd

    frame = pd.read_csv(path)
    ref = frame[frame["label"] == reference].set_index("seed") if reference else None
    lines = ["| label | seeds | selected rounds | full HR@10, best-val round | full HR@10, "
             f"last round | paired diff. from {reference or '-'}, best-val | paired diff., "
             "last | mean rho, last |", "|---|---|---|---|---|---|---|---|"]
    for label, g in frame.groupby("label", sort=False):
        g = g.set_index("seed").sort_index()
        diffs = ["-", "-"]
        if ref is not None and label != reference:
            both = g.index.intersection(ref.index)
            for j, col in enumerate(("hr10_full_selected", "hr10_full_last")):
                d = g.loc[both, col] - ref.loc[both, col]
                se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
                mark = "*" if np.isfinite(se) and abs(d.mean()) > 2 * se else ""
                diffs[j] = _cell(d) + mark + (f" ({len(d)})" if len(d) != len(g) else "")
        rounds = ",".join(str(int(r)) for r in g["selected_round"])
        lines.append(f"| {label} | {','.join(map(str, g.index))} | {rounds} | "
                     f"{_cell(g['hr10_full_selected'])} | {_cell(g['hr10_full_last'])} | "
                     f"{diffs[0]} | {diffs[1]} | {_cell(g['rho_mean_last'])} |")
    return "\n".join(lines) + "\n"


def ablation_table(path: Path, labels: list[str] | None = None) -> str:
    """The Markdown table of one-change ablations in a probe CSV (issue 69): per label, over
    seeds (mean ± standard error), the own table's test full HR@10 at its best-validation
    evaluation, at the last round and their difference (the fall), the server's table's at
    the last round and its lead over the own table there (the gap), and the drift over the
    client's own items at the last round; then the Pearson correlation, over every (label,
    seed), of that drift with the fall and with the gap. ``labels``: only these labels'
    runs (all: None)."""
    import pandas as pd

    frame = pd.read_csv(path)
    if labels:
        frame = frame[frame["label"].isin(labels)]
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


def _writer(path: Path, fields: list[str]) -> tuple[Any, Any]:
    """``path`` opened for appending and its CSV writer (the header written when new);
    UserError where the file's header is not ``fields``."""
    new = not path.is_file()
    if not new:
        with path.open() as f:
            header = next(csv.reader(f), [])
        if header != fields:
            raise UserError(f"{path} has other columns than this probe writes; use a new file")
    f = path.open("a", newline="")
    writer = csv.DictWriter(f, fieldnames=fields)
    if new:
        writer.writeheader()
    return f, writer


def _done(path: Path) -> set[tuple[str, int]]:
    """The (label, seed) pairs already in ``path``."""
    if not path.is_file():
        return set()
    with path.open() as f:
        return {(r["label"], int(r["seed"])) for r in csv.DictReader(f)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="a merging run's TOML (e.g. tuned FedEM)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=None,
                    help="the run's own evaluation (for --runs-out); default --every")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one change to the config (repeatable), e.g. train.local_epochs=4")
    ap.add_argument("--label", default="base", help="the ablation's name in the CSV")
    ap.add_argument("--out", type=Path, required=True, help="CSV, appended to")
    ap.add_argument("--runs-out", type=Path, default=None,
                    help="CSV of one row a run (best-val and last round), appended to")
    ap.add_argument("--plot", type=Path, default=None, metavar="PNG",
                    help="draw --out's rows into PNG and stop (no run)")
    ap.add_argument("--ablation-table", action="store_true",
                    help="print the Markdown table of --out's ablations and stop (no run)")
    ap.add_argument("--labels", nargs="+", default=None,
                    help="--ablation-table: only these labels")
    ap.add_argument("--class-table", action="store_true",
                    help="print the Markdown table of --out's rho by item class and stop")
    ap.add_argument("--runs-table", action="store_true",
                    help="print the Markdown table of --out (a --runs-out CSV) and stop")
    ap.add_argument("--reference", default=None,
                    help="--runs-table: the label the paired differences are taken from")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.ablation_table or args.class_table or args.runs_table:
        print(ablation_table(args.out, args.labels) if args.ablation_table else
              class_table(args.out) if args.class_table else
              runs_table(args.out, args.reference), end="")
        return 0
    if args.plot is not None:
        print(f"wrote {plot(args.out, args.plot)}")
        return 0
    if args.config is None:
        ap.error("--config is required (unless --plot or a table)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = _done(args.out)
    try:
        f, writer = _writer(args.out, FIELDS)
        runs = _writer(args.runs_out, RUN_FIELDS) if args.runs_out else None
        try:
            for seed in args.seeds:
                if (args.label, seed) in done:
                    print(f"em_diagnostics: {args.label} seed {seed} done", file=sys.stderr)
                    continue
                rows, run = run_one(args, seed)
                writer.writerows(rows)
                f.flush()
                if runs is not None:
                    runs[1].writerow(run)
                    runs[0].flush()
        finally:
            f.close()
            if runs is not None:
                runs[0].close()
    except UserError as exc:
        print(f"em_diagnostics: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
