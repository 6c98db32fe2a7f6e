"""Datasets: loaders, synthetic generator, leave-one-out split, negative sampling."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from .download import REGISTRY, cached_dir
from .interactions import Interactions
from .loaders import LOADERS, files_problem
from .split import PROTOCOLS, Split, leave_one_out
from .synthetic import SyntheticConfig, generate

if TYPE_CHECKING:
    from .population import PopulationModel

DATASETS = ("synthetic", *LOADERS)
# datasets whose files carry a rating per pair (csv: when it has a third column)
RATED_DATASETS = ("ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "filmtrust", "csv")

# what a population can be calibrated to (docs/design.md section 17): any real dataset
SOURCE_DATASETS = tuple(name for name in DATASETS if name != "synthetic")

__all__ = ["DATASETS", "PROTOCOLS", "RATED_DATASETS", "SOURCE_DATASETS", "Interactions", "Split",
           "SyntheticConfig", "calibrated_population", "dataset_problem", "leave_one_out",
           "load_dataset", "population_record", "source_problem"]


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


def source_problem(source: str, data_dir: str | Path | None = None,
                   cache_dir: Path | None = None) -> str | None:
    """Why a population cannot be calibrated to dataset ``source`` (``--calibrate-to``),
    as one line; None if its files can be found (``data_dir`` or the download cache)."""
    if source not in SOURCE_DATASETS:
        return (f"--calibrate-to (data.calibrate_to): {source!r} is not a real dataset; choose "
                f"one of {', '.join(SOURCE_DATASETS)}")
    problem = dataset_problem(source, data_dir, cache_dir)
    return None if problem is None else f"--calibrate-to {source}: {problem}"


def calibrated_population(source: str, data_dir: str | Path | None = None,
                          cache_dir: Path | None = None, taste: str = "bilinear"
                          ) -> PopulationModel:
    """The population model fitted to dataset ``source`` read from ``data_dir`` or the
    download cache (docs/design.md section 17), with the user-item score ``taste``
    (:data:`~fedem_private.data.population.TASTES`); fitted once and kept under
    ``<cache>/populations``, keyed by the source's content hash and the fit options."""
    from .download import default_cache_dir
    from .population import FitOptions, cached_fit

    problem = source_problem(source, data_dir, cache_dir)
    if problem is not None:
        raise UserError(problem)
    real = load_dataset(source, data_dir, cache_dir=cache_dir)
    return cached_fit(real, (cache_dir or default_cache_dir()) / "populations",
                      FitOptions(taste=taste))


def population_record(source: str, data_dir: str | Path | None = None,
                      users: int | None = None, cache_dir: Path | None = None,
                      taste: str = "bilinear") -> dict[str, Any]:
    """What a run's summary.json says of its calibrated population (docs/design.md
    section 17): the model's SHA-256, source and calibration, and the users drawn. The model
    comes from the cache the run's data were drawn from (this process's or the disk's)."""
    model = calibrated_population(source, data_dir, cache_dir, taste)
    return {**model.summary(), "users": model.source_users if users is None else users}


def load_dataset(name: str, data_dir: str | Path | None = None, *, seed: int = 0,
                 synthetic: SyntheticConfig | None = None,
                 cache_dir: Path | None = None, min_rating: float | None = None,
                 calibrate_to: str | None = None, users: int | None = None,
                 taste: str = "bilinear") -> Interactions:
    """Load a dataset by name from ``data_dir``, the download cache, or the generator.

    Every observed (user, item) pair is an implicit positive; with ``min_rating``
    only the pairs rated at least that are (datasets with ratings only).
    Nothing is downloaded here: a real dataset not found in ``data_dir`` or the
    cache is a :class:`UserError` telling the user how to get it.

    ``synthetic`` with ``calibrate_to``: ``users`` users (default: as many as the source
    has) drawn with ``seed`` from the population fitted to that real dataset with the
    score ``taste``, whose files ``data_dir`` then names (:func:`calibrated_population`,
    docs/design.md section 17).
    """
    if min_rating is not None and name not in RATED_DATASETS:
        raise UserError(f"--min-rating: dataset {name} has no ratings")
    rating = {} if min_rating is None else {"min_rating": min_rating}
    if name == "synthetic" and calibrate_to is not None:
        from .population import draw_population

        model = calibrated_population(calibrate_to, data_dir, cache_dir, taste)
        return draw_population(model, seed, model.source_users if users is None else users)
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
