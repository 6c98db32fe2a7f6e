"""Host memory: keep freed blocks for reuse while a round runs (issue 19).

A round allocates and frees many large CPU tensors: per chunk of clients its
sent, merged, trained and uploaded tables, each (k, m, d) float32, and under a
similarity aggregation the (n, m d) personalised tables. glibc's malloc serves
any block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
gives it back with ``munmap`` on free, so every such tensor is faulted in
again, page by page, zeroed by the kernel. With LastFM-2K's catalogue (17,632
items, d = 16) one chunk's table is 72 MiB and a FedEM round spent about a
fifth of its CPU time in the kernel doing this (BENCHMARKS.md, "The host
allocator"); on ML-100K the personalised tables (943 x 1,682 x 16 float32,
101 MiB) cost a FedEM round about a tenth.

:func:`keep_freed_memory` is a context manager: inside it, glibc serves every
block from its heap (``M_MMAP_MAX`` 0) and never trims the heap's top
(``M_TRIM_THRESHOLD`` at its maximum), so a freed table's pages serve the next
one; on leaving, mapping large blocks apart and trimming are restored
(``M_MMAP_MAX`` and ``M_TRIM_THRESHOLD`` at glibc's defaults, 65,536 and
128 KiB). Nothing computed changes: the allocator decides where tensors live,
not what they hold.

Why only while a round runs: a heap that never maps blocks apart and never
shrinks can fragment without bound under other allocation patterns. The
per-client FedEM reference (:mod:`fedem_private.reference.round`) on
ML-100K, run in a process tuned for good, grew to 23 GB resident until the OOM
killer took it, against 1.26 GiB with glibc's defaults (BENCHMARKS.md, "A
fourth reading"). A :class:`~fedem_private.simulation.loop.Simulation` wraps
each round in the context, so whatever the process does between rounds (a
reference round, an attack, a user's own analysis) runs with mapping and
trimming on. Restoring fixes glibc's mmap threshold where it stood (an
explicit setting ends its sliding). The heap a round grew stays with the
process (glibc returns only a free top), and later blocks reuse it; blocks it
cannot hold are mapped apart again instead of growing it, so the peak stays
where glibc's defaults put it (LastFM-2K FedEM: 6.66 GiB, against 6.65 with
the defaults and 8.53 with the tuning in force for good; BENCHMARKS.md).

Between runs, :func:`release_between_runs` hands a finished run's memory back. A
finished :class:`~fedem_private.simulation.loop.Simulation` sits in reference cycles
(its privacy layer and its view hold it), so its tables outlive the run until the
cyclic collector's next full pass, which counts Python objects, not bytes, and may not
come for many runs: a process running four LastFM-2K `cdp-gaussian` PFedRec trials one
after another held 1.7, 2.8, 3.8 and 4.8 GB after them, and a `fedem-private tune`
worker was killed by the kernel at 16 GB. With a collection and ``malloc_trim`` after
each run, it held 386 MiB after every one (docs/speed.md, "Memory between runs").

The context nests (only the outermost one changes settings). Set
``FEDEM_PRIVATE_MALLOC=system`` to leave the allocator alone. Only glibc
(Linux) has these settings; elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import platform
from collections.abc import Iterator
from typing import Any

#: the environment variable that turns the tuning off (``system``)
ENV = "FEDEM_PRIVATE_MALLOC"

# glibc's mallopt parameters (malloc.h) and the values set inside / restored outside
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_NEVER = 2**31 - 1  # the largest int mallopt takes
_DEFAULT_TRIM = 128 * 1024  # DEFAULT_TRIM_THRESHOLD
_DEFAULT_MMAP_MAX = 65536  # DEFAULT_MMAP_MAX

_mallopt: Any = None  # the C function, once found; False: not available here
_malloc_trim: Any = None  # likewise
_depth = 0  # how many contexts are open
_active = False  # whether the outermost open context changed the settings


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc, the one C library tuned here."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def enabled() -> bool:
    """Whether the tuning may be applied: glibc, and not ``FEDEM_PRIVATE_MALLOC=system``."""
    return os.environ.get(ENV, "").strip().lower() != "system" and is_glibc()


def _c_function(name: str, argtypes: list[Any]) -> Any:
    """The C library's function ``name`` returning int, or False where there is none."""
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return False
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


def _find_mallopt() -> Any:
    global _mallopt
    if _mallopt is None:
        _mallopt = _c_function("mallopt", [ctypes.c_int, ctypes.c_int])
    return _mallopt


def _find_malloc_trim() -> Any:
    global _malloc_trim
    if _malloc_trim is None:
        _malloc_trim = _c_function("malloc_trim", [ctypes.c_size_t])
    return _malloc_trim


def in_force() -> bool:
    """Whether the tuning is in force now (inside an open context that applied it)."""
    return _active


@contextlib.contextmanager
def keep_freed_memory() -> Iterator[bool]:
    """Make glibc reuse freed blocks of any size inside the block (module docstring).

    Yields whether the settings are in force: False when ``FEDEM_PRIVATE_MALLOC=system``,
    when the C library is not glibc, or when ``mallopt`` refused them. The environment
    variable is read at each outermost entry.
    """
    global _depth, _active
    _depth += 1
    try:
        if _depth == 1 and enabled():
            mallopt = _find_mallopt()
            # mallopt returns 1 on success; trim first, so that a refused mmap setting
            # leaves at most a heap that does not shrink (restored on leaving either way)
            _active = bool(mallopt) and (mallopt(_M_TRIM_THRESHOLD, _TRIM_NEVER) == 1
                                         and mallopt(_M_MMAP_MAX, 0) == 1)
            if mallopt and not _active:
                _restore(mallopt)
        yield _active
    finally:
        _depth -= 1
        if _depth == 0 and _active:
            _active = False
            _restore(_find_mallopt())


def release_between_runs() -> int:
    """Free what finished runs left in reference cycles, and return free heap pages.

    Runs the cyclic garbage collector (all generations), then, on glibc with the
    tuning enabled, ``malloc_trim(0)`` so that the freed tables' pages go back to the
    system instead of staying resident in the heap's middle. Call it between runs, not
    inside a round (inside one the freed blocks are meant to be reused: module
    docstring). Returns the number of unreachable objects the collector found.
    """
    found = gc.collect()
    if enabled() and (trim := _find_malloc_trim()):
        trim(0)
    return found


def _restore(mallopt: Any) -> None:
    mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)


def available_bytes() -> int | None:
    """Memory the kernel says a new allocation can still get without swapping
    (``MemAvailable`` of /proc/meminfo), or None where that is not known (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gib(nbytes: float) -> str:
    """A byte count as GiB with one decimal (``108.0 GiB``)."""
    return f"{nbytes / 2**30:.1f} GiB"
