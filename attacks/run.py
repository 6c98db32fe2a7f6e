"""The ``fedem-private attack RUN_DIR`` command: run the attacks, score them, audit the privacy.

For a run directory recorded with ``--record-rounds``:

1. every item-level attack (capability ``kind`` "item" in
   :mod:`attacks.registry`: ``support``, ``projection``, ``imia``, ...) runs
   on every recorded round with its options, given only the
   :class:`~attacks.observations.Observation` and the
   :class:`~attacks.observations.PublicKnowledge`;
2. a client-level attack (``attribute``, where the run recorded demographics)
   gets in addition the attribute of a seeded ``known_fraction`` of the
   recorded clients (:class:`~attacks.attribute.KnownAttributes`) and is
   scored on the others;
3. only then is the ground truth read, by the scorer: per attack and round,
   under both membership relations (``positive_vs_any``,
   ``positive_vs_sampled``), the metrics of :func:`attacks.scoring.score_attack`;
4. the audit: each record's ``eps_lower_bound`` (the larger of the
   Clopper-Pearson and one-run bounds over both relations, each bound at
   level 1 - (1 - 0.95) / 2) is compared with ``eps_accounted``, the
   per-round epsilon the accountant charged for the one upload the attack
   saw. A bound above it sets ``audit_ok`` False.

Assumptions, written into ``attacks.json``: the bounds on natural training
data are NOT certified (membership was not decided by coins; members and
non-members also differ through public item priors), so a violation there is
reported as a finding to investigate (``audit_certified`` False), and only
the ``canary`` record (:mod:`attacks.canary`: coin-flipped canaries through
the run's own release function and parameters) is a certified audit.
Modes without a guarantee: ``none`` and ``paper`` have no accounted epsilon
(``eps_accounted`` None, ``audit_ok`` None: nothing to audit, the leak is
shown by the attack metrics); ``ldp-touched-rows`` claims a nominal per-round
epsilon, and is audited against that claim: a bound above it fails the audit
with the reason stated (the mode is insecure by design: the touched rows
leak). ``paper`` is compared, for information, with the paper's heuristic
per-round epsilon (``eps_claimed``), labelled as a heuristic.

The result is written atomically to ``RUN_DIR/attacks.json``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedem_private.errors import UserError
from fedem_private.privacy.registry import capability, lookup

from . import registry
from ._atomic import write_json
from .attribute import KnownAttributes
from .canary import (
    audit_confidence,
    audited,
    claimed_epsilon,
    params_from_log,
)
from .ground_truth import Demographics, GroundTruth, load_demographics, load_ground_truth
from .labels import RELATIONS, labels_for
from .observations import (
    Observation,
    PublicKnowledge,
    load_observations,
    load_public,
    observes_aggregate,
)
from .scoring import score_attack, score_attribute
from .shadow import ShadowModel

CONFIDENCE = 0.95
OUTPUT = "attacks.json"
ATTRIBUTE = "gender"
ASSUMPTIONS = (
    "Item-level records: the empirical epsilon lower bounds are computed on natural "
    "training data, whose membership was not decided by fair coins; they are estimates, "
    "not certified bounds (audit_certified false), and a violation is a finding to "
    "investigate. The canary record audits the run's own release function with "
    "coin-flipped canaries: its bound is certified at the stated confidence. "
    "eps_accounted is the per-round epsilon charged for the single upload an attack saw. "
    "Under a central mechanism the attacks see the released aggregate, the same for every "
    "client: their scores carry the population's signal (popularity) as much as a "
    "client's, so each item record also scores the clients who sat the round out "
    "('control', relations_control) and the difference is what participating revealed; "
    "its eps bounds are not compared with the accounted eps (the canary record is the "
    "audit of a central mechanism)."
)
#: the verdict of an item record on a released aggregate
AGGREGATE_VERDICT = ("the observation is the released aggregate, shared by every client: "
                     "item scores measure the population as much as the client (see "
                     "'control'); the canary record audits the mechanism")


def parse_attacks(text: str) -> tuple[str, ...]:
    """``"support,imia"`` -> ("support", "imia"); names the registry lacks are a UserError."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not names:
        raise UserError("--attacks: no attack named")
    known = registry.names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown attack {unknown[0]!r}; known: {', '.join(known)}")
    return names


def resolve_options(names: Sequence[str], given: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """Each attack's options: ``given[name]`` (an options instance, or a mapping of
    field -> text, :func:`attacks.registry.options_with`), else its defaults."""
    given = dict(given or {})
    stray = [n for n in given if n not in names]
    if stray:
        raise UserError(f"options for attack {stray[0]!r}, which is not run")
    out: dict[str, Any] = {}
    for name in names:
        value = given.get(name)
        try:
            out[name] = (registry.default_options(name) if value is None else
                         registry.options_with(name, value) if isinstance(value, Mapping)
                         else value)
        except ValueError as e:
            raise UserError(str(e)) from None
        if not isinstance(out[name], registry.attack_class(name).options):
            raise UserError(f"attack {name!r}: options must be "
                            f"{registry.attack_class(name).options.__name__}")
    return out


# --------------------------------------------------------------------------- privacy context

def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: unreadable ({e})") from e


def _finite(x: Any) -> float | None:
    if x is None or isinstance(x, str):
        return None
    value = float(x)
    return value if math.isfinite(value) else None


class PrivacyContext:
    """What the accountant said about the recorded rounds (read from the run directory)."""

    def __init__(self, run_dir: Path, public: PublicKnowledge) -> None:
        self.mode = public.privacy_mode
        self.log = dict(public.privacy_params)
        claims = capability(self.mode, "claims_guarantee") or capability(self.mode,
                                                                          "nominal_only")
        self.params = params_from_log(self.log) if claims else None
        summary = _read_json(run_dir / "summary.json") or {}
        ledger = _read_json(run_dir / "privacy_ledger.json") or {}
        privacy = summary.get("privacy") or {}
        heuristic = privacy.get("paper_heuristic") or {}
        self.paper_heuristic = _finite(heuristic.get("epsilon_round_max"))
        self.cumulative: dict[int, float | None] = {}
        for entry in ledger.get("log", []):
            eps = (entry.get("epsilon") or {}).get("reported")
            self.cumulative[int(entry["round"])] = _finite(eps)
        gaussian_upload = (capability(self.mode, "ldp_upload")
                           and lookup(self.mode).noise_kind == "gaussian")
        self.delta = float(self.log.get("delta") or 0.0) if gaussian_upload else 0.0

    @property
    def accounted(self) -> float | None:
        """Per-round eps guaranteed for one upload (None: no guarantee)."""
        if self.params is None or not self.params.guarantee:
            return None
        return claimed_epsilon(self.params)

    @property
    def claimed(self) -> tuple[float | None, str]:
        """The per-round figure the mode claims, and what it is."""
        if self.params is not None and self.params.guarantee:
            return self.accounted, "accounted per-round epsilon"
        if capability(self.mode, "nominal_only") and self.params is not None:
            return claimed_epsilon(self.params), "nominal per-round epsilon (NO guarantee)"
        if capability(self.mode, "paper_heuristic"):
            return self.paper_heuristic, "paper's heuristic per-round epsilon (NOT a guarantee)"
        return None, "no privacy claimed"


def _verdict(lower: float | None, ctx: PrivacyContext, certified: bool,
             claim: tuple[float | None, str] | None = None) -> tuple[bool | None, str]:
    """(audit_ok, reason) for one record; ``claim``: (eps, what) it is held to instead of
    the run's per-round claim (a mechanism whose audit tests another, e.g. dp-ftrl's
    whole release)."""
    claimed, what = claim if claim is not None else ctx.claimed
    if claimed is None:
        return None, f"mode {ctx.mode}: {what}; nothing to audit (see the attack metrics)"
    if lower is None:
        return None, "no lower bound"
    if lower <= claimed:
        return True, f"lower bound {lower:.3g} <= {what} {claimed:.3g}"
    kind = "certified (coin-flipped canaries)" if certified else \
        "NOT certified (natural membership): investigate"
    if capability(ctx.mode, "nominal_only"):
        return False, (f"lower bound {lower:.3g} > {what} {claimed:.3g}, {kind}; "
                       "ldp-touched-rows is insecure: the touched rows leak")
    return False, f"lower bound {lower:.3g} > {what} {claimed:.3g}, {kind}"


def _lower_bound(metrics: dict[str, dict[str, Any]]) -> tuple[float | None, str | None]:
    best, source = None, None
    for relation, m in metrics.items():
        for key in ("eps_lb_cp", "eps_lb_one_run"):
            value = m.get(key)
            if value is not None and (best is None or value > best):
                best, source = float(value), f"{relation}/{key}"
    return best, source


# --------------------------------------------------------------------------- the attacks

def known_attributes(demo: Demographics, name: str, clients: np.ndarray, fraction: float,
                     seed: int) -> tuple[KnownAttributes, np.ndarray]:
    """(the side knowledge, the clients to score): a seeded split of ``clients`` with a value."""
    values = dict(zip(demo.clients.tolist(), np.asarray(demo.attributes[name]).tolist(),
                      strict=True))
    have = np.array([c for c in clients.tolist()
                     if c in values and np.isfinite(values[c]) and values[c] in (0, 1)],
                    dtype=np.int64)
    perm = np.random.default_rng(seed).permutation(have.size)
    n_known = int(round(fraction * have.size))
    known = np.sort(have[perm[:n_known]])
    evaluate = np.sort(have[perm[n_known:]])
    return (KnownAttributes(name, known, np.array([int(values[c]) for c in known.tolist()])),
            evaluate)


def _item_record(name: str, obs: Observation, public: PublicKnowledge, gt: GroundTruth,
                 ctx: PrivacyContext, seed: int, device: str = "cpu",
                 shadow: ShadowModel | None = None, options: Any = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    cls = registry.attack_class(name)
    aggregate = observes_aggregate(public)
    # on a released aggregate every recorded client saw the same tables: score them all,
    # then the participants (main) and the clients who sat the round out (control) apart
    seen = (Observation(obs.round, obs.clients, obs.sent, obs.upload,
                        np.ones_like(obs.participated)) if aggregate else obs)
    scores = cls.scores(seen, public, options, device=device, shadow=shadow)
    seconds = time.perf_counter() - t0
    level = 1.0 - (1.0 - CONFIDENCE) / 2.0  # two bounds, one figure: Bonferroni

    def score(rows: np.ndarray) -> dict[str, dict[str, Any]]:
        s = scores.copy()
        s[~rows] = np.nan
        return {rel: score_attack(s, labels_for(obs, gt, rel), relation=rel,  # type: ignore[arg-type]
                                  confidence=level, delta=ctx.delta, seed=seed,
                                  randomized_membership=False,
                                  public_fraction=public_fraction(public, rel))
                for rel in RELATIONS}

    metrics = score(obs.participated)
    lower, source = _lower_bound(metrics)
    ok, reason = (None, AGGREGATE_VERDICT) if aggregate else _verdict(lower, ctx,
                                                                       certified=False)
    extra_rows: dict[str, Any] = {}
    if aggregate:
        extra_rows = {"relations_control": score(~obs.participated),
                      "n_control_clients": int((~obs.participated).sum())}
    note = cls.assumption(public, shadow, options)
    extra = {"assumption": note} if note else {}
    return {**extra, "attack": name, "round": obs.round, "seconds": seconds,
            "n_clients": int(obs.participated.sum()), "relations": metrics, **extra_rows,
            "eps_lower_bound": lower, "eps_lower_bound_source": source,
            "eps_accounted": ctx.accounted, "eps_claimed": ctx.claimed[0],
            "eps_accounted_cumulative": ctx.cumulative.get(obs.round),
            "audit_ok": ok, "audit_certified": False, "audit_reason": reason}


def _client_record(name: str, obs: Observation, public: PublicKnowledge,
                   demo: Demographics | None, fraction: float, seed: int, options: Any
                   ) -> dict[str, Any]:
    base: dict[str, Any] = {"attack": name, "round": obs.round, "attribute": ATTRIBUTE,
                            "eps_lower_bound": None, "eps_accounted": None, "eps_claimed": None,
                            "audit_ok": None, "audit_certified": False,
                            "audit_reason": "attribute inference is not a membership test"}
    if demo is None or ATTRIBUTE not in demo.attributes:
        base.update({"skipped": f"the run recorded no {ATTRIBUTE}", "seconds": 0.0})
        return base
    part = obs.clients[obs.participated]
    known, evaluate = known_attributes(demo, ATTRIBUTE, part, fraction, seed)
    t0 = time.perf_counter()
    prob = registry.attack_class(name).infer(obs, public, known, options, seed)
    seconds = time.perf_counter() - t0
    pos = {int(c): j for j, c in enumerate(obs.clients)}
    truth = dict(zip(demo.clients.tolist(), np.asarray(demo.attributes[ATTRIBUTE]).tolist(),
                     strict=True))
    rows = np.array([pos[int(c)] for c in evaluate], dtype=np.int64)
    y = np.array([int(truth[int(c)]) for c in evaluate], dtype=np.int64)
    metrics = score_attribute(prob[rows], y, known.values)
    base.update({"seconds": seconds, "known_fraction": fraction, "n_known": int(known.clients.size),
                 **metrics})
    return base


def _mechanism_record(name: str, ctx: PrivacyContext, seed: int, options: Any
                      ) -> dict[str, Any]:
    base: dict[str, Any] = {"attack": name, "round": None, "audit_certified": True}
    if ctx.params is None or not audited(ctx.mode):
        base.update({"skipped": f"no canary design for mode {ctx.mode}", "seconds": 0.0,
                     "eps_lower_bound": None, "eps_accounted": None, "eps_claimed": None,
                     "audit_ok": None, "audit_reason": "not audited"})
        return base
    t0 = time.perf_counter()
    out = registry.attack_class(name).audit(ctx.params, options, seed,
                                            audit_confidence(ctx.mode))
    lower = out["eps_lower_bound"]
    claim = (out["eps_claimed"], out["claim_kind"]) if out.get("claim_kind") else None
    ok, reason = _verdict(lower, ctx, certified=True, claim=claim)
    base.update({"seconds": time.perf_counter() - t0, "relations": {"canary": out},
                 "eps_lower_bound": lower, "eps_accounted": ctx.accounted,
                 "eps_claimed": claim[0] if claim else ctx.claimed[0], "audit_ok": ok,
                 "audit_reason": reason})
    return base


@dataclass(frozen=True)
class _LedgerPublic:
    """The privacy mode and parameters of a run that recorded nothing, from its ledger."""

    privacy_mode: str
    privacy_params: dict[str, Any]


def _ledger_public(path: Path) -> _LedgerPublic:
    ledger = _read_json(path / "privacy_ledger.json")
    if not ledger or not isinstance(ledger.get("params"), dict):
        raise UserError(f"{path}: no privacy_ledger.json with the run's privacy parameters")
    return _LedgerPublic(str(ledger["params"].get("mode")), dict(ledger["params"]))


def run_attacks(run_dir: str | Path, names: Sequence[str] | None = None, *, seed: int = 0,
                known_fraction: float = 0.5, rounds: Sequence[int] | None = None,
                write: bool = True, device: str = "cpu",
                shadow: Callable[[PublicKnowledge], ShadowModel | None] | None = None,
                options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run, score and audit ``names`` on a recorded run; returns (and writes) the report.

    ``names``: registered attacks (default: :func:`attacks.registry.default_attacks`);
    ``options``: per attack, its options (:func:`resolve_options`; default: its defaults).

    ``shadow(public)``: the recorded backbone's client training for the attacks that
    take a shadow (``imia``'s) (:mod:`attacks.shadow`; the experiments layer builds it from the
    backbone's registration); None, or a None result: ``imia``'s MF shadow.

    ``rounds``: only these recorded rounds (default: all). ``device`` (``cpu`` or
    ``cuda``, resolved by the caller): where the attacks with the ``device`` capability
    compute; their random draws stay on the CPU, so the scores agree within float
    tolerance.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"run directory not found: {path}")
    names = parse_attacks(",".join(registry.default_attacks() if names is None else names))
    opts = resolve_options(names, options)
    kind = {n: registry.capabilities(n).kind for n in names}
    if not 0.0 < known_fraction < 1.0:
        raise UserError(f"--known-fraction must be in (0, 1), got {known_fraction}")
    # a mechanism audit needs only the run's privacy parameters: it also runs on a run
    # that recorded nothing (e.g. cdp-gaussian, whose uploads no one sees)
    audits_only = all(kind[n] == "mechanism" for n in names)
    public: Any = (_ledger_public(path) if audits_only and not (path / "observations").is_dir()
                   else load_public(path))
    observations = load_observations(path, rounds) if not isinstance(public, _LedgerPublic) \
        else []
    if not observations and not audits_only:
        wanted = "" if rounds is None else f" for rounds {', '.join(map(str, rounds))}"
        raise UserError(f"{path}: no recorded observations{wanted} (run with --record-rounds)")
    ctx = PrivacyContext(path, public)
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    needs_truth = any(kind[n] == "item" for n in names)
    recorded = [o.round for o in observations]
    truth = {g.round: g for g in load_ground_truth(path, recorded)} if needs_truth else {}
    demo = load_demographics(path) if "client" in kind.values() else None
    wants_shadow = any(registry.capabilities(n).shadow for n in names)
    model = shadow(public) if shadow is not None and wants_shadow else None
    for obs in observations:
        for name in names:
            if kind[name] == "item":
                if obs.round not in truth:
                    raise UserError(f"{path}: no ground truth for round {obs.round}")
                records.append(_item_record(name, obs, public, truth[obs.round], ctx, seed,
                                            device, model, opts[name]))
            elif kind[name] == "client":
                records.append(_client_record(name, obs, public, demo, known_fraction, seed,
                                              opts[name]))
    records += [_mechanism_record(n, ctx, seed, opts[n]) for n in names
                if kind[n] == "mechanism"]
    verdicts = [r["audit_ok"] for r in records if r.get("audit_ok") is not None]
    report: dict[str, Any] = {
        "run_dir": str(path),
        "privacy_mode": ctx.mode,
        "eps_accounted_per_round": ctx.accounted,
        "eps_claimed_per_round": ctx.claimed[0],
        "eps_claimed_is": ctx.claimed[1],
        "assumptions": ASSUMPTIONS,
        "confidence": CONFIDENCE,
        "seed": seed,
        "attacks": list(names),
        "rounds": recorded,
        "audit_ok": (all(verdicts) if verdicts else None),
        "audit_failures": [f"{r['attack']} round {r['round']}: {r['audit_reason']}"
                           for r in records if r.get("audit_ok") is False],
        "seconds_total": time.perf_counter() - t0,
        "records": records,
    }
    report = _json_ready(report)
    if write:
        report["path"] = str(write_json(path / OUTPUT, report))
    else:
        report["path"] = None
    return report


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _json_ready(value.item())
    return value


# --------------------------------------------------------------------------- the table

def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "ok" if x else "FAIL"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def public_fraction(public: PublicKnowledge, relation: str) -> float | None:
    """The share of a client's candidates an attacker guesses are members, from public facts:
    under ``positive_vs_sampled`` each positive comes with ``num_negatives`` sampled
    negatives, so 1 / (1 + num_negatives); under ``positive_vs_any`` the server knows no
    public share (None)."""
    if relation == "positive_vs_sampled":
        return 1.0 / (1.0 + int(public.num_negatives))
    return None


def table_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """One row per (attack, round, relation), as display strings."""
    rows = []
    for r in report["records"]:
        audit = _fmt(r.get("audit_ok"))
        common = {"attack": r["attack"], "round": _fmt(r.get("round")),
                  "eps_lb": _fmt(r.get("eps_lower_bound")),
                  "eps_acc": _fmt(r.get("eps_accounted")), "audit": audit,
                  "sec": _fmt(r.get("seconds"), 1)}
        if "attribute" in r:  # a client-level record
            rows.append({**common, "relation": r.get("attribute", "-"),
                         "auc": _fmt(r.get("auc")), "tpr1": "-", "tpr01": "-",
                         "f1": _fmt(r.get("balanced_accuracy")),
                         "base": _fmt(r.get("majority_baseline")), "public": "-", "oracle": "-",
                         "adv": "-"})
            continue
        control = {f"{rel} (control)": m for rel, m in (r.get("relations_control") or {}).items()}
        for rel, m in {**(r.get("relations") or {}), **control}.items():
            rows.append({**common, "relation": rel, "auc": _fmt(m.get("auc")),
                         "tpr1": _fmt(m.get("tpr@1%fpr")), "tpr01": _fmt(m.get("tpr@0.1%fpr")),
                         "f1": _fmt(m.get("f1@20%")),
                         "base": _fmt(m.get("f1@20%_random_baseline")),
                         "public": _fmt(m.get("f1@public")),
                         "oracle": _fmt(m.get("f1_oracle")),
                         "adv": _fmt(m.get("advantage"))})
        if not r.get("relations"):
            rows.append({**common, "relation": r.get("skipped", "-"), "auc": "-", "tpr1": "-",
                         "tpr01": "-", "f1": "-", "base": "-", "public": "-", "oracle": "-",
                         "adv": "-"})
    return rows


COLUMNS = [("attack", "attack"), ("round", "round"), ("relation", "relation"), ("auc", "AUC"),
           ("tpr1", "TPR@1%"), ("tpr01", "TPR@0.1%"), ("f1", "F1@20%/bacc"),
           ("base", "baseline"), ("public", "F1@public"),
           ("oracle", "F1 ORACLE (true |pos|)"),
           ("adv", "adv"), ("eps_lb", "eps_lb"), ("eps_acc", "eps_acc"), ("audit", "audit"),
           ("sec", "sec")]


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table of the report, with the audit verdict underneath."""
    rows = table_rows(report)
    widths = {k: max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in COLUMNS}
    lines = ["  ".join(h.ljust(widths[k]) for k, h in COLUMNS)]
    lines += ["  ".join(r[k].ljust(widths[k]) for k, _ in COLUMNS) for r in rows]
    verdict = report["audit_ok"]
    if verdict is None:
        lines.append(f"audit: nothing to audit (privacy mode {report['privacy_mode']})")
    elif verdict:
        lines.append("audit: ok (no lower bound above the claimed per-round epsilon)")
    else:
        lines.append("audit: FAILED")
        lines += [f"  {f}" for f in report["audit_failures"]]
    notes = sorted({r["assumption"] for r in report["records"] if r.get("assumption")})
    lines += [f"note: {n}" for n in notes]
    lines.append("attribute rows: F1/bacc = balanced accuracy, baseline = majority rate; "
                 "bounds on natural data are not certified (see attacks.json 'assumptions')")
    lines.append("F1@20%: top 20% of each client's candidates (IMIA's cutoff); F1@public: top "
                 "1 / (1 + negatives) (positive_vs_sampled only); both need no secret. "
                 "F1 ORACLE ranks at the true number of positives, which no attacker knows")
    return "\n".join(lines)
