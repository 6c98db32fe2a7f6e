"""The poplabel attack's table on the runs of ``specs/attacks/poplabel.sh`` (issue 44, item 5).

    python -m benchmarks.poplabel_table runs/poplabel [--attacks poplabel,projection]

Runs the attacks (``fedem-private attack``'s code, registry options at their defaults) on
every ``seedS-MODE[-epsE]`` run directory that has no report for them yet
(``poplabel.json`` beside ``attacks.json``), then prints, per privacy mode and total eps,
the mean ± std over seeds of each attack's AUC under both membership relations, F1@20%
with its random baseline (and poplabel's move alone, ``prior_weight`` 0, in a second
pass: ``poplabel_move_only.json``), and under ``cdp-gaussian`` the control clients' AUC (what the
released aggregate says about clients it does not contain). A random guess has AUC 0.5.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from attacks.run import run_attacks

REPORT = "poplabel.json"
NAME = re.compile(r"seed(?P<seed>\d+)-(?P<mode>[a-z-]+?)(?:-eps(?P<eps>[0-9.]+))?$")


#: the second pass: poplabel's move alone (eq. 1, lambda 0), without the sent table's prior
MOVE_ONLY = {"poplabel": {"prior_weight": "0"}}


def _report(path: Path, names: list[str], options: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    out = path / (REPORT if options is None else "poplabel_move_only.json")
    if out.exists():
        report = json.loads(out.read_text())
        if set(names) <= set(report["attacks"]):
            return report
    report = run_attacks(path, names, write=False, options=options)
    out.write_text(json.dumps(report))
    return report


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def rows(root: Path, names: list[str]) -> list[str]:
    """Markdown rows, one per (mode, eps, attack)."""
    groups: dict[tuple[str, float, str], dict[str, list[float]]] = {}
    for path in sorted(root.iterdir()):
        m = NAME.match(path.name)
        if not (m and path.is_dir() and (path / "summary.json").exists()):
            continue
        eps = float(m["eps"]) if m["eps"] else float("inf")
        records = [(r["attack"], r) for r in _report(path, names)["records"]]
        if "poplabel" in names:
            records += [("poplabel λ=0", r) for r in _report(path, ["poplabel"],
                                                             MOVE_ONLY)["records"]]
        for attack, rec in records:
            g = groups.setdefault((m["mode"], eps, attack), {})
            rel = rec["relations"]
            control = (rec.get("relations_control") or {}).get("positive_vs_sampled") or {}
            for key, value in (("seeds", float(m["seed"])),
                               ("sampled", rel["positive_vs_sampled"]["auc"]),
                               ("any", rel["positive_vs_any"]["auc"]),
                               ("f1", rel["positive_vs_sampled"]["f1@20%"]),
                               ("f1_random", rel["positive_vs_sampled"]["f1@20%_random_baseline"]),
                               ("control", control.get("auc"))):
                if value is not None:
                    g.setdefault(key, []).append(float(value))
    order = {"none": 0, "cdp-gaussian": 1, "ldp-laplace": 2, "ldp-gaussian": 3, "ldp-dpsgd": 4}
    out = []
    for (mode, eps, attack), g in sorted(groups.items(),
                                         key=lambda kv: (order.get(kv[0][0], 9), -kv[0][1],
                                                         kv[0][2])):
        seeds = ",".join(str(int(s)) for s in g["seeds"])
        out.append(f"| {mode} | {'-' if eps == float('inf') else f'{eps:g}'} | {attack} | "
                   f"{seeds} | {_cell(g.get('sampled', []))} | {_cell(g.get('any', []))} | 0.5 | "
                   f"{_cell(g.get('f1', []))} | {_cell(g.get('f1_random', []))} | "
                   f"{_cell(g.get('control', []))} |")
    return out


HEADER = ("| privacy | total eps | attack | seeds | AUC pos vs sampled | AUC pos vs any | "
          "AUC random | F1@20% (sampled) | F1@20% random | AUC control (cdp) |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--attacks", default="poplabel")
    args = ap.parse_args()
    print(HEADER)
    print("\n".join(rows(args.root, [a for a in args.attacks.split(",") if a])))


if __name__ == "__main__":
    main()
