"""DP-MostPop on neighbouring datasets built from source data (issue 65, item 3; docs/design.md
sections 2, 5 and 14): the split and the k-subsets are keyed by source ids, the ML-100K
catalogue is public, every relation says so, and the released privacy block holds no
un-noised figure of the data."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

import fedem_private as fp
from fedem_private.baselines.popularity import (
    DIAGNOSTIC_NOTE,
    dp_counts,
    k_subsets,
)
from fedem_private.data import SyntheticConfig, load_dataset
from fedem_private.data.interactions import Interactions, from_raw, without_rows
from fedem_private.data.keys import stable_keys
from fedem_private.data.split import leave_one_out
from fedem_private.errors import UserError
from fedem_private.experiments import neighbours as nb
from fedem_private.privacy import registry
from fedem_private.privacy.mech.base import CATALOGUE_PUBLIC_CLAUSE

ARCHITECTURES = nb.MOSTPOP_USER_LEVEL + nb.MOSTPOP_INTERACTION_LEVEL


def _tied(n_users: int = 6, n_items: int = 12, per_user: int = 7,
          prefix: str = "") -> Interactions:
    """Every user rates ``per_user`` items at one and the same timestamp: its validation and
    test items are chosen by the tie-break alone. Ids are strings when ``prefix`` is set."""
    users, items = [], []
    for u in range(n_users):
        for j in range(per_user):
            users.append(u)
            items.append((3 * u + j) % n_items)

    def ids(a: list[int], p: str) -> np.ndarray:
        return np.array([f"{p}{x:03d}" for x in a]) if prefix else np.array(a)
    return from_raw("tied", ids(users, prefix + "u"), ids(items, prefix + "i"),
                    np.zeros(len(users)))


def _by_source(data: Interactions, seed: int) -> dict:
    """Per source user id: (validation item, test item, training set) as source item ids."""
    sp = leave_one_out(data, seed)
    return {data.user_ids[sp.users[u]].item(): (data.item_ids[sp.val_items[u]].item(),
                                                data.item_ids[sp.test_items[u]].item(),
                                                sorted(data.item_ids[sp.train_of(u)].tolist()))
            for u in range(sp.n_users)}


# --------------------------------------------------------------------- keys and the split
def test_stable_keys_are_the_integer_ids_or_a_hash_of_the_string_alone():
    assert stable_keys(np.array([7, 3, 12])).tolist() == [7, 3, 12]
    alone = stable_keys(np.array(["b"]))
    among = stable_keys(np.array(["a", "b", "c"]))
    assert alone[0] == among[1] and len(set(among.tolist())) == 3
    digest = hashlib.blake2b(b"b", digest_size=8).digest()
    assert alone[0] == int.from_bytes(digest, "little", signed=True)
    assert stable_keys(np.array(["b"])).dtype == np.int64


@pytest.mark.parametrize("prefix", ["", "s"])
def test_removing_a_user_leaves_every_other_users_split_alone(prefix):
    """Old: the tie-break was keyed by the re-indexed user and the row's position, both of
    which shift when user 1 leaves; every tie here is broken by the key alone."""
    data = _tied(prefix=prefix)
    gone = data.user_ids[1]
    without = without_rows(data, data.users == 1)
    assert without.n_users == data.n_users - 1
    for seed in range(8):
        before, after = _by_source(data, seed), _by_source(without, seed)
        assert set(before) - set(after) == {gone.item()}
        for user, split in after.items():
            assert before[user] == split, (seed, user)


def test_the_tie_break_is_still_seeded():
    data = _tied()
    held = {seed: [v[:2] for v in _by_source(data, seed).values()] for seed in range(4)}
    assert len({tuple(map(tuple, h)) for h in held.values()}) > 1


def test_k_subsets_are_keyed_by_source_ids_and_uniform():
    """Each user's k-subset is the same whoever else is in the data (string ids: hashed
    keys), and over seeds every k-set of a user's items turns up about equally often."""
    data = _tied(n_users=6, n_items=12, per_user=8, prefix="s")
    k = 3
    for seed in range(5):
        a, b = leave_one_out(data, seed), leave_one_out(without_rows(data, data.users == 0),
                                                        seed)
        subsets = []
        for sp in (a, b):
            ptr, items = k_subsets(sp, k, seed)
            subsets.append({sp.source_users[u].item(): sorted(sp.source_items[
                items[ptr[u]:ptr[u + 1]]].tolist()) for u in range(sp.n_users)})
        for user, chosen in subsets[1].items():
            assert subsets[0][user] == chosen
    # uniform: user 0's 6 training items, C(6, 3) = 20 subsets over 4000 seeds
    sp = leave_one_out(data, 0)
    seen: dict[tuple, int] = {}
    for seed in range(4000):
        ptr, items = k_subsets(sp, k, seed)
        key = tuple(items[ptr[0]:ptr[1]].tolist())
        seen[key] = seen.get(key, 0) + 1
    assert len(seen) == math.comb(int(sp.train_counts[0]), k)
    expected = 4000 / len(seen)  # 200, binomial sd 14
    assert 0.7 * expected < min(seen.values()) <= max(seen.values()) < 1.3 * expected


# ------------------------------------------------------------------ the neighbour check
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_dp_mostpop_differs_on_neighbours_only_as_its_relation_allows(architecture):
    found = nb.dp_mostpop_pair(architecture)
    assert found.sound, found.violations
    assert found.others == 39  # every other user of the 40 compared
    if architecture == "central":  # the target's clipped vector: k ones
        assert found.gap == pytest.approx(math.sqrt(4))
    elif architecture in nb.MOSTPOP_INTERACTION_LEVEL:
        assert found.gap == pytest.approx(1.0)


@pytest.mark.parametrize("architecture", nb.MOSTPOP_USER_LEVEL)
def test_the_neighbour_check_finds_a_positional_key(architecture, monkeypatch):
    """The check has teeth: with the split's source keys replaced by positions (the old
    k-subsets were keyed by split.users, which shifts when a user leaves), other users'
    k-subsets and reports move and it says so. (Removing one interaction moves no
    position, so the interaction-level architectures cannot show it.)"""
    import fedem_private.data.split as split_module

    real = split_module.leave_one_out

    def positional(data, seed, *args, **kwargs):
        sp = real(data, seed, *args, **kwargs)
        return split_module.Split(sp.n_users, sp.n_items, sp.train_indptr, sp.train_items,
                                  sp.val_items, sp.test_items, sp.users, sp.dropped_users)

    monkeypatch.setattr(nb, "leave_one_out", positional)
    found = nb.dp_mostpop_pair(architecture, target=nb.mostpop_data().user_ids[0].item())
    assert not found.sound


def test_a_catalogue_derived_from_the_data_is_reported():
    """A user alone with an item: without a public catalogue world B loses that item."""
    users = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    items = np.array([0, 1, 2, 9, 0, 1, 2, 3, 1, 2, 3, 4])
    data = from_raw("t", users, items, np.arange(12.0))
    found = nb.dp_mostpop_pair("central", data, k=2, target=0)
    assert any("catalogue" in v for v in found.violations)
    public = from_raw("t", users, items, np.arange(12.0), catalogue=np.arange(10))
    assert nb.dp_mostpop_pair("central", public, k=2, target=0).sound


# ------------------------------------------------------------------- the public catalogue
def _ml100k_dir(tmp_path, rows, catalogue):
    lines = [f"{u}\t{i}\t4\t{t}" for u, i, t in rows]
    (tmp_path / "u.data").write_text("\n".join(lines) + "\n", encoding="latin-1")
    if catalogue is not None:
        (tmp_path / "u.item").write_text(
            "".join(f"{i}|Film {i} (1995)|01-Jan-1995||http://x|" + "|".join("0" * 19) + "\n"
                    for i in catalogue), encoding="latin-1")
    return tmp_path


ROWS = [(1, 1, 10), (1, 2, 11), (1, 3, 12), (1, 7, 13),
        (2, 1, 10), (2, 2, 11), (2, 4, 12), (3, 2, 10), (3, 4, 11), (3, 1, 12)]


def test_ml100k_takes_its_catalogue_from_u_item(tmp_path):
    data = load_dataset("ml-100k", _ml100k_dir(tmp_path, ROWS, range(1, 9)))
    assert data.public_catalogue and data.item_ids.tolist() == list(range(1, 9))
    # items 5, 6 and 8 have no interaction; item 7 is user 1's alone
    assert np.bincount(data.items, minlength=data.n_items)[[4, 5, 7]].tolist() == [0, 0, 0]
    without = without_rows(data, data.users == 0)
    assert without.item_ids.tolist() == data.item_ids.tolist()
    for architecture in ARCHITECTURES:  # items no one rated are counted as zero
        release = dp_counts(leave_one_out(without, 0), architecture, 2, 1.0, 1e-5, 0)
        assert release.estimate.shape == (8,) and np.isfinite(release.estimate).all()


def test_ml100k_without_u_item_derives_the_catalogue_and_refuses_an_unknown_item(tmp_path):
    data = load_dataset("ml-100k", _ml100k_dir(tmp_path, ROWS, None))
    assert not data.public_catalogue and data.item_ids.tolist() == [1, 2, 3, 4, 7]
    with pytest.raises(UserError, match="item 7, which the item catalogue lacks"):
        load_dataset("ml-100k", _ml100k_dir(tmp_path, ROWS, range(1, 7)))


def test_every_stated_relation_says_the_catalogue_is_public():
    for name in registry.names():
        mech = registry.mechanism_for(name)
        stated = CATALOGUE_PUBLIC_CLAUSE in mech.describe()["neighbouring"]
        assert stated == mech.claims_guarantee, name
        assert CATALOGUE_PUBLIC_CLAUSE in mech.describe(sizes_public=True)["neighbouring"] \
            or not mech.claims_guarantee
    sp = leave_one_out(nb.mostpop_data(), 0)
    for architecture in ARCHITECTURES:
        release = dp_counts(sp, architecture, 4, 1.0, 1e-5, 0)
        assert release.privacy["neighbouring"].endswith(CATALOGUE_PUBLIC_CLAUSE)


# ----------------------------------------------------------- what the privacy block holds
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_released_block_holds_no_unnoised_figure_of_the_data(architecture):
    """Two datasets of the same size (users, items) but other training sets: the privacy
    block must read the same (it states the mechanism, not the data); the number of users
    clipped at k, which differs, is a labelled diagnostic outside it."""
    data = nb.mostpop_data()
    a = leave_one_out(data, 0)
    keep = np.concatenate([a.train_of(u)[:3] for u in range(a.n_users)])
    indptr = np.concatenate([[0], np.cumsum(np.minimum(a.train_counts, 3))])
    import dataclasses

    b = dataclasses.replace(a, train_items=keep, train_indptr=indptr)
    ra, rb = (dp_counts(s, architecture, 4, 1.0, 1e-5, 0) for s in (a, b))
    assert ra.privacy == rb.privacy
    assert "users_clipped" not in ra.privacy
    if architecture in nb.MOSTPOP_USER_LEVEL:
        assert ra.diagnostics["users_clipped"] == int((a.train_counts > 4).sum()) > 0
        assert rb.diagnostics["users_clipped"] == 0
        assert ra.diagnostics["note"] == DIAGNOSTIC_NOTE


def test_summary_json_keeps_the_clip_diagnostic_out_of_the_privacy_block(tmp_path):
    syn = SyntheticConfig(n_users=60, n_items=80, mean_activity=12)
    cfg = {"data": {"synthetic": {"n_users": syn.n_users, "n_items": syn.n_items,
                                  "mean_activity": syn.mean_activity}},
           "federation": {"method": "dp-mostpop"}, "baseline": {"k": 5}}
    res = fp.run(cfg, out=tmp_path / "run")
    assert "users_clipped" not in res.summary["privacy"]
    assert CATALOGUE_PUBLIC_CLAUSE in res.summary["privacy"]["neighbouring"]
    clipping = res.summary["clipping"]
    assert clipping["users_clipped"] > 0 and clipping["note"] == DIAGNOSTIC_NOTE
    row = fp.load_results(tmp_path).iloc[0]
    assert row["mode"] == "central-gaussian" and bool(row["guarantee"])
