"""Power of the certified canary audits: false alarms on sound mechanisms, detection of a bug.

For each mechanism (ldp-laplace, ldp-gaussian, ldp-dpsgd, cdp-gaussian), each
accounted per-round eps (1 and 8; one round, so the run's eps is the round's)
and each seed, :func:`attacks.canary.canary_audit` runs twice with the budget
it ships with (each mechanism's ``audit_canaries``) at the stated confidence:

- ``sound``: the mechanism as accounted (``noise_factor`` 1). An alarm (lower
  bound > accounted eps) is a false alarm; at confidence 0.95 each run raises
  one with probability <= 5%, and the table should show none or few.
- ``half-noise``: the planted bug, noise at half the accounted scale while the
  accounted eps is unchanged (``noise_factor`` 0.5, a test/benchmark-only
  knob). An alarm is a detection.

Resumable: every audit appends one row to ``runs.csv``; a rerun skips the rows
already there. ``summary.md`` is rewritten from ``runs.csv`` at the end.

    PYTHONPATH=. OMP_NUM_THREADS=1 python -m benchmarks.probes.audit_power --seeds 20
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import time
from pathlib import Path

from attacks.canary import audit_confidence, canary_audit
from fedem_private.privacy.config import PrivacyConfig
from fedem_private.privacy.params import resolve_params
from fedem_private.privacy.registry import mechanism_for

OUT = Path(__file__).resolve().parents[1] / "results" / "privacy" / "audit_power"
MODES = ("ldp-laplace", "ldp-gaussian", "ldp-dpsgd", "cdp-gaussian", "dp-ftrl")
EPSILONS = (1.0, 8.0)
CONDITIONS = {"sound": 1.0, "half-noise": 0.5}
# dp-ftrl's audited plan: 16 rounds, 4 cyclic cohorts (q = 0.25), so each client takes part
# 4 times and the tree's exact squared sensitivity is S_T = 30 C^2; its third condition is
# the tempting bound k (floor(log2 T) + 1) = 20 C^2 (privacy/ftrl.py), i.e. the noise
# scaled by sqrt(20 / 30) with the accounted eps unchanged
FTRL_PLAN = (16, 0.25)
EXTRA_CONDITIONS = {"dp-ftrl": {"k-times-depth": math.sqrt(20 / 30)}}


def conditions_for(mode: str) -> dict[str, float]:
    """The noise factors ``mode`` is audited at: sound, half the noise, and its own."""
    return {**CONDITIONS, **EXTRA_CONDITIONS.get(mode, {})}
FIELDS = ("mode", "eps_target", "condition", "noise_factor", "seed", "eps_accounted",
          "eps_lower_bound", "eps_lb_cp", "eps_lb_one_run", "eps_lb_gdp", "mu_lb_gdp",
          "mu_claimed", "alarm", "n_canaries", "confidence", "delta", "auc", "seconds")


def params_for(mode: str, eps: float):
    """One round at per-round eps ``eps`` (cdp-gaussian: every client each round, q = 1, so
    the aggregator's unamplified per-round eps is the target); dp-ftrl: :data:`FTRL_PLAN`'s
    whole release at eps ``eps``."""
    if mode == "dp-ftrl":
        rounds, q = FTRL_PLAN
        return resolve_params(PrivacyConfig(mode=mode, epsilon=eps, sample_rate=q), rounds)
    extra = {"sample_rate": 1.0} if mechanism_for(mode).central else {}
    return resolve_params(PrivacyConfig(mode=mode, epsilon=eps, **extra), 1)


def _done(path: Path) -> set[tuple[str, str, str, str]]:
    if not path.is_file():
        return set()
    with path.open(newline="") as f:
        return {(r["mode"], r["eps_target"], r["condition"], r["seed"], r["confidence"])
                for r in csv.DictReader(f)}


def _num(x) -> str:
    return "" if x is None else repr(float(x))


def run(seeds: int, confidence: float | None, out: Path, modes: tuple[str, ...] = MODES,
        epsilons: tuple[float, ...] = EPSILONS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.csv"
    done = _done(path)
    new = not path.is_file()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        for seed in range(seeds):
            for mode in modes:
                for eps in epsilons:
                    params = params_for(mode, eps)
                    level = audit_confidence(mode) if confidence is None else confidence
                    for cond, factor in conditions_for(mode).items():
                        key = (mode, repr(eps), cond, str(seed), repr(level))
                        if key in done:
                            continue
                        t0 = time.perf_counter()
                        r = canary_audit(params, seed=seed, noise_factor=factor,
                                         confidence=level)
                        w.writerow({
                            "mode": mode, "eps_target": repr(eps), "condition": cond,
                            "noise_factor": factor, "seed": seed,
                            "eps_accounted": _num(r["eps_claimed"]),
                            "eps_lower_bound": _num(r["eps_lower_bound"]),
                            "eps_lb_cp": _num(r["eps_lb_cp"]),
                            "eps_lb_one_run": _num(r["eps_lb_one_run"]),
                            "eps_lb_gdp": _num(r.get("eps_lb_gdp")),
                            "mu_lb_gdp": _num(r.get("mu_lb_gdp")),
                            "mu_claimed": _num(r.get("mu_claimed")),
                            "alarm": int(r["audit_ok"] is False),
                            "n_canaries": r["n_canaries"], "confidence": level,
                            "delta": r["delta"], "auc": _num(r["auc"]),
                            "seconds": f"{time.perf_counter() - t0:.2f}"})
                        f.flush()
                        print(f"seed {seed} {mode} eps {eps:g} {cond}: lb "
                              f"{r['eps_lower_bound']:.3f} vs {r['eps_claimed']:.3f}"
                              f"{'  ALARM' if r['audit_ok'] is False else ''}", flush=True)


def summarise(out: Path) -> str:
    """The markdown table of ``runs.csv``, per (mechanism, eps, condition)."""
    with (out / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["eps_target"], r["condition"]), []).append(r)
    conf = sorted({r["confidence"] for r in rows})
    lines = [
        f"Certified canary audits (attacks.canary.canary_audit), confidence {', '.join(conf)}; "
        "alarm = eps lower bound > accounted per-round eps (dp-ftrl: the whole release's).",
        "",
        "| mechanism | eps | condition | seeds | alarms | rate | lower bound: mean (min-max) "
        "| bound that decided (count) | canaries | s / audit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        for eps in sorted({float(k[1]) for k in groups}):
            for cond in conditions_for(mode):
                g = groups.get((mode, repr(eps), cond), [])
                if not g:
                    continue
                lb = [float(r["eps_lower_bound"]) for r in g]
                alarms = sum(int(r["alarm"]) for r in g)
                which: dict[str, int] = {}
                for r in g:
                    named = {k: float(r[k]) for k in ("eps_lb_cp", "eps_lb_one_run",
                                                      "eps_lb_gdp") if r[k]}
                    top = max(named, key=named.__getitem__).removeprefix("eps_lb_")
                    which[top] = which.get(top, 0) + 1
                dec = ", ".join(f"{k} {v}" for k, v in sorted(which.items()))
                sec = sum(float(r["seconds"]) for r in g) / len(g)
                lines.append(
                    f"| {mode} | {eps:g} (acc. {float(g[0]['eps_accounted']):.3f}) | {cond} "
                    f"| {len(g)} | {alarms} | {alarms / len(g):.0%} | {sum(lb) / len(lb):.2f} "
                    f"({min(lb):.2f}-{max(lb):.2f}) | {dec} | {g[0]['n_canaries']} "
                    f"| {sec:.1f} |")
    lines += ["", f"Machine: {platform.machine()} {platform.system()}, "
              f"Python {platform.python_version()}, OMP_NUM_THREADS=1 (one core)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--confidence", type=float, default=None,
                    help="one confidence for every mode (default: each mode's shipped "
                         "attacks.canary.audit_confidence)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--eps", default=",".join(f"{e:g}" for e in EPSILONS))
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args()
    modes = tuple(m for m in a.modes.split(",") if m)
    epsilons = tuple(float(e) for e in a.eps.split(",") if e)
    bad_level = a.confidence is not None and not 0 < a.confidence < 1
    if bad_level or a.seeds < 1 or not set(modes) <= set(MODES):
        raise SystemExit(f"need 0 < confidence < 1, seeds >= 1 and modes among {MODES}")
    if not a.summary_only:
        run(a.seeds, a.confidence, a.out, modes, epsilons)
    text = summarise(a.out)
    (a.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
