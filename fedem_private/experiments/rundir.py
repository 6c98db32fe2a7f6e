"""Run directories written atomically: all of it appears, or none of it does.

Files go to a hidden temporary sibling first; :meth:`RunDir.commit` renames it
into place. An existing non-empty directory is never touched unless the user
asked to replace it, and then only once the new one is complete.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from fedem_private.errors import UserError


def json_safe(value: Any) -> Any:
    """Replace inf/NaN floats (not valid JSON) by strings "inf", "-inf", "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def current_umask() -> int:
    """The process umask (read by setting it and putting it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(path: str | Path, directory: bool = False) -> None:
    """Give ``path`` the permissions a plain ``open`` / ``mkdir`` would have.

    :func:`tempfile.mkstemp` creates 0600 files and :func:`tempfile.mkdtemp`
    0700 folders whatever the umask; an output renamed into place from one of
    them would keep that. This sets 0666 (files) or 0777 (folders) minus the umask.
    """
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def write_text_atomic(path: Path, text: str) -> None:
    """Write a file via a temporary sibling and a rename (permissions as the umask says)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        umask_mode(tmp)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunDir:
    """A run directory under construction; use as a context manager."""

    def __init__(self, out: str | Path, force: bool = False) -> None:
        self.final = Path(out).expanduser()
        if self.final.exists() and not self.final.is_dir():
            raise UserError(f"output path exists and is not a directory: {self.final}")
        if self.final.is_dir() and any(self.final.iterdir()) and not force:
            raise UserError(f"output directory {self.final} already exists and is not empty; "
                            f"pass --force to replace it")
        parent = self.final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create output directory {parent}: {exc.strerror}") from None
        self.path = Path(tempfile.mkdtemp(dir=parent, prefix=f".{self.final.name}.tmp-"))
        umask_mode(self.path, directory=True)
        self.committed = False

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)

    def write_json(self, name: str, obj: Any) -> None:
        (self.path / name).write_text(json.dumps(json_safe(obj), indent=2) + "\n")

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def write_csv(self, name: str, rows: list[dict[str, Any]]) -> None:
        columns: list[str] = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        with (self.path / name).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow(row)

    def commit(self) -> Path:
        """Move the finished directory into place (replacing an old one last)."""
        old = None
        if self.final.exists():
            old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
        os.replace(self.path, self.final)
        self.committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final
