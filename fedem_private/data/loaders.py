"""Readers for the supported dataset formats (docs/design.md section 2).

Each reader takes the directory a user names and returns :class:`Interactions`.
Bad input (missing directory or file, malformed or empty file) raises
:class:`UserError` with one line naming the problem.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UserError
from .interactions import Interactions, from_raw

if TYPE_CHECKING:
    import pandas as pd


def _nested_hint(directory: Path, filename: str) -> str:
    """``; pass --data-dir SUB`` when a folder right under ``directory`` holds ``filename``
    (an archive's own top folder, e.g. ml-10m.zip's ``ml-10M100K/``), else ``""``."""
    try:
        subs = sorted(d for d in directory.iterdir() if d.is_dir() and (d / filename).is_file())
    except OSError:
        return ""
    return f"; it is in {subs[0]}: pass --data-dir {subs[0]}" if subs else ""


def _require_file(directory: Path, filename: str, dataset: str) -> Path:
    if not directory.exists():
        raise UserError(f"dataset {dataset}: directory not found: {directory}")
    if not directory.is_dir():
        raise UserError(f"dataset {dataset}: not a directory: {directory}")
    path = directory / filename
    if not path.is_file():
        raise UserError(f"dataset {dataset}: file not found: {path}"
                        f"{_nested_hint(directory, filename)}")
    if path.stat().st_size == 0:
        raise UserError(f"dataset {dataset}: file is empty: {path}")
    return path


def _has_bom(path: Path) -> bool:
    """Whether the file starts with UTF-8's byte-order mark (then it is UTF-8)."""
    with path.open("rb") as fh:
        return fh.read(3) == b"\xef\xbb\xbf"


def _read_table(path: Path, dataset: str, sep: str, names: list[str], numeric: list[str],
                header: int | None = None, usecols: list[int] | None = None,
                min_cols: int | None = None) -> pd.DataFrame:
    """Read a delimited file; every row must have the expected numeric columns."""
    import pandas as pd  # here, not at import: config validation must stay light

    try:
        engine = "c" if len(sep) == 1 else "python"
        df = pd.read_csv(path, sep=sep, header=header, names=None, engine=engine,
                         dtype=str, keep_default_na=False, skip_blank_lines=True,
                         encoding="utf-8-sig" if _has_bom(path) else "latin-1",
                         quoting=csv.QUOTE_NONE)
    except pd.errors.EmptyDataError as exc:
        raise UserError(f"dataset {dataset}: file is empty: {path}") from exc
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"dataset {dataset}: malformed file {path}: {first}") from exc
    need = min_cols if min_cols is not None else len(names)
    if df.shape[0] == 0:
        raise UserError(f"dataset {dataset}: file has no rows: {path}")
    if df.shape[1] < need:
        raise UserError(f"dataset {dataset}: malformed file {path}: expected {need} columns "
                        f"({', '.join(names[:need])}), found {df.shape[1]}")
    cols = usecols if usecols is not None else list(range(min(len(names), df.shape[1])))
    df = df.iloc[:, cols].copy()
    df.columns = names[: len(cols)]
    for col in numeric:
        if col not in df.columns:
            continue
        values = pd.to_numeric(df[col].str.strip(), errors="coerce")
        bad = values.isna() & df[col].notna()
        if bad.any() or df[col].isna().any():
            row = int(np.flatnonzero(bad.to_numpy() | df[col].isna().to_numpy())[0])
            line = row + 1 + (0 if header is None else header + 1)
            raise UserError(f"dataset {dataset}: malformed file {path}: line {line}: "
                            f"{col} is not a number: {df[col].iloc[row]!r}")
        if col == "rating" and not np.isfinite(values.to_numpy(np.float64)).all():
            row = int(np.flatnonzero(~np.isfinite(values.to_numpy(np.float64)))[0])
            line = row + 1 + (0 if header is None else header + 1)
            raise UserError(f"dataset {dataset}: malformed file {path}: line {line}: "
                            f"rating is not a finite number: {df[col].iloc[row]!r}")
        df[col] = values
    return df


def _positives(df: pd.DataFrame, min_rating: float | None, dataset: str, path: Path
               ) -> pd.DataFrame:
    """The implicit positives: every row, or (``min_rating``) the rows rated at least that."""
    if min_rating is None:
        return df
    if "rating" not in df.columns:
        raise UserError(f"dataset {dataset}: --min-rating needs a rating column; {path} has "
                        "only user,item")
    kept = df[df["rating"] >= min_rating]
    if kept.empty:
        raise UserError(f"dataset {dataset}: no rating >= {min_rating:g} in {path} "
                        f"(ratings range {df['rating'].min():g} to {df['rating'].max():g})")
    return kept


def load_ml100k(directory: Path, min_rating: float | None = None) -> Interactions:
    """MovieLens 100K: ``u.data`` (tab: user item rating timestamp), ``u.user`` (demographics),
    ``u.item`` (the public item catalogue, when present beside ``u.data``).

    The catalogue is the item ids of ``u.item`` (1,682 items), public metadata fixed before
    any user's rating is read, not the items ``u.data`` happens to name: removing a user
    then never removes an item (docs/design.md section 5, "public catalogue"). Without
    ``u.item`` the catalogue is the items ``u.data`` names, as for the other datasets.
    """
    path = _require_file(directory, "u.data", "ml-100k")
    df = _read_table(path, "ml-100k", "\t", ["user", "item", "rating", "timestamp"],
                     ["user", "item", "rating", "timestamp"])
    df = _positives(df, min_rating, "ml-100k", path)
    demo = _read_gender(directory / "u.user", "ml-100k", "|", gender_col=2)
    catalogue = _read_catalogue(directory / "u.item", "ml-100k", "|")
    return from_raw("ml-100k", df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64),
                    df["timestamp"].to_numpy(np.float64), demo, catalogue)


def _read_catalogue(path: Path, dataset: str, sep: str) -> np.ndarray | None:
    """The integer item ids in the first ``sep``-separated field of each line of ``path``
    (a public item metadata file); None when the file is absent."""
    if not path.is_file():
        return None
    ids = []
    for number, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
        if not line.strip():
            continue
        field = line.split(sep, 1)[0].strip()
        try:
            ids.append(int(field))
        except ValueError:
            raise UserError(f"dataset {dataset}: malformed file {path}: line {number}: the "
                            f"item id is not an integer: {field!r}") from None
    if not ids:
        raise UserError(f"dataset {dataset}: file has no rows: {path}")
    return np.array(ids, dtype=np.int64)


def load_ml1m(directory: Path, min_rating: float | None = None) -> Interactions:
    """MovieLens 1M: ``ratings.dat`` (UserID::MovieID::Rating::Timestamp), ``users.dat``."""
    path = _require_file(directory, "ratings.dat", "ml-1m")
    df = _read_ratings(path, "ml-1m", "::")
    df = _positives(df, min_rating, "ml-1m", path)
    demo = _read_gender(directory / "users.dat", "ml-1m", "::", gender_col=1)
    return from_raw("ml-1m", df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64),
                    df["timestamp"].to_numpy(np.float64), demo)


def load_ml10m(directory: Path, min_rating: float | None = None) -> Interactions:
    """MovieLens 10M (the folder ``ml-10M100K/`` of ``ml-10m.zip``): ``ratings.dat``
    (UserID::MovieID::Rating::Timestamp, half-star ratings 0.5 to 5). No demographics."""
    return _load_movielens(directory, "ml-10m", "ratings.dat", "::", min_rating)


def load_ml20m(directory: Path, min_rating: float | None = None) -> Interactions:
    """MovieLens 20M (the folder ``ml-20m/``): ``ratings.csv`` with the header
    ``userId,movieId,rating,timestamp`` (half-star ratings 0.5 to 5). No demographics."""
    return _load_movielens(directory, "ml-20m", "ratings.csv", ",", min_rating)


def load_ml25m(directory: Path, min_rating: float | None = None) -> Interactions:
    """MovieLens 25M (the folder ``ml-25m/``): ``ratings.csv`` with the header
    ``userId,movieId,rating,timestamp`` (half-star ratings 0.5 to 5). No demographics."""
    return _load_movielens(directory, "ml-25m", "ratings.csv", ",", min_rating)


def _load_movielens(directory: Path, dataset: str, filename: str, sep: str,
                    min_rating: float | None) -> Interactions:
    """A MovieLens ratings file without user demographics, ratings and timestamps kept."""
    path = _require_file(directory, filename, dataset)
    df = _read_ratings(path, dataset, sep, header=_MOVIELENS_HEADER if sep == "," else None)
    df = _positives(df, min_rating, dataset, path)
    return from_raw(dataset, df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64),
                    df["timestamp"].to_numpy(np.float64))


_RATING_COLUMNS = ["user", "item", "rating", "timestamp"]
# the first line of ML-20M's and ML-25M's ratings.csv
_MOVIELENS_HEADER = "userId,movieId,rating,timestamp"


def _read_ratings(path: Path, dataset: str, sep: str, header: str | None = None
                  ) -> pd.DataFrame:
    """A MovieLens ratings file as typed columns user, item (int64), rating, timestamp.

    ``sep`` is ``"::"`` (ML-1M, ML-10M: no header) or ``","`` with ``header`` the line the
    file must start with (ML-20M, ML-25M). Millions of rows are read by pandas' C parser
    straight into typed columns; a file it cannot read so (a field that is not an integer id,
    a missing or extra field, a rating that is not a finite number) is read again by
    :func:`_read_table`, which accepts what it can and otherwise names the line.
    """
    if header is not None:
        _check_header(path, dataset, header)
    df = _read_ratings_fast(path, sep, header is not None)
    if df is None:
        return _read_table(path, dataset, sep, _RATING_COLUMNS, _RATING_COLUMNS,
                           header=None if header is None else 0)
    if df.shape[0] == 0:
        raise UserError(f"dataset {dataset}: file has no rows: {path}")
    return df


def _read_ratings_fast(path: Path, sep: str, has_header: bool) -> pd.DataFrame | None:
    """The C parser's typed read of a ratings file (see :func:`_read_ratings`); None when the
    file is not regular enough for it."""
    import pandas as pd

    common = {"engine": "c", "quoting": csv.QUOTE_NONE, "encoding": "latin-1"}
    try:
        if sep == "::":
            # "u::i::r::t" split at ':' is u, '', i, '', r, '', t: a one-character separator
            # the C parser takes, the empty fields read as NaN and checked to be empty
            empty = {1: np.float32, 3: np.float32, 5: np.float32}
            raw = pd.read_csv(path, sep=":", header=None, names=list(range(7)),
                              dtype={0: np.int64, 2: np.int64, 4: np.float64, 6: np.int64,
                                     **empty},
                              keep_default_na=False, na_values={c: [""] for c in empty},
                              **common)
            if not np.isnan(raw[list(empty)].to_numpy()).all():
                return None
            df = pd.DataFrame({name: raw[col].to_numpy()
                               for name, col in zip(_RATING_COLUMNS, (0, 2, 4, 6), strict=True)})
        else:
            df = pd.read_csv(path, sep=sep, header=0 if has_header else None,
                             names=_RATING_COLUMNS,
                             dtype=dict(zip(_RATING_COLUMNS,
                                            (np.int64, np.int64, np.float64, np.int64),
                                            strict=True)),
                             na_filter=False, **common)
    except (ValueError, OverflowError, UnicodeDecodeError):  # pandas' parser errors included
        return None
    if not np.isfinite(df["rating"].to_numpy()).all():
        return None
    return df


def _check_header(path: Path, dataset: str, header: str) -> None:
    """Refuse a file whose first line is not ``header`` (compared without case or quotes)."""
    with path.open("rb") as fh:
        first = fh.readline().decode("utf-8-sig", errors="replace")
    found = first.strip().replace('"', "").replace(" ", "")
    if found.lower() != header.lower():
        raise UserError(f"dataset {dataset}: malformed file {path}: line 1: expected the "
                        f"header {header}, found {first.strip()[:80]!r}")


def load_filmtrust(directory: Path, min_rating: float | None = None) -> Interactions:
    """FilmTrust: ``ratings.txt`` (user item rating, comma- or space-separated, no time)."""
    path = _require_file(directory, "ratings.txt", "filmtrust")
    df = _read_table(path, "filmtrust", r"[,\s]+", ["user", "item", "rating"],
                     ["user", "item", "rating"])
    df = _positives(df, min_rating, "filmtrust", path)
    return from_raw("filmtrust", df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64))


def load_lastfm2k(directory: Path) -> Interactions:
    """HetRec LastFM-2K: ``user_artists.dat`` (tab-separated, header userID artistID weight)."""
    path = _require_file(directory, "user_artists.dat", "lastfm-2k")
    df = _read_table(path, "lastfm-2k", "\t", ["user", "item", "weight"],
                     ["user", "item", "weight"], header=0)
    return from_raw("lastfm-2k", df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64))


# header names the CSV reader recognises (compared lower-cased, quotes and spaces stripped)
CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "user": ("user", "user_id", "userid", "uid", "users"),
    "item": ("item", "item_id", "itemid", "iid", "items", "movie", "movie_id", "movieid",
             "artist", "artist_id", "artistid"),
    "rating": ("rating", "ratings", "score", "weight"),
    "timestamp": ("timestamp", "time", "ts"),
}
_CSV_FORMAT = "user,item[,rating][,timestamp]"
_WORD = re.compile(r"^[A-Za-z][A-Za-z _-]*$")


def _csv_role(field: str) -> str | None:
    name = field.strip().strip('"').strip("'").strip().lower()
    return next((role for role, names in CSV_COLUMNS.items() if name in names), None)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_columns(path: Path, first: list[str]) -> tuple[list[str], list[int]] | None:
    """The roles and positions a header line names, or None when ``first`` has no known name.

    A header must name a user and an item column and nothing unknown; anything else is
    one line saying which column is missing or not recognised.
    """
    roles = [_csv_role(f) for f in first]
    if not any(roles):
        return None
    where = f"dataset csv: {path}: header {','.join(f.strip() for f in first)!r}"
    unknown = [f.strip() for f, r in zip(first, roles, strict=True) if r is None]
    if unknown:
        raise UserError(f"{where}: unknown column {unknown[0]!r}; the columns are "
                        f"{_CSV_FORMAT} (by name, in any order)")
    for role in ("user", "item"):
        if role not in roles:
            raise UserError(f"{where} names no {role} column; the columns are {_CSV_FORMAT}")
    repeated = next((r for r in roles if roles.count(r) > 1), None)
    if repeated is not None:
        raise UserError(f"{where} names the {repeated} column twice")
    names = [role for role in CSV_COLUMNS if role in roles]
    return names, [roles.index(role) for role in names]


def _looks_like_header(first: list[str], second: list[str] | None) -> bool:
    """True when an unrecognised first line is a header rather than data: a field that is text
    where the next line has a number (a rating, a timestamp, or both ids)."""
    if second is None or len(second) != len(first):
        return False
    if any(not _is_number(a.strip()) and _is_number(b.strip())
           for a, b in zip(first[2:], second[2:], strict=True)):
        return True
    return all(not _is_number(a.strip()) and _is_number(b.strip())
               for a, b in zip(first[:2], second[:2], strict=True))


def _unique_words(df: pd.DataFrame) -> bool:
    """True when the first row's user and item are plain words found nowhere else in their
    columns: a header of unknown names (``customer,product``), not a user's interaction."""
    user, item = df["user"].iloc[0].strip(), df["item"].iloc[0].strip()
    return (bool(_WORD.match(user)) and bool(_WORD.match(item))
            and int((df["user"].str.strip() == user).sum()) == 1
            and int((df["item"].str.strip() == item).sum()) == 1)


def load_csv(path: Path, min_rating: float | None = None) -> Interactions:
    """Any CSV of ``user,item[,rating][,timestamp]``.

    A header line is read by name (:data:`CSV_COLUMNS`, any order); without one the
    columns are taken in that order. A first line that looks like a header but names
    no known column is refused rather than read as data. Ids may be strings. The
    rating, when present, must be a number on every row; so must the timestamp.
    """
    path = _csv_path(Path(path))
    # utf-8-sig: a byte-order mark, as spreadsheet programs write it, is not part of the
    # first column's name (issue 67)
    with path.open(encoding="utf-8-sig", errors="replace") as fh:
        lines = [line for line in (fh.readline(), fh.readline()) if line.strip()]
    first = lines[0].strip().split(",") if lines else []
    second = lines[1].strip().split(",") if len(lines) > 1 else None
    named = _csv_columns(path, first)
    if named is None and _looks_like_header(first, second):
        raise _unknown_header(path, first)
    names, usecols = named or (["user", "item", "rating", "timestamp"], None)
    df = _read_table(path, "csv", ",", names, ["rating", "timestamp"],
                     header=None if named is None else 0, usecols=usecols,
                     min_cols=2 if named is None else len(first))
    if named is None and _unique_words(df):
        raise _unknown_header(path, first)
    df = _positives(df, min_rating, "csv", path)
    users = df["user"].str.strip().to_numpy()
    items = df["item"].str.strip().to_numpy()
    if (users == "").any() or (items == "").any():
        raise UserError(f"dataset csv: malformed file {path}: empty user or item id")
    ts = df["timestamp"].to_numpy(np.float64) if "timestamp" in df.columns else None
    return from_raw(path.stem, users, items, ts)


def _unknown_header(path: Path, first: list[str]) -> UserError:
    return UserError(f"dataset csv: {path}: the first line {','.join(first)!r} looks like a "
                     f"header but names no known column; name the columns {_CSV_FORMAT} "
                     f"(e.g. user,item)")


def _csv_path(path: Path) -> Path:
    """The CSV file ``path`` names (a folder: its one .csv), checked to exist and hold bytes."""
    if path.is_dir():
        candidates = sorted(path.glob("*.csv"))
        if len(candidates) != 1:
            raise UserError(f"dataset csv: expected exactly one .csv file in {path}, "
                            f"found {len(candidates)}")
        path = candidates[0]
    if not path.exists():
        raise UserError(f"dataset csv: file not found: {path}")
    if path.stat().st_size == 0:
        raise UserError(f"dataset csv: file is empty: {path}")
    return path


def _read_gender(path: Path, dataset: str, sep: str, gender_col: int) -> dict[str, dict]:
    """Gender per raw user id (1 female, 0 male); empty when the file is absent."""
    if not path.is_file():
        return {}
    rows = path.read_text(encoding="latin-1").splitlines()
    out: dict = {}
    for line in rows:
        parts = line.split(sep)
        if len(parts) > gender_col:
            try:
                out[int(parts[0])] = 1 if parts[gender_col].strip().upper() == "F" else 0
            except ValueError:
                continue
    return {"gender": out}


# the file each loader reads from the directory it is given (csv: the file itself, or a
# directory holding exactly one .csv)
DATA_FILES = {"ml-100k": "u.data", "ml-1m": "ratings.dat", "ml-10m": "ratings.dat",
              "ml-20m": "ratings.csv", "ml-25m": "ratings.csv", "filmtrust": "ratings.txt",
              "lastfm-2k": "user_artists.dat"}


def files_problem(name: str, path: Path) -> str | None:
    """Why the loader of ``name`` will not find its file under an existing ``path``, as one
    line; None when it is there (its content is checked only when read)."""
    if name == "csv":
        if path.is_dir() and len(list(path.glob("*.csv"))) != 1:
            return (f"dataset csv: expected exactly one .csv file in {path}, found "
                    f"{len(list(path.glob('*.csv')))}")
        return None
    if name not in DATA_FILES:
        return None
    if not path.is_dir():
        return f"dataset {name}: not a directory: {path}"
    if not (path / DATA_FILES[name]).is_file():
        return (f"dataset {name}: file not found: {path / DATA_FILES[name]}"
                f"{_nested_hint(path, DATA_FILES[name])}")
    return None


LOADERS: dict[str, Callable[[Path], Interactions]] = {
    "ml-100k": load_ml100k,
    "ml-1m": load_ml1m,
    "ml-10m": load_ml10m,
    "ml-20m": load_ml20m,
    "ml-25m": load_ml25m,
    "filmtrust": load_filmtrust,
    "lastfm-2k": load_lastfm2k,
    "csv": load_csv,
}
