"""FedRAP with its published optimiser at several item-table rates (issue 17).

    python -m benchmarks.fedrap_rates

Reads the runs kept under ``benchmarks/results``: ``fedrap_sgd/kept`` (the code README's
rate, 1000), ``em_agg10/fedrap_sgd/kept`` (FedRAP+EM with the 10% share, same rate) and
``fedrap_ft_lr/lr<rate>/kept`` (``benchmarks/specs/reproduction/fedrap_filmtrust_lr.sh``), and
prints one markdown row per (dataset, rate, method, protocol): sampled HR@10 at the best test round
(FedRAP's code's rule) with those rounds, and at round 100, as mean ± std over seeds
(ddof 1).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import mean_std

ROOT = Path(__file__).resolve().parent / "results" / "reproduction"
README_RATE = "1000 (README)"


def sources(root: Path = ROOT) -> list[tuple[str, Path]]:
    """(rate label, kept folder) for every committed FedRAP grid."""
    out = [(README_RATE, root / "fedrap_sgd" / "kept"),
           (README_RATE, root / "em_agg10" / "fedrap_sgd" / "kept")]
    for folder in sorted((root / "fedrap_ft_lr").glob("lr*")):
        out.append((folder.name.removeprefix("lr"), folder / "kept"))
    return out


def rows(root: Path = ROOT) -> list[str]:
    groups: dict[tuple[str, str, str, str], list[tuple[float, int, float]]] = {}
    for rate, kept in sources(root):
        for summary in sorted(kept.glob("*/*/none/*/seed*/summary.json")):
            dataset, variant, _, protocol, _ = summary.parent.relative_to(kept).parts
            if not variant.startswith("fedrap"):
                continue
            s = json.loads(summary.read_text())
            sel = s["selected"]
            groups.setdefault((dataset, rate, variant, protocol), []).append(
                (sel["metrics"]["sampled"]["hr@10"], sel["round"],
                 s["metrics"]["sampled"]["hr@10"]))

    def cell(values: list[float]) -> str:
        m, sd, n = mean_std(values)
        return f"{m:.3f}" if n == 1 else f"{m:.3f} ± {sd:.3f}"

    def order(key: tuple[str, str, str, str]) -> tuple:
        dataset, rate, variant, protocol = key
        return (dataset != "ml-100k", variant, protocol, -float(rate.split()[0]))

    lines = ["| dataset | table rate | method | protocol | seeds | HR@10, best test round "
             "(rounds) | HR@10 round 100 |", "|---|---|---|---|---|---|---|"]
    for key in sorted(groups, key=order):
        dataset, rate, variant, protocol = key
        vals = groups[key]
        lines.append(f"| {dataset} | {rate} | {variant} (sgd) | {protocol} | {len(vals)} | "
                     f"{cell([v[0] for v in vals])} ({', '.join(str(v[1]) for v in vals)}) | "
                     f"{cell([v[2] for v in vals])} |")
    return lines


def main() -> int:
    print("\n".join(rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
