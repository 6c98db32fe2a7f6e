"""How far apart DP-MostPop's k-clipped counts are on two neighbouring real datasets.

    python -m benchmarks.probes.neighbour_subsets [--data-dir ../shared/datasets/ml-100k]
        [--removals 30] [--k 50] [--seed 0] [--derived-catalogue]

DP-MostPop's ``central`` architecture (``fedem_private/baselines/popularity.py``) claims an
L2 sensitivity of sqrt(k) under add/remove of one user: the two neighbouring datasets' sums
of k-clipped one-hot vectors differ by the removed user's vector alone. That holds only if
every other user's contribution (its leave-one-out split and its random k-subset) is a
function of the seed and that user's own rows, and the item catalogue does not move.

For each of ``--removals`` users drawn at random, the probe writes the ML-100K folder again
without that user's lines in ``u.data`` (the other files unchanged), loads both folders
with the package's loader, splits both with ``leave_one_out`` under one seed and takes
both worlds' k-clipped counts (``k_subsets``, the same seed). It measures:

- ``l2``: the L2 distance of the two count vectors over the items of the world with the
  user, aligned by source item id (a source item absent from the other world counts 0
  there); the claim is l2 <= sqrt(k);
- ``others_changed``: users other than the removed one whose training set or k-subset
  (as source item ids) differs between the worlds; the claim is 0;
- ``catalogue``: the number of items of the world without the user (the world with it
  has ``items``).

``--derived-catalogue`` leaves ``u.item`` out of both folders, so the loader derives the
catalogue from ``u.data`` (removing a user can then shrink it): the keying by source ids
alone must still hold the bound.

It uses only what both the old and the new package have (``Interactions.user_ids``,
``item_ids``, ``Split.users``, ``k_subsets``), so the same command measures a checkout from
before the split and the subsets were keyed by source ids. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import emit
from fedem_private.baselines.popularity import k_subsets
from fedem_private.data import load_dataset
from fedem_private.data.interactions import Interactions
from fedem_private.data.split import Split, leave_one_out

DATASET = "ml-100k"


def _without_user(src: Path, dst: Path, user: str | None, skip: tuple[str, ...] = ()) -> None:
    """Copy the ML-100K folder ``src`` to ``dst`` leaving out ``user``'s lines of u.data
    (None: none) and the files named in ``skip``."""
    for path in src.iterdir():
        if path.is_file() and path.name != "u.data" and path.name not in skip:
            shutil.copy(path, dst / path.name)
    lines = (src / "u.data").read_text(encoding="latin-1").splitlines(keepends=True)
    kept = [line for line in lines if line.split("\t", 1)[0].strip() != user]
    (dst / "u.data").write_text("".join(kept), encoding="latin-1")


def _contributions(data: Interactions, split: Split, k: int, seed: int
                   ) -> tuple[np.ndarray, dict[Any, tuple[tuple, tuple]]]:
    """Counts per item index, and per source user id its (training set, k-subset) as
    sorted tuples of source item ids."""
    indptr, items = k_subsets(split, k, seed)
    counts = np.bincount(items, minlength=split.n_items).astype(np.float64)
    per_user = {}
    for u in range(split.n_users):
        source = data.user_ids[split.users[u]].item()
        train = tuple(sorted(data.item_ids[split.train_of(u)].tolist()))
        subset = tuple(sorted(data.item_ids[items[indptr[u]:indptr[u + 1]]].tolist()))
        per_user[source] = (train, subset)
    return counts, per_user


def measure(data_dir: Path, removals: int, k: int, seed: int,
            derived_catalogue: bool = False) -> dict[str, Any]:
    """The figures of the module docstring, one row per removal and their range."""
    skip = ("u.item",) if derived_catalogue else ()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "full"
        full.mkdir()
        _without_user(data_dir, full, None, skip)
        world = load_dataset(DATASET, full)
        split = leave_one_out(world, seed)
        counts, mine = _contributions(world, split, k, seed)
        draw = np.random.default_rng(seed)
        chosen = draw.choice(world.user_ids, size=removals, replace=False)
        for user in chosen.tolist():
            folder = Path(tmp) / f"without_{user}"
            folder.mkdir()
            _without_user(full, folder, str(user))
            other = load_dataset(DATASET, folder)
            other_counts, theirs = _contributions(other, leave_one_out(other, seed), k, seed)
            # B's counts on A's items, by source item id (A's catalogue holds B's)
            aligned = np.zeros_like(counts)
            where = np.searchsorted(world.item_ids, other.item_ids)
            aligned[where] = other_counts
            changed = sum(1 for u, v in theirs.items() if mine.get(u) != v)
            rows.append({"user": user, "l2": float(np.linalg.norm(counts - aligned)),
                         "others_changed": changed, "catalogue": int(other.n_items)})
            shutil.rmtree(folder)
    gaps = [r["l2"] for r in rows]
    return {"dataset": DATASET, "k": k, "seed": seed, "removals": removals,
            "catalogue_from": "u.data" if derived_catalogue else "u.item when present",
            "items": int(world.n_items), "bound": math.sqrt(k),
            "l2_min": min(gaps), "l2_median": float(np.median(gaps)), "l2_max": max(gaps),
            "within_bound": sum(g <= math.sqrt(k) + 1e-9 for g in gaps),
            "others_changed_max": max(r["others_changed"] for r in rows),
            "catalogue_shrank": sum(r["catalogue"] != world.n_items for r in rows),
            "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/datasets/ml-100k"))
    parser.add_argument("--removals", type=int, default=30)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--derived-catalogue", action="store_true",
                        help="leave u.item out: the catalogue is the items u.data names")
    args = parser.parse_args(argv)
    emit(measure(args.data_dir, args.removals, args.k, args.seed, args.derived_catalogue))


if __name__ == "__main__":
    main()
