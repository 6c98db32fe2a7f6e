"""Host memory: keep freed blocks for reuse instead of faulting fresh pages in (issue 19).

A round allocates and frees many large CPU tensors: per chunk of clients its
sent, merged, trained and uploaded tables, each (k, m, d) float32. glibc's
malloc serves any block above its mmap threshold (at most 32 MiB) with a
fresh ``mmap`` and gives it back with ``munmap`` on free, so every such
tensor is faulted in again, page by page, zeroed by the kernel. With
LastFM-2K's catalogue (17,632 items, d = 16) one chunk's table is 72 MiB and
a FedEM round spent about a fifth of its CPU time in the kernel doing this
(BENCHMARKS.md, "The host allocator"); ML-100K's 7 MiB tables stay under the threshold
and are not affected.

:func:`keep_freed_memory` asks glibc to serve every block from its heap
(``M_MMAP_MAX`` 0) and never to trim the heap's top (``M_TRIM_THRESHOLD``
at its maximum), so freed tables' pages serve the next ones. The reuse is
not immediate: a small allocation can split a freed block, so the heap grows
for a few cycles before it settles (tests/test_hostmem.py). The cost is
memory: the heap keeps its peak, and that growth raises the peak
(LastFM-2K FedEM: 6.64 -> 8.52 GiB resident). Nothing computed changes:
the allocator decides where tensors live, not what they hold.

It is process-wide and applied once, when a :class:`~fedem_private.simulation.loop.Simulation`
is built. Set ``FEDEM_PRIVATE_MALLOC=system`` to leave the allocator as it is.
Only glibc (Linux) has these settings; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

#: the environment variable that turns the tuning off (``system``)
ENV = "FEDEM_PRIVATE_MALLOC"

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_NEVER = 2**31 - 1  # the largest int mallopt takes

_applied: bool | None = None


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc, the one C library tuned here."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Make glibc reuse freed blocks of any size (see the module docstring), once per process.

    Returns whether the settings are in force: False when ``FEDEM_PRIVATE_MALLOC=system``
    at the first call, when the C library is not glibc, or when ``mallopt`` refused them.
    """
    global _applied
    if _applied is not None:  # mallopt's settings last for the process: decided once
        return _applied
    _applied = False
    if os.environ.get(ENV, "").strip().lower() == "system":
        return False
    if not is_glibc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; trim first, so that a refused mmap setting leaves the
    # process with at most a heap that does not shrink
    _applied = (mallopt(_M_TRIM_THRESHOLD, _TRIM_NEVER) == 1
                and mallopt(_M_MMAP_MAX, 0) == 1)
    return _applied
