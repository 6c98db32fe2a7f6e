"""``fedem-private tune``: hyper-parameters chosen on the validation item (docs/design.md §14).

A tuning file names a base run config and a search space::

    [tune]
    trials = 20              # total trials wanted, completed or diverged (a resumed study tops up)
    seed = 0                 # the TPE sampler's seed
    objective = "sampled"    # or "full": the validation item ranked against every item

    [tune.space]             # dotted config keys
    "train.lr" = { low = 0.001, high = 0.3, log = true }
    "baseline.epochs" = { low = 5, high = 50, int = true }
    "baseline.ease_lambda" = { choices = [50.0, 500.0, 5000.0] }

    [base]                   # the run config every trial starts from (TOML run layout)
    data = { dataset = "ml-100k", data_dir = "../shared/datasets/ml-100k" }
    federation = { method = "ease" }

Every trial is one run directory ``<out>/trials/<number>`` (written by
:func:`~fedem_private.experiments.runner.execute`) whose validation item is ranked
against its own 99 sampled negatives (``train.select_round = "best-val"`` is forced,
which draws them separately from the test's); the objective is the last evaluated round's sampled
validation HR@10, maximised by Optuna's TPE sampler. With ``objective = "full"`` the
validation item is ranked against every item but the client's training items and its
test item (``train.select_round = "best-val-full"``), as the test's full ranking is; use
it where sampled and full ranking disagree (LastFM-2K, docs/baselines.md). A study keeps
the objective it was started with. The test item is never read. The
study lives in ``<out>/study.db`` (SQLite), so an interrupted tuning resumes where it
stopped. A trial whose run diverges (NaN or Inf in a table:
:class:`~fedem_private.errors.Diverged`) is kept as a failed trial with its reason and
counts against the budget, so every method gets the same number of tries; the sampler
ignores it. ``<out>/trials.csv`` lists every completed and diverged trial and
``<out>/best.toml`` is the best trial's resolved config; both are rewritten after every
trial (whole files, moved into place), so a study stopped part way keeps them.
``--ray [ADDRESS] --workers N`` runs N workers as Ray tasks that share the study file
(SQLite's lock, waited on for up to two minutes), each adding trials until the study has
enough; worker w samples with seed + w. One worker without Ray is reproducible from the
seed; parallel workers are not (the trial order depends on timing). A second ``tune``
process on the same ``--out`` joins the study too: its sampler's seed counts the trials
already in the file, so start it once the first has begun a trial. A running trial holds
its place in the budget, so workers never run more trials than it allows; a killed
worker's trial is failed (and its place freed) once its heartbeat is five minutes old,
and its setting is queued again (up to :data:`RETRIES` times; the new trial's
``failed_trial`` system attribute names the first trial killed with that setting, and
``retry_history`` every one), so a killed study loses no setting.
A resumed study first prints one line on stderr: its finished trials against the budget,
those failed outside it, and the killed trials queued again.
A running trial prints one line on stderr per evaluated round (its validation HR@10, also
the trial's Optuna intermediate value; the round alone under private tuning) and keeps
the rounds it has done in its ``round`` user attribute. With ``[tune] checkpoint_every =
N`` a trial saves its run's state every N rounds in ``<out>/checkpoints`` (keyed by its
config), so the retry of a killed trial resumes the run where it stopped
(:mod:`fedem_private.experiments.checkpoint`); use it where a trial takes hours.

Tuning a private run on the same data leaks (Papernot and Steinke 2022): the chosen
setting is itself a function of the data, which no run's epsilon accounts for. Report
fixed-in-advance and tuned settings side by side, or account for the search::

    [tune.private]           # only under privacy.mode = "cdp-gaussian"
    score_noise = 20.0       # sigma of the Gaussian noise on each trial's validation hit count
    mean_trials = 8          # optional: K drawn at random (Papernot and Steinke), random search
    distribution = "poisson" # or "geometric", "logarithmic", or a truncated-negative-binomial shape
    total_epsilon = 4.0      # optional: each trial's noise solved so that the search and one
                             # final run cost this much (no privacy.epsilon in [base] then)

Then no searched key may change a trial's privacy event (``train.rounds`` and every
``privacy.*`` key but ``privacy.clip``), the sampler sees only each trial's noisy score
(:func:`fedem_private.privacy.tuning.noisy_score`, divided by the number of validation
users, treated as public like cdp-gaussian's q n), ``<out>/privacy.json`` holds the search's
eps per observer (:func:`fedem_private.privacy.tuning.search_epsilon`, with one final run at
the chosen setting) and ``best.toml`` selects its round as ``last`` (choosing a round by
validation would be one more release). Without ``mean_trials`` the ``[tune] trials`` are
run under TPE and only the every-trial bound holds; with it, K is drawn from the seed
before the search, trials are random search (independent repetitions), and the
only-the-choice bound is added. The validation ranks are computed each evaluated round
inside a trial, as without privacy, but only the last one's noisy count leaves it.

Both bounds compose independent runs, so each trial of a private study draws its own
randomness: its run gets ``train.nonce`` = :func:`trial_nonce` (hashed from the study's seed
and the trial's number), which keys its noise, Poisson participation, initialisation,
negatives and shuffles (:func:`~fedem_private.simulation.sections.run_seed`); the data, the
split and the evaluation candidates stay keyed by ``train.seed``, so every trial is scored on
the same validation items. The chosen setting's final run (``best.toml``) has nonce 0, whose
key is never a trial's. An ordinary study keeps nonce 0 in every trial: its settings are
compared under common random numbers, which lowers the variance of their differences, and it
claims no privacy. A private study writes its released scores to ``noisy-scores.csv``, not
to ``trials.csv``: the settings tried (drawn from the seed) and ``best.toml`` may be
published with the only-the-choice bound; publishing the scores is the every-trial view. The
trials' run directories hold exact metrics: they are the curator's, never published.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fedem_private.errors import Diverged, UserError
from fedem_private.hostmem import release_between_runs
from fedem_private.privacy.registry import capability, names_with
from fedem_private.simulation.config import from_dict, read_toml, to_dict, to_toml, with_overrides


@dataclass(frozen=True)
class Objective:
    """What a trial is scored by (``[tune] objective``): a validation HR@10 and the
    ``train.select_round`` rule forced on every trial, which picks the round by it."""

    name: str  # the [tune] objective value: "sampled" or "full"
    kind: str  # the metrics kind holding it: "val" (sampled) or "val_full"
    rule: str  # the round rule forced on every trial
    words: str  # how outputs name it
    column: str  # its trials.csv column


OBJECTIVES = {
    # the validation item against its own 99 sampled negatives (docs/design.md 2a)
    "sampled": Objective("sampled", "val", "best-val", "sampled validation HR@10", "val_hr@10"),
    # the validation item against every item but the training items and the test item
    "full": Objective("full", "val_full", "best-val-full", "full-ranking validation HR@10",
                      "val_full_hr@10"),
}
DIVERGED = "diverged"  # the user attribute holding a diverged trial's reason
SQLITE_TIMEOUT_S = 120.0  # how long a worker waits for the study file's lock
# a running trial's worker records a heartbeat this often; a trial whose heartbeat is older
# than the grace period (its worker was killed) is failed before the next trial starts
HEARTBEAT_S = 60
GRACE_S = 300
RETRIES = 2  # how often a killed worker's setting is queued again
# a private study's released scores, apart from trials.csv: publishing them is the view
# "every trial seen" of privacy.json, not "only the choice"
NOISY_SCORES = "noisy-scores.csv"
EVERY_TRIAL_VIEW = "every-trial eps (privacy.json: views.<observer>.every_trial)"
OVER_BUDGET = "over_budget"  # user attr of a trial that found the budget claimed and stopped


def _check_space(space: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The search space, checked: each key a dotted config key with {low, high[, log, int]}
    or {choices}."""
    if not isinstance(space, dict) or not space:
        raise UserError("[tune.space] must name at least one dotted config key")
    out = {}
    for key, spec in space.items():
        if key == "train.nonce":
            raise UserError("[tune.space] train.nonce: the tuner sets it (each trial of a "
                            "private study draws its own)")
        if not isinstance(spec, dict):
            raise UserError(f"[tune.space] {key}: give {{low, high}} or {{choices}}")
        if "choices" in spec:
            if not isinstance(spec["choices"], list) or not spec["choices"]:
                raise UserError(f"[tune.space] {key}: choices must be a non-empty list")
        elif "low" in spec and "high" in spec:
            low, high = spec["low"], spec["high"]
            if not (isinstance(low, int | float) and isinstance(high, int | float)
                    and low < high):
                raise UserError(f"[tune.space] {key}: needs numbers low < high")
            if spec.get("log") and low <= 0:
                raise UserError(f"[tune.space] {key}: a log scale needs low > 0")
        else:
            raise UserError(f"[tune.space] {key}: give {{low, high}} or {{choices}}")
        out[key] = spec
    return out


def load_tune_spec(path: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]],
                                             int, int]:
    """(base config dict, space, trials, seed) of a tuning file, every key checked: the
    base and one trial at each range's low end validate as run configs."""
    values = read_toml(path, "tuning file")
    unknown = set(values) - {"tune", "base"}
    if unknown:
        raise UserError(f"tuning file: unknown section [{sorted(unknown)[0]}]; use [tune] "
                        f"and [base]")
    tune = values.get("tune") or {}
    base = values.get("base") or {}
    extra = set(tune) - {"trials", "seed", "space", "private", "objective", "checkpoint_every"}
    if extra:
        raise UserError(f"[tune]: unknown key {sorted(extra)[0]!r}; known: trials, seed, "
                        f"space, private, objective, checkpoint_every")
    load_objective(path)
    load_checkpoint_every(path)
    trials, seed = tune.get("trials", 20), tune.get("seed", 0)
    for name, value in (("trials", trials), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (name == "trials"):
            kind = "positive" if name == "trials" else "non-negative"
            raise UserError(f"[tune] {name} must be a {kind} integer, got {value!r}")
    space = _check_space(tune.get("space"))
    private = load_private(path)
    if private is not None and private.total_epsilon is not None:
        base = _with_solved_noise(base, private, trials)
    low = {k: (s["choices"][0] if "choices" in s else s["low"]) for k, s in space.items()}
    try:
        with_overrides(from_dict(base), low).validate()
    except KeyError as exc:
        raise UserError(f"[tune.space]: unknown config key {exc.args[0]!r}") from None
    return base, space, trials, seed


def load_objective(path: str | Path) -> Objective:
    """The checked ``[tune] objective`` of a tuning file ("sampled", the default, or
    "full")."""
    name = (read_toml(path, "tuning file").get("tune") or {}).get("objective", "sampled")
    if name not in OBJECTIVES:
        raise UserError(f"[tune] objective must be one of {', '.join(OBJECTIVES)}, "
                        f"got {name!r}")
    return OBJECTIVES[name]


def load_checkpoint_every(path: str | Path) -> int | None:
    """The checked ``[tune] checkpoint_every`` of a tuning file: the rounds between a
    trial's checkpoints (None: no checkpoints)."""
    from fedem_private.experiments.checkpoint import check_every

    every = (read_toml(path, "tuning file").get("tune") or {}).get("checkpoint_every")
    return check_every(every, "[tune] checkpoint_every")


def _checkpoint(root: Path, cfg: Any, every: int | None) -> Any:
    """A trial's :class:`~fedem_private.experiments.checkpoint.Checkpointing`, or None:
    ``<out>/checkpoints/<key>``, the key a hash of the trial's resolved config, so the
    retry of a killed trial (same setting, another number) resumes its run."""
    if every is None:
        return None
    from fedem_private.experiments.checkpoint import Checkpointing

    key = hashlib.sha256(to_toml(to_dict(cfg)).encode()).hexdigest()[:16]
    return Checkpointing(root / "checkpoints" / f"{key}.checkpoint", every)


@dataclass(frozen=True)
class PrivateTuning:
    """``[tune.private]``: the score's noise and, when drawn at random, the number of trials
    (module docstring; :mod:`fedem_private.privacy.tuning`)."""

    score_noise: float
    mean_trials: float | None = None
    shape: float = math.inf
    total_epsilon: float | None = None  # the whole search's eps: each trial's noise solved

    def count(self) -> Any:
        """The :class:`~fedem_private.privacy.tuning.TrialCount`, or None for fixed K."""
        from fedem_private.privacy.tuning import TrialCount

        return None if self.mean_trials is None else TrialCount(self.mean_trials, self.shape)


#: searched keys a private search may vary: they leave each trial's privacy event unchanged
_EVENT_FREE = ("privacy.clip",)


def load_private(path: str | Path) -> PrivateTuning | None:
    """The checked ``[tune.private]`` table of a tuning file, or None without one."""
    from fedem_private.privacy.tuning import SHAPES

    values = read_toml(path, "tuning file")
    tune = values.get("tune") or {}
    spec = tune.get("private")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise UserError("[tune.private] must be a table")
    extra = set(spec) - {"score_noise", "mean_trials", "distribution", "total_epsilon"}
    if extra:
        raise UserError(f"[tune.private]: unknown key {sorted(extra)[0]!r}; known: "
                        f"score_noise, mean_trials, distribution, total_epsilon")
    sigma = spec.get("score_noise")
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not (
            0 < sigma < math.inf):
        raise UserError(f"[tune.private] score_noise must be a positive number (the noise "
                        f"on the validation hit count), got {sigma!r}")
    mode = ((values.get("base") or {}).get("privacy") or {}).get("mode")
    if not capability(mode, "private_tuning"):  # the mechanism's, never its name
        modes = " or ".join(f'"{name}"' for name in names_with("private_tuning"))
        raise UserError(f"[tune.private] accounts for tuning under privacy.mode = "
                        f"{modes} only (its relation and trust model); [base] has "
                        f"{mode!r}")
    for key in tune.get("space") or {}:
        if key == "train.rounds" or (key.startswith("privacy.") and key not in _EVENT_FREE):
            raise UserError(f"[tune.private]: [tune.space] {key} changes each trial's privacy "
                            f"event; fix it in [base]")
    base_privacy = (values.get("base") or {}).get("privacy") or {}
    if base_privacy.get("clip_quantile") is not None:
        raise UserError("[tune.private]: adaptive clipping (privacy.clip_quantile) is not "
                        "accounted in a search yet; fix the clip")
    total = spec.get("total_epsilon")
    if total is not None:
        if isinstance(total, bool) or not isinstance(total, int | float) or not (
                0 < total < math.inf):
            raise UserError(f"[tune.private] total_epsilon must be a positive number, "
                            f"got {total!r}")
        if "epsilon" in base_privacy or "noise_multiplier" in base_privacy:
            raise UserError("[tune.private] total_epsilon sets each trial's noise; drop "
                            "privacy.epsilon and privacy.noise_multiplier from [base]")
        total = float(total)
    mean = spec.get("mean_trials")
    if mean is None:
        if "distribution" in spec:
            raise UserError("[tune.private] distribution needs mean_trials")
        return PrivateTuning(float(sigma), total_epsilon=total)
    if "trials" in tune:
        raise UserError("[tune.private] mean_trials draws the number of trials; drop "
                        "[tune] trials")
    if isinstance(mean, bool) or not isinstance(mean, int | float) or not 1 <= mean < math.inf:
        raise UserError(f"[tune.private] mean_trials must be a number >= 1, got {mean!r}")
    dist = spec.get("distribution", "poisson")
    if isinstance(dist, str):
        if dist not in SHAPES:
            raise UserError(f"[tune.private] distribution {dist!r}: choose one of "
                            f"{', '.join(SHAPES)} or a positive shape")
        shape = SHAPES[dist]
    elif isinstance(dist, int | float) and not isinstance(dist, bool) and 0 < dist < math.inf:
        shape = float(dist)
    else:
        raise UserError(f"[tune.private] distribution must be a name or a positive shape, "
                        f"got {dist!r}")
    return PrivateTuning(float(sigma), float(mean), shape, total)


def _with_solved_noise(base: dict[str, Any], private: PrivateTuning,
                       trials: int) -> dict[str, Any]:
    """``base`` with ``privacy.noise_multiplier`` solved so that the whole search and one
    final run cost ``total_epsilon`` (:func:`fedem_private.privacy.tuning.solve_trial_noise`)."""
    from fedem_private.privacy.tuning import solve_trial_noise

    probe = from_dict({**base, "privacy": {**base.get("privacy", {}), "noise_multiplier": 1.0}})
    cfg = probe.validate().resolved()
    assert private.total_epsilon is not None
    try:
        z = solve_trial_noise(private.total_epsilon, cfg.privacy.delta,
                              cfg.privacy.sample_rate, cfg.train.rounds, private.score_noise,
                              trials=trials, count=private.count())
    except ValueError as exc:
        raise UserError(f"[tune.private] {exc}") from None
    return {**base, "privacy": {**base.get("privacy", {}), "noise_multiplier": z}}


def _suggest(trial: Any, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key, spec in space.items():
        if "choices" in spec:
            out[key] = trial.suggest_categorical(key, spec["choices"])
        elif spec.get("int"):
            out[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]),
                                         log=bool(spec.get("log")))
        else:
            out[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]),
                                           log=bool(spec.get("log")))
    return out


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise UserError("tune needs Optuna: pip install 'fedem-private[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _open_study(optuna: Any, root: Path, sampler_seed: int, independent: bool = False) -> Any:
    """The study in ``root/study.db``, created on first use. SQLite waits up to
    :data:`SQLITE_TIMEOUT_S` for a lock, so several workers can share the file.
    ``independent``: random search (every trial drawn without looking at the others)."""
    sampler = (optuna.samplers.RandomSampler(seed=sampler_seed) if independent
               else optuna.samplers.TPESampler(seed=sampler_seed))
    with warnings.catch_warnings():  # heartbeats are marked experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            f"sqlite:///{(root / 'study.db').resolve()}",
            engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}},
            heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, **_retry(optuna))
    return optuna.create_study(
        study_name="fedem-private-tune", storage=storage,
        sampler=sampler, direction="maximize",
        load_if_exists=True)


def _retry(optuna: Any) -> dict[str, Any]:
    """The storage argument that queues a killed worker's setting again (Optuna 4.9
    renamed it; older releases take the first form)."""
    storages = optuna.storages
    if hasattr(storages, "RetryHeartbeatStaleTrialCallback"):
        return {"heartbeat_stale_trial_callback":
                storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)}
    return {"failed_trial_callback": storages.RetryFailedTrialCallback(max_retry=RETRIES)}


def _keep_objective(study: Any, goal: Objective) -> None:
    """Record ``goal`` in a new study; refuse to resume a study scored by another
    objective (a study written before the option existed was scored by "sampled")."""
    had = study.user_attrs.get("objective", "sampled" if study.trials else None)
    if had is None:
        study.set_user_attr("objective", goal.name)
    elif had != goal.name:
        raise UserError(f"tune: the study in this folder was scored by the {had} objective, "
                        f"the file asks for {goal.name}; use another --out")


_RESUME_STRIDE = 7919  # a prime: resumed samplers' seeds never meet a worker's start seed


def _completed(study: Any, optuna: Any) -> int:
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def _diverged(trial: Any, optuna: Any) -> bool:
    return trial.state == optuna.trial.TrialState.FAIL and DIVERGED in trial.user_attrs


def _claims(trials: Any, optuna: Any) -> int:
    """Trials that hold a place in the budget: completed ones, diverged ones (a setting
    that blows up is a finished, if useless, trial; the budget stays equal per method) and
    running ones (a live worker's: a killed worker's trial is failed once its heartbeat is
    :data:`GRACE_S` old, and :func:`_fail_unwatched` fails those of workers that ran before
    heartbeats were recorded)."""
    complete, running = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING
    return sum(t.state in (complete, running) or _diverged(t, optuna) for t in trials)


def _fail_stale(study: Any, optuna: Any) -> None:
    """Fail the running trials whose heartbeat is :data:`GRACE_S` old (their worker was
    killed), freeing their places before the budget is counted; the storage's callback
    queues each one's setting again (:func:`_open_study`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class _OverBudget(Exception):
    """Raised by a trial that found every place in the budget claimed by an earlier one."""


def _fail_unwatched(study: Any, optuna: Any) -> None:
    """Fail the running trials of a study written before workers recorded heartbeats
    (their workers are gone, and no heartbeat will ever mark them stale), once: the study
    then carries the ``heartbeats`` attribute, and ``interrupted`` lists the trials failed
    here. Start the first worker on such a study alone."""
    if study.user_attrs.get("heartbeats"):
        return
    running = [t.number for t in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    for number in running:
        study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    if running:
        study.set_user_attr("interrupted", running)
    study.set_user_attr("heartbeats", True)


def _work(spec: str, out: str, wanted: int, worker: int, best_by: str | None = None) -> int:
    """One worker: add trials to the shared study until it has ``wanted`` finished ones,
    completed or diverged. Running trials hold their place, and each trial first checks
    its place in line: when the trials numbered before it already claim every place
    (:func:`_claims`), it is failed as over budget (user attribute ``over_budget``) and the
    worker stops, so racing workers never run more than ``wanted``. Worker ``w`` samples
    with seed ``seed + w``, so two workers never propose the same first points. After
    each trial it rewrites the study's outputs (:func:`_write_outputs`), so a study
    stopped part way keeps its trials.csv and its best config so far. Returns the trials
    this worker finished."""
    from fedem_private.experiments.runner import execute

    optuna = _import_optuna()
    base, space, _, seed = load_tune_spec(spec)
    private = load_private(spec)
    goal = load_objective(spec)
    every = load_checkpoint_every(spec)
    independent = private is not None and private.mean_trials is not None
    root = Path(out)
    study = _open_study(optuna, root, seed + worker, independent)
    if study.trials:  # a resumed study: a sampler seeded as at the start would propose
        # the study's first points again (its random start-up draws repeat), so the
        # seed also counts the trials already there (deterministic given the file)
        study = _open_study(optuna, root, seed + worker + _RESUME_STRIDE * len(study.trials),
                            independent)

    freed: list[int] = []  # trials whose run ``execute`` finished (and so freed)
    stood_down: list[int] = []  # this worker's trial that found the budget claimed

    def objective(trial: Any) -> float:
        # trial numbers are handed out in order under the study file's lock, so of two
        # workers racing for the last place the later-numbered one stands down
        if _claims([t for t in study.get_trials(deepcopy=False)
                    if t.number < trial.number], optuna) >= wanted:
            trial.set_user_attr(OVER_BUDGET, f"the study's {wanted} places were claimed")
            stood_down.append(trial.number)
            raise _OverBudget
        params = _suggest(trial, space)
        nonce = (trial_nonce(seed, _first_of(_frozen(study, trial.number)))
                 if private is not None else 0)
        cfg = trial_config(base, params, goal, nonce)
        if nonce:
            trial.set_user_attr("nonce", nonce)
        path = root / "trials" / f"{trial.number:04d}"
        checkpoint = _checkpoint(root, cfg, every)
        try:  # frees its run before returning
            summary = execute(cfg, path, force=True,
                              on_round=_progress(trial, goal, cfg.train.rounds,
                                                 shown=private is None),
                              checkpoint=checkpoint)
            freed.append(trial.number)
        except Diverged as exc:  # recorded as a FAIL trial with its reason; the study goes on
            trial.set_user_attr(DIVERGED, str(exc))
            trial.set_user_attr("run_dir", str(path))
            raise
        metrics = summary.get("metrics") or {}
        value = (metrics.get(goal.kind) or {}).get("hr@10")
        if value is None or not math.isfinite(value):
            raise UserError(f"trial {trial.number}: the run reported no {goal.words}")
        trial.set_user_attr("run_dir", str(path))
        if private is not None:  # only the noisy count leaves the trial
            return _released(metrics[goal.kind], private, seed, trial.number)
        return float(value)

    resumed = bool(study.trials)
    done = 0
    while True:
        _fail_stale(study, optuna)  # a killed worker's place is free again
        if resumed:  # once, with the killed workers' trials failed and queued again
            print(_resume_line(study, optuna, wanted, root), file=sys.stderr, flush=True)
            resumed = False
        if _claims(study.get_trials(deepcopy=False), optuna) >= wanted:
            break
        before = len(freed)
        study.optimize(objective, n_trials=1, catch=(Diverged, _OverBudget))
        if stood_down:
            break
        if len(freed) == before:  # the run raised: free it here, not with the next one
            release_between_runs()
        done += 1
        if _completed(study, optuna):
            _write_outputs(study, root, optuna, best_by, private is not None, goal)
    return done


def trial_nonce(seed: int, number: int) -> int:
    """Trial ``number``'s ``train.nonce`` in a private study seeded ``seed``: a non-zero
    value below 2^62 hashed from (seed, number), so every trial's noise, participation,
    initialisation and negatives are its own (:func:`~fedem_private.simulation.sections.
    run_seed`), and none is the final run's (nonce 0). The retry of a killed trial keeps
    the nonce of the trial it replaces (:func:`_first_of`): it continues the same run, the
    same releases, rather than starting a second one."""
    from fedem_private.simulation.sections import SEED_LIMIT

    digest = hashlib.blake2b(f"fedem-private tune trial {int(seed)} {int(number)}".encode(),
                             digest_size=8).digest()
    return 1 + int.from_bytes(digest, "big") % (SEED_LIMIT - 1)


def _frozen(study: Any, number: int) -> Any:
    """The stored (frozen) record of a running trial: its system attributes."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _first_of(trial: Any) -> int:
    """The number of the first trial run with ``trial``'s setting: the trial itself, or
    for the retry of a killed trial the first one killed with that setting."""
    return int(trial.system_attrs.get("failed_trial", trial.number))


def trial_config(base: dict[str, Any], params: dict[str, Any], goal: Objective,
                 nonce: int = 0) -> Any:
    """A trial's resolved run config: ``base`` with the sampled ``params``, the objective's
    round rule and ``train.nonce`` (0 outside a private study, so every trial of an
    ordinary study shares its randomness, a like-for-like comparison of settings)."""
    overrides = {**params, "train.select_round": goal.rule, "train.nonce": nonce}
    return with_overrides(from_dict(base), overrides).validate().resolved()


def _retry_of(trial: Any) -> int | str:
    """The killed trial whose setting ``trial`` runs again (the last of its retry
    history: a setting killed twice names the second trial), or "" for a fresh setting."""
    history = trial.system_attrs.get("retry_history") or []
    return history[-1] if history else trial.system_attrs.get("failed_trial", "")


def _resume_line(study: Any, optuna: Any, wanted: int, root: Path) -> str:
    """One line on what a resumed study holds: its finished trials against the budget,
    those running in other workers, those failed outside the budget (killed or stopped
    workers' trials), and the killed trials whose settings are queued again."""
    state = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    completed = sum(t.state == state.COMPLETE for t in trials)
    diverged = sum(_diverged(t, optuna) for t in trials)
    running = sum(t.state == state.RUNNING for t in trials)
    outside = sum(t.state == state.FAIL and not _diverged(t, optuna) for t in trials)
    queued = [_retry_of(t) for t in trials
              if t.state == state.WAITING and "failed_trial" in t.system_attrs]
    line = (f"tune: resuming {root}: {completed + diverged} of {wanted} trials finished "
            f"({completed} completed, {diverged} diverged)")
    if running:
        line += f", {running} running in another worker"
    if outside:
        line += f", {outside} failed outside the budget (killed or stopped)"
    if queued:
        line += (f"; the setting of killed trial {', '.join(map(str, sorted(queued)))} is "
                 f"queued again (it resumes from its checkpoint where one was kept)")
    return line


def _progress(trial: Any, goal: Objective, rounds: int, shown: bool,
              err: TextIO | None = None) -> Callable[[Any], None]:
    """A trial's progress, called after each of its rounds: the user attribute ``round``
    (the rounds done, for anyone reading the study file) and, on each evaluated round,
    one line on stderr. Where ``shown`` (no private tuning) the line carries the
    objective's validation HR@10 of that round, also reported to Optuna as the trial's
    intermediate value; under private tuning only the round is shown, since a trial's
    validation score leaves it only through the noisy count (:func:`_released`)."""

    def on_round(stats: Any) -> None:
        trial.set_user_attr("round", int(stats.round))
        if stats.metrics is None:
            return
        line = f"tune: trial {trial.number}, round {stats.round}/{rounds}"
        value = (stats.metrics.get(goal.kind) or {}).get("hr@10")
        if shown and value is not None and math.isfinite(value):
            trial.report(float(value), int(stats.round))
            line += f", {goal.words} {value:.4f}"
        print(line, file=err or sys.stderr, flush=True)

    return on_round


def _released(val: dict[str, Any], private: PrivateTuning, seed: int, number: int) -> float:
    """A private trial's score: its validation hit count through the Gaussian mechanism,
    over the (public) number of validation users."""
    from fedem_private.privacy.tuning import noisy_score

    users = int(val["users"])
    hits = round(float(val["hr@10"]) * users)
    return noisy_score(hits, private.score_noise, seed, number) / users


def run_tuning(spec: str | Path, out: str | Path, trials: int | None = None,
               ray: str | None = None, workers: int = 1,
               best_by: str | None = None) -> dict[str, Any]:
    """Run (or resume) the study of ``spec`` into ``out`` until it has ``trials`` finished
    trials, completed or diverged (default: the file's); returns {"best_value",
    "best_params", "completed", "diverged"}.

    ``ray`` (a Ray address, ``local`` for a new local instance): ``workers`` Ray tasks
    share the study file, each running trials until the study has enough (on a cluster,
    ``out`` must be on a file system every node sees). With one worker and no Ray the
    study is reproducible from its seed; parallel workers' trial order depends on timing.
    ``best_by``: a searched choice (``federation.merge``); the best trial of each of its
    values is also written, as ``best-<value>.toml``.
    """
    base, space, file_trials, seed = load_tune_spec(spec)  # a bad file: said first
    private = load_private(spec)
    optuna = _import_optuna()
    if best_by is not None and "choices" not in space.get(best_by, {}):
        raise UserError(f"--best-by {best_by}: not a searched choice of [tune.space] "
                        f"(choices: {', '.join(k for k, v in space.items() if 'choices' in v)})")
    wanted = file_trials if trials is None else int(trials)
    if workers < 1:
        raise UserError(f"--workers must be a positive integer, got {workers}")
    count = None if private is None else private.count()
    if private is not None and private.total_epsilon is not None and trials is not None:
        raise UserError("--trials: [tune.private] total_epsilon was solved for the file's "
                        "number of trials")
    if count is not None:
        if trials is not None:
            raise UserError("--trials: [tune.private] mean_trials draws the number of trials")
        if ray is not None and workers > 1:
            raise UserError("[tune.private] mean_trials: one worker only (with one the "
                            "search, and so its released choice, replays from the seed)")
        wanted = count.draw(seed)
        if wanted == 0:
            raise UserError(f"[tune.private]: the seed drew K = 0 trials ({count.label}); "
                            f"the draw is part of the mechanism, so nothing is chosen")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    goal = load_objective(spec)
    made = _open_study(optuna, root, seed, count is not None)  # once, before workers race
    _keep_objective(made, goal)
    _fail_unwatched(made, optuna)
    if ray is None:
        _work(str(spec), str(root), wanted, 0, best_by)
    else:
        _work_on_ray(str(spec), str(root), wanted, workers, ray, best_by)
    study = _open_study(optuna, root, seed, count is not None)
    if _completed(study, optuna) == 0:
        raise UserError("tune: no trial completed")
    _write_outputs(study, root, optuna, best_by, private is not None, goal)
    best = study.best_trial
    out = {"best_value": best.value, "best_params": best.params, "objective": goal.words,
           "completed": _completed(study, optuna),
           "diverged": sum(_diverged(t, optuna) for t in study.trials)}
    if private is not None:
        out["privacy"] = _account(study, optuna, root, private, wanted, base)
    return out


def _account(study: Any, optuna: Any, root: Path, private: PrivateTuning, drawn: int,
             base: dict[str, Any]) -> dict[str, Any]:
    """``root/privacy.json``: the search's eps (:func:`~fedem_private.privacy.tuning.
    search_epsilon`) from the trials' own privacy records, which must agree."""
    from fedem_private.privacy.tuning import TrialEvent, search_epsilon

    events = set()
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        rec = json.loads((Path(t.user_attrs["run_dir"]) / "summary.json").read_text())
        p = rec["privacy"]
        events.add((float(p["sample_rate"]), round(float(p["noise_multiplier"]), 12),
                    int(rec["rounds"]), float(p["delta"])))
    if len(events) != 1:
        raise UserError(f"[tune.private]: the trials' privacy events differ ({sorted(events)}); "
                        f"the search cannot be accounted as one event repeated")
    q, z, rounds, delta = events.pop()
    trial = TrialEvent(q, z, rounds, private.score_noise)
    started = len(study.trials)  # every trial that began released something
    count = private.count()
    exact = count is not None and started == drawn
    result = search_epsilon(trial, delta, trials=started, count=count if exact else None,
                            final_runs=1)
    result.update({"score_noise": private.score_noise, "trials_drawn": drawn if count else None,
                   "trials_started": started, "trial": {
                       "sample_rate": q, "noise_multiplier": z, "rounds": rounds}})
    if count is not None and not exact:
        result["only_choice_note"] = (f"{started} trials started for K = {drawn} drawn: the "
                                      f"only-the-choice bound does not apply")
    (root / "privacy.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def _work_on_ray(spec: str, out: str, wanted: int, workers: int, address: str,
                 best_by: str | None = None) -> None:
    """``workers`` :func:`_work` calls as Ray tasks (1 CPU each); a failed task is raised."""
    from fedem_private.experiments import ray_tasks

    errors: list[BaseException] = []

    def on_result(i: int, value: Any, error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)

    with ray_tasks.ray_session(address, num_cpus=workers if address == ray_tasks.LOCAL
                               else None):
        ray_tasks.run_tasks(_work, [(spec, out, wanted, w, best_by) for w in range(workers)],
                            workers, on_result)
    if errors:
        raise UserError(f"tune --ray: a worker failed: {str(errors[0]).strip().splitlines()[-1]}")


def _write_outputs(study: Any, root: Path, optuna: Any, best_by: str | None = None,
                   private: bool = False, goal: Objective = OBJECTIVES["sampled"]) -> None:
    """trials.csv (every completed or diverged trial, in trial order; ``retry_of``: the
    killed trial whose setting it ran again, if any), best.toml (the
    best one's resolved config) and, with ``best_by``, best-<value>.toml per value.
    ``private``: the scores are the released noisy ones, and the configs select their
    round as ``last``."""
    complete = optuna.trial.TrialState.COMPLETE
    done = [t for t in study.trials if t.state == complete]
    listed = [t for t in study.trials if t.state == complete or _diverged(t, optuna)]
    keys = sorted({k for t in listed for k in t.params})
    # a private study's scores go to their own file: trials.csv (the settings tried,
    # drawn from the seed) may be published beside the choice, the scores only under the
    # every-trial view (module docstring)
    scored = not private
    with _replacing(root / "trials.csv") as fh:
        writer = csv.writer(fh)
        writer.writerow(["trial", *keys, *([goal.column] if scored else []), "run_dir",
                         "status", "retry_of"])
        for t in listed:
            writer.writerow([t.number, *(t.params.get(k) for k in keys),
                             *(["" if t.value is None else t.value] if scored else []),
                             t.user_attrs.get("run_dir"),
                             "complete" if t.state == complete else DIVERGED,
                             _retry_of(t)])
    if private:
        with _replacing(root / NOISY_SCORES) as fh:
            writer = csv.writer(fh)
            writer.writerow(["trial", f"{goal.column}_noisy", "publishing_costs"])
            for t in done:
                writer.writerow([t.number, t.value, EVERY_TRIAL_VIEW])
    _write_best(root / "best.toml", study.best_trial, f"best of {len(done)} trials", private,
                goal)
    if best_by is None:
        return
    for value in sorted({str(t.params[best_by]) for t in done if best_by in t.params}):
        group = [t for t in done if str(t.params.get(best_by)) == value]
        best = max(group, key=lambda t: t.value)  # ties: the earliest trial
        _write_best(root / f"best-{_slug(value)}.toml", best,
                    f"best of the {len(group)} trials with {best_by} = {value} "
                    f"({len(done)} in all)", private, goal)


def _slug(value: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)


def _write_best(path: Path, trial: Any, what: str, private: bool = False,
                goal: Objective = OBJECTIVES["sampled"]) -> None:
    """A trial's resolved run config, headed by what it is the best of; ``private``: with
    its round selected as ``last`` and its score labelled as the noisy one."""
    from dataclasses import replace

    from fedem_private.simulation.config import load_toml

    # the trial's run directory in this study folder (a study moved or restored from a
    # copy keeps its layout), else where the trial recorded it
    run = path.parent / "trials" / f"{trial.number:04d}"
    cfg = load_toml((run if run.is_dir() else Path(trial.user_attrs["run_dir"]))
                    / "config.toml")
    if private:  # the final run: its own randomness (nonce 0, never a trial's) and the
        # last round (choosing one by validation would be one more release)
        cfg = replace(cfg, train=replace(cfg.train, select_round="last", nonce=0))
    score = f"noisy {goal.words}" if private else goal.words
    with _replacing(path) as fh:
        fh.write(f"# {what} by {score} ({trial.value:.6g}); trial "
                 f"{trial.number}, {json.dumps(trial.params)}\n" + to_toml(to_dict(cfg)))


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[TextIO]:
    """A text file written beside ``path`` and moved over it when complete, so a worker
    reading it, or one writing it at the same time, never sees half a file."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with part.open("w", newline="") as fh:
            yield fh
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
