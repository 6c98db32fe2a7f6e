"""Typed, validated run configuration: TOML files plus command-line overrides.

A run is described by one :class:`RunConfig` with sections ``[data]``,
``[data.synthetic]``, ``[train]``, ``[federation]``, ``[privacy]`` and
``[record]`` (what is recorded for the attacks). Every value is checked before
anything runs; a bad value is a :class:`UserError` with one line naming the key.
The resolved config a run writes (``config.toml``) re-creates the run,
recording included.

The configuration is split by job: :mod:`~fedem_private.simulation.sections` (each
section's dataclass and the names it accepts), :mod:`~fedem_private.simulation.presets`
(the ``paper-code`` preset and protocol labels, as data),
:mod:`~fedem_private.simulation.run_config` (:class:`RunConfig`: what spans sections,
resolution and the one check of a run) and :mod:`~fedem_private.simulation.config_io`
(TOML in and out, overrides, identity), each importing only those before it (no import
circles, docs/design.md section 1). This module imports nothing itself: the names of all
four are importable from here.

Importing this module is light (no torch or pandas): the command line checks
its arguments before the heavy libraries load.
"""

from __future__ import annotations

from fedem_private.privacy.config import PrivacyConfig  # noqa: F401  (re-exported)
from fedem_private.simulation.config_io import (  # noqa: F401  (re-exported)
    LATER_FIELDS,
    _build,
    _coerce,
    _toml_value,
    flatten,
    from_dict,
    identity_dict,
    load_toml,
    read_toml,
    to_dict,
    to_toml,
    with_overrides,
)
from fedem_private.simulation.presets import (  # noqa: F401  (re-exported)
    PAPER_CODE_OPTIONS,
    UNBUILT_OPTIONS,
    UNTIMED_DATASETS,
    _option_token,
    _parse_token,
    auto_select_round,
    option_applies,
    paper_code,
    parse_protocol_label,
    protocol_label,
    protocol_options,
)
from fedem_private.simulation.run_config import (  # noqa: F401  (re-exported)
    _CHECKED,
    RunConfig,
    _is_checked,
    with_cohort,
)
from fedem_private.simulation.sections import (  # noqa: F401  (re-exported)
    ADAPTER_OBJECTIVES,
    AGGREGATIONS,
    BACKBONE_METHOD,
    BASELINE_METHODS,
    BASELINES,
    CODECS,
    DEFAULT_RECORD_CLIENTS,
    DP_MOSTPOP_ARCHITECTURES,
    FEDERATED_METHODS,
    MERGES,
    METHOD_BACKBONE,
    METHOD_DEFAULTS,
    METHODS,
    OPTIMIZERS,
    PEFT_PRETRAINS,
    PROTOCOL_PRESETS,
    PROTOCOLS_ALL,
    SELECT_ROUNDS,
    SGD_FIELDS,
    SIMILARITIES,
    TIMED_DATASETS,
    BaselineConfig,
    DataConfig,
    FederationConfig,
    RecordConfig,
    TrainConfig,
    refuse_central,
)


