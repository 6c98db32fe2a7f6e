"""File naming and safe reading shared by the observation and ground-truth stores."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedem_private.errors import UserError

FORMAT_VERSION = 1
_ROUND_FILE = re.compile(r"^round_(\d+)(?:_part_(\d+))?\.npz$")


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view: the dataclasses are frozen, so their arrays are too."""
    v = a.view()
    v.flags.writeable = False
    return v


def round_name(round_: int, part: int | None) -> str:
    """File name of one round (or one part of a round)."""
    if round_ < 0 or (part is not None and part < 0):
        raise ValueError("round and part must be >= 0")
    return f"round_{round_:04d}.npz" if part is None else f"round_{round_:04d}_part_{part:04d}.npz"


def round_files(folder: Path, rounds: Sequence[int] | None) -> dict[int, list[Path]]:
    """Files per round, parts in part order; a round written both whole and in parts is an error."""
    found: dict[int, list[tuple[int, Path]]] = defaultdict(list)
    if not folder.is_dir():
        return {}
    wanted = None if rounds is None else {int(r) for r in rounds}
    for p in folder.iterdir():
        mt = _ROUND_FILE.match(p.name)
        if mt is None:
            continue
        r = int(mt.group(1))
        if wanted is not None and r not in wanted:
            continue
        found[r].append((-1 if mt.group(2) is None else int(mt.group(2)), p))
    out: dict[int, list[Path]] = {}
    for r in sorted(found):
        items = sorted(found[r])
        if len(items) > 1 and items[0][0] == -1:
            raise UserError(f"{folder}: round {r} is stored both whole and in parts")
        out[r] = [p for _, p in items]
    return out


def load_npz(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """All arrays of an .npz (no pickles); a missing key or a bad file is a UserError."""
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise UserError(f"{path}: malformed file, missing {', '.join(missing)}")
            return {k: z[k] for k in z.files}
    except UserError:
        raise
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable ({e})") from e
