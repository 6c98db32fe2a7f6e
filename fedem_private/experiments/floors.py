"""The accuracy ladder of a report (docs/design.md section 14): references, private floors, models.

A report's seed-aggregated rows fall into three parts:

- **references**: the non-private, non-federated baselines (``mostpop``, ``centralised``,
  ``ease``, ``als``): one value per dataset and protocol, drawn as horizontal lines;
- **floors**: ``dp-mostpop``, popularity released under a privacy architecture, one
  curve per architecture (its row's ``mode``, e.g. ``central-gaussian``);
- **models**: every federated run.

A private model point is judged against the floor of the *same* neighbouring relation
and trust model at the same target epsilon (its mechanism's ``floor``,
:func:`floor_mode`): a personalised model is worth its budget only where it beats private
popularity there. "Beyond seed noise"
means the difference of the means exceeds :data:`NOISE_SE` standard errors of that
difference, sqrt(s_a^2 / n_a + s_b^2 / n_b), with s the standard deviation over seeds.
"""

from __future__ import annotations

import math

import pandas as pd

from fedem_private.privacy.registry import lookup, no_privacy

REFERENCE_METHODS = ("mostpop", "centralised", "ease", "als")
FLOOR_METHOD = "dp-mostpop"
NOISE_SE = 2.0
# dp-mostpop's architecture (baseline.architecture) -> the mode its results rows carry
DP_MOSTPOP_MODE = {"central": "central-gaussian", "local": "ldp-oue",
                   "interaction": "idp-laplace", "interaction-local": "ldp-interaction-laplace"}
FLOOR_LABEL = {mode: arch for arch, mode in DP_MOSTPOP_MODE.items()}


def architecture_of(mode: object) -> str | None:
    """The dp-mostpop architecture a federated privacy mode is judged against: its
    mechanism's ``floor`` (same neighbouring relation and trust model); None when it has
    none (no guarantee) or the mode is not a registered mechanism."""
    cls = lookup(mode)
    return cls.floor if cls is not None else None


def floor_mode(mode: object) -> str | None:
    """The dp-mostpop results-row mode matched to a federated mode (or None)."""
    arch = architecture_of(mode)
    return DP_MOSTPOP_MODE[arch] if arch else None


#: protocol options that choose the reported round on the validation item (sampled, or
#: ranked in full); they change neither the split nor the test
ROUND_BY_VALIDATION = frozenset({"bestval", "bestvalfull"})


def comparable(protocol: object) -> str:
    """A protocol label without ``+bestval`` or ``+bestvalfull``: choosing the reported
    round on the validation item changes neither the split nor the test, so such a run
    meets the floors (which have no rounds) of its protocol. Other options stay (a round
    chosen on the test, ``+besttest``, is not comparable)."""
    base, *options = str(protocol).split("+")
    return "+".join([base, *(o for o in options if o not in ROUND_BY_VALIDATION)])


def method_of(variant: str) -> str:
    """The method a variant label starts with (``ease [ease_lambda=500]`` -> ``ease``)."""
    return str(variant).split(" ", 1)[0].split("~", 1)[0]


def part(agg: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of one part of the ladder: ``references``, ``floors`` or ``models``."""
    methods = agg["variant"].map(method_of)
    if name == "references":
        return agg[methods.isin(REFERENCE_METHODS)]
    if name == "floors":
        return agg[methods == FLOOR_METHOD]
    if name == "models":
        return agg[~methods.isin((*REFERENCE_METHODS, FLOOR_METHOD))]
    raise ValueError(f"unknown ladder part {name!r}")


def floors_for(floors: pd.DataFrame, mode: str | None) -> pd.DataFrame:
    """The floor rows a panel of models under ``mode`` is drawn with: the matched
    architecture's (all of them when ``mode`` is None, none when the mode has no floor)."""
    if mode is None:
        return floors
    matched = floor_mode(mode)
    return floors[floors["mode"] == matched] if matched else floors.iloc[0:0]


def _difference(a: pd.Series, b: pd.Series, column: str) -> tuple[float, float]:
    """(mean_a - mean_b, its standard error over seeds; nan when a side has one seed)."""
    diff = a[f"{column}_mean"] - b[f"{column}_mean"]
    var = sum((r[f"{column}_std"] ** 2) / r["n_seeds"] for r in (a, b))
    return float(diff), math.sqrt(var) if not math.isnan(var) else math.nan


def verdict(row: pd.Series, floors: pd.DataFrame, column: str = "hr10_full",
            chance: float | None = None) -> str:
    """How a model row stands against the floor of its relation at its epsilon: ``beats``,
    ``below`` or ``within noise`` (with the floor's value), or ``–`` when not judged
    (no privacy, no matched floor, or none run at that epsilon).

    With ``chance`` (the metric's value for a random ranking), a model whose mean is not
    above it by :data:`NOISE_SE` standard errors is ``at chance`` whatever the floor does:
    beating a floor that is itself at chance is no finding, and neither is being level
    with one (a model below chance is never ``within noise``); one below its floor beyond
    noise reads ``below (...), at chance``.
    """
    matched = floor_mode(row["mode"])
    eps = row["eps_target"]
    if matched is None or not isinstance(eps, float) or not math.isfinite(eps):
        return "–"
    same = floors[(floors["mode"] == matched) & (floors["dataset"] == row["dataset"])
                  & (floors["protocol"].map(comparable) == comparable(row["protocol"]))
                  & ((floors["eps_target"] - eps).abs() <= 1e-9 * max(1.0, eps))]
    if same.empty:
        return f"– (no {FLOOR_LABEL[matched]} DP-MostPop at ε={eps:g})"
    floor = same.iloc[0]
    diff, se = _difference(row, floor, column)
    value = f"{FLOOR_LABEL[matched]} {floor[f'{column}_mean']:.3f}"
    if math.isnan(se) or row["n_seeds"] < 2 or floor["n_seeds"] < 2:
        return f"{'above' if diff > 0 else 'below'}, one seed ({value})"
    own_se = row[f"{column}_std"] / math.sqrt(row["n_seeds"])
    at_chance = chance is not None and row[f"{column}_mean"] - chance <= NOISE_SE * own_se
    if -diff > NOISE_SE * se:
        return f"below ({value})" + (", at chance" if at_chance else "")
    if at_chance:
        return f"at chance ({value})"
    if diff > NOISE_SE * se:
        return f"beats ({value})"
    return f"within noise ({value})"


def ladder_table(agg: pd.DataFrame, random_full: float) -> list[list[str]]:
    """Rows (rung, full HR@10, sampled HR@10) of the non-private rungs, best last: chance,
    the references and the best federated model without privacy."""
    rows = [["chance (random ranking, ≈)", f"{random_full:.3f}", "0.100"]]
    refs = part(agg, "references").sort_values("hr10_full_mean")
    models = part(agg, "models")
    plain = models[models["mode"].map(no_privacy).astype(bool)]
    best = plain.sort_values("hr10_full_mean").tail(1)
    for _, r in pd.concat([refs, best]).sort_values("hr10_full_mean").iterrows():
        rows.append([str(r["variant"]) + (" (best federated, no privacy)"
                                          if method_of(r["variant"]) not in REFERENCE_METHODS
                                          else ""),
                     f"{r['hr10_full_mean']:.3f}", f"{r['hr10_sampled_mean']:.3f}"])
    return rows
