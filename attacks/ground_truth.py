"""The private side of a recorded run: only the scorer reads it (docs/design.md, section 6).

Per recorded round and client: the training positives and the negatives the
client sampled that round; per client: demographics (e.g. gender, for the
attribute attack). No attack module imports this one (a test checks).

On disk, inside a run directory (apart from what the server saw)::

    run_dir/ground_truth/round_0007.npz       one GroundTruth (or ..._part_0002.npz)
    run_dir/ground_truth/demographics.npz     Demographics
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from fedem_private.errors import UserError

from ._atomic import write_npz
from ._store import FORMAT_VERSION, load_npz, readonly, round_files, round_name

TRUTH_DIR = "ground_truth"
DEMOGRAPHICS_FILE = "demographics.npz"


@dataclass(frozen=True, eq=False)
class Ragged:
    """Rows of integer ids of different lengths, stored CSR-style.

    Row ``j`` is ``indices[indptr[j]:indptr[j + 1]]`` (duplicates allowed:
    sampled negatives are drawn with replacement).
    """

    indptr: np.ndarray  # (k + 1,) int64, non-decreasing, indptr[0] == 0
    indices: np.ndarray  # (indptr[-1],) int64

    def __post_init__(self) -> None:
        indptr = np.asarray(self.indptr, dtype=np.int64)
        indices = np.asarray(self.indices, dtype=np.int64)
        if indptr.ndim != 1 or indptr.shape[0] < 1 or indptr[0] != 0:
            raise ValueError("Ragged.indptr must be 1-D and start at 0")
        if np.any(np.diff(indptr) < 0) or indptr[-1] != indices.shape[0] or indices.ndim != 1:
            raise ValueError("Ragged.indptr must be non-decreasing and end at len(indices)")
        object.__setattr__(self, "indptr", readonly(indptr))
        object.__setattr__(self, "indices", readonly(indices))

    @classmethod
    def from_rows(cls, rows: Sequence[np.ndarray | Sequence[int]]) -> Ragged:
        """Build from a list of per-row id arrays."""
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        parts = [np.asarray(r, dtype=np.int64).reshape(-1) for r in rows]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return cls(indptr, indices)

    def __len__(self) -> int:
        return int(self.indptr.shape[0] - 1)

    def row(self, j: int) -> np.ndarray:
        """The ids of row ``j``."""
        return self.indices[self.indptr[j]: self.indptr[j + 1]]

    def rows(self) -> Iterator[np.ndarray]:
        """Iterate over the rows."""
        for j in range(len(self)):
            yield self.row(j)

    def take(self, rows: np.ndarray) -> Ragged:
        """A new Ragged with the given rows, in that order."""
        return Ragged.from_rows([self.row(int(j)) for j in np.asarray(rows)])

    def to_mask(self, n_cols: int) -> np.ndarray:
        """(len(self), n_cols) boolean membership matrix."""
        mask = np.zeros((len(self), n_cols), dtype=bool)
        owner = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= n_cols):
            raise ValueError(f"ids outside [0, {n_cols})")
        mask[owner, self.indices] = True
        return mask


@dataclass(frozen=True, eq=False)
class GroundTruth:
    """Private truth for one recorded round; only the scorer may read it.

    Row ``j`` of ``positives`` / ``negatives`` belongs to ``clients[j]``:
    the client's training positives and the negatives it sampled that round.
    """

    round: int
    clients: np.ndarray  # (k,) int64
    positives: Ragged
    negatives: Ragged

    def __post_init__(self) -> None:
        clients = np.asarray(self.clients, dtype=np.int64).reshape(-1)
        if len(self.positives) != clients.shape[0] or len(self.negatives) != clients.shape[0]:
            raise ValueError("GroundTruth: one row of positives and negatives per client")
        if np.unique(clients).shape[0] != clients.shape[0]:
            raise ValueError("GroundTruth.clients has duplicate ids")
        object.__setattr__(self, "round", int(self.round))
        object.__setattr__(self, "clients", readonly(clients))

    def select(self, clients: np.ndarray) -> GroundTruth:
        """The rows of ``clients`` in that order (KeyError naming a missing client)."""
        pos = {int(c): j for j, c in enumerate(self.clients)}
        wanted = np.asarray(clients, dtype=np.int64).reshape(-1)
        missing = [int(c) for c in wanted if int(c) not in pos]
        if missing:
            raise KeyError(f"round {self.round}: no ground truth for clients {missing[:5]}")
        rows = np.array([pos[int(c)] for c in wanted], dtype=np.int64)
        return GroundTruth(self.round, wanted, self.positives.take(rows),
                           self.negatives.take(rows))


@dataclass(frozen=True, eq=False)
class Demographics:
    """Per-client attributes, e.g. ``gender`` (float: 0/1, NaN unknown; or int: -1 unknown)."""

    clients: np.ndarray  # (n,) int64
    attributes: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        clients = np.asarray(self.clients, dtype=np.int64).reshape(-1)
        attrs: dict[str, np.ndarray] = {}
        for name, values in self.attributes.items():
            a = np.asarray(values)
            if a.shape != clients.shape or a.dtype == object:
                raise ValueError(f"attribute {name!r} must be numeric with one value per client")
            attrs[name] = readonly(a)
        object.__setattr__(self, "clients", readonly(clients))
        object.__setattr__(self, "attributes", MappingProxyType(attrs))


def _as_ragged(x: Ragged | Sequence[np.ndarray | Sequence[int]]) -> Ragged:
    """Accept a :class:`Ragged` (the CSR pair) or a list of per-client id arrays."""
    return x if isinstance(x, Ragged) else Ragged.from_rows(list(x))


def save_ground_truth(run_dir: str | Path, round_: int, clients: np.ndarray,
                      positives: Ragged | Sequence[np.ndarray],
                      negatives: Ragged | Sequence[np.ndarray],
                      *, part: int | None = None) -> Path:
    """Write one round's training positives and sampled negatives per client.

    ``positives`` / ``negatives``: ``Ragged(indptr, indices)`` (CSR over the
    clients) or a list of per-client id arrays, rows in the order of ``clients``.
    """
    gt = GroundTruth(round_, clients, _as_ragged(positives), _as_ragged(negatives))
    arrays = {
        "format_version": np.array(FORMAT_VERSION),
        "round": np.array(gt.round, dtype=np.int64),
        "clients": gt.clients,
        "pos_indptr": gt.positives.indptr, "pos_indices": gt.positives.indices.astype(np.int32),
        "neg_indptr": gt.negatives.indptr, "neg_indices": gt.negatives.indices.astype(np.int32),
    }
    return write_npz(Path(run_dir) / TRUTH_DIR / round_name(gt.round, part), arrays)


def _truth_from(path: Path) -> GroundTruth:
    z = load_npz(path, ("round", "clients", "pos_indptr", "pos_indices",
                         "neg_indptr", "neg_indices"))
    try:
        return GroundTruth(int(z["round"]), z["clients"], Ragged(z["pos_indptr"], z["pos_indices"]),
                           Ragged(z["neg_indptr"], z["neg_indices"]))
    except ValueError as e:
        raise UserError(f"{path}: {e}") from e


def load_ground_truth(run_dir: str | Path, rounds: Sequence[int] | None = None
                      ) -> list[GroundTruth]:
    """All recorded ground truth (or that of ``rounds``), sorted by round; parts are joined."""
    out = []
    for r, paths in round_files(Path(run_dir) / TRUTH_DIR, rounds).items():
        parts = [_truth_from(p) for p in paths]
        if any(g.round != r for g in parts):
            raise UserError(f"{paths[0]}: file name and stored round disagree")
        clients = np.concatenate([g.clients for g in parts])
        pos = [row for g in parts for row in g.positives.rows()]
        neg = [row for g in parts for row in g.negatives.rows()]
        try:
            out.append(GroundTruth(r, clients, Ragged.from_rows(pos), Ragged.from_rows(neg)))
        except ValueError as e:
            raise UserError(f"round {r} ground truth: {e}") from e
    return out


def save_demographics(run_dir: str | Path, clients: np.ndarray,
                      attributes: Mapping[str, np.ndarray]) -> Path:
    """Write per-client attributes, e.g. ``{"gender": g}``, to ``ground_truth/demographics.npz``."""
    demo = Demographics(clients, attributes)
    bad = [n for n in demo.attributes if not n.isidentifier() or n == "clients"]
    if bad:
        raise ValueError(f"attribute names must be identifiers other than 'clients': {bad}")
    arrays = {"clients": demo.clients, **{f"attr_{n}": a for n, a in demo.attributes.items()}}
    return write_npz(Path(run_dir) / TRUTH_DIR / DEMOGRAPHICS_FILE, arrays)


def load_demographics(run_dir: str | Path) -> Demographics | None:
    """The recorded demographics, or None when the run recorded none."""
    path = Path(run_dir) / TRUTH_DIR / DEMOGRAPHICS_FILE
    if not path.exists():
        return None
    z = load_npz(path, ("clients",))
    attrs = {k.removeprefix("attr_"): v for k, v in z.items() if k.startswith("attr_")}
    return Demographics(z["clients"], attrs)
