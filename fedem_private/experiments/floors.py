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

from fedem_private.experiments import outcome
from fedem_private.privacy.registry import lookup, no_privacy

REFERENCE_METHODS = ("mostpop", "centralised", "ease", "als")
FLOOR_METHOD = "dp-mostpop"
NOISE_SE = outcome.NOISE_SE
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


def chance_of(row: pd.Series, column: str = "hr10_full", chance: float | None = None,
              chance_se: float = 0.0) -> tuple[float | None, float]:
    """(chance's value of ``column``, its standard error over the evaluated users) for a
    seed-aggregated row: the row's own (``chance_hr10_full`` of its runs' summaries, on
    their evaluated users, :mod:`~fedem_private.experiments.outcome`) where it has them,
    else the ``chance`` and ``chance_se`` given."""
    if column == "hr10_full":
        own = row.get("chance_hr10_full_mean")
        if own is not None and isinstance(own, float) and math.isfinite(own):
            se = row.get("chance_hr10_full_se_mean")
            return own, float(se) if se is not None and math.isfinite(se) else 0.0
    return chance, chance_se


def verdict(row: pd.Series, floors: pd.DataFrame, column: str = "hr10_full",
            chance: float | None = None, chance_se: float = 0.0) -> str:
    """How a model row stands against the floor of its relation at its epsilon: ``beats``,
    ``below`` or ``within noise`` (with the floor's value), or ``–`` when not judged
    (no privacy, no matched floor, or none run at that epsilon).

    With a chance level (the row's own, :func:`chance_of`, else ``chance`` with its standard
    error ``chance_se`` over the evaluated users), a model whose mean is within
    :data:`NOISE_SE` standard errors of it (the seeds' and chance's together) is ``at
    chance`` whatever the floor does (issue 80: 0.042-0.050 against chance 0.036 ± 0.006 is
    no finding, and was read ``below``): beating a floor that is itself at chance is no
    finding, and neither is being level with one or below it. A model below chance beyond
    that noise and below its floor reads ``below (...), at chance``.
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
    chance, chance_se = chance_of(row, column, chance, chance_se)
    mean = row[f"{column}_mean"]
    if math.isnan(se) or row["n_seeds"] < 2 or floor["n_seeds"] < 2:
        if chance is not None and chance_se > 0 and abs(mean - chance) <= NOISE_SE * chance_se:
            return f"at chance, one seed ({value})"
        return f"{'above' if diff > 0 else 'below'}, one seed ({value})"
    own_se = row[f"{column}_std"] / math.sqrt(row["n_seeds"])
    noise = NOISE_SE * math.sqrt(own_se ** 2 + chance_se ** 2)
    at_chance = chance is not None and mean - chance <= noise
    if at_chance and mean >= chance - noise:
        return f"at chance ({value})"
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
