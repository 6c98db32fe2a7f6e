"""Tuning curves of `fedem-private tune` studies: what validation chose, and what test says.

    python -m benchmarks.tuning_curves runs/tune/fedmf-ml-100k runs/tune/fedmf-cdp4-ml-100k \\
        --reference "MostPop (val)=0.4814" --out benchmarks/results/ladder/tuning

For each study folder (its ``trials/<n>`` run directories): every completed trial's
validation HR@10 (the objective: sampled, or ranked in full for a study with
``objective = "full"``, whose trials select their round by ``best-val-full``) beside
its test HR@10, sampled and full, and the best validation so far. Writes
``<out>/tuning_curves.png`` (best validation so far against the trial number, and test
full HR@10 against validation per trial: the validation-test gap) and
``<out>/tuning_curves.md`` (one table per study). The test
figures are read after the study; the tuner never sees them.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KEYS = ("train.lr", "train.local_epochs", "train.num_negatives", "train.dim", "train.rounds",
        "federation.server_lr", "federation.server_momentum", "federation.merge",
        "federation.aggregation", "federation.adapter_lr", "privacy.sample_rate", "privacy.clip",
        "privacy.dpsgd_rate", "privacy.dpsgd_steps", "privacy.dpsgd_lr")


def trials(study: Path) -> list[dict]:
    """(number, val, test sampled, test full, settings, objective) of every finished trial;
    ``val`` is the objective the trial was scored by ("sampled" or "full")."""
    out = []
    for run in sorted((study / "trials").glob("[0-9]*")):
        summary = run / "summary.json"
        if not summary.is_file():
            continue
        metrics = json.loads(summary.read_text())["metrics"]
        cfg = tomllib.loads((run / "config.toml").read_text())
        settings = {}
        for key in KEYS:
            section, name = key.split(".")
            value = cfg.get(section, {}).get(name)
            if value is not None and not (section == "privacy"
                                          and cfg["privacy"]["mode"] == "none"):
                settings[name] = value
        full_goal = cfg.get("train", {}).get("select_round") == "best-val-full"
        out.append({"n": int(run.name),
                    "val": metrics["val_full" if full_goal else "val"]["hr@10"],
                    "objective": "full" if full_goal else "sampled",
                    "sampled": metrics["sampled"]["hr@10"], "full": metrics["full"]["hr@10"],
                    "settings": settings})
    return out


def _fmt(settings: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in settings.items())


def searched(rows: list[dict]) -> list[dict]:
    """The rows with only the settings that vary across the study's trials (the searched
    ones; a fixed default says nothing)."""
    keys = {k for r in rows for k in r["settings"]}
    varying = {k for k in keys if len({repr(r["settings"].get(k)) for r in rows}) > 1}
    return [{**r, "settings": {k: v for k, v in r["settings"].items() if k in varying}}
            for r in rows]


def objective_label(rows: list[dict]) -> str:
    """How a study's trials were scored: "full ranking" or "sampled"."""
    return "full ranking" if rows and rows[0].get("objective") == "full" else "sampled"


def table(name: str, rows: list[dict]) -> str:
    rows = searched(rows)
    goal = objective_label(rows)
    lines = [f"### {name} ({len(rows)} trials)", "",
             f"| trial | val HR@10 ({goal}; the objective) | best so far | test HR@10 sampled | "
             "test HR@10 full | settings |", "|---|---|---|---|---|---|"]
    best = -1.0
    for r in rows:
        best = max(best, r["val"])
        mark = " **(chosen)**" if r["val"] == max(x["val"] for x in rows) else ""
        lines.append(f"| {r['n']}{mark} | {r['val']:.4f} | {best:.4f} | {r['sampled']:.4f} | "
                     f"{r['full']:.4f} | {_fmt(r['settings'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--reference", action="append", default=[],
                    help='a horizontal line on the validation panel, "label=value"')
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ladder/tuning"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    md, goals = [], set()
    for i, study in enumerate(args.studies):
        rows = trials(study)
        if not rows:
            continue
        md.append(table(study.name, rows))
        goals.add(objective_label(rows))
        best, curve = -1.0, []
        for r in rows:
            best = max(best, r["val"])
            curve.append(best)
        left.plot([r["n"] for r in rows], curve, marker="o", color=f"C{i}", label=study.name)
        right.scatter([r["val"] for r in rows], [r["full"] for r in rows], color=f"C{i}",
                      label=study.name)
    for j, ref in enumerate(args.reference):
        label, value = ref.rsplit("=", 1)
        left.axhline(float(value), color="0.4", linestyle=("--", ":", "-.")[j % 3], label=label)
    left.set_xlabel("trial")
    goal = goals.pop() if len(goals) == 1 else "each study's objective"
    left.set_ylabel(f"best validation HR@10 so far ({goal})")
    left.set_title("what the tuner saw")
    right.set_xlabel(f"validation HR@10 ({goal})")
    right.set_ylabel("test HR@10 (full ranking)")
    right.set_title("validation against test, per trial")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "tuning_curves.png", dpi=110)
    (args.out / "tuning_curves.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
