"""Helpers shared by the sweep and report tests: tiny sweep files and a stub attack step."""

from __future__ import annotations

import json
from pathlib import Path

from fedem_private.experiments.attack_step import AttackStep

# two methods x two budgets, one seed, the projection attack
TINY_2X2 = """
methods = ["fedmf", "fedem"]
privacy = ["ldp-laplace"]
epsilons = [inf, 8]
seeds = [0]
attacks = ["projection"]
"""

TINY_BASE = """
[base.data.synthetic]
n_users = 40
n_items = 60
mean_activity = 8

[base.train]
rounds = 2
local_epochs = 1
dim = 4

[base.privacy]
clip = 5.0
"""


def write_spec(path: Path, sweep: str, base: str = TINY_BASE) -> Path:
    path.write_text("[sweep]\n" + sweep + "\n" + base)
    return path


class StubAttacks:
    """Stands in for recording + attacks.run: counts calls, writes a small attacks.json."""

    def __init__(self) -> None:
        self.recorded: list[Path] = []
        self.attacked: list[Path] = []

    def record(self, sim, run_dir: Path, rounds, clients) -> None:
        assert not run_dir.name.startswith("seed")  # the temporary directory, not the final one
        (run_dir / "observations").mkdir()
        (run_dir / "observations" / "stub.txt").write_text(f"{rounds} {clients}\n")
        self.recorded.append(run_dir)

    def attack(self, run_dir: Path, names) -> None:
        """attacks.json shaped like attacks.run's: metrics nested per membership relation."""
        eps = json.loads((run_dir / "summary.json").read_text())["privacy"]["epsilon"]["pld"]
        auc = 0.9 if eps is None else 0.55
        records = [{"attack": n, "round": r, "seconds": 0.1, "n_clients": 10,
                    "relations": {
                        "positive_vs_any": {"auc": 0.99, "tpr@1%fpr": 0.5, "f1": 0.1},
                        "positive_vs_sampled": {"auc": auc - 0.1 * (r == 1), "tpr@1%fpr": 0.2,
                                                "f1": 0.3}},
                    "eps_lower_bound": 0.1, "eps_accounted": None if eps is None else 1.0,
                    "audit_ok": None if eps is None else True}
                   for n in names for r in (1, 2)]
        (run_dir / "attacks.json").write_text(json.dumps({"audit_ok": True, "records": records}))
        self.attacked.append(run_dir)

    def step(self) -> AttackStep:
        return AttackStep(record=self.record, attack=self.attack)
