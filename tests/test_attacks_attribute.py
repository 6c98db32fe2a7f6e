"""Attribute (gender) inference from uploads, with side knowledge of a known fraction."""

from __future__ import annotations

import inspect
import typing

import numpy as np
import pytest

from attacks.attribute import KnownAttributes, attribute, client_features
from attacks.observations import Observation, PublicKnowledge
from attacks.scoring import score_attribute


def _population(seed: int = 0, k: int = 120, m: int = 100, d: int = 4
                ) -> tuple[Observation, PublicKnowledge, np.ndarray]:
    """Clients whose trained rows depend on their gender: g = 1 mostly items 0-49."""
    rng = np.random.default_rng(seed)
    gender = (rng.random(k) < 0.3).astype(np.int64)
    sent = rng.normal(0, 0.1, (m, d)).astype(np.float32)
    upload = np.broadcast_to(sent, (k, m, d)).copy()
    for j in range(k):
        home = np.arange(0, 50) if gender[j] else np.arange(50, 100)
        pos = np.concatenate([rng.choice(home, 8, replace=False), rng.choice(m, 2)])
        neg = rng.choice(np.setdiff1d(np.arange(m), pos), 40, replace=False)
        direction = rng.normal(size=d)
        upload[j, pos] += 0.1 * direction
        upload[j, neg] -= 0.1 * direction
    obs = Observation(1, np.arange(k), np.broadcast_to(sent, (k, m, d)), upload,
                      np.ones(k, dtype=bool))
    public = PublicKnowledge(n_clients=k, n_items=m, dim=d, lr=0.1, local_epochs=1,
                             batch_size=64, num_negatives=4, method="toy")
    return obs, public, gender


@pytest.mark.parametrize("features, floor", [("interactions", 0.9), ("scores", 0.9),
                                             ("uploads", 0.65), ("auto", 0.9)])
def test_attribute_recovers_a_taste_correlated_gender(features: str, floor: float) -> None:
    obs, public, gender = _population()
    known = KnownAttributes("gender", np.arange(60), gender[:60])
    prob = attribute(obs, public, known, features=features)
    assert prob.shape == (obs.n_clients,) and np.all((prob >= 0) & (prob <= 1))
    out = score_attribute(prob[60:], gender[60:], known.values)
    # change norms mix in the random negatives; inferred interactions do not
    assert out["auc"] > floor and out["balanced_accuracy"] > floor - 0.1
    assert out["majority_baseline"] == pytest.approx((gender[60:] == 0).mean())


def test_attribute_without_signal_is_at_chance() -> None:
    obs, public, gender = _population(seed=3)
    shuffled = np.random.default_rng(5).permutation(gender)
    known = KnownAttributes("gender", np.arange(60), shuffled[:60])
    out = score_attribute(attribute(obs, public, known, features="interactions")[60:],
                          shuffled[60:], known.values)
    assert abs(out["auc"] - 0.5) < 0.2


def test_nonparticipants_and_single_class_side_knowledge() -> None:
    obs, public, gender = _population()
    part = obs.participated.copy()
    part[:5] = False
    cut = Observation(1, obs.clients, obs.sent, obs.upload, part)
    prob = attribute(cut, public, KnownAttributes("gender", np.arange(60), gender[:60]),
                     features="interactions")
    assert np.isnan(prob[:5]).all() and not np.isnan(prob[5:]).any()
    flat = attribute(obs, public, KnownAttributes("gender", [0, 1], [1, 1]))
    np.testing.assert_array_equal(flat, np.ones(obs.n_clients))
    feats = client_features(cut, public)
    assert not feats[:5].any()
    np.testing.assert_allclose(np.linalg.norm(feats[5:], axis=1), 1.0)


def test_known_attributes_are_validated() -> None:
    with pytest.raises(ValueError):
        KnownAttributes("gender", [1, 2], [0, 2])
    with pytest.raises(ValueError):
        KnownAttributes("gender", [1, 1], [0, 1])
    with pytest.raises(ValueError):
        KnownAttributes("gender", [1, 2], [0])
    obs, public, gender = _population()
    with pytest.raises(ValueError):
        attribute(obs, public, KnownAttributes("gender", [0, 1], [0, 1]), features="nope")


def test_attribute_signature_admits_no_ground_truth() -> None:
    params = list(inspect.signature(attribute).parameters.values())
    hints = typing.get_type_hints(attribute)
    positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert [hints[p.name] for p in positional] == [Observation, PublicKnowledge, KnownAttributes]
    for p in params:
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert hints[p.name] in (int, float, bool, str) and p.default is not p.empty


def test_score_attribute_by_hand() -> None:
    out = score_attribute(np.array([0.9, 0.2, 0.6, 0.1]), np.array([1, 0, 0, 0]),
                          np.array([0, 0, 1]))
    assert out["auc"] == 1.0
    assert out["balanced_accuracy"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert out["accuracy"] == 0.75 and out["majority_baseline"] == 0.75
    with pytest.raises(ValueError):
        score_attribute(np.array([np.nan]), np.array([1]), np.array([1]))
