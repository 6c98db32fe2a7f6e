"""The ladder plan's time model against measured runs (issue 80, item 7).

``python -m benchmarks.probes.plan_time [--fit] [--ml100k DIR]`` runs a few short FedMF
runs that differ in what the model says a run's time depends on (the participants, the
catalogue m, the local work: epochs x positives x (1 + negatives)), each once, and prints
each run's measured training seconds (summary.json's ``seconds_total``) beside the model's
(:func:`fedem_private.experiments.ladder.federated_seconds`). ``--fit``: solve the model's
four constants by least squares on the runs marked ``fit`` and print them; the others
(another catalogue under cdp-gaussian with a sampled cohort, more local work, ML-100K) are
the check. Timings depend on the machine and its load: give them with both.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from fedem_private import api
from fedem_private.experiments import ladder

# (name, used for the fit, config overrides): synthetic users at mean activity 20, each
# run varying one thing the model says the time depends on
CDP = {"privacy.mode": "cdp-gaussian", "privacy.epsilon": 4.0, "privacy.clip": 1.0,
       "privacy.delta": 1e-5}
RUNS = [
    ("m2000", True, {"data.synthetic.n_items": 2000}),
    ("m20000", True, {"data.synthetic.n_items": 20000}),
    ("m2000-epochs20", True, {"data.synthetic.n_items": 2000, "train.local_epochs": 20}),
    ("users100-m2000", True, {"data.synthetic.n_users": 100, "data.synthetic.n_items": 2000}),
    ("m20000-cdp-q1", True, {"data.synthetic.n_items": 20000, **CDP,
                             "privacy.sample_rate": 1.0}),
    ("m2000-cdp-q1", True, {"data.synthetic.n_items": 2000, **CDP,
                            "privacy.sample_rate": 1.0}),
    ("m2000-cdp-q0.2", True, {"data.synthetic.n_items": 2000, **CDP,
                              "privacy.sample_rate": 0.2}),
    ("m10000-epochs5-cdp-q0.2", False, {"data.synthetic.n_items": 10000,
                                        "train.local_epochs": 5, **CDP,
                                        "privacy.sample_rate": 0.2}),
    ("m5000-epochs10-neg8", False, {"data.synthetic.n_items": 5000, "train.local_epochs": 10,
                                    "train.num_negatives": 8}),
    ("users1000-m8000-cohort200", False, {"data.synthetic.n_users": 1000,
                                          "data.synthetic.n_items": 8000,
                                          "train.cohort_size": 200}),
]
BASE = {"train.rounds": 8, "train.local_epochs": 2, "train.dim": 16, "train.eval_every": 8}
SYNTHETIC = {"data.synthetic.n_users": 400, "data.synthetic.mean_activity": 20.0}
CONSTANTS = ("S_PER_CLIENT", "S_PER_EXAMPLE", "S_PER_ITEM_DIM", "S_EVAL_ITEM_DIM")


def _terms(cfg: object, users: int, items: int, positives: float) -> list[float]:
    """The model's terms apart (it is linear in its constants): its seconds with one
    constant at 1 and the others at 0, for each of :data:`CONSTANTS`."""
    saved = [getattr(ladder, c) for c in CONSTANTS]
    out = []
    try:
        for one in CONSTANTS:
            for c in CONSTANTS:
                setattr(ladder, c, 1.0 if c == one else 0.0)
            out.append(ladder.federated_seconds(cfg, users, items, positives))
    finally:
        for c, v in zip(CONSTANTS, saved, strict=True):
            setattr(ladder, c, v)
    return out


def measure(overrides: dict, out: Path) -> tuple[float, list[float]]:
    """(measured training seconds, the model's terms) of one run."""
    res = api.run(None, out, overrides=overrides, warn=False)
    cfg = res.config.validate().resolved()
    data = ladder._nest({k: v for k, v in overrides.items() if k.startswith("data.")})
    _, users, items, positives = ladder.data_shape(data.get("data", {}), cfg.train.seed)
    return float(res.summary["seconds_total"]), _terms(cfg, users, items, positives)


def main(argv: list[str] | None = None) -> None:
    """Run the probe's runs and print measured against modelled seconds."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", action="store_true", help="fit the two constants on the fit runs")
    p.add_argument("--ml100k", default=None, metavar="DIR",
                   help="also check a FedMF run on ML-100K (its folder)")
    args = p.parse_args(argv)
    runs = [(name, fit, {**BASE, **SYNTHETIC, **o}) for name, fit, o in RUNS]
    if args.ml100k:
        runs.append(("ml-100k", False, {**BASE, "data.dataset": "ml-100k",
                                        "data.data_dir": args.ml100k}))
    if args.ml100k:
        runs.append(("ml-100k-cdp-q0.2", False, {**BASE, "data.dataset": "ml-100k",
                                                 "data.data_dir": args.ml100k, **CDP,
                                                 "privacy.sample_rate": 0.2}))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # the first run of a process pays one-off costs, and the first run of each privacy
        # setting its accounting (cached by the accountants across runs: a ladder's later
        # seeds and rungs of a setting find it so): each is run once first, unmeasured
        warm = {json.dumps({k: v for k, v in o.items() if k.startswith(("privacy.",
                                                                        "train.rounds"))},
                           sort_keys=True): o for _, _, o in runs}
        for i, overrides in enumerate(warm.values()):
            small = {**overrides, "data.synthetic.n_items": 500} \
                if "data.dataset" not in overrides else overrides
            measure(small, Path(tmp) / f"warm-up-{i}")
        for name, fit, overrides in runs:
            rows.append((name, fit, *measure(overrides, Path(tmp) / name)))
    consts = np.array([getattr(ladder, c) for c in CONSTANTS])
    if args.fit:
        x = np.array([terms for _, fit, _, terms in rows if fit])
        y = np.array([t for _, fit, t, _ in rows if fit])
        consts, *_ = np.linalg.lstsq(x, y, rcond=None)
    out = {**{c: float(v) for c, v in zip(CONSTANTS, consts, strict=True)}, "runs": []}
    for name, fit, t, terms in rows:
        model = float(np.dot(consts, terms))
        out["runs"].append({"run": name, "fit": fit, "measured_s": round(t, 2),
                            "model_s": round(model, 2), "ratio": round(t / model, 2)})
        print(f"{name:<26} {'fit  ' if fit else 'check'} measured {t:7.2f} s  model "
              f"{model:7.2f} s  measured/model {t / model:.2f}")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
