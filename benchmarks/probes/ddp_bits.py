"""ddp-skellam's accuracy against the bit width b and the dropout fraction (issue 68).

A probe (it looks inside: it swaps the simulated secure aggregation for the plain modular
sum it computes, see below), so it lives under benchmarks/probes/.

    OMP_NUM_THREADS=1 nice -n 5 python -m benchmarks.probes.ddp_bits --dataset synthetic --seeds 0
    OMP_NUM_THREADS=1 nice -n 5 python -m benchmarks.probes.ddp_bits --dataset ml-100k --seeds 0 1 2

Every point trains in this process, one after another, and writes one JSON under
``runs/ddp_bits/<dataset>/`` (resumable: a point whose JSON exists is not run again);
``--report`` (or the end of a run) writes ``<out>/bits.{csv,md,png}`` from the JSONs
(``<out>/bits-synthetic.*`` for the synthetic path check).

Points, all at total eps ``--epsilon`` (4), delta 1e-5, the ladder's FedMF settings tuned
at eps 4 under cdp-gaussian (benchmarks/results/ladder/tuning/fedmf-cdp4-ml-100k-best.toml;
on synthetic the same with 20 rounds and clip 20):

- ``ddp``: ddp-skellam at b = 8 .. 20 bits (the scale gamma: the largest whose wrap-around
  bound is <= 1e-6 a round; tolerance 0.1, no dropout), fixed cohorts K = round(q n) with
  no amplification, the worst client charged for every round it was in;
- ``cdp``: the idealised cdp-gaussian at the same eps (Poisson sampling at rate q, its
  amplification counted: less noise for the same eps);
- ``cdp-z``: cdp-gaussian with ddp-skellam's Gaussian-equivalent noise multiplier
  (z = sqrt(mu) / Delta_2 of the continuous limit: the noise ddp-skellam adds, without
  its discretisation), so ddp minus cdp-z is the cost of the b bits (rounding inflation,
  wrap-around) and cdp-z minus cdp the cost of giving up amplification;
- ``drop``: ddp-skellam at 16 bits with ``--dropout`` 0, 0.05, 0.1, 0.2 and tolerance 0.2
  (each client's noise share sized for floor(0.8 K) inputs), one seed.

The secure aggregation is not simulated here by default (``--protocol plain``): each round
sums the clients' b-bit inputs mod 2^b directly, with the same senders, dropouts and abort
rule (:func:`fedem_private.privacy.secagg.plain_round`; the masks cancel to exactly this
sum, tests/test_secagg.py checks it), because the simulated protocol's pure-Python Shamir
sharing costs ~10 s a round at ML-100K's cohort of 472 on this machine. ``--protocol
simulated`` runs the protocol. The cost in bytes per client is measured by
benchmarks/probes/secagg_costs.py and by the runs in docs/privacy.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import data_dir, fmt_mean_std, machine, mean_std, seed_noise, train

ROOT = Path(__file__).resolve().parents[2]
TUNED = ROOT / "benchmarks/results/ladder/tuning/fedmf-cdp4-ml-100k-best.toml"
LADDER = ROOT / "benchmarks/results/ladder/ml-100k.md"
BITS = (8, 10, 12, 14, 16, 18, 20)
DROPOUTS = (0.0, 0.05, 0.1, 0.2)
DROP_TOLERANCE = 0.2
# the floors' runs: no federated privacy mode (DP-MostPop's own noise is its [baseline])
NO_PRIVACY = {"privacy.mode": "none", "privacy.sample_rate": 1.0, "privacy.epsilon": None}
# the ladder's rows cited beside ours (ML-100K, 3 seeds, mean ± sd)
LADDER_ROWS = {
    "chance": "chance (expected, random order)",
    "MostPop": "MostPop",
    "DP-MostPop central eps 4": "DP-MostPop central eps 4",
    "Centralised MF (val-tuned)": "Centralised MF (val-tuned: lr=0.001,epochs=50)",
    "FedMF cdp-gaussian eps 4 (val-tuned at eps 4)":
        "FedMF cdp-gaussian eps 4 (val-tuned at eps 4)",
}


def base_config(dataset: str, seed: int) -> Any:
    from fedem_private.api import resolve_config

    over: dict[str, Any] = {"train.seed": seed}
    if dataset == "synthetic":
        over.update({"data.dataset": "synthetic", "data.data_dir": None, "train.rounds": 20,
                     "privacy.clip": 20.0})
    else:
        over.update({"data.dataset": dataset, "data.data_dir": data_dir(dataset)})
    return resolve_config(TUNED, over)


def gaussian_equivalent_z(epsilon: float, rounds: int, delta: float) -> float:
    """ddp-skellam's noise multiplier in the continuous limit (Delta_1 -> 0): the Gaussian
    RDP composed over every round, no amplification (DdpSkellam.calibrate's)."""
    from fedem_private.privacy.skellam import calibrate_variance

    return math.sqrt(calibrate_variance(epsilon, rounds, 0.0, 1.0, delta))


def points(dataset: str, seeds: list[int], bits: tuple[int, ...], dropouts: tuple[float, ...],
           epsilon: float) -> list[dict[str, Any]]:
    """The grid, the most telling points first (seed 0 of every arm, then the others)."""
    out: list[dict[str, Any]] = []
    rounds = base_config(dataset, 0).train.rounds
    z = gaussian_equivalent_z(epsilon, rounds, 1e-5)
    ddp = {"privacy.mode": "ddp-skellam", "privacy.epsilon": epsilon}
    for i, seed in enumerate(seeds):
        arms = [(f"cdp-s{seed}", "cdp", None, 0.0,
                 {"privacy.mode": "cdp-gaussian", "privacy.epsilon": epsilon}),
                (f"cdpz-s{seed}", "cdp-z", None, 0.0,
                 {"privacy.mode": "cdp-gaussian", "privacy.noise_multiplier": z})]
        arms += [(f"ddp-b{b}-s{seed}", "ddp", b, 0.0, {**ddp, "privacy.ddp_bits": b})
                 for b in bits]
        if dataset == "synthetic":  # the floors (on ML-100K: the ladder's, cited)
            arms += [(f"mostpop-s{seed}", "MostPop", None, 0.0,
                      {"federation.method": "mostpop", **NO_PRIVACY}),
                     (f"dpmostpop-s{seed}", f"DP-MostPop central eps {epsilon:g}", None, 0.0,
                      {"federation.method": "dp-mostpop", **NO_PRIVACY,
                       "baseline.architecture": "central", "baseline.epsilon": epsilon})]
        if i == 0:
            arms += [(f"drop{p:g}-b16-s{seed}", "drop", 16, p,
                      {**ddp, "privacy.ddp_bits": 16, "privacy.dropout": p,
                       "privacy.ddp_tolerance": DROP_TOLERANCE}) for p in dropouts]
        for name, arm, b, p, over in arms:
            out.append({"name": name, "arm": arm, "bits": b, "dropout": p, "seed": seed,
                        "dataset": dataset, "overrides": over})
    return sorted(out, key=_priority)


def _priority(point: dict[str, Any]) -> tuple[int, int]:
    """Run order on a loaded machine (an ML-100K ddp-skellam point takes ~8 minutes
    there): the references and 8 to 16 bits at seed 0, 16 bits at the other seeds, 20 bits,
    the dropout sweep, then the rest."""
    arm, seed, bits = point["arm"], point["seed"], point["bits"] or 0
    if seed == 0 and (arm not in ("ddp", "drop") or bits <= 16) and arm != "drop":
        return 0, bits
    if arm == "ddp" and bits == 16:
        return 1, seed
    if arm == "cdp-z":  # ddp's noise without its bits: the comparison that isolates them
        return 1, 10 + seed
    if arm == "ddp" and bits == 20 and seed == 0:
        return 2, 0
    if arm == "drop":
        return 3, {0.1: 0, 0.2: 1, 0.05: 3, 0.0: 4}[point["dropout"]]
    if arm == "ddp" and bits == 18 and seed == 0:
        return 3, 2
    return 4, {12: 0, 20: 1}.get(bits, 3 if arm == "cdp" else 4)


def run_point(point: dict[str, Any], runs: Path, protocol: str) -> None:
    from fedem_private.experiments.analysis import with_overrides
    from fedem_private.privacy.ddp import DdpSecureSum

    DdpSecureSum.simulate_protocol = protocol == "simulated"
    over = dict(point["overrides"])
    base = base_config(point["dataset"], point["seed"])
    if "privacy.noise_multiplier" in over:  # a noise multiplier in the place of the budget
        base = replace(base, privacy=replace(base.privacy, epsilon=None,
                                             noise_multiplier=over.pop("privacy.noise_multiplier")))
    if over.get("privacy.mode") == "none":  # a floor: the same data and split, no FL
        from fedem_private.api import resolve_config
        from fedem_private.simulation.config import read_toml

        layout = {"data": read_toml(TUNED)["data"], "train": {"seed": point["seed"]}}
        cfg = resolve_config(layout, {"data.dataset": base.data.dataset,
                                      "data.data_dir": base.data.data_dir,
                                      **{k: v for k, v in over.items()
                                         if not k.startswith("privacy.")}})
    else:
        cfg = with_overrides(base, over)
    from fedem_private.errors import UserError

    t0 = time.perf_counter()
    try:
        res = train(cfg)
    except UserError as err:  # e.g. too few bits for the noise: the point is infeasible
        res = {"metrics": None, "privacy": None, "seconds_per_round": None,
               "error": str(err)}
    record = {**point, "metrics": res["metrics"], "privacy": res["privacy"],
              "seconds_per_round": res["seconds_per_round"], "protocol": protocol,
              "error": res.get("error"),
              "wall_s": time.perf_counter() - t0, "machine": machine(),
              "date": time.strftime("%Y-%m-%d")}
    path = runs / f"{point['name']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, path)


def _row(rec: dict[str, Any]) -> dict[str, Any]:
    m, priv = rec["metrics"], rec["privacy"]
    ddp = priv.get("ddp_skellam") or {}
    eps = (priv.get("epsilon") or {}).get("reported")
    return {"name": rec["name"], "arm": rec["arm"], "bits": rec["bits"],
            "dropout": rec["dropout"], "seed": rec["seed"],
            "full_hr10": m["full"]["hr@10"], "sampled_hr10": m["sampled"]["hr@10"],
            "epsilon_reported": eps, "noise_multiplier": priv.get("noise_multiplier"),
            "scale_gamma": ddp.get("scale_gamma"),
            # the rounding's inflation of the sensitivity, Delta_2 / (gamma C): the noise
            # is sized to Delta_2, the signal is gamma C
            "rounding_inflation": (ddp["l2_sensitivity_int"] / (ddp["scale_gamma"] * ddp["clip"])
                                   if ddp else None),
            "gaussian_equivalent_z": ddp.get("gaussian_equivalent_multiplier"),
            "rounds_released": ddp.get("rounds_released"),
            "rounds_aborted": len(ddp.get("rounds_aborted") or []),
            "aborted_secagg": sum("secure aggregation aborted" in a["reason"]
                                  for a in ddp.get("rounds_aborted") or []),
            "aborted_noise": sum("the noise needs" in a["reason"]
                                 for a in ddp.get("rounds_aborted") or []),
            "wrapped_entries_total": ddp.get("wrapped_entries_total"),
            "masked_input_bytes": (ddp.get("bytes_per_client") or {}).get("masked_input"),
            "seconds_per_round": rec["seconds_per_round"], "wall_s": rec["wall_s"],
            "protocol": rec["protocol"], "date": rec.get("date", "")}


def ladder_refs() -> dict[str, tuple[float, float, float, float]]:
    """{label: (sampled mean, sd, full mean, sd)} from the ladder's table."""
    out: dict[str, tuple[float, float, float, float]] = {}
    if not LADDER.is_file():
        return out
    cells = {}
    for line in LADDER.read_text().splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(parts) >= 6:
            cells[parts[0]] = parts
    num = re.compile(r"([0-9.]+) ± ([0-9.]+)")
    for label, rung in LADDER_ROWS.items():
        if rung in cells:
            s, f = num.match(cells[rung][3]), num.match(cells[rung][5])
            if s and f:
                out[label] = (float(s[1]), float(s[2]), float(f[1]), float(f[2]))
    return out


def _stats(rows: list[dict[str, Any]], key: str) -> tuple[float, float, int]:
    return mean_std([r[key] for r in rows])


def report(dataset: str, runs: Path, out: Path, command: str) -> None:
    recs = [json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))]
    if not recs:
        raise SystemExit(f"no finished points under {runs}")
    failed = [r for r in recs if r.get("error")]
    recs = [r for r in recs if not r.get("error")]
    rows = [_row(r) for r in recs]
    stem = "bits" if dataset == "ml-100k" else f"bits-{dataset}"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: (r["arm"], r["bits"] or 0, r["dropout"],
                                                r["seed"])))
    mach = recs[0]["machine"]
    dates = sorted({r["date"] for r in rows if r["date"]})
    lines = [f"# ddp-skellam: accuracy against bits b and dropout ({dataset}, eps 4)", "",
             f"Command: `{command}`; measured {', '.join(dates)} on {mach['cpu']} "
             f"({mach['cores']} cores shared with other jobs, {mach['threads']} thread; "
             "heavily loaded: times are inflated). Secure aggregation: "
             f"{', '.join(sorted({r['protocol'] for r in rows}))} (see the script's docstring). "
             "Mean ± sd over the seeds finished; a difference 'exceeds seed noise' when it "
             "is larger than twice its standard error.", ""]
    refs: list[tuple[str, float, float, float, float, int]] = []
    ref_eps: dict[str, str] = {}
    for label, (sm, ss, fm, fs) in ladder_refs().items() if dataset == "ml-100k" else []:
        refs.append((label + " [ladder]", sm, ss, fm, fs, 3))
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).append(r)
    cdp = by_arm.get("cdp", [])
    if dataset != "ml-100k":
        from dataclasses import asdict

        from fedem_private.experiments.ladder import chance_figures

        seeds = sorted({r["seed"] for r in rows})
        ch = chance_figures(asdict(base_config(dataset, 0).data), seeds)
        refs.append(("chance (exact expectation) [here]", *mean_std(ch["hr10_sampled"])[:2],
                     *mean_std(ch["hr10_full"])[:2], len(seeds)))
        for arm in sorted(a for a in by_arm if "MostPop" in a):
            (sm, ss, n), (fm, fs, _) = (_stats(by_arm[arm], "sampled_hr10"),
                                       _stats(by_arm[arm], "full_hr10"))
            refs.append((f"{arm} [here]", sm, ss, fm, fs, n))
    for arm, label in (("cdp", "cdp-gaussian eps 4 (Poisson q, amplified) [here]"),
                       ("cdp-z", "cdp-gaussian at ddp's z (no amplification's noise) [here]")):
        if by_arm.get(arm):
            (sm, ss, n), (fm, fs, _) = (_stats(by_arm[arm], "sampled_hr10"),
                                       _stats(by_arm[arm], "full_hr10"))
            refs.append((label, sm, ss, fm, fs, n))
            e = [r["epsilon_reported"] for r in by_arm[arm] if r["epsilon_reported"]]
            ref_eps[label] = f"{sum(e) / len(e):.3g}" if e else "-"
    lines += ["## References", "", "| reference | seeds | sampled HR@10 | full HR@10 | eps |",
              "|---|---|---|---|---|"]
    for label, sm, ss, fm, fs, n in refs:
        eps = ref_eps.get(label, "4" if "eps 4" in label else "-")
        lines.append(f"| {label} | {n} | {fmt_mean_std(sm, ss)} | {fmt_mean_std(fm, fs)} | "
                     f"{eps} |")
    # the idealised reference: our cdp-gaussian runs when 2 seeds or more finished, else
    # the ladder's 3 seeds of the same settings
    band = _band(cdp, refs)
    lines += ["", "## ddp-skellam against bits (tolerance 0.1, no dropout)", "",
              "| bits | seeds | sampled HR@10 | full HR@10 | eps (worst client) | gamma | "
              "Delta_2 / (gamma C) | "
              "z (Gaussian-equiv.) | wrapped entries | bytes/client (masked input) | "
              "full HR@10 vs cdp eps 4 | full HR@10 vs cdp at ddp's z | s/round |",
              "|---" * 13 + "|"]
    if band:
        lines.insert(-2, f"The comparison column: against {band[0]} (full HR@10 "
                     f"{fmt_mean_std(band[3], band[4])}, {band[5]} seeds).\n")

    ddp = by_arm.get("ddp", [])
    fc = (band[3], band[4], band[5]) if band else None
    for b in sorted({r["bits"] for r in ddp}):
        rs = [r for r in ddp if r["bits"] == b]
        sm, ss, n = _stats(rs, "sampled_hr10")
        fm, fs, _ = _stats(rs, "full_hr10")
        verdict = _verdict(fm, fs, n, fc)
        cz = by_arm.get("cdp-z", [])
        verdict_z = _verdict(fm, fs, n, _stats(cz, "full_hr10") if cz else None)
        eps = mean_std([r["epsilon_reported"] for r in rs])[0]
        lines.append(
            f"| {b} | {n} | {fmt_mean_std(sm, ss)} | {fmt_mean_std(fm, fs)} | {eps:.3f} | "
            f"{rs[0]['scale_gamma']:.4g} | {rs[0]['rounding_inflation']:.3f} | "
            f"{rs[0]['gaussian_equivalent_z']:.4g} | "
            f"{sum(r['wrapped_entries_total'] or 0 for r in rs)} | {rs[0]['masked_input_bytes']} "
            f"| {verdict} | {verdict_z} | "
            f"{mean_std([r['seconds_per_round'] for r in rs])[0]:.2f} |")
    for r in sorted(failed, key=lambda r: (r["bits"] or 0, r["seed"])):
        lines.append(f"| {r['bits']} | {r['seed']} (seed) | infeasible: {r['error']} "
                     "| | | | | | | | | | |")
    drops = by_arm.get("drop", [])
    if drops:
        lines += ["", f"## ddp-skellam against dropout (16 bits, tolerance {DROP_TOLERANCE}, "
                  "seed 0)", "", "| dropout | sampled HR@10 | full HR@10 | eps (worst client) | "
                  "rounds released | rounds aborted (secagg: a client with < t surviving "
                  "neighbours; noise: < n_t inputs) |", "|---|---|---|---|---|---|"]
        for r in sorted(drops, key=lambda r: r["dropout"]):
            lines.append(f"| {r['dropout']:g} | {r['sampled_hr10']:.4f} | {r['full_hr10']:.4f} "
                         f"| {r['epsilon_reported']:.3f} | {r['rounds_released']} | "
                         f"{r['rounds_aborted']} (secagg {r['aborted_secagg']}, noise "
                         f"{r['aborted_noise']}) |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(ddp, band, by_arm.get("cdp-z", []), refs, out / f"{stem}.png", dataset,
         sorted({r["bits"] for r in failed if r["arm"] == "ddp"}))
    print(f"wrote {out / stem}.{{csv,md,png}}")


def _verdict(m: float, s: float, n: int, ref: tuple[float, float, int] | None) -> str:
    """The difference to a reference (mean, sd, seeds) and whether it exceeds seed noise;
    with one seed on either side only the difference."""
    if ref is None or math.isnan(ref[0]):
        return "-"
    if n > 1 and ref[2] > 1:
        diff, two_se, beyond = seed_noise(m, s, n, ref[0], ref[1], ref[2])
        return (f"{diff:+.4f} (2 SE {two_se:.4f}: {'exceeds' if beyond else 'within'} "
                "seed noise)")
    return f"{m - ref[0]:+.4f} (1 seed: noise not estimated)"


def _band(cdp: list[dict[str, Any]], refs: list[tuple[str, float, float, float, float, int]]
          ) -> tuple[str, float, float, float, float, int] | None:
    """(label, sampled mean, sd, full mean, sd, seeds) of the idealised cdp-gaussian."""
    if len(cdp) >= 2:
        (sm, ss, n), (fm, fs, _) = _stats(cdp, "sampled_hr10"), _stats(cdp, "full_hr10")
        return "cdp-gaussian eps 4 (here)", sm, ss, fm, fs, n
    for ref in refs:
        if ref[0].startswith("FedMF cdp-gaussian eps 4"):
            return ("cdp-gaussian eps 4 (the ladder's runs of the same settings)",
                    *ref[1:])
    if cdp:
        (sm, ss, n), (fm, fs, _) = _stats(cdp, "sampled_hr10"), _stats(cdp, "full_hr10")
        return "cdp-gaussian eps 4 (here)", sm, ss, fm, fs, n
    return None


def plot(ddp: list[dict[str, Any]], band: tuple[str, float, float, float, float, int] | None,
         cdpz: list[dict[str, Any]],
         refs: list[tuple[str, float, float, float, float, int]], path: Path,
         dataset: str, infeasible: list[int] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.0))
    bits = sorted({r["bits"] for r in ddp})
    infeasible = [b for b in infeasible or [] if b not in bits]
    ticks = sorted({*bits, *infeasible, *BITS})  # a width not run yet: an empty tick
    for ax, key, title in ((axes[0], "full_hr10", "full HR@10"),
                           (axes[1], "sampled_hr10", "sampled HR@10 (100 candidates)")):
        lo, hi = min(ticks, default=8) - 0.5, max(ticks, default=20) + 0.5
        bands = []
        if band:
            i = 1 if key == "sampled_hr10" else 3
            bands.append((band[i], band[i + 1], band[5], "tab:blue",
                          "idealised cdp-gaussian eps 4"
                          + (" (ladder's runs)" if "ladder" in band[0] else "")))
        if cdpz:
            m, sd, n = _stats(cdpz, key)
            bands.append((m, sd, n, "tab:green", "cdp-gaussian at ddp's noise (no ampl.)"))
        for m, sd, n, colour, label in bands:
            sd = 0.0 if math.isnan(sd) else sd
            ax.axhspan(m - sd, m + sd, color=colour, alpha=0.18, lw=0)
            ax.axhline(m, color=colour, lw=1.2,
                       label=f"{label}: {m:.3f} ± {sd:.3f} ({n} seed{'s' if n > 1 else ''})")
        styles = {"MostPop": ("grey", "--"), "DP-MostPop central eps 4": ("tab:purple", "-."),
                  "chance": ("black", ":"), "chance (exact expectation)": ("black", ":")}
        for ref in refs:
            name = ref[0].removesuffix(" [ladder]").removesuffix(" [here]")
            if name in styles:
                colour, dash = styles[name]
                v = ref[1 if key == "sampled_hr10" else 3]
                ax.axhline(v, color=colour, ls=dash, lw=1, label=f"{name}: {v:.3f}")
        if bits:
            ms = [_stats([r for r in ddp if r["bits"] == b], key) for b in bits]
            ax.errorbar(bits, [m for m, _, _ in ms],
                        yerr=[0 if math.isnan(s) else s for _, s, _ in ms], color="tab:red",
                        marker="o", capsize=3, label="ddp-skellam eps 4 (mean ± sd)")
        if infeasible:
            ax.plot(infeasible, [0.0] * len(infeasible), "x", color="tab:red", ms=9,
                    clip_on=False, label="ddp-skellam infeasible (noise overflows b bits)")
            for b in infeasible:
                ax.annotate("too few\nbits", (b, 0), textcoords="offset points",
                            xytext=(0, 10), ha="center", fontsize=7, color="tab:red")
        ax.set_xlim(lo, hi)
        ax.set_xticks(ticks or list(BITS))
        ax.set_xlabel("bits b per entry of the modular sum")
        ax.set_ylabel(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7.5, loc="lower center", ncol=3, frameon=False)
    n = len({r["seed"] for r in ddp})
    fig.suptitle(f"{dataset}: ddp-skellam against bits, beside the idealised cdp-gaussian "
                 f"(band: mean ± sd, {n} seed{'s' if n > 1 else ''})", fontsize=10)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--bits", type=int, nargs="+", default=list(BITS))
    ap.add_argument("--dropouts", type=float, nargs="+", default=list(DROPOUTS))
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--protocol", choices=("plain", "simulated"), default="plain")
    ap.add_argument("--only", default=None, help="run only points whose name matches this regex")
    ap.add_argument("--runs", default=None, help="default runs/ddp_bits/<dataset>")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/privacy/secagg"))
    ap.add_argument("--report", action="store_true", help="only write the report")
    args = ap.parse_args(argv)
    runs = Path(args.runs or ROOT / "runs/ddp_bits" / args.dataset)
    runs.mkdir(parents=True, exist_ok=True)
    command = (f"OMP_NUM_THREADS=1 nice -n 5 python -m benchmarks.probes.ddp_bits --dataset "
               f"{args.dataset} --seeds {' '.join(map(str, args.seeds))}")
    if not args.report:
        grid = points(args.dataset, args.seeds, tuple(args.bits), tuple(args.dropouts),
                      args.epsilon)
        if args.only:
            grid = [p for p in grid if re.search(args.only, p["name"])]
        todo = [p for p in grid if not (runs / f"{p['name']}.json").exists()]
        print(f"{len(todo)} of {len(grid)} points to run", flush=True)
        for p in todo:
            t0 = time.perf_counter()
            run_point(p, runs, args.protocol)
            print(f"done {p['name']} in {time.perf_counter() - t0:.0f} s", flush=True)
    report(args.dataset, runs, Path(args.out), command)


if __name__ == "__main__":
    main()
