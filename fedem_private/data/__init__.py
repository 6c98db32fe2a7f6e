"""Datasets: loaders, synthetic generator, leave-one-out split, negative sampling."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .download import REGISTRY, cached_dir
from .interactions import Interactions
from .loaders import LOADERS
from .split import PROTOCOLS, Split, leave_one_out
from .synthetic import SyntheticConfig, generate

DATASETS = ("synthetic", *LOADERS)
# datasets whose files carry a rating per pair (csv: when it has a third column)
RATED_DATASETS = ("ml-100k", "ml-1m", "filmtrust", "csv")

__all__ = ["DATASETS", "PROTOCOLS", "RATED_DATASETS", "Interactions", "Split", "SyntheticConfig",
           "leave_one_out", "load_dataset"]


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
    if name not in LOADERS:
        raise UserError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if data_dir is not None:
        return LOADERS[name](Path(data_dir).expanduser(), **rating)
    if name == "csv":
        raise UserError("dataset csv needs --data-dir pointing at the CSV file")
    cached = cached_dir(name, cache_dir)
    if cached is None:
        hint = (f"run `fedem-private datasets download {name}` or " if name in REGISTRY else "")
        raise UserError(f"dataset {name}: no --data-dir given and no cached copy; {hint}"
                        f"pass --data-dir DIR")
    return LOADERS[name](cached, **rating)
