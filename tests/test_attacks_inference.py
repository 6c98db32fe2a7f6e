"""Support and projection attacks on a hand-made one-round MF simulation.

The simulation here is deliberately independent of the real simulator: a few
clients, random user vectors and item table, plain full-batch gradient descent
on BCE over each client's positives and sampled negatives.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import attacks
from attacks import ATTACKS, run_attack
from attacks.ground_truth import GroundTruth, Ragged, load_ground_truth, save_ground_truth
from attacks.labels import labels_for
from attacks.observations import (
    Observation,
    PublicKnowledge,
    load_observations,
    load_public,
    save_observation,
    save_public,
)
from attacks.projection import projection
from attacks.scoring import auc, score_attack
from attacks.shadow import ShadowModel
from attacks.support import changed_rows, support


@dataclass(frozen=True)
class Toy:
    obs: Observation
    gt: GroundTruth
    public: PublicKnowledge


def simulate(seed: int = 0, k: int = 12, m: int = 240, d: int = 16, n_pos: int = 12,
             num_negatives: int = 4, epochs: int = 5, lr: float = 0.5,
             noise: str = "none", scale: float = 0.0) -> Toy:
    """One recorded round: each client runs full-batch GD from the same sent table."""
    rng = np.random.default_rng(seed)
    sent = rng.normal(0.0, 0.1, (m, d))
    users = rng.normal(0.0, 0.1, (k, d))
    uploads, positives, negatives = [], [], []
    for u in range(k):
        pos = rng.choice(m, n_pos, replace=False)
        neg = rng.choice(np.setdiff1d(np.arange(m), pos), n_pos * num_negatives, replace=True)
        items = np.concatenate([pos, neg])
        y = np.concatenate([np.ones(n_pos), np.zeros(neg.size)])
        q, p = sent.copy(), users[u].copy()
        for _ in range(epochs):
            g = 1.0 / (1.0 + np.exp(-(q[items] @ p))) - y
            grad_p = (g[:, None] * q[items]).mean(axis=0)
            grad_q = np.zeros_like(q)
            np.add.at(grad_q, items, g[:, None] * p[None, :] / items.size)
            q -= lr * grad_q
            p -= lr * grad_p
        if noise == "all":
            q = q + rng.laplace(0.0, scale, q.shape)
        elif noise == "touched":
            touched = np.unique(items)
            q[touched] += rng.laplace(0.0, scale, (touched.size, d))
        uploads.append(q)
        positives.append(pos)
        negatives.append(neg)
    clients = np.arange(100, 100 + k)
    obs = Observation(3, clients, np.broadcast_to(sent, (k, m, d)).astype(np.float32),
                      np.stack(uploads).astype(np.float32), np.ones(k, dtype=bool))
    gt = GroundTruth(3, clients, Ragged.from_rows(positives), Ragged.from_rows(negatives))
    public = PublicKnowledge(n_clients=k, n_items=m, dim=d, lr=lr, local_epochs=epochs,
                             batch_size=10**6, num_negatives=num_negatives, method="toy-sr",
                             optimizer="sgd", privacy_mode="none" if noise == "none" else noise)
    return Toy(obs, gt, public)


@pytest.fixture(scope="module")
def toy() -> Toy:
    return simulate()


def _pooled_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    mask = ~np.isnan(labels)
    return auc(labels[mask].astype(int), scores[mask])


@pytest.mark.parametrize("relation", ["positive_vs_any", "positive_vs_sampled"])
def test_projection_separates_noise_free_uploads(toy: Toy, relation: str) -> None:
    scores = projection(toy.obs, toy.public)
    labels = labels_for(toy.obs, toy.gt, relation)
    assert _pooled_auc(scores, labels) >= 0.9
    # orientation: every client's positives sit above its sampled negatives
    for j in range(toy.obs.n_clients):
        pos, neg = toy.gt.positives.row(j), toy.gt.negatives.row(j)
        assert scores[j, pos].mean() > 0 > scores[j, neg].mean()


def test_projection_orientation_without_negatives() -> None:
    toy = simulate(seed=1, num_negatives=0, n_pos=30)
    scores = projection(toy.obs, toy.public)
    assert _pooled_auc(scores, labels_for(toy.obs, toy.gt, "positive_vs_any")) == 1.0
    assert (scores[toy.gt.positives.to_mask(toy.obs.n_items)] > 0).all()


def test_support_finds_exactly_the_touched_rows(toy: Toy) -> None:
    touched = toy.gt.positives.to_mask(toy.obs.n_items) | toy.gt.negatives.to_mask(toy.obs.n_items)
    np.testing.assert_array_equal(changed_rows(toy.obs, toy.public) == 1.0, touched)
    assert _pooled_auc(support(toy.obs, toy.public), touched.astype(float)) == 1.0


def test_support_sees_touched_rows_through_touched_row_noise() -> None:
    toy = simulate(seed=2, noise="touched", scale=1.0)
    touched = toy.gt.positives.to_mask(toy.obs.n_items) | toy.gt.negatives.to_mask(toy.obs.n_items)
    np.testing.assert_array_equal(changed_rows(toy.obs, toy.public) == 1.0, touched)
    labels = labels_for(toy.obs, toy.gt, "positive_vs_any")
    assert _pooled_auc(support(toy.obs, toy.public), labels) > 0.8


@pytest.mark.parametrize("name", ["support", "projection"])
def test_heavy_noise_on_every_entry_defeats_the_attacks(name: str) -> None:
    toy = simulate(seed=3, k=24, noise="all", scale=0.5)
    scores = ATTACKS[name](toy.obs, toy.public)
    for relation in ("positive_vs_any", "positive_vs_sampled"):
        assert abs(_pooled_auc(scores, labels_for(toy.obs, toy.gt, relation)) - 0.5) < 0.06


def test_nonparticipants_get_nan_rows_and_are_dropped_by_the_scorer(toy: Toy) -> None:
    part = np.ones(toy.obs.n_clients, dtype=bool)
    part[[0, 5]] = False
    obs = Observation(toy.obs.round, toy.obs.clients, toy.obs.sent, toy.obs.upload, part)
    for name, scores in zip(ATTACKS, run_attack_all(obs, toy.public), strict=True):
        assert np.isnan(scores[[0, 5]]).all(), name
        assert not np.isnan(scores[part]).any(), name
        out = score_attack(scores, labels_for(obs, toy.gt, "positive_vs_sampled"),
                           relation="positive_vs_sampled")
        assert out["n_clients"] == obs.n_clients - 2


def run_attack_all(obs: Observation, public: PublicKnowledge) -> list[np.ndarray]:
    return [run_attack(name, [obs], public)[0] for name in ATTACKS]


def test_run_attack_rejects_unknown_names(toy: Toy) -> None:
    with pytest.raises(ValueError, match="unknown attack"):
        run_attack("nope", [toy.obs], toy.public)


# --- attacks never receive ground truth -----------------------------------------------

_FORBIDDEN = re.compile(r"positive|negative|label|truth|member|gt$|demograph|gender|secret",
                        re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_signature_admits_only_observation_and_public_knowledge(name: str) -> None:
    fn = ATTACKS[name]
    params = list(inspect.signature(fn).parameters.values())
    hints = typing.get_type_hints(fn)
    positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert [hints[p.name] for p in positional] == [Observation, PublicKnowledge]
    for p in params:
        assert not _FORBIDDEN.search(p.name), p.name
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            assert p.default is not inspect.Parameter.empty
            # scalars, or imia's shadow of the backbone's client (built from the backbone's
            # registration and the public facts; its fields hold no private name)
            assert hints[p.name] in (int, float, bool, str, ShadowModel | None), p.name
        assert p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def test_the_shadow_model_carries_nothing_private() -> None:
    for f in dataclasses.fields(ShadowModel):
        assert not _FORBIDDEN.search(f.name), f.name


def test_attack_modules_never_import_the_private_side() -> None:
    pkg = Path(attacks.__file__).parent
    private = {"ground_truth", "labels", "scoring", "audit"}
    for module in ("base", "support", "projection", "observations"):
        tree = ast.parse((pkg / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[-1]} | {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name.split(".")[-1] for a in node.names}
            else:
                continue
            assert not names & private, (module, names)
        assert "GroundTruth" not in (pkg / f"{module}.py").read_text()


# --- what the attacks need survives the round trip through a run directory -----------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attacks_survive_save_and_load(tmp_path: Path, toy: Toy, dtype: str) -> None:
    save_public(tmp_path, toy.public)
    save_observation(tmp_path, toy.obs, sent_dtype=dtype, delta_dtype=dtype)
    save_ground_truth(tmp_path, toy.gt.round, toy.gt.clients, toy.gt.positives,
                      toy.gt.negatives)
    (obs,) = load_observations(tmp_path)
    public = load_public(tmp_path)
    (gt,) = load_ground_truth(tmp_path)
    assert public == toy.public
    np.testing.assert_array_equal(changed_rows(obs, public), changed_rows(toy.obs, toy.public))
    before, after = projection(toy.obs, toy.public), projection(obs, public)
    tol = 1e-4 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(after, before, atol=tol)
    labels = labels_for(obs, gt, "positive_vs_sampled")
    assert _pooled_auc(after, labels) >= 0.9
