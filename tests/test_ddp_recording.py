"""--record-rounds under ddp-skellam keeps what the server really saw: masked integers and
their modular sum (the secure aggregation's transcript), not the clients' updates."""

from __future__ import annotations

import pytest

pytest.importorskip("Crypto", reason="the [secagg] extra (pycryptodome) is not installed")

import numpy as np  # noqa: E402
from recorded_runs import ddp_recorded_round  # noqa: E402
from scipy import stats  # noqa: E402

from attacks.observations import load_observations, load_public  # noqa: E402
from fedem_private.privacy import skellam  # noqa: E402

BITS = 12


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    """A tiny ddp-skellam run recording its last round, and every client's b-bit input
    (before masking) as its encoding produced it."""
    rec = ddp_recorded_round(tmp_path_factory.mktemp("ddp-rec"), {
        "clip": 0.05, "epsilon": 8.0, "sample_rate": 0.8, "ddp_bits": BITS})
    return rec.run_dir, rec.transcript, rec.inputs


def test_public_json_names_the_transcript(recorded) -> None:
    run_dir, _, _ = recorded
    assert load_public(run_dir).extra["server_view"] == "secagg-transcript"


def test_a_recorded_upload_is_masked_not_the_clients_input(recorded) -> None:
    _, tr, inputs = recorded
    r = int(tr["round"])
    senders = tr["recorded_senders"]
    assert senders.size >= 5 and tr["masked"].shape == (senders.size, int(tr["padded_dim"]))
    own = np.stack([inputs[(r, int(c))] for c in senders])
    masked = tr["masked"]
    # the inputs sit near 0 mod 2^b (small rounded values plus noise); the top 3 bits of a
    # masked upload are uniform, those of the inputs are not (the test fails unmasked)
    def p_uniform(values: np.ndarray) -> float:
        counts = np.bincount((values.ravel() >> (BITS - 3)).astype(np.int64), minlength=8)
        return float(stats.chisquare(counts).pvalue)

    assert p_uniform(masked) > 1e-4
    assert p_uniform(own) < 1e-12
    # and no correlation between a client's masked upload and its own input (centred)
    n = own.shape[1]
    for c_own, c_masked in zip(skellam.centred(own, BITS), skellam.centred(masked, BITS),
                               strict=True):
        assert abs(np.corrcoef(c_own, c_masked)[0, 1]) < 5 / np.sqrt(n)
    assert not np.array_equal(own, masked)


def test_the_recorded_sum_decodes_to_the_release(recorded) -> None:
    run_dir, tr, inputs = recorded
    r = int(tr["round"])
    bits = int(tr["bits"])
    # the modular sum is the senders' inputs summed mod 2^b (the masks cancelled)
    plain = sum(inputs[(r, int(c))].astype(np.int64) for c in tr["senders"]) % (1 << bits)
    assert np.array_equal(tr["total"], plain)
    # decoded with the transcript's public parameters alone, it is the released update
    est = skellam.unrotate(skellam.centred(tr["total"], bits).astype(np.float64)
                           / float(tr["scale"]), tr["rotation_signs"].astype(np.float64),
                           int(tr["dim"])) / float(tr["expected_count"])
    obs = next(o for o in load_observations(run_dir) if o.round == r)
    released_delta = (obs.upload[0].astype(np.float64) - obs.sent[0].astype(np.float64))
    assert np.allclose(released_delta.ravel(), est, atol=1e-5)
    assert np.abs(est).max() > 1e-3  # not vacuous: the release moved
