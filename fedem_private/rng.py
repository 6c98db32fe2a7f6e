"""Counter-based random numbers keyed by (seed, stream, round, client, counter).

Every random draw in a simulation is a pure function of its key, so results do
not depend on batching, chunking, client order or the number of threads: the
vectorised engine and the per-client reference loop see the same numbers.

The generator is SplitMix64's finaliser applied to a key built by chaining the
fields through the same mixer (a counter-based design in the spirit of
Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011). It is
a statistical generator for simulation, not a cryptographic one.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / float(1 << 53)


class Stream(IntEnum):
    """Independent named streams; adding a new one never shifts the others."""

    INIT = 1
    NEGATIVES = 2
    SHUFFLE = 3
    PARTICIPATION = 4
    EVAL = 5
    SPLIT = 6
    NOISE = 7
    ADAPTER_INIT = 8
    SYNTHETIC = 9
    ATTACK = 10
    MODEL_INIT = 11  # backbone parts beyond p_u and the item table (MLP, score head)
    FEDMERGE_INIT = 12  # FedMerge's K initial table perturbations (server)
    POISSON = 13  # cdp-gaussian's Poisson client sampling
    CENTRAL_NOISE = 14  # cdp-gaussian's one noise draw on the aggregate per round
    PRETRAIN = 15  # FedPEFT's server-side autoencoder over item attributes (its weights)
    HOLDOUT_FOLDS = 16  # --adapter-objective holdout: each client's fixed fold permutation
    ADAPTER_SHUFFLE = 17  # holdout: the order of the adapter's batches over the withheld fold
    AGG_SAMPLE = 18  # --agg-clients-ratio: the uploads similarity aggregation takes (server)
    DPSGD_SAMPLE = 19  # ldp-dpsgd: each local step's Poisson sample of the client's positives
    DPSGD_NEGATIVES = 20  # ldp-dpsgd: each step's data-independent negatives (whole catalogue)
    DPSGD_NOISE = 21  # ldp-dpsgd: the Gaussian noise on every step's gradient sum
    CANARY = 22  # cdp-gaussian's one-shot canary audit: the canaries' random directions


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrap-around arithmetic)."""
    x = x ^ (x >> _S30)
    x = x * _M1
    x = x ^ (x >> _S27)
    x = x * _M2
    return x ^ (x >> _S31)


def _u64(a: np.ndarray | int) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype != np.uint64:
        arr = arr.astype(np.int64).astype(np.uint64)
    return arr


def key(seed: int, stream: int, round_: int | np.ndarray, client: int | np.ndarray) -> np.ndarray:
    """Hash (seed, stream, round, client) to a uint64 key; broadcasts over arrays."""
    with np.errstate(over="ignore"):
        k = _mix(_u64(seed) + _GOLDEN)
        k = _mix(k ^ (_u64(int(stream)) * _GOLDEN))
        k = _mix(k ^ ((_u64(round_) + np.uint64(1)) * _M1))
        k = _mix(k ^ ((_u64(client) + np.uint64(1)) * _M2))
    return k


def bits(k: np.ndarray, counter: np.ndarray | int) -> np.ndarray:
    """64 random bits for each (key, counter) pair; broadcasts."""
    with np.errstate(over="ignore"):
        return _mix(_u64(k) + (_u64(counter) + np.uint64(1)) * _GOLDEN)


def uniform(k: np.ndarray, counter: np.ndarray | int) -> np.ndarray:
    """Uniform float64 in the open interval (0, 1) for each (key, counter)."""
    b = bits(k, counter) >> _S11
    return (b.astype(np.float64) + 0.5) * _INV53


def uniform_grid(seed: int, stream: int, round_: int, clients: np.ndarray, n: int,
                 offset: int = 0) -> np.ndarray:
    """(len(clients), n) uniforms; row c uses counters offset..offset+n-1 of client c."""
    k = key(seed, stream, round_, np.asarray(clients))[:, None]
    ctr = np.arange(offset, offset + n, dtype=np.int64)[None, :]
    return uniform(k, ctr)


def randbelow(u: np.ndarray, high: np.ndarray | int) -> np.ndarray:
    """Map uniforms in (0,1) to integers in [0, high); exact enough for high < 2**40."""
    h = np.asarray(high, dtype=np.int64)
    return np.minimum((u * h).astype(np.int64), h - 1)


def laplace_from_uniform(u: np.ndarray, scale: float) -> np.ndarray:
    """Inverse-CDF Laplace(0, scale) from uniforms in (0, 1)."""
    c = u - 0.5
    return -scale * np.sign(c) * np.log1p(-2.0 * np.abs(c))


def normal_from_uniform(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Box-Muller standard normals from two independent uniform arrays."""
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# The CPU ``torch.Generator`` is a Mersenne Twister whose ``manual_seed`` keeps only the low
# 32 bits of its argument: seeding it with a 64-bit key would make keys that share their low
# half draw identical numbers (two noise vectors whose difference is noise-free). Instead its
# whole 624-word state is written from the full 64-bit key. The state layout of the pinned
# torch (2.13) is checked once against ``manual_seed`` (:func:`_mt_template`).
_MT_WORDS = 624
_MT_FIRST = 3  # uint64 slot of state[0]: after seed_ (u64), left_ + seeded_, next_
_MT_INDEX = np.arange(_MT_WORDS, dtype=np.uint64)
_LOW32 = np.uint64(0xFFFFFFFF)
_TEMPLATE: np.ndarray | None = None


def _mt_template() -> np.ndarray:
    """A fresh CPU generator's state bytes, after checking where its 624 words lie.

    ``manual_seed(s)`` sets state[0] = s mod 2**32 and state[1] = 1812433253 (s xor
    s >> 30) + 1 mod 2**32 (the MT19937 seeding recurrence); finding them in the slots
    this module writes proves the layout. Any other layout raises instead of drawing
    from a state half written.
    """
    global _TEMPLATE
    if _TEMPLATE is None:
        s = 0x2545F491
        raw = torch.Generator().manual_seed(s).get_state().numpy().copy()
        words = raw.view(np.uint64) if raw.size % 8 == 0 else None
        second = (1812433253 * (s ^ (s >> 30)) + 1) & 0xFFFFFFFF
        if (words is None or words.size < _MT_FIRST + _MT_WORDS or int(words[_MT_FIRST]) != s
                or int(words[_MT_FIRST + 1]) != second):
            raise RuntimeError("torch's CPU generator state has an unexpected layout; "
                               "fedem_private.rng cannot key it at full width")
        _TEMPLATE = raw
    return _TEMPLATE


def mt_words(k: np.ndarray | int) -> np.ndarray:
    """The 624 32-bit words (as uint64) of the generator state keyed by ``k``: word i is the
    low half of bits(k, i). Distinct 64-bit keys give distinct states (word 0 alone is a
    bijection of the key's mix, and 624 words are compared)."""
    return bits(np.uint64(int(k)), _MT_INDEX) & _LOW32


def generator(seed: int, stream: int, round_: int, client: int) -> torch.Generator:
    """A torch CPU generator whose whole state is keyed by (seed, stream, round, client).

    Used for bulk draws (noise on whole tables, shuffles). All 64 bits of the key
    reach the state (see :func:`mt_words`): no two distinct keys share a stream, so no
    two (round, client) pairs of a run draw the same noise (docs/design.md section 5,
    "Randomness"). Seeding costs about 20 microseconds per generator.
    """
    k = int(key(seed, stream, round_, client))
    raw = _mt_template().copy()
    words = raw.view(np.uint64)
    words[0] = np.uint64(k)  # the seed_ field: informational, as initial_seed() reports
    words[_MT_FIRST: _MT_FIRST + _MT_WORDS] = mt_words(k)
    g = torch.Generator()
    g.set_state(torch.from_numpy(raw))
    return g


def client_uniform(seed: int, stream: int, round_: int, clients: np.ndarray, n: int,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(len(clients), n) uniforms in [0, 1); row c depends on (seed, stream, round, clients[c])."""
    out = torch.empty((len(clients), n), dtype=dtype)
    for row, c in enumerate(np.asarray(clients).tolist()):
        out[row].uniform_(0.0, 1.0, generator=generator(seed, stream, round_, c))
    return out


def client_noise(seed: int, round_: int, clients: np.ndarray, n: int, kind: str,
                 scale: float, stream: int = Stream.NOISE) -> torch.Tensor:
    """Noise for many clients in one call: (len(clients), n) float64 tensor.

    kind is "laplace" (scale b: density exp(-|x|/b) / 2b) or "gaussian" (std
    sigma). Client c's noise is a function of (seed, stream, round, clients[c])
    alone, so chunking and client order do not change it.

    Laplace uses the inverse CDF on one uniform u in [0, 1) per entry, computed
    row by row in place (a row stays in cache): with v = 2u - 1 (exact in
    float64), x = -b * sign(v) * log(1 - |v|). |v| is capped at 1 - 2**-53 so
    the single grid point u = 0 gives a large but finite draw (|x| <= 36.8 b).
    """
    if kind not in ("laplace", "gaussian"):
        raise ValueError(f"unknown noise kind {kind!r}")
    ids = np.asarray(clients).tolist()
    out = torch.empty((len(ids), n), dtype=torch.float64)
    if kind == "gaussian":
        for row, c in enumerate(ids):
            out[row].normal_(0.0, scale, generator=generator(seed, stream, round_, c))
        return out
    sign = torch.empty(n, dtype=torch.float64)
    for row, c in enumerate(ids):
        r = out[row]
        r.uniform_(0.0, 1.0, generator=generator(seed, stream, round_, c))
        r.mul_(2.0).sub_(1.0)
        torch.sign(r, out=sign)
        r.abs_().clamp_(max=1.0 - 2.0**-53).neg_().log1p_().mul_(sign).mul_(-scale)
    return out
