"""Fidelity: does a world calibrated to 3,000 gowalla users reproduce the real study?
(issue 78, item 4; docs/population.md, "Fidelity: the generator against real users")

    python -m benchmarks.probes.fidelity --real-runs ../main/runs/gowalla-study
    python -m benchmarks.probes.fidelity --report-only

The population model is fitted to gowalla's **proxy** population (the first 3,000 users of
:mod:`benchmarks.gowalla_study`'s public order; nothing of the study's users), cached under
``--runs``/populations. From it ``--users`` users (default 26,858, the study population's
size) are drawn with ``--seed`` and written once as a CSV (user, item, timestamp: the
draw's order), which then runs the study's own rungs (:func:`benchmarks.gowalla_study.rungs`,
the same protocol: strict split, ``--eval-users`` evaluated, DP-MostPop's k by validation)
at eps 4 with the ``n32`` FedMF settings, one seed; a finished run is not run again.

The real side is read, not run: ``study.csv`` (``--out``) for the real rungs at the same
seed, and, where ``--real-runs`` holds the study's run folders, their ``ranks.csv`` for
the real paired verdict. The worlds' statistics (users, items, interactions per user,
item popularity's Gini and top-1% share) and the calibration rungs (MostPop and EASE full
HR@10, :mod:`fedem_private.data.calibration`) of 3,000 real study users (the study's
N = 3,000 population) against the world's first 3,000 are computed here. Writes
``fidelity.csv`` and ``fidelity.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import gowalla_study as study
from benchmarks.paired import hits, paired, verdicts

RUNGS = ("mostpop", "als", "dp-mostpop-k", "fedmf-none-vn32", "fedmf-cdp-vn32-eps4")
EPS = 4.0


def model_for(proxy: Path, runs: Path) -> tuple[Any, float]:
    """The population model fitted to the proxy CSV (cached) and the seconds it took."""
    from fedem_private.data import load_dataset
    from fedem_private.data.population import cached_fit

    t0 = time.perf_counter()
    model = cached_fit(load_dataset("csv", proxy), runs / "populations")
    return model, time.perf_counter() - t0


def world_csv(model: Any, users: int, seed: int, folder: Path) -> Path:
    """The drawn world as ``user,item,timestamp`` (written once, atomically)."""
    import pandas as pd

    from fedem_private.data.population import draw_population

    path = folder / f"gowalla-calibrated-{users}-seed{seed}.csv"
    if not path.is_file():
        world = draw_population(model, seed, users)
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"user": world.users, "item": world.items,
                      "timestamp": world.timestamps}).to_csv(path.with_suffix(".tmp"),
                                                             index=False)
        path.with_suffix(".tmp").rename(path)
    return path


def gini(counts: np.ndarray) -> float:
    """Gini coefficient of the item counts c (ascending, i = 1..m):
    G = sum_i (2 i - m - 1) c_(i) / (m sum c)."""
    c = np.sort(counts.astype(np.float64))
    m = c.shape[0]
    return float(((2 * np.arange(1, m + 1) - m - 1) * c).sum() / (m * c.sum()))


def world_stats(path: Path) -> dict[str, float]:
    """Users, items, interactions per user, and the item popularity's Gini and top-1% share
    (of the items with an interaction)."""
    from fedem_private.data import load_dataset

    data = load_dataset("csv", path)
    per_user = np.bincount(data.users, minlength=data.n_users)
    pop = np.sort(np.bincount(data.items, minlength=data.n_items))[::-1]
    top = max(1, data.n_items // 100)
    return {"users": data.n_users, "items": data.n_items, "interactions": int(per_user.sum()),
            "per_user_mean": float(per_user.mean()), "per_user_median": float(np.median(per_user)),
            "gini": gini(pop), "top1pct_share": float(pop[:top].sum() / pop.sum())}


def rungs3000(path: Path, seed: int, lam: float) -> tuple[float, float]:
    """(MostPop, EASE) full HR@10 of the first 3,000 users in ``path`` (their own items)."""
    import pandas as pd

    from fedem_private.data import calibration as cal
    from fedem_private.data import leave_one_out
    from fedem_private.data.loaders import load_csv

    frame = pd.read_csv(path)
    first = frame["user"].drop_duplicates().to_numpy()[:3000]
    part = path.parent / f"{path.stem}-first3000.csv"
    if not part.is_file():
        frame[frame["user"].isin(first)].to_csv(part, index=False)
    hr = cal.rungs(leave_one_out(load_csv(part), seed), seed, lam)
    return float(hr[0]), float(hr[1])


def best_dp_mostpop(rows: dict[str, dict[str, Any]]) -> str:
    """The DP-MostPop rung (at EPS) with the best validation full HR@10 (first by name)."""
    names = sorted(r for r in rows if r.startswith("dp-mostpop-k") and r.endswith(f"-eps{EPS:g}"))
    return max(names, key=lambda r: rows[r]["val"])


def calibrated_rows(root: Path, seed: int) -> dict[str, dict[str, Any]]:
    """rung -> {hr, se, val, run} of the finished runs under ``root``."""
    out = {}
    for run in sorted(root.glob(f"*-seed{seed}")):
        if (run / "summary.json").is_file():
            s = json.loads((run / "summary.json").read_text())["metrics"]
            out[run.name.rpartition("-seed")[0]] = {
                "hr": s["full"]["hr@10"], "se": s["full"].get("hr@10_se"),
                "val": (s.get("val_full") or {}).get("hr@10"), "run": run}
    return out


def real_rows(study_csv: Path, seed: int) -> dict[str, dict[str, Any]]:
    """rung -> {hr, se, val, seeds} of the real study population ("all") at ``seed``; a rung
    the study did not run at that seed: its mean over the seeds it ran."""
    import pandas as pd

    f = pd.read_csv(study_csv)
    f = f[f.population == "all"]
    out = {}
    for rung, g in f.groupby("rung"):
        at = g[g.seed == seed]
        use = at if not at.empty else g
        out[rung] = {"hr": float(use.hr10_full.mean()), "se": float(use.hr10_full_se.mean()),
                     "val": float(use.val_hr10_full.mean()) if use.val_hr10_full.notna().all()
                     else None, "seeds": sorted(use.seed.tolist())}
    return out


def verdict(a: Path, b: Path) -> tuple[float, float, float, str]:
    """(mean paired difference of test hits, its SE, two-sided p, verdict) of run a over
    run b (:mod:`benchmarks.paired`; one comparison per world)."""
    test = paired([hits(a)], [hits(b)])
    return (test.diff, test.se, min(1.0, 2 * min(test.p_greater, test.p_less)),
            verdicts([test])[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=26858)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-users", type=int, default=2000)
    ap.add_argument("--ease-lambda", type=float, default=500.0)
    ap.add_argument("--only", nargs="+", help="run only rungs whose name starts so")
    ap.add_argument("--runs", type=Path, default=Path("runs/fidelity"))
    ap.add_argument("--real-runs", type=Path, default=Path("runs/gowalla-study"),
                    help="the gowalla study's run folders (for the real paired verdict)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/population/gowalla"))
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    if a.users < 3000:
        print("fidelity: --users must be at least 3000", file=sys.stderr)
        return 2
    if not study.SOURCE.is_file():
        print(f"fidelity: {study.SOURCE} not found (../shared/datasets is not part of the "
              f"project)", file=sys.stderr)
        return 2
    paths = study.populations(a.runs.parent / "gowalla-study" / "data", ["3000"])
    model, fit_s = model_for(paths["proxy"], a.runs)
    world = world_csv(model, a.users, a.seed, a.runs / "data")
    root = a.runs / f"Ncalibrated{a.users}"
    if not a.report_only:
        for rung, cfg in study.rungs(world, a.seed, [EPS], a.eval_users, variant="n32"):
            name = rung.rpartition("-seed")[0]
            if not name.startswith(RUNGS) or (a.only and not name.startswith(tuple(a.only))):
                continue
            study.ensure(root / rung, cfg)
    text = report(a, model, fit_s, paths, world, root)
    print(text)
    return 0


def report(a: argparse.Namespace, model: Any, fit_s: float, paths: dict[str, Path],
           world: Path, root: Path) -> str:
    """fidelity.csv (one row per rung and statistic) and fidelity.md (the tables)."""
    import pandas as pd

    real = real_rows(a.out / "study.csv", a.seed)
    cal = calibrated_rows(root, a.seed)
    rows: list[dict[str, Any]] = []
    stats = {"real study population": world_stats(paths["all"]),
             "proxy (the fit's source)": world_stats(paths["proxy"]),
             "calibrated world": world_stats(world)}
    lines = ["## The worlds\n", "| statistic | " + " | ".join(stats) + " |",
             "|---|" + "---|" * len(stats)]
    for key in stats["calibrated world"]:
        vals = [stats[w][key] for w in stats]
        fmt = "{:,.0f}" if key in ("users", "items", "interactions") else "{:.3f}"
        lines.append(f"| {key} | " + " | ".join(fmt.format(v) for v in vals) + " |")
        rows += [{"table": "world", "name": key, "world": w, "value": stats[w][key]}
                 for w in stats]
    real3 = rungs3000(paths["3000"], a.seed, a.ease_lambda)
    cal3 = rungs3000(world, a.seed, a.ease_lambda)
    lines += ["", "## The calibration's rungs (full HR@10, strict split)\n",
              "| rung | target (proxy, 2 splits) | achieved (calibration, 2 draws) | "
              f"3,000 real study users (seed {a.seed}) | the world's first 3,000 users |",
              "|---|---|---|---|---|"]
    for j, name in enumerate(("MostPop", f"EASE (lambda {a.ease_lambda:g})")):
        lines.append(f"| {name} | {model.targets[j]:.4f} | {model.achieved[j]:.4f} | "
                     f"{real3[j]:.4f} | {cal3[j]:.4f} |")
        rows += [{"table": "calibration", "name": name, "world": w, "value": v}
                 for w, v in (("target", model.targets[j]), ("achieved", model.achieved[j]),
                              ("real 3000", real3[j]), ("calibrated 3000", cal3[j]))]
    lines += ["", f"The model {model.sha256[:16]} (s = {model.taste_strength:.4g}, "
              f"w = {model.order_strength:.4g}; loaded or fitted in {fit_s:.0f} s by this "
              f"command, a fit being cached under {a.runs / 'populations'}).", ""]
    lines += ["## The study's rungs (full HR@10, eps 4, seed "
              f"{a.seed}, {a.eval_users:,} evaluation users)\n",
              "| rung | real | calibrated | calibrated / real |", "|---|---|---|---|"]
    names = [("MostPop", "mostpop"), ("ALS (central)", "als"),
             ("DP-MostPop (k by validation)", None),
             ("FedMF n32, no noise", "fedmf-none-vn32"),
             ("FedMF n32, DP-FedAvg + row selection", "fedmf-cdp-vn32-eps4")]
    for label, rung in names:
        r_name = best_dp_mostpop(real) if rung is None else rung
        c_name = best_dp_mostpop(cal) if rung is None and any(
            k.startswith("dp-mostpop-k") for k in cal) else rung
        r, c = real.get(r_name), cal.get(c_name) if c_name else None
        extra = f" (k {r_name.split('-k')[1].split('-')[0]})" if rung is None else ""
        cextra = (f" (k {c_name.split('-k')[1].split('-')[0]})" if rung is None and c_name
                  else "")
        seeds = "" if r is None or r["seeds"] == [a.seed] else f" (seeds {r['seeds']})"
        rtxt = "-" if r is None else f"{r['hr']:.4f}{extra}{seeds}"
        ctxt = "-" if c is None else f"{c['hr']:.4f}{cextra}"
        ratio = "-" if r is None or c is None else f"{c['hr'] / r['hr']:.2f}"
        lines.append(f"| {label} | {rtxt} | {ctxt} | {ratio} |")
        rows += [{"table": "rungs", "name": label, "world": "real",
                  "value": None if r is None else r["hr"]},
                 {"table": "rungs", "name": label, "world": "calibrated",
                  "value": None if c is None else c["hr"]}]
    lines += ["", "## The verdict: FedMF n32 private against DP-MostPop, paired on the "
              "evaluated users\n", "| world | paired diff ± SE | two-sided p | verdict |",
              "|---|---|---|---|"]
    for world_name, rows_, folder in (("real", real, a.real_runs / "Nall"),
                                      ("calibrated", cal, root)):
        fed = folder / f"fedmf-cdp-vn32-eps4-seed{a.seed}"
        dpm = folder / f"{best_dp_mostpop(rows_)}-seed{a.seed}" if any(
            k.startswith("dp-mostpop-k") for k in rows_) else None
        if dpm is None or not (fed / "ranks.csv").is_file() or not (dpm / "ranks.csv").is_file():
            lines.append(f"| {world_name} | - | - | - |")
            continue
        diff, se, p, word = verdict(fed, dpm)
        lines.append(f"| {world_name} | {diff:+.4f} ± {se:.4f} | {p:.3g} | {word} |")
        rows.append({"table": "verdict", "name": "paired diff", "world": world_name,
                     "value": diff})
    pd.DataFrame(rows).to_csv(a.out / "fidelity.csv", index=False)
    text = "\n".join(lines) + "\n"
    (a.out / "fidelity.md").write_text(
        "# Fidelity: a world calibrated to gowalla's 3,000-user proxy against the real "
        "study population (benchmarks/probes/fidelity.py)\n\n" + text)
    return text


if __name__ == "__main__":
    raise SystemExit(main())
