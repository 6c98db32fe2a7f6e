"""Atomic file writes: a reader sees the old file or the complete new one, never a part.

The bytes go to a temporary file in the destination's own folder (so the final
rename never crosses a file system), are flushed and fsync'ed, and only then
replace the destination with :func:`os.replace`, which is atomic on POSIX and
Windows. If anything fails, or the process is interrupted, before the rename,
the temporary file is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

TMP_SUFFIX = ".tmp"


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(f)`` on a temporary binary file, then atomically move it to ``path``."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=TMP_SUFFIX)
    try:
        # mkstemp makes the file 0600; give it what the user's umask gives any new file
        mask = os.umask(0o022)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dest


def write_npz(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray],
              compress: bool = True) -> Path:
    """Atomically write ``arrays`` as one ``.npz`` archive (no pickled objects)."""
    save = np.savez_compressed if compress else np.savez

    def _write(f: IO[bytes]) -> None:
        save(f, **arrays)

    return atomic_write(path, _write)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write ``obj`` as indented, key-sorted UTF-8 JSON (NaN rejected)."""
    data = (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))
