"""Readers for the supported dataset formats (DESIGN section 2).

Each reader takes the directory a user names and returns :class:`Interactions`.
Bad input (missing directory or file, malformed or empty file) raises
:class:`UserError` with one line naming the problem.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UserError
from .interactions import Interactions, from_raw

if TYPE_CHECKING:
    import pandas as pd


def _require_file(directory: Path, filename: str, dataset: str) -> Path:
    if not directory.exists():
        raise UserError(f"dataset {dataset}: directory not found: {directory}")
    if not directory.is_dir():
        raise UserError(f"dataset {dataset}: not a directory: {directory}")
    path = directory / filename
    if not path.is_file():
        raise UserError(f"dataset {dataset}: file not found: {path}")
    if path.stat().st_size == 0:
        raise UserError(f"dataset {dataset}: file is empty: {path}")
    return path


def _read_table(path: Path, dataset: str, sep: str, names: list[str], numeric: list[str],
                header: int | None = None, usecols: list[int] | None = None,
                min_cols: int | None = None) -> pd.DataFrame:
    """Read a delimited file; every row must have the expected numeric columns."""
    import pandas as pd  # here, not at import: config validation must stay light

    try:
        engine = "c" if len(sep) == 1 else "python"
        df = pd.read_csv(path, sep=sep, header=header, names=None, engine=engine,
                         dtype=str, keep_default_na=False, skip_blank_lines=True,
                         encoding="latin-1",
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
    """MovieLens 100K: ``u.data`` (tab: user item rating timestamp), ``u.user`` (demographics)."""
    path = _require_file(directory, "u.data", "ml-100k")
    df = _read_table(path, "ml-100k", "\t", ["user", "item", "rating", "timestamp"],
                     ["user", "item", "rating", "timestamp"])
    df = _positives(df, min_rating, "ml-100k", path)
    demo = _read_gender(directory / "u.user", "ml-100k", "|", gender_col=2)
    return from_raw("ml-100k", df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64),
                    df["timestamp"].to_numpy(np.float64), demo)


def load_ml1m(directory: Path, min_rating: float | None = None) -> Interactions:
    """MovieLens 1M: ``ratings.dat`` (UserID::MovieID::Rating::Timestamp), ``users.dat``."""
    path = _require_file(directory, "ratings.dat", "ml-1m")
    df = _read_table(path, "ml-1m", "::", ["user", "item", "rating", "timestamp"],
                     ["user", "item", "rating", "timestamp"])
    df = _positives(df, min_rating, "ml-1m", path)
    demo = _read_gender(directory / "users.dat", "ml-1m", "::", gender_col=1)
    return from_raw("ml-1m", df["user"].to_numpy(np.int64), df["item"].to_numpy(np.int64),
                    df["timestamp"].to_numpy(np.float64), demo)


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


def load_csv(path: Path, min_rating: float | None = None) -> Interactions:
    """Any CSV of ``user,item[,rating][,timestamp]``; a header row is detected and skipped.

    Ids may be strings. The third column, when present, is the rating and must
    be a number on every row; the fourth, when present, is the timestamp.
    """
    path = Path(path)
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
    with path.open(encoding="utf-8", errors="replace") as fh:
        first = fh.readline().strip().split(",")
    names = {"user", "user_id", "userid", "uid"}
    header = 0 if first and first[0].strip().lower() in names else None
    df = _read_table(path, "csv", ",", ["user", "item", "rating", "timestamp"],
                     ["rating", "timestamp"], header=header, min_cols=2)
    df = _positives(df, min_rating, "csv", path)
    users = df["user"].str.strip().to_numpy()
    items = df["item"].str.strip().to_numpy()
    if (users == "").any() or (items == "").any():
        raise UserError(f"dataset csv: malformed file {path}: empty user or item id")
    ts = df["timestamp"].to_numpy(np.float64) if "timestamp" in df.columns else None
    return from_raw(path.stem, users, items, ts)


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


LOADERS: dict[str, Callable[[Path], Interactions]] = {
    "ml-100k": load_ml100k,
    "ml-1m": load_ml1m,
    "filmtrust": load_filmtrust,
    "lastfm-2k": load_lastfm2k,
    "csv": load_csv,
}
