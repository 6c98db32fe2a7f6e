"""Secure aggregation over Z_{2^b}, simulated as a protocol (docs/privacy.md, "ddp-skellam").

Bonawitz et al., "Practical secure aggregation for privacy-preserving machine learning"
(CCS 2017), over the sparse graph of SecAgg+ (Bell et al., "Secure single-server
aggregation with (poly)logarithmic overhead", CCS 2020). One round, cohort U1:

0. advertise keys: client u draws two X25519 key pairs, c_u (to encrypt its shares) and
   s_u (its pairwise masks), and sends both public keys (64 bytes);
1. share keys: the server fixes the communication graph: the complete graph when the
   cohort is small (at most ``degree`` + 1 clients), else a Harary graph H(n, k) on a
   keyed random relabelling of the cohort (each client paired with its k nearest ring
   neighbours, SecAgg+); u draws a 16-byte self-mask seed beta_u and a 16-byte seed
   sigma_u from which its mask key s_u is derived (HKDF), Shamir-shares both among its
   neighbours with threshold t (pycryptodome's Shamir over GF(2^128), the primitive
   Flower's secure aggregation uses) and sends each neighbour its share pair encrypted
   with AES-GCM under HKDF(X25519(c_u, c_v)) through the server;
2. masked input: u sends y_u = x_u + PRG(beta_u) + sum_{v in N(u)} +-PRG(k_uv) mod 2^b,
   k_uv = HKDF(X25519(s_u, s_v)) (+ when u < v, - otherwise, so the pairs cancel),
   PRG = the AES-CTR key stream; clients that drop before this step send nothing (U2 the
   senders);
3. unmasking: every surviving sender (U3) answers, for each neighbour w, with its share
   of beta_w if w sent an input and of sigma_w if it did not (never both: an honest client
   checks); the server needs t shares of each; it removes PRG(beta_w) for every sender and
   the pairwise masks the senders added toward each client that dropped before sending.

Too few shares for any of them aborts the round (:class:`SecAggAbort`, one message) and
nothing is released. What the server sees (:class:`RoundView`): the public keys, the
encrypted shares it relays, the masked inputs (uniform over Z_{2^b}^L to it), who dropped
when, the reconstructed seeds and the modular sum. Security (as in the papers): against
an honest-but-curious server and up to t - 1 colluding neighbours of any client, the
server learns only the sum of the senders' inputs. Not simulated: signatures against an
active server, consistency checks, real networking.

Two kinds of randomness (docs/design.md section 5): the server's, keyed by the run seed,
fixes only the graph's relabelling; every client's secrets (both key pairs, beta_u,
sigma_u) come from a :class:`~fedem_private.privacy.client_secrets.ClientSecrets`, which
the server's half never receives: the OS by default, or HKDF of a client-secret seed the
server is not given (a reproducible run). With the run seed, the cohort and the recorded
view alone the masked inputs stay uniform (``tests/test_secure_path.py``). All cryptography
is the ``cryptography`` package's (X25519, HKDF-SHA256, AES-CTR, AES-GCM) and
pycryptodome's (Shamir); nothing here is hand-written crypto.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedem_private import rng
from fedem_private.privacy.client_secrets import ClientSecrets

GRAPH = 1101  # key stream of the graph's relabelling (the server's randomness)
SEED_BYTES = 16
PUBLIC_KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
ID_BYTES = 4
# one encrypted share message: nonce, (sender, receiver ids, share index, two 16-byte
# shares) and the AEAD tag
SHARE_PAYLOAD = 2 * ID_BYTES + 1 + 2 * SEED_BYTES
SHARE_MESSAGE = NONCE_BYTES + SHARE_PAYLOAD + TAG_BYTES
UNMASK_MESSAGE = ID_BYTES + 1 + SEED_BYTES  # (whose share, index, share)


class SecAggAbort(RuntimeError):
    """The round cannot be unmasked (too many dropouts): nothing is released."""


def default_degree(cohort: int) -> int:
    """SecAgg+'s O(log n) degree: 2 ceil(log2 n), even, at least 4 (complete below)."""
    return max(4, 2 * math.ceil(math.log2(max(cohort, 2))))


def default_threshold(degree: int) -> int:
    """t = floor(k / 2) + 1 shares of the k neighbours' (a majority of them)."""
    return degree // 2 + 1


def graph(ids: np.ndarray, degree: int, *, seed: int, round_: int) -> dict[int, np.ndarray]:
    """Each client's neighbours (sorted ids): the complete graph when len(ids) <= degree + 1,
    else the Harary graph H(n, k) (k even) on a keyed random ring order of ``ids``."""
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.shape[0]
    if n <= degree + 1:
        return {int(u): np.delete(ids, i) for i, u in enumerate(ids)}
    if degree % 2:
        raise ValueError(f"a Harary graph's degree must be even, got {degree}")
    order = ids[np.argsort(rng.uniform(rng.key(seed, GRAPH, round_, ids), 0), kind="stable")]
    pos = np.arange(n)
    offs = np.concatenate([np.arange(1, degree // 2 + 1), -np.arange(1, degree // 2 + 1)])
    neigh = order[(pos[:, None] + offs[None, :]) % n]
    return {int(u): np.sort(neigh[i]) for i, u in enumerate(order)}


def _hkdf(material: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(material)


def prg(key: bytes, length: int, bits: int) -> np.ndarray:
    """``length`` uniform values in Z_{2^b} (uint32): the AES-CTR key stream of ``key``
    (16 or 32 bytes), 4 bytes a value, masked to b bits (2^b divides 2^32)."""
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
    stream = enc.update(b"\0" * (4 * length)) + enc.finalize()
    return np.frombuffer(stream, dtype="<u4") & np.uint32((1 << bits) - 1)


def _raw(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass
class Costs:
    """Bytes and seconds of one round: per client up/down (mean over the cohort) and the
    server's CPU time; client time is summed over the clients' own steps."""

    upload_keys: int = 0
    upload_shares: int = 0
    upload_input: int = 0
    upload_unmask: int = 0
    download: int = 0
    client_seconds: float = 0.0
    server_seconds: float = 0.0
    clients: int = 0

    def per_client(self) -> dict[str, float]:
        n = max(self.clients, 1)
        return {"upload_keys_bytes": self.upload_keys / n,
                "upload_shares_bytes": self.upload_shares / n,
                "upload_masked_input_bytes": self.upload_input / n,
                "upload_unmask_bytes": self.upload_unmask / n,
                "download_bytes": self.download / n,
                "client_cpu_seconds": self.client_seconds / n,
                "server_cpu_seconds": self.server_seconds}


@dataclass
class RoundView:
    """What the server saw in one round (what ``--record-rounds`` keeps)."""

    cohort: np.ndarray
    senders: np.ndarray  # U2: their masked inputs reached the server
    survivors: np.ndarray  # U3: they answered the unmasking step
    masked: dict[int, np.ndarray]  # sender id -> masked input (uint32 in Z_{2^b})
    total: np.ndarray | None  # the unmasked modular sum (None: aborted)
    degree: int
    threshold: int
    costs: Costs = field(default_factory=Costs)


@dataclass
class _Client:
    c_key: X25519PrivateKey
    s_key: X25519PrivateKey
    beta: bytes
    sigma: bytes
    c_pub: bytes
    s_pub: bytes


def _mask_key(sigma: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(_hkdf(sigma, b"fedem secagg mask key"))


def _client(secrets: ClientSecrets, round_: int, u: int) -> _Client:
    """Client u's round secrets, from its own secret source (never the run seed)."""
    c_bytes = secrets.material(b"secagg c", round_, u, 32)
    beta = secrets.material(b"secagg beta", round_, u, SEED_BYTES)
    sigma = secrets.material(b"secagg sigma", round_, u, SEED_BYTES)
    c_key = X25519PrivateKey.from_private_bytes(c_bytes)
    s_key = _mask_key(sigma)
    return _Client(c_key, s_key, beta, sigma, _raw(c_key.public_key()),
                   _raw(s_key.public_key()))


def _pair_key(mine: X25519PrivateKey, theirs: bytes, round_: int, info: bytes) -> bytes:
    shared = mine.exchange(X25519PublicKey.from_public_bytes(theirs))
    return _hkdf(shared, info + round_.to_bytes(8, "little"))


def run_round(inputs: np.ndarray, ids: np.ndarray, bits: int, *, seed: int, round_: int,
              degree: int | None = None, threshold: int | None = None,
              drop_before: np.ndarray | tuple[int, ...] = (),
              drop_after: np.ndarray | tuple[int, ...] = (),
              secrets: ClientSecrets | None = None) -> RoundView:
    """One round of secure aggregation of ``inputs`` ((m, L) integers in Z_{2^b}, row i
    client ``ids[i]``); the clients' secrets from ``secrets`` (None: the OS); clients in
    ``drop_before`` drop before sending their masked input, those in ``drop_after`` after
    it (before unmasking). The returned view's ``total`` is the modular sum of the
    senders' inputs; :class:`SecAggAbort` when unmasking fails."""
    ids = np.asarray(ids, dtype=np.int64)
    x = np.asarray(inputs)
    m, length = x.shape
    if ids.shape != (m,) or len(set(ids.tolist())) != m:
        raise ValueError("ids must be distinct, one per input row")
    if not 1 <= bits <= 32:
        raise ValueError(f"bits must be in [1, 32], got {bits}")
    mod = np.uint64(1 << bits)
    k = default_degree(m) if degree is None else int(degree)
    nbrs = graph(ids, k, seed=seed, round_=round_)
    kk = min(k, m - 1)
    t = default_threshold(kk) if threshold is None else int(threshold)
    if not 1 <= t <= max(kk, 1):
        raise ValueError(f"threshold {t} must be in [1, {kk}]")
    costs = Costs(clients=m)
    before = set(np.asarray(drop_before, dtype=np.int64).tolist())
    after = set(np.asarray(drop_after, dtype=np.int64).tolist())
    row = {int(u): i for i, u in enumerate(ids)}

    # 0. advertise keys
    tick = time.perf_counter()
    secrets = ClientSecrets() if secrets is None else secrets
    clients = {int(u): _client(secrets, round_, int(u)) for u in ids}
    costs.client_seconds += time.perf_counter() - tick
    costs.upload_keys += m * 2 * PUBLIC_KEY_BYTES
    costs.download += sum(len(nbrs[u]) * 2 * PUBLIC_KEY_BYTES for u in nbrs)

    # 1. share keys: Shamir shares of beta_u and sigma_u, encrypted for each neighbour
    tick = time.perf_counter()
    held: dict[int, dict[int, tuple[int, bytes, bytes]]] = {int(u): {} for u in ids}
    for u, cl in clients.items():
        mine = nbrs[u]
        n_sh = len(mine)
        beta_sh = Shamir.split(t, n_sh, cl.beta, ssss=False)
        sigma_sh = Shamir.split(t, n_sh, cl.sigma, ssss=False)
        for j, v in enumerate(mine.tolist()):
            key = _pair_key(cl.c_key, clients[v].c_pub, round_, b"fedem secagg enc")
            nonce = (u.to_bytes(ID_BYTES, "little") + v.to_bytes(ID_BYTES, "little")
                     + b"\0" * (NONCE_BYTES - 2 * ID_BYTES))
            payload = (u.to_bytes(ID_BYTES, "little") + v.to_bytes(ID_BYTES, "little")
                       + bytes([beta_sh[j][0]]) + beta_sh[j][1] + sigma_sh[j][1])
            ct = AESGCM(key).encrypt(nonce, payload, None)
            # the server relays ct; v decrypts it with its own half of the agreement
            back = _pair_key(clients[v].c_key, cl.c_pub, round_, b"fedem secagg enc")
            plain = AESGCM(back).decrypt(nonce, ct, None)
            idx = plain[2 * ID_BYTES]
            body = plain[2 * ID_BYTES + 1:]
            held[v][u] = (idx, body[:SEED_BYTES], body[SEED_BYTES:])
            costs.upload_shares += NONCE_BYTES + len(ct)
            costs.download += NONCE_BYTES + len(ct)
    costs.client_seconds += time.perf_counter() - tick

    # 2. masked inputs (every client computes its own; the dropped-before send nothing)
    tick = time.perf_counter()
    pair_mask: dict[tuple[int, int], np.ndarray] = {}
    masked: dict[int, np.ndarray] = {}
    for u, cl in clients.items():
        if u in before:
            continue
        y = x[row[u]].astype(np.uint64) + prg(cl.beta, length, bits)
        for v in nbrs[u].tolist():
            a, b = (u, v) if u < v else (v, u)
            mask = pair_mask.get((a, b))
            if mask is None:
                mask = prg(_pair_key(cl.s_key, clients[v].s_pub, round_, b"fedem secagg mask"),
                           length, bits)
                pair_mask[(a, b)] = mask
            y = y + mask if u < v else y + (mod - mask.astype(np.uint64))
        masked[u] = (y % mod).astype(np.uint32)
    costs.client_seconds += time.perf_counter() - tick
    costs.upload_input += len(masked) * ((length * bits + 7) // 8)
    senders = np.array(sorted(masked), dtype=np.int64)
    survivors = np.array([u for u in senders.tolist() if u not in after], dtype=np.int64)
    view = RoundView(ids, senders, survivors, masked, None, kk, t, costs)

    # 3. unmasking: each survivor answers one share per neighbour (beta or sigma)
    surviving = set(survivors.tolist())
    sent = set(senders.tolist())
    tick = time.perf_counter()
    total = np.zeros(length, dtype=np.uint64)
    for u in senders.tolist():
        total += masked[u]
    for w in ids.tolist():
        answers = [(held[v][w][0], held[v][w][1 if w in sent else 2])
                   for v in nbrs[w].tolist() if v in surviving]
        costs.upload_unmask += len(answers) * UNMASK_MESSAGE
        if len(answers) < t:
            raise SecAggAbort(
                f"secure aggregation aborted in round {round_}: client {w} has {len(answers)} "
                f"surviving neighbours of the t = {t} needed to unmask (too many dropouts: "
                f"{m - len(sent)} before sending, {len(sent) - len(surviving)} after); "
                f"nothing released")
        secret = Shamir.combine(answers[:t], ssss=False)
        if w in sent:  # remove its self-mask
            total += mod - prg(secret, length, bits).astype(np.uint64)
        else:  # it dropped before sending: remove the masks its neighbours added toward it
            key = _mask_key(secret)
            for v in nbrs[w].tolist():
                if v not in sent:
                    continue
                mask = prg(_pair_key(key, clients[v].s_pub, round_, b"fedem secagg mask"),
                           length, bits).astype(np.uint64)
                # v added +mask if v < w, -mask otherwise
                total += (mod - mask) if v < w else mask
        total %= mod
    costs.server_seconds += time.perf_counter() - tick
    view.total = (total % mod).astype(np.uint32)
    return view


def plain_round(inputs: np.ndarray, ids: np.ndarray, bits: int, *, seed: int, round_: int,
                degree: int | None = None, threshold: int | None = None,
                drop_before: np.ndarray | tuple[int, ...] = (),
                drop_after: np.ndarray | tuple[int, ...] = ()) -> RoundView:
    """:func:`run_round`'s outcome without its cryptography, for accuracy benchmarks only:
    the same senders and survivors, the same abort rule (a client with fewer than t
    surviving neighbours in the same graph) and the same ``total`` (the senders' inputs
    summed mod 2^b, which the masks cancel to exactly); no keys, no masked inputs
    (``masked`` is empty) and no costs. It shows the server nothing a real round would
    not, and it is no protocol: ``--record-rounds`` needs :func:`run_round`."""
    ids = np.asarray(ids, dtype=np.int64)
    x = np.asarray(inputs)
    m = x.shape[0]
    if ids.shape != (m,) or len(set(ids.tolist())) != m:
        raise ValueError("ids must be distinct, one per input row")
    if not 1 <= bits <= 32:
        raise ValueError(f"bits must be in [1, 32], got {bits}")
    k = default_degree(m) if degree is None else int(degree)
    nbrs = graph(ids, k, seed=seed, round_=round_)
    kk = min(k, m - 1)
    t = default_threshold(kk) if threshold is None else int(threshold)
    if not 1 <= t <= max(kk, 1):
        raise ValueError(f"threshold {t} must be in [1, {kk}]")
    before = set(np.asarray(drop_before, dtype=np.int64).tolist())
    after = set(np.asarray(drop_after, dtype=np.int64).tolist())
    sent = [u for u in ids.tolist() if u not in before]
    senders = np.array(sorted(sent), dtype=np.int64)
    survivors = np.array([u for u in senders.tolist() if u not in after], dtype=np.int64)
    surviving = set(survivors.tolist())
    for w in ids.tolist():
        answers = sum(1 for v in nbrs[w].tolist() if v in surviving)
        if answers < t:
            raise SecAggAbort(
                f"secure aggregation aborted in round {round_}: client {w} has {answers} "
                f"surviving neighbours of the t = {t} needed to unmask (too many dropouts: "
                f"{m - len(sent)} before sending, {len(sent) - len(surviving)} after); "
                f"nothing released")
    keep = np.isin(ids, senders)
    total = (x[keep].astype(np.uint64).sum(axis=0) % np.uint64(1 << bits)).astype(np.uint32)
    return RoundView(ids, senders, survivors, {}, total, kk, t, Costs(clients=m))
