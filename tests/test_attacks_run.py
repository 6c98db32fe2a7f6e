"""The attack command's logic (attacks.run): isolation from ground truth, report, audit."""

from __future__ import annotations

import ast
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recorded_runs import recorded_run

import attacks
import attacks.attribute as attribute_mod
import attacks.run as run_mod
from attacks import registry
from attacks.attribute import KnownAttributes
from attacks.ground_truth import TRUTH_DIR
from attacks.observations import Observation, PublicKnowledge
from attacks.registry import default_attacks
from attacks.run import format_table, parse_attacks, run_attacks
from fedem_private.errors import UserError

ITEM_KEYS = ("auc", "auc_client_mean", "tpr@1%fpr", "tpr@0.1%fpr", "precision@20%", "recall@20%",
             "f1@20%", "f1_oracle",
             "f1_random_baseline", "advantage", "eps_lb_cp", "eps_lb_one_run")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_run(tmp_path_factory.mktemp("run") / "none", clients=40)


@pytest.fixture(scope="module")
def report(plain_run: Path) -> dict[str, Any]:
    return run_attacks(plain_run, default_attacks())


def test_report_has_one_record_per_attack_and_round(report: dict[str, Any],
                                                    plain_run: Path) -> None:
    on_disk = json.loads((plain_run / "attacks.json").read_text())
    assert on_disk["records"] == report["records"]
    assert not [p for p in plain_run.iterdir() if p.name.endswith(".tmp")]
    seen = [(r["attack"], r["round"]) for r in report["records"]]
    expected = [(a, r) for r in (1, 3) for a in ("support", "projection", "imia", "attribute")]
    assert seen == [*expected, ("canary", None)]
    for rec in report["records"]:
        for key in ("eps_lower_bound", "eps_accounted", "audit_ok", "seconds"):
            assert key in rec
        if rec["attack"] in attacks.ATTACKS:
            for relation in ("positive_vs_any", "positive_vs_sampled"):
                assert set(ITEM_KEYS) <= set(rec["relations"][relation])
            assert rec["audit_ok"] is None and rec["eps_accounted"] is None  # mode none
    projection = next(r for r in report["records"] if r["attack"] == "projection")
    assert projection["relations"]["positive_vs_any"]["auc"] >= 0.9
    attribute = next(r for r in report["records"] if r["attack"] == "attribute")
    assert {"auc", "balanced_accuracy", "majority_baseline", "n_known"} <= set(attribute)
    assert report["audit_ok"] is None
    assert "not certified" in report["assumptions"].lower() or "estimates" in report["assumptions"]
    text = format_table(report)
    assert "imia" in text and "positive_vs_sampled" in text and "gender" in text


def _checked(fn: Any, calls: list[tuple[str, tuple, dict]], name: str, run_dir: Path) -> Any:
    """Wrap an attack: hide the ground truth while it runs, and log what it receives."""

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, args, kwargs))
        truth = run_dir / TRUTH_DIR
        hidden = run_dir / ".hidden_truth"
        outer = truth.exists()  # attribute calls item attacks: hide once, at the outer call
        if outer:
            truth.rename(hidden)
        try:
            return fn(*args, **kwargs)
        finally:
            if outer:
                hidden.rename(truth)

    return spy


def test_attacks_never_receive_ground_truth(plain_run: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(plain_run, run_dir)
    calls: list[tuple[str, tuple, dict]] = []
    for n, f in attacks.ATTACKS.items():  # every registered item attack's function
        monkeypatch.setattr(registry.attack_class(n), "function",
                            staticmethod(_checked(f, calls, n, run_dir)))
    monkeypatch.setattr(attribute_mod, "attribute",
                        _checked(attribute_mod.attribute, calls, "attribute", run_dir))
    splits: list[tuple[KnownAttributes, np.ndarray]] = []
    original_split = run_mod.known_attributes

    def logged_split(*args: Any, **kwargs: Any) -> tuple[KnownAttributes, np.ndarray]:
        out = original_split(*args, **kwargs)
        splits.append(out)
        return out

    monkeypatch.setattr(run_mod, "known_attributes", logged_split)
    run_attacks(run_dir, ["support", "projection", "imia", "attribute"], rounds=[1],
                write=False)
    assert {c[0] for c in calls} == {"support", "projection", "imia", "attribute"}
    for name, args, kwargs in calls:
        allowed = (Observation, PublicKnowledge) + ((KnownAttributes,) if name == "attribute"
                                                     else ())
        assert all(isinstance(a, allowed) for a in args), name
        assert not kwargs or all(isinstance(v, int | float | str | bool)
                                 for v in kwargs.values()), name
    # the side knowledge never covers a client the attribute attack is scored on
    assert splits
    for known, evaluate in splits:
        assert not set(known.clients.tolist()) & set(evaluate.tolist())
        assert known.clients.size and evaluate.size


def test_attack_modules_never_import_the_private_side() -> None:
    pkg = Path(attacks.__file__).parent
    private = {"ground_truth", "labels", "scoring", "audit", "canary", "run"}
    for module in ("imia", "attribute"):
        tree = ast.parse((pkg / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[-1]} | {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name.split(".")[-1] for a in node.names}
            else:
                continue
            assert not names & private, (module, names)


def test_parse_attacks_and_user_errors(plain_run: Path, tmp_path: Path) -> None:
    assert parse_attacks(" imia,support,imia ") == ("imia", "support")
    with pytest.raises(UserError, match="unknown attack 'x'"):
        parse_attacks("support,x")
    with pytest.raises(UserError, match="no attack"):
        parse_attacks(",")
    with pytest.raises(UserError, match="not found"):
        run_attacks(tmp_path / "missing")
    with pytest.raises(UserError, match="known-fraction"):
        run_attacks(plain_run, ["attribute"], known_fraction=1.0)


# --- the audit ----------------------------------------------------------------------------

def test_sound_laplace_run_passes_the_audit(tmp_path: Path) -> None:
    run = recorded_run(tmp_path / "lap", clients=30, privacy__mode="ldp-laplace",
                       privacy__epsilon_round=1.0)
    rep = run_attacks(run, ["support", "projection", "canary"], write=False)
    assert rep["audit_ok"] is True and not rep["audit_failures"]
    for rec in rep["records"]:
        assert rec["eps_accounted"] == pytest.approx(1.0)
        assert rec["eps_lower_bound"] <= 1.0
    canary = rep["records"][-1]
    assert canary["attack"] == "canary" and canary["audit_certified"] is True
    # the noise drowns a clipped delta: item attacks are at chance
    for rec in rep["records"][:-1]:
        assert abs(rec["relations"]["positive_vs_any"]["auc"] - 0.5) < 0.1


def test_touched_rows_leak_and_fail_the_audit_with_the_reason(tmp_path: Path) -> None:
    run = recorded_run(tmp_path / "tr", rounds="1", clients=30,
                       privacy__mode="ldp-touched-rows", privacy__epsilon_round=1.0)
    rep = run_attacks(run, ["support", "canary"], write=False)
    support, canary = rep["records"]
    assert support["eps_accounted"] is None and support["eps_claimed"] == pytest.approx(1.0)
    # the touched rows show through the noise: members of the trained set stand out
    assert support["relations"]["positive_vs_any"]["auc"] > 0.6
    assert canary["audit_ok"] is False and canary["eps_lower_bound"] > 1.0
    assert "insecure" in canary["audit_reason"] and "certified" in canary["audit_reason"]
    assert rep["audit_ok"] is False and rep["audit_failures"]


def test_a_mechanism_with_half_the_noise_is_caught(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run = recorded_run(tmp_path / "broken", rounds="1", clients=10, privacy__mode="ldp-laplace",
                       privacy__epsilon_round=1.0)
    import dataclasses

    import attacks.canary as canary_mod

    real = canary_mod.release

    def half_noise(params, *args, **kwargs):  # a bug: half the scale the accountant assumes
        return real(dataclasses.replace(params, noise_scale=params.noise_scale / 2), *args,
                    **kwargs)

    monkeypatch.setattr(canary_mod, "release", half_noise)
    rep = run_attacks(run, ["canary"], write=False)
    (rec,) = rep["records"]
    assert rec["audit_ok"] is False and rec["eps_lower_bound"] > 1.0
    assert rec["eps_accounted"] == pytest.approx(1.0)
    assert "certified" in rec["audit_reason"]
    assert rep["audit_ok"] is False
    assert math.isfinite(rec["eps_lower_bound"])
