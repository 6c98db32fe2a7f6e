"""The observation / ground-truth store: round trips, validation, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

import attacks._atomic as atomic
from attacks.ground_truth import (
    GroundTruth,
    Ragged,
    load_demographics,
    load_ground_truth,
    save_demographics,
    save_ground_truth,
)
from attacks.labels import labels_for, membership_labels
from attacks.observations import (
    Observation,
    PublicKnowledge,
    load_observations,
    load_public,
    save_observation,
    save_public,
)
from fedem_private.errors import UserError


def _obs(round_: int = 2, k: int = 3, m: int = 7, d: int = 4, seed: int = 0,
         first_client: int = 10) -> Observation:
    rng = np.random.default_rng(seed)
    sent = rng.normal(size=(k, m, d)).astype(np.float32)
    upload = sent.copy()
    upload[:, :3] += rng.normal(scale=1e-3, size=(k, 3, d)).astype(np.float32)
    part = np.ones(k, dtype=bool)
    part[-1] = False
    return Observation(round_, np.arange(first_client, first_client + k), sent, upload, part)


def _public() -> PublicKnowledge:
    return PublicKnowledge(n_clients=50, n_items=7, dim=4, lr=0.1, local_epochs=10,
                           batch_size=256, num_negatives=4, method="fedem",
                           privacy_mode="ldp-laplace",
                           privacy_params={"clip": 1.0, "eps_round": 0.5, "noise_scale": 4.0})


def test_observation_round_trip_keeps_the_delta(tmp_path: Path) -> None:
    obs = _obs()
    save_observation(tmp_path, obs)
    (back,) = load_observations(tmp_path)
    assert back.round == obs.round
    np.testing.assert_array_equal(back.clients, obs.clients)
    np.testing.assert_array_equal(back.participated, obs.participated)
    np.testing.assert_array_equal(back.sent, obs.sent)
    np.testing.assert_allclose(back.delta(), obs.delta(), atol=1e-6)
    # untouched rows stay exactly untouched
    assert (back.delta()[:, 3:] == 0).all()


def test_float16_storage_is_smaller_and_keeps_zero_rows(tmp_path: Path) -> None:
    obs = _obs(k=4, m=200, d=16)
    small = save_observation(tmp_path / "a", obs, sent_dtype="float16", delta_dtype="float16",
                             compress=False)
    big = save_observation(tmp_path / "b", obs, compress=False)
    assert small.stat().st_size < 0.6 * big.stat().st_size
    (back,) = load_observations(tmp_path / "a")
    assert (back.delta()[:, 3:] == 0).all()
    np.testing.assert_allclose(back.delta(), obs.delta(), rtol=2e-3, atol=1e-6)


def test_rounds_sorted_filtered_and_parts_joined(tmp_path: Path) -> None:
    save_observation(tmp_path, _obs(round_=12))
    save_observation(tmp_path, _obs(round_=3, first_client=0), part=0)
    save_observation(tmp_path, _obs(round_=3, first_client=5, seed=1), part=1)
    rounds = load_observations(tmp_path)
    assert [o.round for o in rounds] == [3, 12]
    np.testing.assert_array_equal(rounds[0].clients, [0, 1, 2, 5, 6, 7])
    assert [o.round for o in load_observations(tmp_path, rounds=[12])] == [12]
    save_observation(tmp_path, _obs(round_=3))  # whole and in parts: ambiguous
    with pytest.raises(UserError, match="both whole and in parts"):
        load_observations(tmp_path)


def test_codec_parameters_round_trip_and_join_across_parts(tmp_path: Path) -> None:
    """A FedPEFT round keeps theta as sent and as uploaded: shared B stored once, per-client A,
    exact zeros in the change kept, and a part of clients who sat out filled with zeros."""
    rng = np.random.default_rng(3)
    k, m, d, r = 3, 7, 4, 2
    a0 = rng.normal(size=(k, m, r)).astype(np.float32)
    a1 = a0.copy()
    a1[:, :2] += rng.normal(scale=1e-3, size=(k, 2, r)).astype(np.float32)
    b0 = np.repeat(rng.normal(size=(1, d, r)).astype(np.float32), k, axis=0)
    b1 = b0 + rng.normal(scale=1e-3, size=b0.shape).astype(np.float32)
    base = _obs(k=k, m=m, d=d)
    obs = dataclasses.replace(base, participated=np.ones(k, dtype=bool),
                              sent_theta={"A": a0, "B": b0}, upload_theta={"A": a1, "B": b1})
    path = save_observation(tmp_path, obs, part=0)
    with np.load(path) as z:
        assert "sent_theta_shared__B" in z and "sent_theta__A" in z
    absent = Observation(2, np.arange(20, 22), np.zeros((2, m, d), np.float32),
                         np.zeros((2, m, d), np.float32), np.zeros(2, dtype=bool))
    save_observation(tmp_path, absent, part=1)
    (back,) = load_observations(tmp_path)
    assert set(back.sent_theta) == {"A", "B"} == set(back.upload_theta)
    np.testing.assert_array_equal(back.sent_theta["A"][:k], a0)
    np.testing.assert_allclose(back.upload_theta["B"][:k], b1, atol=1e-6)
    assert (back.upload_theta["A"][:k, 2:] == back.sent_theta["A"][:k, 2:]).all()
    assert back.sent_theta["A"].shape == (k + 2, m, r) and not back.sent_theta["A"][k:].any()
    with pytest.raises(ValueError, match="same groups"):
        Observation(2, np.arange(k), base.sent, base.upload, np.ones(k, dtype=bool),
                    sent_theta={"A": a0}, upload_theta={})


def test_public_knowledge_round_trip_and_strictness(tmp_path: Path) -> None:
    pub = _public()
    path = save_public(tmp_path, pub)
    assert load_public(tmp_path) == pub
    data = json.loads(path.read_text())
    data["seed"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="seed"):
        load_public(tmp_path)
    with pytest.raises(UserError, match="missing"):
        load_public(tmp_path / "nowhere")


def test_ground_truth_and_demographics_round_trip(tmp_path: Path) -> None:
    pos = [np.array([1, 2]), np.array([0]), np.array([], dtype=np.int64)]
    neg = [np.array([5, 5, 6, 3]), np.array([4, 6]), np.array([], dtype=np.int64)]
    save_ground_truth(tmp_path, 2, np.array([10, 11, 12]), pos, neg)
    csr = Ragged.from_rows(pos)
    save_ground_truth(tmp_path, 4, np.array([10, 11, 12]), csr, Ragged.from_rows(neg))
    gts = load_ground_truth(tmp_path)
    assert [g.round for g in gts] == [2, 4]
    for j in range(3):
        np.testing.assert_array_equal(gts[0].positives.row(j), pos[j])
        np.testing.assert_array_equal(gts[1].negatives.row(j), neg[j])
    sel = gts[0].select(np.array([12, 10]))
    np.testing.assert_array_equal(sel.positives.row(1), [1, 2])
    with pytest.raises(KeyError, match="99"):
        gts[0].select(np.array([99]))
    assert load_demographics(tmp_path) is None
    save_demographics(tmp_path, np.array([10, 11, 12]), {"gender": np.array([0.0, np.nan, 1.0])})
    demo = load_demographics(tmp_path)
    assert demo is not None
    np.testing.assert_array_equal(demo.attributes["gender"], [0.0, np.nan, 1.0])
    # the server's folder and the private folder are apart
    assert not (tmp_path / "observations").exists()
    assert sorted(p.name for p in (tmp_path / "ground_truth").iterdir()) == [
        "demographics.npz", "round_0002.npz", "round_0004.npz"]


def test_labels_under_both_relations() -> None:
    gt = GroundTruth(2, np.array([10, 11]), Ragged.from_rows([[1, 2], [0]]),
                     Ragged.from_rows([[3, 3, 4], [2]]))
    any_ = membership_labels(gt, np.array([11, 10]), 5, "positive_vs_any")
    np.testing.assert_array_equal(any_, [[1, 0, 0, 0, 0], [0, 1, 1, 0, 0]])
    sampled = membership_labels(gt, np.array([10, 11]), 5, "positive_vs_sampled")
    np.testing.assert_array_equal(sampled, [[np.nan, 1, 1, 0, 0], [1, np.nan, 0, np.nan, np.nan]])
    with pytest.raises(ValueError, match="relation"):
        membership_labels(gt, np.array([10]), 5, "positive_vs_rest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="round"):
        labels_for(_obs(round_=3, k=2, m=5, first_client=10), gt, "positive_vs_any")


def test_records_are_frozen_and_validated() -> None:
    obs = _obs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        obs.round = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        obs.upload[0, 0, 0] = 1.0
    bad = obs.upload.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        Observation(1, obs.clients, obs.sent, bad, obs.participated)
    with pytest.raises(ValueError, match="upload"):
        Observation(1, obs.clients, obs.sent, obs.upload[:, :2], obs.participated)
    with pytest.raises(ValueError, match="boolean"):
        Observation(1, obs.clients, obs.sent, obs.upload, obs.participated.astype(int))
    with pytest.raises(ValueError, match="lr"):
        dataclasses.replace(_public(), lr=0.0)


def test_malformed_files_are_user_errors(tmp_path: Path) -> None:
    folder = tmp_path / "observations"
    folder.mkdir()
    (folder / "round_0001.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="round_0001.npz"):
        load_observations(tmp_path)
    np.savez(folder / "round_0001.npz", round=np.array(1))
    with pytest.raises(UserError, match="missing"):
        load_observations(tmp_path)


# --- atomic writes -----------------------------------------------------------------


def _no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(atomic.TMP_SUFFIX)]


def test_interrupted_write_leaves_no_partial_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def half_then_die(f, **arrays):  # type: ignore[no-untyped-def]
        f.write(b"PK\x03\x04 half an archive")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_observation(tmp_path, _obs())
    folder = tmp_path / "observations"
    assert list(folder.iterdir()) == []


def test_failed_rewrite_keeps_the_old_file(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    save_observation(tmp_path, _obs(seed=0))
    path = tmp_path / "observations" / "round_0002.npz"
    before = path.read_bytes()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk vanished")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk vanished"):
        save_observation(tmp_path, _obs(seed=1))
    with pytest.raises(OSError, match="disk vanished"):
        save_public(tmp_path, _public())
    assert path.read_bytes() == before
    assert not (tmp_path / "observations" / "public.json").exists()
    assert _no_temp_files(tmp_path / "observations")
    monkeypatch.undo()
    (back,) = load_observations(tmp_path)
    np.testing.assert_array_equal(back.sent, _obs(seed=0).sent)
