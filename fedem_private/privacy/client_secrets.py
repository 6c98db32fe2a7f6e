"""Each simulated client's secrets, kept apart from the server's randomness.

docs/design.md section 5, "Two kinds of randomness". A simulation runs the server and every
client in one process, so the separation is one of keys, not of machines:

- the **server's randomness** (cohorts, the secure-aggregation graph, the rotation's signs,
  central noise, the dropout draws of the simulated network) is keyed by the run seed, which
  the simulated server holds and ``summary.json`` prints;
- a **client's secrets** (its two X25519 key pairs, its self-mask seed beta_u and mask-key
  seed sigma_u, its randomised rounding and its Skellam noise share) come from a
  :class:`ClientSecrets`, which no server-side code receives: the server's half of the
  protocol (:func:`fedem_private.privacy.secagg.unmask`) and the recorded server view take
  only public keys, ciphertexts, masked inputs and unmasking shares.

Two sources:

- ``ClientSecrets()`` (the default, ``--client-secret-seed`` unset): the operating system's
  CSPRNG (``os.urandom``), fresh for every client and round, as a deployment draws them.
  A run under it does not repeat bit for bit; its accuracy varies by the noise shares only.
- ``ClientSecrets(seed)`` (``--client-secret-seed S``): each secret is HKDF-SHA256 of the
  client-secret seed and (stream, round, client), so a run repeats. The summary marks the
  seed "not known to the server": the simulated server is never given it, and with the run
  seed alone the recorded view decodes nothing (``tests/test_secure_path.py``). A reader who
  is given S is no longer the server of the threat model.

Nothing here is hand-written cryptography: HKDF is the ``cryptography`` package's (when it is
installed: the ``[secagg]`` extra; the non-cryptographic uses, the rounding and noise keys,
fall back to a keyed SplitMix hash of the secret seed without it).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np

from fedem_private import rng

#: the label the summary gives the client-secret seed
NOT_KNOWN_TO_SERVER = "not known to the server (clients' secrets: keys, mask seeds, noise shares)"


@dataclass(frozen=True)
class ClientSecrets:
    """The source of every client's secrets (module docstring); ``seed`` None: the OS."""

    seed: int | None = None

    @property
    def reproducible(self) -> bool:
        return self.seed is not None

    def material(self, label: bytes, round_: int, client: int, length: int) -> bytes:
        """``length`` secret bytes of client ``client`` for ``label`` in round ``round_``:
        ``os.urandom`` (default) or HKDF-SHA256(seed; info = label, round, client)."""
        if self.seed is None:
            return os.urandom(int(length))
        info = (b"fedem client secret " + label + b"/" + int(round_).to_bytes(8, "little")
                + int(client).to_bytes(8, "little", signed=True))
        ikm = int(self.seed).to_bytes(16, "little", signed=True)
        try:
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.kdf.hkdf import HKDF
        except ImportError:  # without the [secagg] extra: BLAKE2b keyed by the seed
            out = b""
            block = 0
            while len(out) < length:
                out += hashlib.blake2b(info + block.to_bytes(4, "little"), key=ikm,
                                       digest_size=64).digest()
                block += 1
            return out[:length]
        return HKDF(algorithm=hashes.SHA256(), length=int(length), salt=None,
                    info=info).derive(ikm)

    def keys(self, label: bytes, round_: int, clients: np.ndarray) -> np.ndarray:
        """One 64-bit key (uint64) per client for the counter-based draws of
        :mod:`fedem_private.rng` (the rounding's uniforms, the noise share's generator)."""
        clients = np.asarray(clients, dtype=np.int64)
        if clients.size == 0:
            return np.zeros(0, dtype=np.uint64)
        if self.seed is None:
            return np.frombuffer(os.urandom(8 * clients.size), dtype="<u8").copy()
        # one HKDF per (round, label) over the whole chunk, then mixed with each client id:
        # the per-client keys are a keyed hash of (round secret, client)
        root = int.from_bytes(self.material(label, round_, -1, 8), "little")
        return rng.key(root & 0x7FFF_FFFF_FFFF_FFFF, 0, int(round_), clients)

    def describe(self) -> dict[str, object]:
        """The summary's entry: where the clients' secrets came from, never the seed's
        consequences for the server (it is not given the seed)."""
        if self.seed is None:
            return {"source": "os.urandom (fresh per client and round; the run does not "
                              "repeat bit for bit)", "known_to_server": False}
        return {"source": "HKDF-SHA256 of --client-secret-seed", "seed": int(self.seed),
                "known_to_server": False, "note": NOT_KNOWN_TO_SERVER}
