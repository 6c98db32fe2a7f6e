"""Item attributes for FedPEFT's server-side pre-training (docs/design.md section 11).

The FedPEFT paper (reference 003, section "Pre-train") encodes each item's
attributes into an input vector x, trains an autoencoder on the server and
uses its latent vectors as the initial item table. The paper encodes the
attribute text with sentence-t5; nothing is downloaded here, so x is built
from the dataset's own files:

    x_i = [genre flags of item i, TF-IDF of the words of item i's title]

- MovieLens-100K (``u.item``: ``id|title|release date|video release
  date|IMDb URL|19 genre flags``, latin-1): the 19 flags in the order of
  ``u.genre`` (unknown, Action, ..., Western);
- MovieLens-1M (``movies.dat``: ``id::title::Genre1|Genre2``, latin-1): one
  flag for each of its 18 genres (:data:`ML1M_GENRES`).

The title's trailing release year "(1995)" is removed before the TF-IDF:
under a capped vocabulary the most frequent tokens would otherwise be the
years of the 1990s (every title has one), crowding out the words that tell
films apart; the year says little about what a film is. English stop words
("the", "of", ...) are dropped for the same reason. The TF-IDF keeps the
``max_features`` most frequent remaining words, and each title's TF-IDF row
has unit L2 norm (a title with none of those words has a zero row).

Datasets without attribute files (synthetic, filmtrust, lastfm-2k, csv) have
no attributes: :func:`item_attributes` returns None for them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import UserError

#: datasets whose files carry item attributes
ATTRIBUTE_DATASETS = ("ml-100k", "ml-1m")
#: ML-100K's genres, in the column order of u.item (as listed in u.genre)
ML100K_GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
                 "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
                 "Romance", "Sci-Fi", "Thriller", "War", "Western")
#: ML-1M's genres (its README), one flag each in this order
ML1M_GENRES = ML100K_GENRES[1:]
#: vocabulary cap of the title TF-IDF
TITLE_WORDS = 300
_YEAR = re.compile(r"\s*\(\d{4}\)\s*$")


def strip_year(title: str) -> str:
    """A MovieLens title without its trailing release year: "Toy Story (1995)" -> "Toy Story"."""
    return _YEAR.sub("", title).strip()


def item_attributes(dataset: str, data_dir: str | Path | None, raw_item_ids: np.ndarray,
                    max_features: int = TITLE_WORDS, cache_dir: Path | None = None
                    ) -> np.ndarray | None:
    """The attribute matrix x (n_items, n_genres + title words) of FedPEFT's pre-training.

    FedPEFT paper, section "Pre-train": the server's item attributes become
    input vectors x for the autoencoder (see the module docstring for what x
    holds). Row i belongs to the package's item index i, whose raw id is
    ``raw_item_ids[i]`` (``Interactions.item_ids``). ``data_dir`` None reads the
    download cache, as :func:`~fedem_private.data.load_dataset` does.

    Returns None for a dataset without attributes; raises :class:`UserError`
    when the attribute file is missing or malformed, or lacks one of the items.
    """
    if dataset not in ATTRIBUTE_DATASETS:
        return None
    directory = _resolve_dir(dataset, data_dir, cache_dir)
    if dataset == "ml-100k":
        ids, titles, genres = _read_ml100k(directory / "u.item")
    else:
        ids, titles, genres = _read_ml1m(directory / "movies.dat")
    return _assemble(dataset, ids, titles, genres, np.asarray(raw_item_ids), max_features)


def _resolve_dir(dataset: str, data_dir: str | Path | None, cache_dir: Path | None) -> Path:
    if data_dir is not None:
        return Path(data_dir).expanduser()
    from .download import cached_dir

    cached = cached_dir(dataset, cache_dir)
    if cached is None:
        raise UserError(f"dataset {dataset}: item attributes need --data-dir DIR or a cached "
                        f"copy")
    return cached


def _read_lines(path: Path, dataset: str) -> list[str]:
    if not path.is_file():
        raise UserError(f"dataset {dataset}: item attribute file not found: {path}")
    lines = [line for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]
    if not lines:
        raise UserError(f"dataset {dataset}: item attribute file is empty: {path}")
    return lines


def _read_ml100k(path: Path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """u.item -> (raw ids, titles, genre flags (n, 19))."""
    n_genres = len(ML100K_GENRES)
    ids, titles, flags = [], [], []
    for number, line in enumerate(_read_lines(path, "ml-100k"), start=1):
        parts = line.split("|")
        if len(parts) != 5 + n_genres:
            raise UserError(f"dataset ml-100k: malformed file {path}: line {number}: expected "
                            f"{5 + n_genres} '|'-separated fields, found {len(parts)}")
        try:
            ids.append(int(parts[0]))
            row = [int(v) for v in parts[5:]]
        except ValueError:
            raise UserError(f"dataset ml-100k: malformed file {path}: line {number}: the id "
                            f"and genre flags must be integers") from None
        if any(v not in (0, 1) for v in row):
            raise UserError(f"dataset ml-100k: malformed file {path}: line {number}: genre "
                            f"flags must be 0 or 1")
        titles.append(parts[1])
        flags.append(row)
    return np.array(ids, dtype=np.int64), titles, np.array(flags, dtype=np.float64)


def _read_ml1m(path: Path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """movies.dat -> (raw ids, titles, genre flags (n, 18))."""
    column = {g: j for j, g in enumerate(ML1M_GENRES)}
    ids, titles = [], []
    flags = []
    for number, line in enumerate(_read_lines(path, "ml-1m"), start=1):
        parts = line.split("::")
        if len(parts) != 3:
            raise UserError(f"dataset ml-1m: malformed file {path}: line {number}: expected "
                            f"MovieID::Title::Genres")
        try:
            ids.append(int(parts[0]))
        except ValueError:
            raise UserError(f"dataset ml-1m: malformed file {path}: line {number}: the movie "
                            f"id is not an integer: {parts[0]!r}") from None
        row = np.zeros(len(ML1M_GENRES))
        for genre in filter(None, (g.strip() for g in parts[2].split("|"))):
            if genre not in column:
                raise UserError(f"dataset ml-1m: malformed file {path}: line {number}: "
                                f"unknown genre {genre!r}")
            row[column[genre]] = 1.0
        titles.append(parts[1])
        flags.append(row)
    return np.array(ids, dtype=np.int64), titles, np.array(flags, dtype=np.float64)


def _assemble(dataset: str, ids: np.ndarray, titles: list[str], genres: np.ndarray,
              raw_item_ids: np.ndarray, max_features: int) -> np.ndarray:
    """Rows in the order of ``raw_item_ids``: [genre flags, title TF-IDF]."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    uniq, first = np.unique(ids, return_index=True)
    if uniq.shape[0] != ids.shape[0]:
        raise UserError(f"dataset {dataset}: the item attribute file repeats item ids")
    wanted = raw_item_ids.astype(np.int64)
    pos = np.searchsorted(uniq, wanted)
    found = (pos < uniq.shape[0]) & (uniq[np.minimum(pos, uniq.shape[0] - 1)] == wanted)
    if not found.all():
        missing = int(wanted[~found][0])
        raise UserError(f"dataset {dataset}: the item attribute file has no row for item "
                        f"{missing} ({int((~found).sum())} items missing)")
    rows = first[pos]
    words = [strip_year(titles[r]) for r in rows.tolist()]
    tfidf = TfidfVectorizer(max_features=max_features, stop_words="english", lowercase=True)
    try:
        text = tfidf.fit_transform(words).toarray()
    except ValueError:  # no title has a word outside the stop list
        text = np.zeros((len(words), 0))
    return np.concatenate([genres[rows], text.astype(np.float64)], axis=1)
