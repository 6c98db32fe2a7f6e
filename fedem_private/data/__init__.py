"""Datasets: loaders, synthetic generator, leave-one-out split, negative sampling."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .download import REGISTRY, cached_dir
from .interactions import Interactions
from .loaders import LOADERS, files_problem
from .split import PROTOCOLS, Split, leave_one_out
from .synthetic import SyntheticConfig, generate

DATASETS = ("synthetic", *LOADERS)
# datasets whose files carry a rating per pair (csv: when it has a third column)
RATED_DATASETS = ("ml-100k", "ml-1m", "filmtrust", "csv")

__all__ = ["DATASETS", "PROTOCOLS", "RATED_DATASETS", "Interactions", "Split", "SyntheticConfig",
           "dataset_problem", "leave_one_out", "load_dataset"]


def dataset_problem(name: str, data_dir: str | Path | None = None,
                    cache_dir: Path | None = None) -> str | None:
    """Why :func:`load_dataset` could not find ``name``'s files, as one line; None if it can.

    Checks only what can be checked without reading (the folder or file named, the file the
    loader reads in it, or a cached copy), so a sweep can refuse to start instead of failing
    every point; the loaders still check each file they read.
    """
    if name == "synthetic":
        return None
    if name not in LOADERS:
        return f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}"
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if path.exists():
            return files_problem(name, path)
        return f"dataset {name}: {'file' if name == 'csv' else 'directory'} not found: {path}"
    if name == "csv":
        return "dataset csv needs --data-dir pointing at the CSV file"
    if cached_dir(name, cache_dir) is None:
        hint = (f"run `fedem-private datasets download {name}` or " if name in REGISTRY else "")
        return f"dataset {name}: no --data-dir given and no cached copy; {hint}pass --data-dir DIR"
    return None


def load_dataset(name: str, data_dir: str | Path | None = None, *, seed: int = 0,
                 synthetic: SyntheticConfig | None = None,
                 cache_dir: Path | None = None, min_rating: float | None = None
                 ) -> Interactions:
    """Load a dataset by name from ``data_dir``, the download cache, or the generator.

    Every observed (user, item) pair is an implicit positive; with ``min_rating``
    only the pairs rated at least that are (datasets with ratings only).
    Nothing is downloaded here: a real dataset not found in ``data_dir`` or the
    cache is a :class:`UserError` telling the user how to get it.
    """
    if min_rating is not None and name not in RATED_DATASETS:
        raise UserError(f"--min-rating: dataset {name} has no ratings")
    rating = {} if min_rating is None else {"min_rating": min_rating}
    if name == "synthetic":
        return generate(synthetic or SyntheticConfig(), seed)
    if name not in LOADERS or data_dir is None:
        problem = dataset_problem(name, data_dir, cache_dir)
        if problem is not None:
            raise UserError(problem)
    if data_dir is not None:  # the loader names a missing folder or file itself
        return LOADERS[name](Path(data_dir).expanduser(), **rating)
    cached = cached_dir(name, cache_dir)
    assert cached is not None  # dataset_problem found it
    return LOADERS[name](cached, **rating)
