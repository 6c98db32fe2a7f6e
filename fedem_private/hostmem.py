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

The tuning has a second cost, which is why it is applied only where it pays: a
heap that never returns memory and never maps blocks apart can fragment without
bound under a different allocation pattern. The per-client FedEM reference
(:mod:`fedem_private.simulation.reference`) on ML-100K, run in a tuned process,
grew to 23 GB resident until the OOM killer took it, against 1.26 GiB with
glibc's defaults (BENCHMARKS.md, "A fourth reading"). A
:class:`~fedem_private.simulation.loop.Simulation` therefore asks for the tuning
only when one chunk's host table is larger than glibc's largest dynamic mmap
threshold (:data:`MMAP_THRESHOLD_MAX`, 32 MiB on 64-bit): below it, glibc's own
sliding threshold already keeps such blocks on the heap after the first free,
and there is nothing to gain (ML-100K, FilmTrust and ML-1M at d = 16 and 64
clients a chunk: 7-15 MiB; LastFM-2K: 72 MiB).

Once applied the settings are process-wide and stay for the process's life
(every later run in it, and anything else it does, inherits them). Set
``FEDEM_PRIVATE_MALLOC=system`` to leave the allocator as it is. Only glibc
(Linux) has these settings; elsewhere it does nothing.
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

#: glibc's ceiling on its dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX,
#: 4 MiB x sizeof(long)): blocks larger than this are always mapped apart by default
MMAP_THRESHOLD_MAX = 32 * (1 << 20)

_applied: bool | None = None


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc, the one C library tuned here."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def in_force() -> bool:
    """Whether an earlier call applied the tuning in this process."""
    return bool(_applied)


def worth_tuning(block_bytes: int) -> bool:
    """Whether blocks of ``block_bytes`` are ones glibc would map and unmap on every
    allocation by default (larger than :data:`MMAP_THRESHOLD_MAX`)."""
    return block_bytes > MMAP_THRESHOLD_MAX


def keep_freed_memory(block_bytes: int | None = None) -> bool:
    """Make glibc reuse freed blocks of any size (see the module docstring), once per process.

    ``block_bytes``: the largest host block the caller will allocate and free over and over
    (a chunk's table); when given and not above :data:`MMAP_THRESHOLD_MAX`, nothing is
    changed (the tuning would gain nothing and risks fragmentation) and a later call may
    still apply it. None applies it unconditionally.

    Returns whether the settings are in force: False when ``FEDEM_PRIVATE_MALLOC=system``
    at the first call, when the C library is not glibc, when ``mallopt`` refused them, or
    when the blocks are too small to need them and no earlier call applied them.
    """
    global _applied
    if _applied is not None:  # mallopt's settings last for the process: decided once
        return _applied
    if block_bytes is not None and not worth_tuning(block_bytes):
        return False  # not decided: a wider catalogue later in this process may need it
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
