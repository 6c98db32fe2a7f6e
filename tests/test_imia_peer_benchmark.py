"""benchmarks/imia_peer.py without the published code: the refusal line and exit code, the
candidate sets, the ranking read from the published loop's order, the scoring at the
published cutoff, and the glue's inputs from a tiny recorded run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the benchmarks package

from benchmark_cli import run_module  # noqa: E402

from attacks.ground_truth import save_ground_truth  # noqa: E402
from attacks.observations import (  # noqa: E402
    Observation,
    PublicKnowledge,
    save_observation,
    save_public,
)
from benchmarks import imia_peer  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("benchmarks.imia_peer", *args)


def test_without_peer_dir_one_line_and_exit_2():
    res = _run()
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "hi-weiyuan/FedRec_IMIA" in lines[0] and "--peer-dir" in lines[0]
    assert "Traceback" not in res.stderr


def test_peer_dir_without_its_files_exit_2(tmp_path):
    res = _run("--peer-dir", str(tmp_path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "membership_attack.py" in lines[0] and str(tmp_path) in lines[0]


def test_candidate_sets_distinct_negatives_minus_positives():
    sets = imia_peer.candidate_sets([np.array([5, 2, 5])], [np.array([7, 2, 7, 0, 9])])
    assert sets == [([2, 5], [0, 7, 9])]


def _hand_example():
    # client A: candidates 0..9, positives {0, 1}; the loop confirmed 1 then 5 as positives,
    # 9, 0, 8 as negatives; 2, 3, 4, 6, 7 never confirmed
    # client B: candidates 0..4, positive {3}; confirmed 3, nothing else
    sets = [([0, 1], [2, 3, 4, 5, 6, 7, 8, 9]), ([3], [0, 1, 2, 4])]
    rows = [imia_peer.order_scores(12, [1, 5], [9, 0, 8], list(range(10))),
            imia_peer.order_scores(12, [3], [], list(range(5)))]
    return np.vstack(rows), imia_peer.labels_matrix(sets, 12)


def test_order_scores_rank_confirmed_positives_first_negatives_last():
    scores, labels = _hand_example()
    a = scores[0]
    assert a[1] > a[5] > 0  # confirmed positives, earliest highest
    assert (a[[2, 3, 4, 6, 7]] == 0).all()  # never confirmed: tied in the middle
    assert a[8] < 0 and a[0] < a[8] and a[9] < a[0]  # confirmed negatives, earliest lowest
    assert np.isnan(a[10:]).all() and np.isnan(scores[1, 5:]).all()  # not candidates
    assert np.isnan(labels[1, 5:]).all() and labels[0, 1] == 1 and labels[0, 9] == 0


def test_f1_at_published_cutoff_and_client_auc_by_hand():
    scores, labels = _hand_example()
    cut = imia_peer.f1_at_cutoff(scores, labels)
    # A: top ceil(0.2 * 10) = 2 = {1, 5}: precision 1/2, recall 1/2, F1 0.5; B: top 1 = {3}: 1
    assert cut["f1"] == pytest.approx(0.75)
    # random: F1 of precision |pos| / n = 0.2 and recall 0.2, for both clients
    assert cut["random_baseline"] == pytest.approx(0.2)
    # A: positive 1 beats all 8 negatives, positive 0 (-19) beats only 9 (-20): 9 / 16; B: 1
    assert imia_peer.client_auc(scores, labels) == pytest.approx((9 / 16 + 1) / 2)


def test_client_auc_skips_clients_with_one_class():
    labels = np.array([[1.0, 0.0, np.nan], [1.0, 1.0, np.nan]])
    scores = np.array([[0.0, 1.0, np.nan], [1.0, 2.0, np.nan]])
    assert imia_peer.client_auc(scores, labels) == 0.0
    assert math.isnan(imia_peer.client_auc(scores[1:], labels[1:]))


def test_peer_job_from_a_tiny_recorded_run(tmp_path):
    m, d = 8, 2
    rng = np.random.default_rng(0)
    sent = rng.normal(size=(m, d)).astype(np.float32)
    upload = np.stack([sent, sent, sent]).copy()
    upload[0, [1, 4, 6]] += 0.5
    upload[2, [0, 3]] -= 0.25
    dense = {"w0": np.ones((3, 2 * d, 4), np.float32), "b0": np.zeros((3, 4), np.float32)}
    # recorded in the order 2, 1, 0 (as a run writes its client chunks); 1 sat the round out
    obs = Observation(1, np.array([2, 1, 0]), np.stack([sent] * 3), upload,
                      np.array([True, False, True]), dense)
    save_observation(tmp_path, obs)
    save_public(tmp_path, PublicKnowledge(n_clients=3, n_items=m, dim=d, lr=0.1,
                                          local_epochs=10, batch_size=256, num_negatives=4,
                                          method="fedncf", backbone="ncf"))
    save_ground_truth(tmp_path, 1, np.array([2, 1, 0]),
                      [np.array([4, 1]), np.array([2]), np.array([3])],
                      [np.array([6, 6, 1]), np.array([0]), np.array([0, 0])])
    job = imia_peer.peer_job(tmp_path, 1)
    assert job["clients"] == [0, 2]  # the participants, by client id
    assert job["sets"] == [([3], [0]), ([1, 4], [6])]
    np.testing.assert_array_equal(job["sent"], sent)
    np.testing.assert_allclose(job["uploads"], upload[[2, 0]], atol=1e-6)
    assert set(job["sent_dense"]) == {"w0", "b0"} and job["sent_dense"]["w0"].shape == (4, 4)
    assert (job["backbone"], job["lr"], job["local_epochs"], job["batch_size"],
            job["dim"], job["n_items"]) == ("ncf", 0.1, 10, 256, d, m)
    assert imia_peer.peer_job(tmp_path, 1, limit=1)["clients"] == [0]  # the lowest id


@pytest.mark.parametrize("method", ["pfedrec", "fedrap"])
def test_peer_models_score_as_our_backbones(method):
    """The modules handed to the published attack for PFedRec and FedRAP give our
    backbone's probability for the same table, head (and personal table)."""
    import types

    import torch

    from fedem_private.models import backbone_class
    from fedem_private.models.base import ClientParams

    m, d = 7, 3
    cfg = types.SimpleNamespace(num_users=2, num_items=m, latent_dim=d, fedrap_init_std=0.1)
    peer = imia_peer.PEER_MODULES[method](cfg)
    q = peer.embedding_item.weight.detach()
    private = {"w": peer.affine_output.weight.detach()[0][None].clone(),
               "b": peer.affine_output.bias.detach().clone()}
    if method == "fedrap":
        private["personal"] = peer.personal.weight.detach()[None].clone()
        assert 0.05 < float(private["personal"].std()) < 0.2  # drawn at init_std
    ours = backbone_class(method)(m, d, 0, 0.1).scores(ClientParams(q[None], {}, private))
    got = peer(torch.zeros(m, dtype=torch.long), torch.arange(m))
    torch.testing.assert_close(got, torch.sigmoid(ours[0]))
