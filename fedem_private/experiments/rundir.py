"""Run directories written atomically: all of it appears, or none of it does.

Files go to a hidden temporary sibling first; :meth:`RunDir.commit` renames it
into place. An existing non-empty directory is never touched unless the user
asked to replace it, and then only once the new one is complete.

The temporary sibling is named ``.<name>.tmp-<pid>@<host>-<random>``: an
interrupt (Ctrl-C, SIGTERM) at any instruction removes it, and one left by a
process that was killed outright (SIGKILL, a lost machine) is recognised by
its dead ``pid`` and removed by :func:`remove_stale` (a resumed sweep, the next
run of the same directory).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

from fedem_private.errors import ResultsElsewhere, UserError

# what summary.json says of its own figures (issue 65): the privacy block describes the
# release; everything else is the simulator's measurement of the private data
NOT_PRIVATE = (
    "not private: every figure in this summary but the privacy block (metrics, selected, "
    "clipping, cold_items, merge_rho_mean, server_stats, dropped_users, communication, "
    "references) is the "
    "simulator's exact measurement over the users' data, not a release of the mechanism; "
    "the eps covers the released models, not publishing these")


def json_safe(value: Any) -> Any:
    """Replace inf/NaN floats (not valid JSON) by strings "inf", "-inf", "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_text_atomic(path: Path, text: str) -> None:
    """Write a file via a temporary sibling and a rename (permissions as the umask says).

    The sibling's name is chosen before it is made, so an interrupt at any point removes it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:  # 0666 minus the umask
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# .<name>.tmp-<pid>@<host>-<random> (a run in progress), .<name>.old-<pid> (one replaced);
# older versions wrote .<name>.tmp-<random>, with no pid
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?:tmp-(?:(?P<pid>\d+)@(?P<host>.+)-)?[0-9a-z_]+"
                        r"|old-(?P<old_pid>\d+))$")


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def _alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this machine (or may: not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: someone else's process
        return True
    return True


def is_stale(path: Path) -> bool:
    """True for a temporary (or replaced) run directory whose writer is gone: its pid is not
    alive on this machine, or it was named by an older version without a pid. One written on
    another machine (a Ray cluster) is never stale here."""
    match = _TEMP_NAME.match(path.name)
    if match is None or not path.is_dir():
        return False
    pid = match["pid"] or match["old_pid"]
    if pid is None:
        return True
    if match["host"] is not None and match["host"] != _host():
        return False
    return not _alive(int(pid))


def remove_stale(root: Path, name: str | None = None) -> list[Path]:
    """Remove the stale temporary run directories (:func:`is_stale`) under ``root`` (only its
    direct children named for ``name``, when given); returns what was removed."""
    if not root.is_dir():
        return []
    found = (root.glob(f".{glob_escape(name)}.*") if name is not None
             else (p for p in root.rglob(".*") if p.is_dir()))
    removed = [p for p in found if is_stale(p)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def glob_escape(text: str) -> str:
    """``text`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def _remove_finishing(path: Path, tries: int = 3) -> None:
    """``shutil.rmtree(path)``, finished even when an interrupt (a second Ctrl-C, a
    SIGTERM) lands part way: the removal is retried, then the interrupt re-raised."""
    interrupted: BaseException | None = None
    for _ in range(tries):
        try:
            shutil.rmtree(path, ignore_errors=True)
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


class RunDir:
    """A run directory under construction; use as a context manager.

    The temporary directory is made in ``__enter__``, so that no interrupt can land
    between its creation and the ``with`` that removes it.
    """

    def __init__(self, out: str | Path, force: bool = False) -> None:
        self.final = Path(out).expanduser()
        if self.final.exists() and not self.final.is_dir():
            raise UserError(f"output path exists and is not a directory: {self.final}")
        # what a run killed outright left of its progress (LIVE_FILES): nothing finished
        self.stale_live = left_live(self.final)
        if self.final.is_dir() and any(self.final.iterdir()) and not force \
                and not self.stale_live:
            raise UserError(f"output directory {self.final} already exists and is not empty; "
                            f"pass --force to replace it")
        # what stood there when the run began: only that may be replaced (with force); a
        # run that finished into the same folder meanwhile is never overwritten
        self.replaces = (self.final.is_dir() and any(self.final.iterdir())
                         and not self.stale_live)
        self.parent = self.final.parent
        try:
            self.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create output directory {self.parent}: "
                            f"{exc.strerror}") from None
        self.path = self.parent / (f".{self.final.name}.tmp-{os.getpid()}@{_host()}-"
                                   f"{secrets.token_hex(4)}")
        self.committed = False
        self.live: Path | None = None  # where write_live wrote (the final folder or path)
        self.made_final = False  # write_live made the final folder

    def __enter__(self) -> RunDir:
        remove_stale(self.parent, self.final.name)
        if self.stale_live:
            _remove_live(self.final)
        try:
            os.mkdir(self.path)  # 0777 minus the umask
        except FileExistsError:  # pragma: no cover - 32 random bits
            raise UserError(f"temporary directory {self.path} already exists") from None
        except OSError as exc:
            raise UserError(f"cannot write in {self.parent}: {exc.strerror}") from None
        except BaseException:  # an interrupt right after the folder was made
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.committed:
            self._drop_live()
            _remove_finishing(self.path)

    def write_live(self, progress: dict[str, Any],
                   rows: list[dict[str, Any]] | None = None) -> Path:
        """The run's progress while it goes on: ``progress.json`` (``progress`` plus this
        writer's pid and host) and, when ``rows`` are given, ``metrics.csv`` so far, each
        replaced atomically. They go into the final folder itself when it held nothing at
        the start (made if need be), else (``--force`` over a finished run, which stays whole
        until the new one is complete) into the temporary folder. :meth:`commit` replaces
        them by the finished run; an interrupted run removes them (:meth:`__exit__`), and one
        killed outright leaves them for the next run into the folder to remove
        (:func:`left_live`). Returns the folder written."""
        folder = self.path if self.replaces else self.final
        if folder == self.final and not folder.exists():
            try:
                folder.mkdir()
                self.made_final = True
            except FileExistsError:  # another run made it meanwhile: write beside ours
                folder = self.path
        self.live = folder
        record = {**progress, "pid": os.getpid(), "host": _host(), "note": LIVE_NOTE}
        if rows is not None:
            write_text_atomic(folder / "metrics.csv", csv_text(rows))
        write_text_atomic(folder / "progress.json", json.dumps(json_safe(record), indent=2)
                          + "\n")
        return folder

    def _drop_live(self) -> None:
        """Remove what :meth:`write_live` wrote into the final folder (and the folder, when it
        made it and nothing else is there)."""
        if self.live is None or self.live == self.path:
            return
        _remove_live(self.live)
        if self.made_final:
            with contextlib.suppress(OSError):
                self.live.rmdir()
        self.live = None

    def write_json(self, name: str, obj: Any) -> None:
        (self.path / name).write_text(json.dumps(json_safe(obj), indent=2) + "\n")

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def write_csv(self, name: str, rows: list[dict[str, Any]]) -> None:
        (self.path / name).write_text(csv_text(rows), newline="")

    def commit(self) -> Path:
        """Move the finished directory into place (replacing an old one last); an interrupt
        part way puts the old one back."""
        (self.path / "progress.json").unlink(missing_ok=True)  # a live record, not a result
        if not self.replaces:
            if self.live == self.final:  # the final folder held only this run's progress
                _remove_live(self.final)
            return self._commit_new()
        old = None
        try:
            if self.final.exists():
                old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
                os.replace(self.final, old)
            os.replace(self.path, self.final)
            self.committed = True
        except BaseException:
            self.committed = not self.path.exists()
            if old is not None and not self.committed and not self.final.exists():
                os.replace(old, self.final)
            raise
        finally:
            if old is not None and self.committed:
                shutil.rmtree(old, ignore_errors=True)
        return self.final

    def commit_or_moved(self) -> ResultsElsewhere | None:
        """:meth:`commit`; where another run had taken the folder meanwhile, the
        :class:`~fedem_private.errors.ResultsElsewhere` naming where this run's results went,
        for the caller to raise once it has wound the run up (else None)."""
        try:
            self.commit()
        except ResultsElsewhere as exc:
            return exc
        return None

    def _commit_new(self) -> Path:
        """Move the finished directory to a path that held nothing when the run began, by
        one atomic rename: if another run finished into it meanwhile (two runs started
        together with one ``--out``), this run's results go to the first free ``-2``,
        ``-3``, ... beside it (issue 67), and :class:`~fedem_private.errors.ResultsElsewhere`
        says where: the run is finished and kept, only not where it was asked to go."""
        target = self.final
        for n in range(2, 1000):
            try:
                os.rename(self.path, target)
                self.committed = True
                break
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                target = self.final.with_name(f"{self.final.name}-{n}")
        else:  # pragma: no cover - a thousand runs into one folder at once
            raise UserError(f"output directory {self.final} and its -2 to -999 are taken")
        if target != self.final:
            raise ResultsElsewhere(f"another run finished into {self.final} while this one "
                                   f"ran; this run's results are in {target}", target)
        return target


# what a run writes into its folder while it goes on (RunDir.write_live), and what the
# progress record says of itself
LIVE_FILES = ("metrics.csv", "progress.json")
LIVE_NOTE = ("a run in progress: metrics.csv holds its evaluated rounds so far; the finished "
             "run directory replaces both files")


def csv_text(rows: list[dict[str, Any]]) -> str:
    """``rows`` as CSV text, the columns in order of first appearance."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def _remove_live(folder: Path) -> None:
    for name in LIVE_FILES:
        (folder / name).unlink(missing_ok=True)


def left_live(folder: Path) -> bool:
    """True when ``folder`` holds only the progress of a run that is gone (:data:`LIVE_FILES`,
    its ``progress.json`` naming a process not alive on this machine): nothing finished, so a
    new run may take the folder. A folder another live run is writing into is a UserError."""
    progress = folder / "progress.json"
    if not folder.is_dir() or not progress.is_file():
        return False
    if any(p.name not in LIVE_FILES for p in folder.iterdir()):
        return False
    try:
        record = json.loads(progress.read_text(encoding="utf-8"))
        pid, host = int(record["pid"]), str(record["host"])
    except (ValueError, KeyError, TypeError, OSError):
        return False
    if host != _host():
        raise UserError(f"output directory {folder} holds the progress of a run on {host} "
                        f"(pid {pid}) that may still be going; choose another --out, or "
                        f"remove the folder if that run is gone")
    if _alive(pid):
        raise UserError(f"output directory {folder} is being written by a run in progress "
                        f"(pid {pid}); wait for it or choose another --out")
    return True


def _read_whole(path: Path, what: str) -> Any:
    """``path`` parsed as JSON (``what``: json) or TOML (toml), or one line on what is wrong."""
    import tomllib

    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if what == "json" else tomllib.loads(text)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; not a complete run directory") from None
    except (ValueError, OSError) as e:  # JSONDecodeError, TOMLDecodeError, UnicodeError
        raise UserError(f"{path}: unreadable, truncated or not {what.upper()} "
                        f"({' '.join(str(e).split())})") from None


def check_recorded(path: Path, rounds: list[int] | None = None) -> None:
    """The files ``fedem-private attack`` reads from the run directory ``path``, checked
    before any work (importing the attacks alone takes seconds): ``summary.json`` and
    ``config.toml`` parse (and ``privacy_ledger.json`` where there is one); where the run
    recorded rounds, ``observations/public.json`` parses and the recorded rounds (of
    ``rounds``, when given) are there, each ``.npz`` a whole archive. A run without
    ``observations/`` is left to the attacks (a mechanism audit needs none). One line on
    the first thing wrong, as a :class:`UserError`."""
    import zipfile

    for name, what in (("summary.json", "json"), ("config.toml", "toml"),
                       ("privacy_ledger.json", "json")):
        if name == "privacy_ledger.json" and not (path / name).exists():
            continue
        data = _read_whole(path / name, what)
        if not isinstance(data, dict):
            raise UserError(f"{path / name}: not a JSON object; not a run directory's")
    obs = path / "observations"
    if not obs.is_dir():
        return
    if not isinstance(_read_whole(obs / "public.json", "json"), dict):
        raise UserError(f"{obs / 'public.json'}: not a JSON object")
    pattern = re.compile(r"round_(\d+)(?:_part_\d+)?\.npz")
    recorded = {int(m.group(1)) for p in obs.iterdir() if (m := pattern.fullmatch(p.name))}
    wanted = recorded if rounds is None else recorded & set(rounds)
    if not wanted:
        asked = "" if rounds is None else f" of rounds {', '.join(map(str, rounds))}"
        have = f" (recorded: {', '.join(map(str, sorted(recorded)))})" if recorded else ""
        raise UserError(f"{obs}: no recorded observations{asked}{have}; run with "
                        f"--record-rounds")
    for folder in (obs, path / "ground_truth"):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            m = pattern.fullmatch(p.name)
            if m is None or int(m.group(1)) not in wanted:
                continue
            try:
                with zipfile.ZipFile(p) as z:  # the central directory only: cheap
                    z.namelist()
            except (zipfile.BadZipFile, OSError) as e:
                raise UserError(f"{p}: truncated or not an .npz archive ({e})") from None
