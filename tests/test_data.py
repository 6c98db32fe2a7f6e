"""Loaders, synthetic generator, leave-one-out split, negative sampling, downloads."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedem_private.data import SyntheticConfig, generate, leave_one_out, load_dataset
from fedem_private.data.download import REGISTRY, Source, download
from fedem_private.data.interactions import from_raw
from fedem_private.data.negatives import sample_excluding
from fedem_private.data.split import cold_share, exclusion_csr
from fedem_private.errors import UserError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- loaders
def test_ml100k_format_and_gender(tmp_path):
    write(tmp_path / "u.data", "1\t10\t5\t100\n1\t11\t3\t50\n2\t10\t4\t70\n")
    write(tmp_path / "u.user", "1|24|M|x|1\n2|53|F|y|2\n")
    d = load_dataset("ml-100k", tmp_path)
    assert (d.n_users, d.n_items, d.n_interactions) == (2, 2, 3)
    assert d.demographics["gender"].tolist() == [0, 1]
    assert d.user_ids.tolist() == [1, 2] and d.item_ids.tolist() == [10, 11]


def test_filmtrust_comma_and_space(tmp_path):
    write(tmp_path / "a" / "ratings.txt", "1,1,2\n1,2,4\n2,1,3.5\n")
    write(tmp_path / "b" / "ratings.txt", "1 1 2\n1 2 4\n2 1 3.5\n")
    a, b = load_dataset("filmtrust", tmp_path / "a"), load_dataset("filmtrust", tmp_path / "b")
    assert a.n_interactions == b.n_interactions == 3 and a.timestamps is None


def test_ml1m_and_lastfm(tmp_path):
    write(tmp_path / "m" / "ratings.dat", "1::5::3::10\n2::5::1::20\n")
    write(tmp_path / "m" / "users.dat", "1::F::1::10::x\n2::M::1::10::y\n")
    m = load_dataset("ml-1m", tmp_path / "m")
    assert m.n_interactions == 2 and m.demographics["gender"].tolist() == [1, 0]
    write(tmp_path / "l" / "user_artists.dat", "userID\tartistID\tweight\n2\t51\t13883\n2\t52\t1\n")
    assert load_dataset("lastfm-2k", tmp_path / "l").n_interactions == 2


def test_csv_with_header_and_string_ids(tmp_path):
    f = write(tmp_path / "x.csv", "user,item,rating,timestamp\nann,a,1,3\nann,b,1,1\nbob,a,1,2\n")
    d = load_dataset("csv", f)
    assert d.n_users == 2 and d.n_items == 2 and d.timestamps is not None
    f2 = write(tmp_path / "y.csv", "u1,i1\nu1,i2\n")
    assert load_dataset("csv", f2).n_interactions == 2


def test_duplicates_keep_latest():
    d = from_raw("t", np.array([1, 1, 1]), np.array([5, 5, 6]), np.array([1.0, 9.0, 3.0]))
    assert d.n_interactions == 2
    assert sorted(d.timestamps.tolist()) == [3.0, 9.0]


@pytest.mark.parametrize("content,needle", [
    ("", "empty"),
    ("1\t2\n", "expected 4 columns"),
    ("1\tx\t3\t4\n", "not a number"),
])
def test_malformed_files_are_user_errors(tmp_path, content, needle):
    write(tmp_path / "u.data", content)
    with pytest.raises(UserError) as exc:
        load_dataset("ml-100k", tmp_path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_missing_things_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="directory not found"):
        load_dataset("ml-100k", tmp_path / "nope")
    with pytest.raises(UserError, match="file not found"):
        load_dataset("ml-100k", tmp_path)
    with pytest.raises(UserError, match="unknown dataset"):
        load_dataset("ml-99m", tmp_path)
    with pytest.raises(UserError, match="no cached copy"):
        load_dataset("ml-1m", None, cache_dir=tmp_path)


def test_real_ml100k_pinned(ml100k_dir):
    digest = hashlib.sha256((ml100k_dir / "u.data").read_bytes()).hexdigest()
    assert digest == REGISTRY["ml-100k"].files["u.data"]
    d = load_dataset("ml-100k", ml100k_dir)
    assert (d.n_users, d.n_items, d.n_interactions) == (943, 1682, 100000)
    assert np.mean(d.demographics["gender"] == 1) == pytest.approx(273 / 943)


def test_real_filmtrust(filmtrust_dir):
    d = load_dataset("filmtrust", filmtrust_dir)
    sp = leave_one_out(d, 0)
    assert d.n_users == 1508 and sp.dropped_users > 0
    assert sp.n_users + sp.dropped_users == d.n_users


# ----------------------------------------------------------------------------- split
def test_leave_one_out_by_time_and_drops():
    users = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2])
    items = np.array([1, 2, 3, 4, 1, 2, 5, 6, 7])
    ts = np.array([4, 1, 3, 2, 1, 2, 9, 8, 7], dtype=float)
    sp = leave_one_out(from_raw("t", users, items, ts), seed=0)
    assert sp.dropped_users == 1 and sp.n_users == 2
    assert sp.test_items.tolist() == [0, 4] and sp.val_items.tolist() == [2, 5]
    assert sp.train_of(0).tolist() == [1, 3] and sp.train_of(1).tolist() == [6]


def test_leave_one_out_without_time_is_seeded():
    d = generate(SyntheticConfig(n_users=50, n_items=40, mean_activity=8), seed=3)
    d = from_raw("t", d.user_ids[d.users], d.item_ids[d.items])
    a, b, c = leave_one_out(d, 1), leave_one_out(d, 1), leave_one_out(d, 2)
    assert np.array_equal(a.test_items, b.test_items)
    assert not np.array_equal(a.test_items, c.test_items)


def test_cold_share_counts_held_out_items_no_training_positive_has():
    users = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    items = np.array([1, 2, 3, 9, 1, 2, 3, 4, 2, 3, 4, 1])
    ts = np.array([1, 2, 3, 4] * 3, dtype=float)  # the last column is each user's test item
    sp = leave_one_out(from_raw("t", users, items, ts), seed=0)
    # training positives: {1, 2}, {1, 2}, {2, 3}; test items 9 (user 0's alone) and 4
    # (user 2 holds it out for validation) are cold, 1 is not
    assert cold_share(sp) == pytest.approx(2 / 3)
    # validation items 3, 3 (user 2 trains on it) and 4 (nobody does)
    assert cold_share(sp, sp.val_items) == pytest.approx(1 / 3)


def test_everyone_filtered_is_user_error():
    d = from_raw("tiny", np.array([1, 2]), np.array([1, 1]))
    with pytest.raises(UserError, match="fewer than 3"):
        leave_one_out(d, 0)


def test_protocol_exclusions():
    d = generate(SyntheticConfig(n_users=30, n_items=50, mean_activity=6), seed=0)
    sp = leave_one_out(d, 0)
    ip, it = exclusion_csr(sp, "paper")
    sp_ip, sp_it = exclusion_csr(sp, "strict")
    for u in range(sp.n_users):
        paper = set(it[ip[u]: ip[u + 1]].tolist())
        strict = set(sp_it[sp_ip[u]: sp_ip[u + 1]].tolist())
        assert strict == set(sp.train_of(u).tolist())
        assert paper == strict | {int(sp.val_items[u]), int(sp.test_items[u])}
    with pytest.raises(UserError):
        exclusion_csr(sp, "loose")


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_is_deterministic_and_shaped():
    cfg = SyntheticConfig(n_users=300, n_items=200)
    a, b, c = generate(cfg, 0), generate(cfg, 0), generate(cfg, 1)
    assert np.array_equal(a.users, b.users) and np.array_equal(a.items, b.items)
    assert not np.array_equal(a.items, c.items)
    counts = np.bincount(a.users)
    assert counts.min() >= 3 and counts.std() > 0.3 * counts.mean()  # heavy-tailed activity
    pop = np.sort(np.bincount(a.items))[::-1]
    assert pop[: len(pop) // 10].sum() > 0.2 * pop.sum()  # popular head


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), st.integers(1, 45), st.integers(0, 10_000))
def test_synthetic_top_k_is_the_full_sort_prefix(rows, m, k, seed):
    """The partial partition picks each row's k smallest keys in the order a full argsort
    gives them (the slow, obvious reference), also when k reaches the row's length."""
    from fedem_private.data.synthetic import _top

    keys = np.random.default_rng(seed).normal(size=(rows, m))
    k = min(k, m)
    assert np.array_equal(_top(keys, k)[:, :k], np.argsort(keys, axis=1)[:, :k])


def test_synthetic_bad_config():
    with pytest.raises(UserError):
        generate(SyntheticConfig(n_users=0), 0)


# ----------------------------------------------------------------------------- negatives
@settings(max_examples=60, deadline=None)
@given(st.integers(5, 40), st.lists(st.lists(st.integers(0, 39), max_size=20), min_size=1,
                                    max_size=6), st.integers(0, 10_000))
def test_sample_excluding_matches_brute_force(m, excl_lists, seed):
    excl = [np.unique([e for e in lst if e < m]) for lst in excl_lists]
    excl = [e if len(e) < m else e[:-1] for e in excl]
    indptr = np.concatenate([[0], np.cumsum([len(e) for e in excl])]).astype(np.int64)
    flat = np.concatenate(excl).astype(np.int64) if indptr[-1] else np.zeros(0, np.int64)
    g = np.random.default_rng(seed)
    users = g.integers(0, len(excl), size=50)
    u = g.uniform(size=50)
    got = sample_excluding(indptr, flat, m, users, u)
    for j, user in enumerate(users):
        allowed = np.setdiff1d(np.arange(m), excl[user])
        assert got[j] == allowed[int(u[j] * len(allowed))]


def test_sample_excluding_is_uniform():
    indptr = np.array([0, 3])
    excl = np.array([0, 4, 5])
    u = np.random.default_rng(0).uniform(size=70_000)
    got = sample_excluding(indptr, excl, 10, np.zeros(70_000, dtype=np.int64), u)
    counts = np.bincount(got, minlength=10)
    assert counts[[0, 4, 5]].sum() == 0
    expected = 10_000
    chi2 = ((counts[counts > 0] - expected) ** 2 / expected).sum()
    assert chi2 < 30  # 6 degrees of freedom: p < 1e-4 above this


# ----------------------------------------------------------------------------- download
def _zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"pack/{name}", data)
    return buf.getvalue()


@pytest.fixture
def local_server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_checks_sha256(local_server, tmp_path, monkeypatch):
    root, base = local_server
    data = b"1\t1\t5\t1\n1\t2\t5\t2\n1\t3\t5\t3\n"
    (root / "good.zip").write_bytes(_zip_bytes({"u.data": data, "u.user": b"1|1|F|x|1\n"}))
    (root / "bad.zip").write_bytes(_zip_bytes({"u.data": b"tampered\n", "u.user": b""}))
    pinned = hashlib.sha256(data).hexdigest()
    monkeypatch.setitem(REGISTRY, "ml-100k", Source(f"{base}/good.zip", {"u.data": pinned,
                                                                          "u.user": None}))
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match="SHA-256 mismatch"):
        download("ml-100k", cache, url=f"{base}/bad.zip")
    assert not (cache / "ml-100k").exists()
    with pytest.raises(UserError, match="archive SHA-256 mismatch"):
        download("ml-100k", cache, sha256="0" * 64)
    folder, manifest = download("ml-100k", cache)
    assert manifest["files"]["u.data"]["verified"] and not manifest["files"]["u.user"]["verified"]
    assert load_dataset("ml-100k", None, cache_dir=cache).n_interactions == 3
    assert folder == cache / "ml-100k"
    with pytest.raises(UserError, match="download from"):
        download("ml-1m", cache, url=f"{base}/missing.zip")
