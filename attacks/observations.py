"""What the server saw, and what it knows: the attacks' side of the data contract.

docs/design.md, section 6. Two records reach the attacks:

- :class:`Observation`: what an honest-but-curious server saw in one recorded
  round: which clients, the table it sent each of them, what each uploaded,
  and whether each took part.
- :class:`PublicKnowledge`: the training hyper-parameters and the privacy
  mode with its public parameters (the threat model of section 5 lets the
  server know them).

The private side (training positives, sampled negatives, demographics) lives in
:mod:`attacks.ground_truth`, which no attack module imports.

On disk, inside a run directory::

    run_dir/observations/public.json          PublicKnowledge
    run_dir/observations/round_0007.npz       one Observation, or
    run_dir/observations/round_0007_part_0002.npz   when a round is written in client chunks

An observation file holds ``sent`` (float32, or float16 to halve the space;
stored once as ``sent_shared`` when every client of the file was sent the same
table, as under FedAvg) and ``delta = upload - sent`` computed from the
original arrays (float32 or float16): the delta is what the attacks use, and
storing it directly keeps it as exact as its dtype even when ``sent`` is
stored lossily. Untouched rows (delta exactly 0) stay exactly unchanged
through the round trip. On loading,
``upload = sent + delta`` in float32. Every file is written atomically
(:mod:`attacks._atomic`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from fedem_private.errors import UserError

from ._atomic import write_json, write_npz
from ._store import FORMAT_VERSION, load_npz, readonly, round_files, round_name

OBS_DIR = "observations"
PUBLIC_FILE = "public.json"
_STORE_DTYPES = {"float16": np.float16, "float32": np.float32}
#: npz key prefixes of the sent dense groups: one per client, or one shared copy
DENSE, DENSE_SHARED = "sent_dense__", "sent_dense_shared__"
#: npz key prefixes of a FedPEFT codec's sent parameters (per client, or one shared copy)
#: and of their change in the upload (uploaded minus sent, per client)
THETA, THETA_SHARED, THETA_DELTA = "sent_theta__", "sent_theta_shared__", "theta_delta__"


@dataclass(frozen=True, eq=False)
class Observation:
    """What the server saw in one recorded round (docs/design.md, sections 5-6).

    ``sent[j]`` is the table the server sent client ``clients[j]`` (Q_sent) and
    ``upload[j]`` what that client uploaded after the privacy layer. Rows of
    clients that did not take part (``participated[j]`` False) carry no
    information; attacks return NaN scores for them. ``sent_dense`` holds the
    shared dense groups the server sent with the table (FedNCF's MLP weights,
    name -> (k, ...)); empty for a backbone that has none, or a recording made
    before they were stored.
    """

    round: int
    clients: np.ndarray  # (k,) int64 client ids
    sent: np.ndarray  # (k, m, d) float
    upload: np.ndarray  # (k, m, d) float
    participated: np.ndarray  # (k,) bool
    sent_dense: Mapping[str, np.ndarray] = field(default_factory=dict)
    sent_theta: Mapping[str, np.ndarray] = field(default_factory=dict)
    upload_theta: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clients = np.asarray(self.clients, dtype=np.int64).reshape(-1)
        sent = np.asarray(self.sent)
        upload = np.asarray(self.upload)
        part = np.asarray(self.participated)
        if part.dtype != np.bool_:
            raise ValueError("Observation.participated must be a boolean array")
        k = clients.shape[0]
        if sent.ndim != 3 or sent.shape[0] != k:
            raise ValueError(f"Observation.sent must be (k={k}, m, d); got {sent.shape}")
        if upload.shape != sent.shape:
            raise ValueError(f"Observation.upload {upload.shape} != sent {sent.shape}")
        if part.shape != (k,):
            raise ValueError(f"Observation.participated must be ({k},); got {part.shape}")
        if np.unique(clients).shape[0] != k:
            raise ValueError("Observation.clients has duplicate ids")
        for name, a in (("sent", sent), ("upload", upload)):
            if not np.issubdtype(a.dtype, np.floating):
                raise ValueError(f"Observation.{name} must be floating point")
            if not np.isfinite(a).all():
                raise ValueError(f"Observation.{name} of round {self.round} has NaN or Inf")
        for attr in ("sent_dense", "sent_theta", "upload_theta"):
            groups = {}
            for name, value in dict(getattr(self, attr)).items():
                a = np.asarray(value)
                if a.ndim < 1 or a.shape[0] != k or not np.issubdtype(a.dtype, np.floating):
                    raise ValueError(f"Observation.{attr}[{name!r}] must be float (k={k}, ...); "
                                     f"got {a.dtype} {a.shape}")
                groups[str(name)] = readonly(a)
            object.__setattr__(self, attr, MappingProxyType(groups))
        if set(self.sent_theta) != set(self.upload_theta) or any(
                self.sent_theta[n].shape != self.upload_theta[n].shape for n in self.sent_theta):
            raise ValueError("Observation.sent_theta and upload_theta must hold the same groups "
                             "with the same shapes")
        object.__setattr__(self, "round", int(self.round))
        object.__setattr__(self, "clients", readonly(clients))
        object.__setattr__(self, "sent", readonly(sent))
        object.__setattr__(self, "upload", readonly(upload))
        object.__setattr__(self, "participated", readonly(part))

    @property
    def n_clients(self) -> int:
        return int(self.clients.shape[0])

    @property
    def n_items(self) -> int:
        return int(self.sent.shape[1])

    @property
    def dim(self) -> int:
        return int(self.sent.shape[2])

    def delta(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """upload - sent for clients ``start:stop``, in float64, shape (stop-start, m, d)."""
        sl = slice(start, stop)
        return self.upload[sl].astype(np.float64) - self.sent[sl].astype(np.float64)


#: ``PublicKnowledge.extra["observation"]`` of a run whose recording holds the released
#: aggregate of a central mechanism (every client's row is the same two tables) instead
#: of each client's upload
AGGREGATE_OBSERVATION = "released-aggregate"


def observes_aggregate(public: PublicKnowledge) -> bool:
    """Whether the recorded rows are a central mechanism's released aggregate."""
    return public.extra.get("observation") == AGGREGATE_OBSERVATION


@dataclass(frozen=True)
class PublicKnowledge:
    """Hyper-parameters the server knows (docs/design.md, section 5 threat model).

    ``privacy_params`` holds the mode's public parameters, e.g. ``clip``,
    ``noise_scale``, ``eps_round``, ``delta``. Nothing secret belongs here: no
    seed (it would let the server regenerate the noise), no user vectors.
    """

    n_clients: int
    n_items: int
    dim: int
    lr: float
    local_epochs: int
    batch_size: int
    num_negatives: int
    method: str
    privacy_mode: str = "none"
    privacy_params: Mapping[str, Any] = field(default_factory=dict)
    backbone: str = "mf"
    optimizer: str = "adam"
    protocol: str = "strict"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("n_clients", "n_items", "dim", "local_epochs", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"PublicKnowledge.{name} must be >= 1")
        if int(self.num_negatives) < 0:
            raise ValueError("PublicKnowledge.num_negatives must be >= 0")
        if not (math.isfinite(float(self.lr)) and float(self.lr) > 0):
            raise ValueError("PublicKnowledge.lr must be finite and > 0")
        object.__setattr__(self, "privacy_params", MappingProxyType(dict(self.privacy_params)))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["privacy_params"] = dict(self.privacy_params)
        out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PublicKnowledge:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown public-knowledge keys: {', '.join(unknown)}")
        return cls(**dict(data))


def save_observation(run_dir: str | Path, obs: Observation, *, part: int | None = None,
                     sent_dtype: str = "float32", delta_dtype: str = "float32",
                     compress: bool = True) -> Path:
    """Write ``obs`` to ``run_dir/observations/round_XXXX[_part_YYYY].npz`` atomically.

    ``sent_dtype`` / ``delta_dtype`` are "float32" or "float16". ``part`` lets a
    simulator that records a round in client chunks write each chunk as it goes.
    """
    if sent_dtype not in _STORE_DTYPES or delta_dtype not in _STORE_DTYPES:
        raise ValueError(f"store dtypes must be one of {sorted(_STORE_DTYPES)}")
    delta = obs.upload.astype(np.float64) - obs.sent.astype(np.float64)
    arrays = {
        "format_version": np.array(FORMAT_VERSION),
        "round": np.array(obs.round, dtype=np.int64),
        "clients": obs.clients,
        "participated": obs.participated,
        "delta": delta.astype(_STORE_DTYPES[delta_dtype]),
    }
    if obs.n_clients > 1 and _all_equal(obs.sent):
        # one shared table (FedAvg-style methods send every client the same): store it once
        arrays["sent_shared"] = obs.sent[0].astype(_STORE_DTYPES[sent_dtype])
    else:
        arrays["sent"] = obs.sent.astype(_STORE_DTYPES[sent_dtype])
    for prefix, shared, groups in ((DENSE, DENSE_SHARED, obs.sent_dense),
                                    (THETA, THETA_SHARED, obs.sent_theta)):
        for name, value in groups.items():
            # small groups; one copy when every client got the same (FedAvg)
            if obs.n_clients > 1 and _all_equal(value):
                arrays[f"{shared}{name}"] = value[0].astype(np.float32)
            else:
                arrays[f"{prefix}{name}"] = value.astype(np.float32)
    for name, value in obs.upload_theta.items():  # exact zeros stay zeros, as for the table
        arrays[f"{THETA_DELTA}{name}"] = (value.astype(np.float64) - obs.sent_theta[name].astype(
            np.float64)).astype(np.float32)
    stored_sent = arrays.get("sent", arrays.get("sent_shared"))
    if not np.isfinite(arrays["delta"]).all() or not np.isfinite(stored_sent).all():
        raise ValueError(f"round {obs.round}: values overflow {sent_dtype}/{delta_dtype}")
    path = Path(run_dir) / OBS_DIR / round_name(obs.round, part)
    return write_npz(path, arrays, compress=compress)


def _all_equal(sent: np.ndarray) -> bool:
    """Whether every client's sent table is the same (checked client by client)."""
    first = sent[0]
    return all(np.array_equal(first, sent[j]) for j in range(1, sent.shape[0]))


def _observation_from(path: Path) -> Observation:
    z = load_npz(path, ("round", "clients", "participated", "delta"))
    delta = z["delta"].astype(np.float32)
    if "sent_shared" in z:
        # a read-only broadcast view: the shared table is not copied once per client
        sent = np.broadcast_to(z["sent_shared"].astype(np.float32), delta.shape)
    elif "sent" in z:
        sent = z["sent"].astype(np.float32)
    else:
        raise UserError(f"{path}: malformed file, missing sent")
    upload = sent + delta
    k = delta.shape[0]

    def groups(prefix: str, shared: str) -> dict[str, np.ndarray]:
        out = {key[len(prefix):]: z[key].astype(np.float32) for key in z
               if key.startswith(prefix)}
        for key in z:
            if key.startswith(shared):
                table = z[key].astype(np.float32)
                out[key[len(shared):]] = np.broadcast_to(table, (k, *table.shape))
        return out

    theta = groups(THETA, THETA_SHARED)
    theta_up = {name: theta[name] + z[f"{THETA_DELTA}{name}"].astype(np.float32)
                for name in theta if f"{THETA_DELTA}{name}" in z}
    try:
        return Observation(int(z["round"]), z["clients"], sent, upload, z["participated"],
                           groups(DENSE, DENSE_SHARED), theta, theta_up)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from e


def _shared_table(sent: np.ndarray) -> np.ndarray | None:
    """The one (m, d) table behind a broadcast (k, m, d) view, else None."""
    return sent[0] if sent.ndim == 3 and sent.strides[0] == 0 else None


def _concat_observations(obs: list[Observation]) -> Observation:
    if len(obs) == 1:
        return obs[0]
    shared = [_shared_table(o.sent) for o in obs]
    first = shared[0]
    if first is not None and all(t is not None and np.array_equal(first, t) for t in shared):
        k = sum(o.n_clients for o in obs)
        sent = np.broadcast_to(first, (k, *first.shape))
    else:
        sent = np.concatenate([o.sent for o in obs])
    return Observation(obs[0].round, np.concatenate([o.clients for o in obs]),
                       sent,
                       np.concatenate([o.upload for o in obs]),
                       np.concatenate([o.participated for o in obs]),
                       *(_concat_groups(obs, attr)
                         for attr in ("sent_dense", "sent_theta", "upload_theta")))


def _concat_groups(obs: list[Observation], attr: str) -> dict[str, np.ndarray]:
    """One group mapping (``sent_dense``, ``sent_theta`` or ``upload_theta``) of the joined
    parts; parts of clients that sat the round out carry none, and get zeros."""
    have = [o for o in obs if getattr(o, attr)]
    names = sorted(getattr(have[0], attr)) if have else []
    out = {}
    for name in names:
        ref = np.asarray(getattr(have[0], attr)[name])
        out[name] = np.concatenate([
            np.asarray(getattr(o, attr)[name]) if name in getattr(o, attr)
            else np.zeros((o.n_clients, *ref.shape[1:]), dtype=ref.dtype) for o in obs])
    return out


def load_observations(run_dir: str | Path, rounds: Sequence[int] | None = None
                      ) -> list[Observation]:
    """All recorded observations (or those of ``rounds``), sorted by round; parts are joined."""
    out = []
    for r, paths in round_files(Path(run_dir) / OBS_DIR, rounds).items():
        parts = [_observation_from(p) for p in paths]
        if any(o.round != r for o in parts):
            raise UserError(f"{paths[0]}: file name and stored round disagree")
        try:
            out.append(_concat_observations(parts))
        except ValueError as e:
            raise UserError(f"round {r} observations: {e}") from e
    return out


def save_public(run_dir: str | Path, public: PublicKnowledge) -> Path:
    """Write ``run_dir/observations/public.json`` atomically."""
    return write_json(Path(run_dir) / OBS_DIR / PUBLIC_FILE, public.to_dict())


def load_public(run_dir: str | Path) -> PublicKnowledge:
    """Read ``run_dir/observations/public.json``."""
    path = Path(run_dir) / OBS_DIR / PUBLIC_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return PublicKnowledge.from_dict(data)
    except FileNotFoundError as e:
        raise UserError(f"{path}: missing (was the run recorded?)") from e
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: malformed ({e})") from e
