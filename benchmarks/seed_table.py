"""A markdown table of mean ± std over seeds from sweep run directories, with seed-noise verdicts.

For each (dataset, protocol) and each variant: sampled and full HR@10 at the last round,
mean ± std over the seeds found, and (when the runs log them) FedMerge's weight entropy
and EM's rho. Each variant is compared with a baseline variant (default ``fedmf``): the
difference of means "exceeds seed noise" when it is larger than twice its standard error,
sqrt(s1^2 / n1 + s2^2 / n2), a rough two-sided 95% rule for a handful of seeds.

    python -m benchmarks.seed_table runs/fedmerge runs/fedmerge-k2 runs/fedmerge-k8 \
        --baseline fedmf --metric sampled
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from fedem_private.experiments.analysis import no_privacy

from .common import fmt_mean_std as _fmt
from .common import mean_std as _ms
from .common import seed_noise


def _runs(roots: list[str]) -> list[dict]:
    out = []
    for root in roots:
        for summary in sorted(Path(root).rglob("summary.json")):
            if any(part.startswith(".") for part in summary.parts):
                continue
            s = json.loads(summary.read_text())
            point = summary.parent / "sweep_point.json"
            name = json.loads(point.read_text()).get("name") if point.exists() else None
            parts = (name or str(summary.parent.relative_to(root))).split("/")
            out.append({
                "dataset": s["dataset"], "protocol": s["protocol"], "variant": parts[1],
                "mode": parts[2], "seed": s["seed"],
                "sampled": s["metrics"]["sampled"]["hr@10"], "full": s["metrics"]["full"]["hr@10"],
                "entropy": (s.get("server_stats") or {}).get("fedmerge_entropy"),
                "rho": s.get("merge_rho_mean"),
            })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--baseline", default="fedmf")
    ap.add_argument("--metric", default="sampled", choices=("sampled", "full"))
    args = ap.parse_args()
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in _runs(args.roots):
        groups[(r["dataset"], r["protocol"], r["mode"])][r["variant"]].append(r)
    print("| data, protocol | variant | seeds | sampled HR@10 | full HR@10 | entropy | rho | "
          f"vs {args.baseline} ({args.metric}) |")
    print("|---|---|---|---|---|---|---|---|")
    for (data, proto, mode), by_variant in sorted(groups.items()):
        base = _ms([r[args.metric] for r in by_variant.get(args.baseline, [])])
        for variant in sorted(by_variant):
            rows = by_variant[variant]
            cells = {k: _ms([r[k] for r in rows]) for k in ("sampled", "full", "entropy", "rho")}
            m, s, n = cells[args.metric]
            verdict = ""
            if variant != args.baseline and base[2] > 1 and n > 1:
                diff, two_se, beyond = seed_noise(m, s, n, *base)
                verdict = (f"{diff:+.4f} ({'exceeds' if beyond else 'within'} "
                           f"seed noise, 2 s.e. = {two_se:.4f})")
            label = f"{data}, {proto}" + ("" if no_privacy(mode) else f", {mode}")
            print(f"| {label} | {variant} | {n} | {_fmt(*cells['sampled'][:2])} | "
                  f"{_fmt(*cells['full'][:2])} | {_fmt(*cells['entropy'][:2])} | "
                  f"{_fmt(*cells['rho'][:2])} | {verdict} |")


if __name__ == "__main__":
    main()
