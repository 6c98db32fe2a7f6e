"""fedem-private: simulate private federated recommendation and measure it honestly.

The Python API (:mod:`fedem_private.api`), loaded on first use so that
``import fedem_private`` stays light::

    import fedem_private as fp
    res = fp.run({"train": {"rounds": 5}})    # -> Result: metrics DataFrame, summary, ledger
    fp.sweep("my-sweep.toml", out="runs/s")   # -> results DataFrame
    fp.attack("runs/recorded")                # -> attacks report (attacks.json)
    fp.load_results("runs/s")                 # -> DataFrame, one row per run
"""

from fedem_private._version import __version__

API = ("run", "sweep", "attack", "load_results", "load_run", "resolve_config", "Result",
       "RunWarning")
__all__ = ["__version__", *API]


def __dir__() -> list[str]:
    """The public API too (it is loaded on first use), for ``dir()`` and completion."""
    return sorted({*globals(), *API})


def __getattr__(name: str):
    if name in API:
        from fedem_private import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
