"""Attack suite on ML-100K uploads: success, run time and the privacy audit (issue 5).

    python -m benchmarks.attacks [--rounds 50] [--clients 943] [--eps 100,10,1]
        [--methods fedmf,fedem] [--touched-methods fedmf] [--extra-eps inf,1e4]
        [--extra-methods fedmf] [--out runs/bench-attacks]
        [--results benchmarks/results/attacks/attacks_ml100k.md] [--tables-only]

For each method: one run without privacy, one per total epsilon under
``ldp-laplace`` (calibrated over the run's rounds by the default accountant),
one per epsilon under the INSECURE ``ldp-touched-rows`` (for the methods in
``--touched-methods``), and ``--extra-eps`` budgets under ``ldp-laplace`` for
``--extra-methods`` (``inf``: clipping without noise), to show the trend.
Each run records rounds 1 and the last for the first ``--clients`` client
ids, then the ``fedem-private attack`` logic runs every attack (support,
projection, imia, attribute, canary). Finished runs and finished attack
reports are kept and skipped when the script is restarted.
The Markdown tables go to ``--results`` and to stdout.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from attacks import registry
from attacks.run import run_attacks
from fedem_private.experiments.analysis import PLD_MAX_ROUND_EPS, no_privacy
from fedem_private.experiments.recording import RecordSpec, recording_setup
from fedem_private.experiments.runner import execute

from .common import machine, run_config

#: what `fedem-private attack` runs by default, and the item attacks among them (the registry)
ATTACKS = registry.default_attacks()
ITEM = tuple(a for a in ATTACKS if registry.capabilities(a).kind == "item")


def _points(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs, most important first (a restarted or interrupted script keeps what is done)."""
    points = [{"method": m, "mode": "none", "eps": None} for m in args.methods]
    points += [{"method": m, "mode": "ldp-touched-rows", "eps": e}
               for m in args.touched_methods for e in args.eps]
    points += [{"method": m, "mode": "ldp-laplace", "eps": e}
               for m in args.methods for e in args.eps]
    points += [{"method": m, "mode": "ldp-laplace", "eps": e}
               for m in args.extra_methods for e in args.extra_eps]
    for p in points:
        p["name"] = f"{p['method']}-{p['mode']}" + ("" if p["eps"] is None else f"-eps{p['eps']:g}")
    return points


def _run(point: dict[str, Any], args: argparse.Namespace) -> Path:
    path = Path(args.out) / point["name"]
    over: dict[str, Any] = {"federation.method": point["method"], "train.rounds": args.rounds,
                            "train.eval_every": args.rounds, "train.seed": args.seed,
                            "privacy.mode": point["mode"]}
    if point["eps"] is not None:
        over["privacy.epsilon"] = float(point["eps"])
        if float(point["eps"]) / args.rounds > PLD_MAX_ROUND_EPS:
            over["privacy.accountant"] = "rdp"  # beyond the PLD accountant's range
    if not (path / "summary.json").exists():
        t0 = time.perf_counter()
        spec = RecordSpec((1, "last"), args.clients)
        execute(run_config("ml-100k", **over), path, force=True, setup=recording_setup(spec))
        print(f"trained {point['name']} in {time.perf_counter() - t0:.0f} s", flush=True)
    if not (path / "attacks.json").exists():
        t0 = time.perf_counter()
        run_attacks(path, ATTACKS, seed=args.seed)
        print(f"attacked {point['name']} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def _f(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "ok" if x else "**FAIL**"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return (json.loads((path / "summary.json").read_text()),
            json.loads((path / "attacks.json").read_text()))


def _item_rows(report: dict[str, Any]) -> list[str]:
    rows = []
    for r in report["records"]:
        if r["attack"] not in ITEM:
            continue
        for rel, m in r["relations"].items():
            rows.append(f"| {r['attack']} | {r['round']} | {rel} | {_f(m['auc'])} | "
                        f"{_f(m['tpr@1%fpr'])} | {_f(m['tpr@0.1%fpr'])} | "
                        f"{_f(m['precision@20%'])} | {_f(m['recall@20%'])} | {_f(m['f1@20%'])} | "
                        f"{_f(m['f1@20%_random_baseline'])} | {_f(m['f1_oracle'])} | "
                        f"{_f(m['advantage'])} | {_f(m['eps_lb_cp'])} | "
                        f"{_f(m['eps_lb_one_run'])} | {_f(r['seconds'], 1)} |")
    return rows


ITEM_HEADER = ("| attack | round | relation | AUC | TPR@1%FPR | TPR@0.1%FPR | precision@20% | "
               "recall@20% | F1@20% | F1@20% random | F1 oracle (true count) | advantage | "
               "eps_lb CP | eps_lb one-run | seconds |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _gender_rows(name: str, report: dict[str, Any]) -> list[str]:
    rows = []
    for r in report["records"]:
        if r["attack"] == "attribute" and "auc" in r:
            rows.append(f"| {name} | {r['round']} | {_f(r['auc'])} | "
                        f"{_f(r['balanced_accuracy'])} | {_f(r['accuracy'])} | "
                        f"{_f(r['majority_baseline'])} | {r['n_known']} | {r['n_eval']} | "
                        f"{_f(r['seconds'], 1)} |")
    return rows


def _privacy_rows(name: str, summary: dict[str, Any], report: dict[str, Any]) -> list[str]:
    hr = (summary.get("metrics") or {}).get("full", {}).get("hr@10")
    rows = []
    for r in report["records"]:
        if r["attack"] in ITEM:
            a, s = r["relations"]["positive_vs_any"], r["relations"]["positive_vs_sampled"]
            rows.append(f"| {name} | {_f(hr)} | {r['attack']} | {r['round']} | {_f(a['auc'])} | "
                        f"{_f(s['auc'])} | {_f(s['f1@20%'])} / {_f(s['f1@20%_random_baseline'])} | "
                        f"{_f(a['tpr@1%fpr'])} | {_f(r['eps_lower_bound'])} | "
                        f"{_f(r['eps_claimed'])} | {_f(r['audit_ok'])} |")
        elif r["attack"] == "attribute" and "auc" in r:
            rows.append(f"| {name} | {_f(hr)} | gender | {r['round']} | {_f(r['auc'])} | - | "
                        f"bacc {_f(r['balanced_accuracy'])} | - | - | - | - |")
        elif r["attack"] == "canary":
            rows.append(f"| {name} | {_f(hr)} | canary (certified) | - | - | - | - | - | "
                        f"{_f(r['eps_lower_bound'])} | {_f(r['eps_claimed'])} | "
                        f"{_f(r['audit_ok'])} |")
    return rows


PRIVACY_HEADER = ("| run | HR@10 | attack | round | AUC any | AUC sampled | F1@20% / random "
                  "(sampled) | TPR@1% (any) | eps_lb | eps claimed/round | audit |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|")


def tables(points: list[dict[str, Any]], args: argparse.Namespace, cmd: str) -> str:
    out = [f"# Attacks on ML-100K uploads ({args.rounds} rounds, {args.clients} recorded "
           f"clients, seed {args.seed})", "",
           f"Command: `{cmd}`", "",
           f"Machine: {machine()}", "",
           "Bounds on natural training data (eps_lb CP / one-run) are estimates, not certified: "
           "membership was not decided by coins. The canary rows are the certified audit of each "
           "run's release function. `eps claimed/round` is the per-round eps accounted for one "
           "upload (ldp-laplace), the nominal eps ldp-touched-rows claims without a guarantee, "
           "or none.", ""]
    for p in points:
        if not no_privacy(p["mode"]):
            continue
        summary, report = _load(Path(args.out) / p["name"])
        hr = (summary.get("metrics") or {}).get("full", {}).get("hr@10")
        out += [f"## {p['method']}, no privacy (full-ranking HR@10 {_f(hr, 4)})", "",
                ITEM_HEADER, *_item_rows(report), ""]
    out += ["## Gender inference (known fraction 0.5 of recorded clients)", "",
            "| run | round | AUC | balanced acc. | accuracy | majority baseline | known | "
            "evaluated | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        _, report = _load(Path(args.out) / p["name"])
        out += _gender_rows(p["name"], report)
    out += ["", "## Under local DP (total eps over the run; per-round eps in the table)", "",
            PRIVACY_HEADER]
    for p in points:
        if no_privacy(p["mode"]):
            continue
        summary, report = _load(Path(args.out) / p["name"])
        out += _privacy_rows(p["name"], summary, report)
    out += ["", "## Attack run time (seconds per recorded round)", "",
            "| run | " + " | ".join(ATTACKS) + " |", "|---|" + "---|" * len(ATTACKS)]
    for p in points:
        _, report = _load(Path(args.out) / p["name"])
        for rnd in report.get("rounds", []):
            secs = []
            for a in ATTACKS:
                rec = [r for r in report["records"] if r["attack"] == a
                       and r["round"] in (rnd, None)]
                secs.append(_f(rec[0]["seconds"], 1) if rec else "-")
            out.append(f"| {p['name']} round {rnd} | " + " | ".join(secs) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    import sys

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--clients", type=int, default=943)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eps", default="100,10,1")
    ap.add_argument("--methods", default="fedmf,fedem")
    ap.add_argument("--touched-methods", default="fedmf")
    ap.add_argument("--extra-eps", default="inf,1e4",
                    help="further ldp-laplace budgets, to show the trend")
    ap.add_argument("--extra-methods", default="fedmf")
    ap.add_argument("--out", default="runs/bench-attacks")
    ap.add_argument("--results", default="benchmarks/results/attacks/attacks_ml100k.md")
    ap.add_argument("--tables-only", action="store_true")
    args = ap.parse_args()
    args.eps = [float(e) for e in args.eps.split(",") if e.strip()]
    args.methods = [m for m in args.methods.split(",") if m]
    args.touched_methods = [m for m in args.touched_methods.split(",") if m]
    args.extra_eps = [float(e) for e in args.extra_eps.split(",") if e.strip()]
    args.extra_methods = [m for m in args.extra_methods.split(",") if m]
    points = _points(args)
    if not args.tables_only:
        for p in points:
            _run(p, args)
    text = tables([p for p in points if (Path(args.out) / p["name"] / "attacks.json").exists()],
                  args, "python -m benchmarks.attacks " + " ".join(sys.argv[1:]))
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    if results.exists() and "Machine:" in (old := results.read_text()) and "Machine:" in text:
        # keep the hand-written header (command, reading guide); replace the tables
        text = old[:old.index("Machine:")] + text[text.index("Machine:"):]
    results.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
