"""fedem-private: simulate private federated recommendation and measure it honestly.

The Python API (:mod:`fedem_private.api`), loaded on first use so that
``import fedem_private`` stays light::

    import fedem_private as fp
    res = fp.run({"train": {"rounds": 5}})    # -> Result: metrics DataFrame, summary, ledger
    fp.sweep("my-sweep.toml", out="runs/s")   # -> results DataFrame
    fp.attack("runs/recorded")                # -> attacks report (attacks.json)
    fp.load_results("runs/s")                 # -> DataFrame, one row per run
"""

import sys
import types

__version__ = "0.1.0"

API = ("run", "sweep", "attack", "load_results", "load_run", "Result")


def __getattr__(name: str):
    if name in API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps ``fedem_private.sweep`` the API function once the submodule of that name loads
    (importing a submodule sets it as a package attribute); the module stays reachable as
    ``sys.modules["fedem_private.sweep"]`` and by ``from fedem_private.sweep import ...``."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
