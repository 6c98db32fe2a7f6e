"""Privacy layer (docs/design.md section 5): clipping, mechanisms, accounting, calibration, ledger.

Modules: ``config`` (PrivacyConfig), ``registry`` (mode name -> mechanism
class), ``mech`` (one module per mechanism: self-description, capabilities,
options and hooks), ``clipping`` (float64 per-client L1/L2 clipping),
``params`` (config -> per-round parameters), ``mechanisms`` (the noise
primitives and one release function per local mode), ``types`` (the records and
protocols the mechanisms' hooks share), ``bounds`` (the composition bounds' math),
``accountants`` (one class per bound behind one interface), ``accounting`` (asks the
accountants: every bound of a history),
``calibration`` (total budget -> per-round noise, one generic routine), ``ledger`` (per-client
rounds and eps spent), ``central`` (cdp-gaussian: Poisson sampling, clipped
sum, one noise draw on the aggregate).

Names below are imported lazily, so ``import fedem_private.privacy.config``
does not pull in dp-accounting (slow to import); opacus is only imported by
``accounting.opacus_rdp_epsilon``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PrivacyConfig": "config",
    "Mechanism": "mech.base",
    "mechanism_for": "registry",
    "register": "registry",
    "ClipStats": "clipping",
    "clip_l1": "clipping",
    "clip_l2": "clipping",
    "MechanismParams": "params",
    "resolve_params": "params",
    "paper_heuristic_epsilon": "params",
    "RoundPrivacyStats": "mechanisms",
    "release": "mechanisms",
    "RoundMechanism": "accounting",
    "EpsilonBounds": "accounting",
    "compose": "accounting",
    "epsilon_bounds": "accounting",
    "Accountant": "accountants",
    "accountant_class": "accountants",
    "calibrate": "calibration",
    "noise_multiplier_for": "calibration",
    "laplace_epsilon_round": "calibration",
    "gaussian_noise_multiplier": "calibration",
    "PrivacyLedger": "ledger",
    "PrivacyLayer": "layer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
