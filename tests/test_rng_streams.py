"""No two draws of a run share a stream (docs/design.md section 5, "Randomness").

A CPU torch.Generator keeps only the low 32 bits of ``manual_seed``'s argument,
so seeding it with a 64-bit key made (round, client) pairs whose keys share
their low half draw the same noise: the difference of their uploads was then
noise-free. The pairs below are such pairs at ML-100K size over 100 rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedem_private import rng

# (seed, (round, client), (round, client)) whose NOISE keys share their low 32 bits
SHARED_LOW_HALF = [(1, (43, 586), (47, 50)), (1, (8, 860), (68, 880)),
                   (2, (54, 728), (93, 18))]
ML1M_USERS, ROUNDS = 6040, 100


@pytest.mark.parametrize("seed,a,b", SHARED_LOW_HALF)
def test_keys_that_share_their_low_half_draw_different_noise(seed, a, b) -> None:
    ka = int(rng.key(seed, rng.Stream.NOISE, a[0], a[1]))
    kb = int(rng.key(seed, rng.Stream.NOISE, b[0], b[1]))
    mask = (1 << 32) - 1
    assert ka != kb and (ka & ((1 << 63) - 1)) & mask == (kb & ((1 << 63) - 1)) & mask
    for kind in ("laplace", "gaussian"):
        na = rng.client_noise(seed, a[0], np.array([a[1]]), 256, kind, 1.0)
        nb = rng.client_noise(seed, b[0], np.array([b[1]]), 256, kind, 1.0)
        assert not torch.equal(na, nb)
        assert float((na - nb).abs().min()) > 0  # no entry cancels


@pytest.mark.parametrize("stream", [rng.Stream.NOISE, rng.Stream.DPSGD_NOISE])
def test_no_two_keyed_states_repeat_at_ml1m_size_over_100_rounds(stream) -> None:
    """Every (seed 0-2, round, client) of an ML-1M-size run keys a distinct generator
    state: the 64-bit keys are distinct, and so are the first two state words (64 bits)
    that :func:`rng.generator` writes from them."""
    rounds = np.repeat(np.arange(1, ROUNDS + 1), ML1M_USERS)
    clients = np.tile(np.arange(ML1M_USERS), ROUNDS)
    for seed in range(3):
        keys = rng.key(seed, stream, rounds, clients)
        assert np.unique(keys).size == keys.size
        w0 = rng.bits(keys, 0) & np.uint64(0xFFFFFFFF)
        w1 = rng.bits(keys, 1) & np.uint64(0xFFFFFFFF)
        assert np.unique((w0 << np.uint64(32)) | w1).size == keys.size


def test_a_generator_is_written_from_all_of_its_key() -> None:
    """The state that rng.generator sets is the one mt_words derives, and it is a pure
    function of the key (the same key, the same numbers)."""
    g = rng.generator(7, rng.Stream.NOISE, 3, 11)
    k = int(rng.key(7, rng.Stream.NOISE, 3, 11))
    words = g.get_state().numpy().view(np.uint64)
    assert np.array_equal(words[3: 3 + 624], rng.mt_words(k))
    a = torch.randn(64, generator=rng.generator(7, rng.Stream.NOISE, 3, 11))
    assert torch.equal(a, torch.randn(64, generator=rng.generator(7, rng.Stream.NOISE, 3, 11)))
    b = torch.randn(64, generator=rng.generator(7, rng.Stream.NOISE, 3, 12))
    assert not torch.equal(a, b)
