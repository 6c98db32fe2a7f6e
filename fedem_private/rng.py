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

import math
from collections.abc import Callable
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
# (b + 0.5) 2**-53 rounds to 1.0 at b = 2**53 - 1 (ties to even): capped at the largest
# double below 1, so the interval is open at both ends
_MAX_U = 1.0 - 2.0**-53


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
    TUNE_SCORE = 23  # tune's private mode: the Gaussian noise on a trial's validation hit count
    TUNE_TRIALS = 24  # tune's private mode: the number of trials, drawn before the search
    SYNTHETIC_POP = 25  # a calibrated population: user u's factor, activity, items, order


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


def identities(clients: int | np.ndarray) -> np.ndarray:
    """Clients' identity keys (int64): ``clients`` itself, or for a count n the indices
    0..n-1 (a population whose identities are its positions). The participation draws
    are keyed by these, so that removing one client moves no other's draw."""
    if np.ndim(clients) == 0:
        return np.arange(int(clients), dtype=np.int64)
    return np.asarray(clients, dtype=np.int64)


def bits(k: np.ndarray, counter: np.ndarray | int) -> np.ndarray:
    """64 random bits for each (key, counter) pair; broadcasts."""
    with np.errstate(over="ignore"):
        return _mix(_u64(k) + (_u64(counter) + np.uint64(1)) * _GOLDEN)


def uniform(k: np.ndarray, counter: np.ndarray | int) -> np.ndarray:
    """Uniform float64 in the open interval (0, 1) for each (key, counter)."""
    b = bits(k, counter) >> _S11
    return np.minimum((b.astype(np.float64) + 0.5) * _INV53, _MAX_U)


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


def smallest(u: np.ndarray, k: int) -> np.ndarray:
    """The sorted positions of the ``k`` smallest values of the 1-d ``u``, ties to the lower
    position: ``np.sort(np.argsort(u, kind="stable")[:k])`` exactly, by one partition in
    O(n) instead of a sort in O(n log n) (a cohort of 1,000 out of 10^6 users' draws: 1.4 ms
    against 87 ms). tests/test_rng_keyed.py checks it against that sort, ties included."""
    u = np.asarray(u)
    n, k = u.shape[0], int(k)
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.arange(0)
    cut = np.partition(u, k - 1)[k - 1]
    below = np.flatnonzero(u < cut)
    level = np.flatnonzero(u == cut)[: k - below.shape[0]]
    return np.sort(np.concatenate([below, level]))


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


# ---------------------------------------------------------------------------------------------
# The same generator as tensor operations on any device (docs/design.md section 16).
#
# torch has no uint64 arithmetic, but int64 addition and multiplication wrap modulo 2**64 in
# two's complement, so they compute the uint64 results bit for bit; only the right shift
# differs (arithmetic in torch), so every shift is masked to its logical value. The mixer, the
# key chain and the counter step are those of the numpy functions above: ``uniform_t`` equals
# ``uniform`` bit for bit, on the CPU and on a GPU alike (tests/test_rng_keyed.py).
# ---------------------------------------------------------------------------------------------


def _signed(u: int | np.unsignedinteger) -> int:
    """The int64 with the same 64 bits as the uint64 ``u``."""
    v = int(u) & 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


_T_GOLDEN, _T_M1, _T_M2 = _signed(_GOLDEN), _signed(_M1), _signed(_M2)
# elements per block of a grid draw on the CPU: a block's int64 passes (a dozen of them)
# stay in the core's cache instead of streaming the whole grid through memory each time
_CPU_BLOCK = 1 << 15
_DEVICE_BLOCK = 1 << 26  # elsewhere: one kernel per pass over (nearly) the whole grid


EPOCH_SHIFT = 32  # counter of position i in epoch e: (e << 32) + i
INDEX_BITS = 20  # a client's samples per round: fewer than 2**20
_RANDOM_BITS = 63 - INDEX_BITS  # the sort key's random part, above the position


_CONSTS: dict[torch.device, dict[str, torch.Tensor]] = {}


def _beside(device: torch.device) -> dict[str, torch.device]:
    """Factory keywords for a new tensor on ``device``: none for the CPU (torch's default),
    so that a CPU draw is never taken for one made for the run's device."""
    return {} if device.type == "cpu" else {"device": device}


def _consts(device: torch.device) -> dict[str, torch.Tensor]:
    """The mixer's constants as 0-dim int64 tensors on ``device``: torch's CPU kernels
    take a vectorised path for a tensor operand, a scalar one per element for a Python int
    (about 50 times slower for shifts)."""
    have = _CONSTS.get(device)
    if have is None:
        vals = {"s30": 30, "s27": 27, "s31": 31, "s11": 11, "k30": (1 << 34) - 1,
                "k27": (1 << 37) - 1, "k31": (1 << 33) - 1, "k11": (1 << 53) - 1,
                "s21": 64 - _RANDOM_BITS, "k21": (1 << _RANDOM_BITS) - 1, "s20": INDEX_BITS,
                "m1": _T_M1, "m2": _T_M2, "golden": _T_GOLDEN}
        have = {k: torch.tensor(v, dtype=torch.int64, **_beside(device))
                for k, v in vals.items()}
        _CONSTS[device] = have
    return have


def _mix_t(x: torch.Tensor, tmp: torch.Tensor | None = None) -> torch.Tensor:
    """SplitMix64 finaliser on an int64 tensor, in place (x is overwritten and returned);
    ``tmp`` (x's shape) is scratch space. Right shifts are masked to their logical value."""
    c = _consts(x.device)
    tmp = torch.empty_like(x) if tmp is None else tmp
    for shift, mult in (("30", "m1"), ("27", "m2"), ("31", None)):
        torch.bitwise_right_shift(x, c["s" + shift], out=tmp)
        tmp &= c["k" + shift]
        x ^= tmp
        if mult is not None:
            x *= c[mult]
    return x


def key_t(seed: int, stream: int, round_: int, clients: torch.Tensor) -> torch.Tensor:
    """:func:`key` of (seed, stream, round, c) for every c of the int64 tensor ``clients``,
    as int64 (the uint64 key's bits), on ``clients``' device."""
    with np.errstate(over="ignore"):
        k = _mix(_u64(seed) + _GOLDEN)
        k = _mix(k ^ (_u64(int(stream)) * _GOLDEN))
        k = _mix(k ^ ((_u64(round_) + np.uint64(1)) * _M1))
    c = clients.to(torch.int64) + 1
    c *= _T_M2
    c ^= _signed(k)
    return _mix_t(c)


def _uniform_from_keys(k: torch.Tensor, ctr: torch.Tensor) -> torch.Tensor:
    """:func:`uniform` on tensors: k and ctr int64, broadcast together; float64 in (0, 1)."""
    c = _consts(k.device)
    x = _bits_t(k, ctr)
    torch.bitwise_right_shift(x, c["s11"], out=x)
    x &= c["k11"]
    u = x.to(torch.float64)
    u += 0.5
    u *= _INV53
    return u.clamp_(max=_MAX_U)


def _as_clients(clients: torch.Tensor | np.ndarray | list[int],
                device: torch.device | str | None) -> tuple[torch.Tensor, dict]:
    """clients as an int64 tensor, and the keyword arguments that put new tensors beside it:
    on ``device``, else on the device of a ``clients`` tensor, else torch's default (the
    CPU; no ``device`` argument at all, so a draw made for the CPU is not taken for one
    made for the run's device)."""
    if device is None and isinstance(clients, torch.Tensor) and clients.device.type != "cpu":
        device = clients.device
    kw = {} if device is None else {"device": torch.device(device)}
    if isinstance(clients, torch.Tensor):
        return clients.to(dtype=torch.int64, **kw), kw
    return torch.as_tensor(np.asarray(clients, dtype=np.int64), **kw), kw


def uniform_t(seed: int, stream: int, round_: int, clients: torch.Tensor | np.ndarray,
              counters: int | torch.Tensor, device: torch.device | str | None = None
              ) -> torch.Tensor:
    """Keyed uniforms in (0, 1) for a chunk of clients in one call, on ``device``.

    ``counters`` is n (row c holds counters 0 .. n-1 of clients[c]: a (k, n) grid) or an
    int64 tensor broadcast against ``clients[:, None]`` ((n,) or (k, n)). Entry (c, j) is
    ``uniform(key(seed, stream, round, clients[c]), counter)`` exactly, whatever the
    device, the chunk or the grid's width (Salmon et al. 2011: a draw is a function of its
    key and its position alone).
    """
    cl, kw = _as_clients(clients, device)
    k = key_t(seed, stream, round_, cl)[:, None]
    if isinstance(counters, int):
        ctr = torch.arange(counters, dtype=torch.int64, **kw)[None, :]
    else:
        ctr = counters.to(dtype=torch.int64, **kw)
        ctr = ctr[None, :] if ctr.dim() == 1 else ctr
    return _blocked(k, ctr, torch.float64, _uniform_from_keys)


def uniform_keyed_t(seed: int, stream: int, round_: int, clients: torch.Tensor,
                    counters: torch.Tensor) -> torch.Tensor:
    """``uniform(key(seed, stream, round, clients[j]), counters[j])`` for every j of the
    int64 tensors ``clients`` and ``counters`` (same shape: a ragged draw laid out flat),
    on their device, in one call."""
    return _uniform_from_keys(key_t(seed, stream, round_, clients), counters)


def _blocked(k: torch.Tensor, ctr: torch.Tensor, dtype: torch.dtype,
             draw: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """draw(keys, counters) over the (rows, n) grid that k (rows, 1) and ctr ((1, n) or
    (rows, n)) broadcast to, in blocks of rows and columns (``_CPU_BLOCK`` elements on
    the CPU), written into one output of ``dtype``. Entries are elementwise functions of
    their key and counter, so blocking changes no number."""
    rows, n = torch.broadcast_shapes(k.shape, ctr.shape)
    out = k.new_empty((rows, n), dtype=dtype)  # beside the keys
    block = _CPU_BLOCK if k.device.type == "cpu" else _DEVICE_BLOCK
    per_row = max(1, block // max(n, 1))
    cols = min(max(n, 1), block)
    for r in range(0, rows, per_row):
        kb = k[r: r + per_row]
        for c in range(0, n, cols):
            cb = ctr[:, c: c + cols] if ctr.shape[0] == 1 else ctr[r: r + per_row, c: c + cols]
            out[r: r + per_row, c: c + cols] = draw(kb, cb)
    return out




def _bits_t(k: torch.Tensor, ctr: torch.Tensor) -> torch.Tensor:
    """:func:`bits` on tensors (int64 holding the uint64 bits), k and ctr broadcast."""
    c = _consts(k.device)
    x = torch.add(ctr, 1)
    x *= c["golden"]
    x = torch.add(x, k)  # the broadcast shape, a fresh tensor
    return _mix_t(x)


def _sort_key(k: torch.Tensor, ctr: torch.Tensor) -> torch.Tensor:
    """The top 43 of the keyed 64 bits, as a non-negative int64, shifted above the
    position's 20 bits (the low bits are left 0 for the position)."""
    c = _consts(k.device)
    x = _bits_t(k, ctr)
    torch.bitwise_right_shift(x, c["s21"], out=x)
    x &= c["k21"]
    torch.bitwise_left_shift(x, c["s20"], out=x)
    return x


def _sort_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of an int64 tensor sorted ascending, in place. The values sorted here are
    distinct, so every sort returns the same rows: numpy's vectorised sort on the CPU
    (several times faster than torch's there), torch's elsewhere."""
    if x.device.type == "cpu":
        x.numpy().sort(axis=-1)
        return x
    return torch.sort(x, dim=-1).values


def epoch_orders_t(seed: int, stream: int, round_: int, clients: torch.Tensor | np.ndarray,
                   lengths: torch.Tensor | np.ndarray, first_epoch: int, epochs: int,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Sample orders of epochs first_epoch .. first_epoch + epochs - 1 for a chunk, at once.

    Returns (k, epochs, max n) int64: row (c, e)'s first lengths[c] entries are a
    permutation of 0 .. lengths[c] - 1 and the padding holds lengths[c] .. max n - 1.
    Position i of epoch e gets the keyed 64 bits at counter (e << 32) + i; the order
    sorts the positions by the top 43 of them (a sort of i.i.d. uniform keys is a
    uniform permutation), the position itself in the low 20 bits of the sort key, so
    keys are distinct and every sort (numpy, torch, CPU, GPU) agrees; two equal 43-bit
    draws (probability about n**2 / 2**44 per row) keep their positions' order. An
    epoch's order depends only on (seed, stream, round, client, epoch): not on the chunk,
    the padding or how many epochs are drawn. Rows are sorted in groups of similar length
    (:func:`_width_buckets`: a few calls per chunk, none per client), so a chunk with a
    wide spread of lengths draws and sorts about twice its real entries, not k x max n.
    """
    cl, kw = _as_clients(clients, device)
    n = lengths.to(dtype=torch.int64, **kw) if isinstance(lengths, torch.Tensor) else \
        torch.as_tensor(np.asarray(lengths, dtype=np.int64), **kw)
    k = int(cl.shape[0])
    width = int(n.max()) if k else 0
    if width >= 1 << INDEX_BITS:
        raise ValueError(f"a client has {width} samples; epoch orders allow < 2**{INDEX_BITS}")
    out = torch.arange(width, dtype=torch.int64, **kw).expand(k, epochs, width).clone()
    keys = key_t(seed, stream, round_, cl)
    for rows, w in _width_buckets(n, width):
        out[rows, :, :w] = _bucket_orders(keys[rows], n[rows], w, first_epoch, epochs)
    return out


def _width_buckets(n: torch.Tensor, width: int) -> list[tuple[torch.Tensor, int]]:
    """Rows grouped by the power of two at or above their length (capped at ``width``):
    (row indices, grid width) per group, so that a group's padded grid is at most about
    twice its real entries whatever the spread of lengths in the chunk."""
    if width == 0:
        return []
    cap = torch.clamp(n, min=1)
    w = torch.minimum(torch.exp2(torch.ceil(torch.log2(cap.double()))).long(),
                      torch.full_like(cap, width))
    return [(torch.nonzero(w == v).flatten(), int(v)) for v in torch.unique(w).tolist()]


def _bucket_orders(keys: torch.Tensor, n: torch.Tensor, w: int, first_epoch: int,
                   epochs: int) -> torch.Tensor:
    """:func:`epoch_orders_t` for rows of lengths <= w, on a (rows, epochs, w) grid."""
    kw = _beside(keys.device)
    pos = torch.arange(w, dtype=torch.int64, **kw)
    ep = torch.arange(first_epoch, first_epoch + epochs, dtype=torch.int64, **kw)
    ctr = ((ep[:, None] << EPOCH_SHIFT) + pos[None, :]).reshape(1, -1)
    x = _blocked(keys[:, None], ctr, torch.int64, _sort_key).reshape(-1, epochs, w)
    pad = ((1 << _RANDOM_BITS) - 1) << INDEX_BITS  # the largest random part: sorts last
    x.masked_fill_((pos[None, :] >= n[:, None])[:, None, :], pad)
    x |= pos
    x = _sort_rows(x)
    x &= torch.full((), (1 << INDEX_BITS) - 1, dtype=torch.int64, **kw)
    return x


def bernoulli_t(seed: int, stream: int, round_: int, clients: torch.Tensor | np.ndarray,
                counters: int | torch.Tensor, rate: float,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Poisson-sampling masks: keyed uniform < rate, (k, n) bool (see :func:`uniform_t`)."""
    return uniform_t(seed, stream, round_, clients, counters, device) < rate


def normal_t(seed: int, stream: int, round_: int, clients: torch.Tensor | np.ndarray, n: int,
             device: torch.device | str | None = None) -> torch.Tensor:
    """(k, n) standard normals, Box-Muller on pairs of keyed uniforms (both outputs used).

    Pair p takes uniforms u1, u2 at counters 2p, 2p + 1 and gives entries 2p, 2p + 1:
    sqrt(-2 ln u1) (cos 2 pi u2, sin 2 pi u2) (Box and Muller 1958), so a row's first
    entries do not depend on n. u1 > 0, so every draw is finite (|x| <= 8.6).
    """
    u = uniform_t(seed, stream, round_, clients, 2 * ((n + 1) // 2), device)
    u1, u2 = u[:, 0::2], u[:, 1::2]
    r = u1.log_().mul_(-2.0).sqrt_()
    theta = u2.mul_(2.0 * math.pi)
    out = torch.stack((r * torch.cos(theta), r * torch.sin(theta)), dim=2)
    return out.reshape(u.shape[0], -1)[:, :n]


def laplace_t(seed: int, stream: int, round_: int, clients: torch.Tensor | np.ndarray, n: int,
              device: torch.device | str | None = None) -> torch.Tensor:
    """(k, n) Laplace(0, 1) draws by the inverse CDF of keyed uniforms u in (0, 1):
    x = -sign(u - 1/2) ln(1 - 2 |u - 1/2|), as :func:`laplace_from_uniform`. u is never 0
    or 1, so every draw is finite (|x| <= 36.7)."""
    c = uniform_t(seed, stream, round_, clients, n, device).sub_(0.5)
    sign = torch.sign(c)
    return c.abs_().mul_(-2.0).log1p_().mul_(sign).neg_()


def client_uniform(seed: int, stream: int, round_: int, clients: np.ndarray, n: int,
                   dtype: torch.dtype = torch.float64,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """(len(clients), n) uniforms in (0, 1); row c depends on (seed, stream, round,
    clients[c]) alone (:func:`uniform_t`, one call for the chunk)."""
    return uniform_t(seed, stream, round_, clients, n, device).to(dtype)


def client_noise(seed: int, round_: int, clients: np.ndarray, n: int, kind: str,
                 scale: float, stream: int = Stream.NOISE,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Noise for many clients in one call: (len(clients), n) float64 tensor on ``device``
    (None: the CPU).

    kind is "laplace" (scale b: density exp(-|x|/b) / 2b) or "gaussian" (std sigma).
    Client c's noise is a function of (seed, stream, round, clients[c]) alone, keyed at
    full width (docs/design.md section 5), so chunking and client order do not change it:
    :func:`laplace_t` (inverse CDF) or :func:`normal_t` (Box-Muller), scaled.
    """
    if kind not in ("laplace", "gaussian"):
        raise ValueError(f"unknown noise kind {kind!r}")
    draw = laplace_t if kind == "laplace" else normal_t
    return draw(seed, stream, round_, clients, n, device).mul_(scale)
