"""fedem_private.experiments.analysis: the names table scripts use beyond the API (issue 41,
item 5; docs/design.md section 1)."""
import numpy as np

from fedem_private.experiments import analysis


def test_the_names_are_the_rooms_own():
    from fedem_private.privacy import accounting, registry
    from fedem_private.simulation import config

    assert analysis.no_privacy is registry.no_privacy
    assert analysis.compose is accounting.compose
    assert analysis.with_overrides is config.with_overrides
    assert set(analysis.__all__) <= set(dir(analysis))


def test_candidate_counts_leave_out_the_consumed_items(small_split):
    counts = analysis.candidate_counts(small_split)
    for u in range(small_split.n_users):
        seen = set(small_split.train_items[small_split.train_indptr[u]:
                                           small_split.train_indptr[u + 1]].tolist())
        seen.add(int(small_split.val_items[u]))
        assert counts[u] == small_split.n_items - len(seen)
    assert np.all(counts > 0) and counts.dtype.kind == "i"
