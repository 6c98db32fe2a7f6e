"""MovieLens 10M, 20M and 25M (issue 66, item 5): loaders on small files in the official
layout, their registration and pinned archive checksums, and offline downloads.

The real archives are hundreds of megabytes and never fetched here: every file is generated
in ``tmp_path`` in the layout the official archive unpacks to (``ml-10M100K/ratings.dat``,
``ml-20m/ratings.csv``, ``ml-25m/ratings.csv``).
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedem_private.cli import main
from fedem_private.data import DATASETS, RATED_DATASETS, dataset_problem, load_dataset
from fedem_private.data import download as dl
from fedem_private.data.loaders import (
    _RATING_COLUMNS,
    DATA_FILES,
    LOADERS,
    _read_ratings,
    _read_ratings_fast,
    _read_table,
    files_problem,
)
from fedem_private.errors import UserError
from fedem_private.simulation.sections import TIMED_DATASETS, DataConfig

NEW = ("ml-10m", "ml-20m", "ml-25m")
# the folder each official archive unpacks to, and its ratings file
LAYOUT = {"ml-10m": ("ml-10M100K", "ratings.dat"), "ml-20m": ("ml-20m", "ratings.csv"),
          "ml-25m": ("ml-25m", "ratings.csv")}
USERS = (11, 22, 33, 44, 55, 66, 77, 88)
ITEMS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)
TINY = ["--rounds", "1", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def fixture_rows() -> list[tuple[int, int, float, int]]:
    """48 ratings: 8 users x 6 distinct items of 10, every half star from 0.5 to 5, distinct
    timestamps in an order that is neither the file's nor the ids'."""
    rows = []
    for k, user in enumerate(USERS):
        for j in range(6):
            item = ITEMS[(k + j) % len(ITEMS)]
            rating = 0.5 * (1 + (3 * k + 7 * j) % 10)
            stamp = 1_000_000_000 + ((17 * k + 29 * j) % 48) * 1000
            rows.append((user, item, rating, stamp))
    return rows


def write_official(root: Path, name: str, rows: list[tuple[int, int, float, int]] | None = None
                   ) -> Path:
    """The folder of ``name``'s unpacked archive under ``root``: ratings and movies files."""
    rows = fixture_rows() if rows is None else rows
    folder_name, ratings = LAYOUT[name]
    folder = root / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    if name == "ml-10m":
        (folder / ratings).write_text("".join(f"{u}::{i}::{r:g}::{t}\n" for u, i, r, t in rows))
        (folder / "movies.dat").write_text("".join(
            f"{i}::Film {i} (1995)::Comedy|Drama\n" for i in ITEMS))
    else:
        (folder / ratings).write_text("userId,movieId,rating,timestamp\n" + "".join(
            f"{u},{i},{r:.1f},{t}\n" for u, i, r, t in rows))
        (folder / "movies.csv").write_text("movieId,title,genres\n" + "".join(
            f'{i},"Film {i}, The (1995)",Comedy|Drama\n' for i in ITEMS))
    return folder


# --------------------------------------------------------------------------- registration
@pytest.mark.parametrize("name", NEW)
def test_each_new_dataset_is_registered_once_everywhere_it_must_be(name):
    assert name in LOADERS and name in DATASETS and name in DATA_FILES
    assert name in RATED_DATASETS and name in TIMED_DATASETS
    source = dl.REGISTRY[name]
    assert source.url == f"https://files.grouplens.org/datasets/movielens/{name}.zip"
    assert re.fullmatch(r"[0-9a-f]{64}", source.archive_sha256 or "")
    assert re.fullmatch(r"[0-9a-f]{32}", source.archive_md5 or "")
    assert DATA_FILES[name] in source.files  # the file the loader reads is in the archive


def test_ml1m_keeps_its_files_and_gains_archive_pins():
    source = dl.REGISTRY["ml-1m"]
    assert set(source.files) == {"ratings.dat", "users.dat"}
    assert source.archive_sha256 and source.archive_md5
    assert DATA_FILES["ml-1m"] == "ratings.dat" and "ml-1m" in TIMED_DATASETS


def test_datasets_list_names_the_new_datasets(tmp_path, capsys):
    assert main(["datasets", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in NEW:
        assert re.search(rf"^{name}\s+not cached; use --data-dir or download$", out, re.M)


# --------------------------------------------------------------------------- loaders
@pytest.mark.parametrize("name", NEW)
def test_ids_counts_ratings_and_timestamps(tmp_path, name):
    rows = fixture_rows()
    d = load_dataset(name, write_official(tmp_path, name))
    assert (d.n_users, d.n_items, d.n_interactions) == (8, 10, 48)
    assert d.user_ids.tolist() == list(USERS) and d.item_ids.tolist() == list(ITEMS)
    assert d.demographics == {}  # these releases carry no demographics
    got = {(int(d.user_ids[u]), int(d.item_ids[i])): t
           for u, i, t in zip(d.users, d.items, d.timestamps, strict=True)}
    assert got == {(u, i): float(t) for u, i, _, t in rows}


@pytest.mark.parametrize("name", NEW)
def test_min_rating_keeps_the_half_stars_at_or_above_it(tmp_path, name):
    rows = fixture_rows()
    folder = write_official(tmp_path, name)
    assert {r for _, _, r, _ in rows} == {0.5 * k for k in range(1, 11)}  # half stars
    for cut in (3.5, 4.0, 5.0):
        d = load_dataset(name, folder, min_rating=cut)
        kept = {(u, i) for u, i, r, _ in rows if r >= cut}
        assert {(int(d.user_ids[u]), int(d.item_ids[i]))
                for u, i in zip(d.users, d.items, strict=True)} == kept
    with pytest.raises(UserError, match=r"no rating >= 6 .*ratings range 0.5 to 5"):
        load_dataset(name, folder, min_rating=6)
    DataConfig(dataset=name, min_rating=4.0).validate()  # allowed: the dataset is rated


@pytest.mark.parametrize("name", NEW)
def test_the_latest_rating_is_the_test_item(tmp_path, name):
    from fedem_private.data import leave_one_out

    rows = fixture_rows()
    d = load_dataset(name, write_official(tmp_path, name))
    sp = leave_one_out(d, seed=0)
    for k, user in enumerate(USERS):
        mine = sorted((t, i) for u, i, _, t in rows if u == user)
        split_user = int(np.flatnonzero(d.user_ids[sp.users] == user)[0])
        assert d.item_ids[sp.test_items[split_user]] == mine[-1][1], k
        assert d.item_ids[sp.val_items[split_user]] == mine[-2][1], k
    with pytest.raises(UserError, match="has timestamps"):
        DataConfig(dataset=name, first_seen_order=True).validate()


@pytest.mark.parametrize("name", NEW)
def test_the_fast_reader_agrees_with_the_validating_one(tmp_path, name):
    folder = write_official(tmp_path, name)
    path = folder / LAYOUT[name][1]
    sep = "::" if name == "ml-10m" else ","
    fast = _read_ratings(path, name, sep,
                         header=None if sep == "::" else "userId,movieId,rating,timestamp")
    slow = _read_table(path, name, sep, _RATING_COLUMNS, _RATING_COLUMNS,
                       header=None if sep == "::" else 0)
    assert _read_ratings_fast(path, sep, sep == ",") is not None  # not the fallback
    assert list(fast.columns) == _RATING_COLUMNS
    assert fast["user"].dtype == np.int64 and fast["item"].dtype == np.int64
    for col in _RATING_COLUMNS:
        assert np.array_equal(fast[col].to_numpy(np.float64), slow[col].to_numpy(np.float64))


def test_ml1m_still_reads_its_own_files(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::5::3::10\n2::5::1::20\n2::7::4::5\n")
    (tmp_path / "users.dat").write_text("1::F::1::10::x\n2::M::1::10::y\n")
    d = load_dataset("ml-1m", tmp_path, min_rating=3)
    assert d.n_interactions == 2 and d.demographics["gender"].tolist() == [1, 0]
    assert sorted(d.timestamps.tolist()) == [5.0, 10.0]


def test_windows_line_endings_read_the_same(tmp_path):
    rows = fixture_rows()
    a = write_official(tmp_path / "a", "ml-20m", rows)
    b = write_official(tmp_path / "b", "ml-10m", rows)
    for folder, fname in ((a, "ratings.csv"), (b, "ratings.dat")):
        (folder / fname).write_bytes((folder / fname).read_bytes().replace(b"\n", b"\r\n"))
    da, db = load_dataset("ml-20m", a), load_dataset("ml-10m", b)
    assert da.n_interactions == db.n_interactions == 48
    assert np.array_equal(da.timestamps, db.timestamps)


@pytest.mark.parametrize("name,content,needle", [
    ("ml-10m", "1::2::3.5::4\n1::x::3::4\n", "line 2: item is not a number: 'x'"),
    ("ml-10m", "1::2::3.5::4\n1::2::inf::4\n", "line 2: rating is not a finite number"),
    ("ml-10m", "1::2::3.5::4\n1::2::3.5::4::5\n", "malformed file"),
    ("ml-10m", "1::2::3.5\n", "expected 4 columns"),
    ("ml-20m", "userId,movieId,rating,timestamp\n1,2,3.5,4\n1,2,3.5,4\n5,6,x,7\n",
     "line 4: rating is not a number: 'x'"),
    ("ml-20m", "userId,movieId,rating,timestamp\n", "file has no rows"),
    ("ml-25m", "user,item,rating\n1,2,3.5\n", "line 1: expected the header "
                                               "userId,movieId,rating,timestamp"),
    ("ml-25m", "userId,movieId,rating,timestamp\n1,2,nan,4\n", "not a number: 'nan'"),
])
def test_malformed_files_are_one_line_user_errors(tmp_path, name, content, needle):
    folder = tmp_path / LAYOUT[name][0]
    folder.mkdir()
    (folder / LAYOUT[name][1]).write_text(content)
    with pytest.raises(UserError) as exc:
        load_dataset(name, folder)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg and msg.startswith(f"dataset {name}: ")


@pytest.mark.parametrize("name", NEW)
def test_files_problem_names_the_missing_file_and_where_it_is(tmp_path, name):
    folder_name, fname = LAYOUT[name]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert files_problem(name, empty) == f"dataset {name}: file not found: {empty / fname}"
    assert dataset_problem(name, empty) == files_problem(name, empty)
    with pytest.raises(UserError, match=f"dataset {name}: file not found: "):
        load_dataset(name, empty)
    # the folder above the unpacked archive: the message says which folder to pass
    folder = write_official(tmp_path / "parent", name)
    hint = f"; it is in {folder}: pass --data-dir {folder}"
    assert files_problem(name, tmp_path / "parent") == (
        f"dataset {name}: file not found: {tmp_path / 'parent' / fname}{hint}")
    with pytest.raises(UserError) as exc:
        load_dataset(name, tmp_path / "parent")
    assert str(exc.value).endswith(hint)
    assert files_problem(name, folder) is None and dataset_problem(name, folder) is None
    assert dataset_problem(name, tmp_path / "nowhere") == (
        f"dataset {name}: directory not found: {tmp_path / 'nowhere'}")
    assert files_problem(name, folder / fname) == f"dataset {name}: not a directory: " \
                                                  f"{folder / fname}"
    assert "datasets download " + name in dataset_problem(name, None, cache_dir=tmp_path)


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("name", ["ml-20m", "ml-10m"])
def test_a_run_on_a_local_copy_writes_a_summary(tmp_path, capsys, name):
    folder = write_official(tmp_path / "data", name)
    out = tmp_path / "run"
    assert main(["run", "--dataset", name, "--data-dir", str(folder), *TINY,
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == name and summary["rounds"] == 1
    assert (summary["n_users"], summary["n_items"]) == (8, 10)
    assert f"wrote {out}" in capsys.readouterr().out


def test_a_run_pointed_above_the_archive_folder_is_one_line(tmp_path, capsys):
    folder = write_official(tmp_path / "data", "ml-10m")
    out = tmp_path / "run"
    assert main(["run", "--dataset", "ml-10m", "--data-dir", str(tmp_path / "data"), *TINY,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"pass --data-dir {folder}" in err
    assert not out.exists()


# --------------------------------------------------------------------------- downloads
def _archive(tmp_path: Path, name: str) -> Path:
    """A zip in the official layout (top folder, then the files) holding the fixture."""
    src = write_official(tmp_path / "src", name)
    archive = tmp_path / f"{name}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for f in sorted(src.iterdir()):
            zf.write(f, f"{src.name}/{f.name}")
    return archive


@pytest.mark.parametrize("name", NEW)
def test_an_archive_with_the_wrong_checksum_is_refused(tmp_path, capsys, name):
    archive = _archive(tmp_path, name)  # not the official bytes: the pinned SHA-256 differs
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=f"dataset {name}: archive SHA-256 mismatch: expected "
                                        f"{dl.REGISTRY[name].archive_sha256}"):
        dl.download(name, cache, url=f"file://{archive}")
    assert not (cache / name).exists() and dl.cached_dir(name, cache) is None
    assert main(["datasets", "download", name, "--url", f"file://{archive}",
                 "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    assert "archive SHA-256 mismatch" in err and len(err.splitlines()) == 1
    assert not (cache / name).exists()


def test_the_published_md5_is_checked_too(tmp_path, monkeypatch):
    archive = _archive(tmp_path, "ml-25m")
    data = archive.read_bytes()
    official = dl.REGISTRY["ml-25m"]
    sha, md5 = hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest()
    cache = tmp_path / "cache"
    # a SHA-256 that matches does not excuse an MD5 that does not
    monkeypatch.setitem(dl.REGISTRY, "ml-25m", dl.Source(official.url, official.files,
                                                         sha, "0" * 32))
    with pytest.raises(UserError, match="dataset ml-25m: archive MD5 mismatch: expected 0{32}"):
        dl.download("ml-25m", cache, url=f"file://{archive}")
    assert not (cache / "ml-25m").exists()
    # both match: unpacked (flat), every file verified through the archive, and loadable
    monkeypatch.setitem(dl.REGISTRY, "ml-25m", dl.Source(official.url, official.files,
                                                         sha, md5))
    folder, manifest = dl.download("ml-25m", cache, url=f"file://{archive}")
    assert folder == cache / "ml-25m" and (folder / "ratings.csv").is_file()
    assert manifest["archive_verified"] and manifest["archive_md5"] == md5
    assert manifest["archive_sha256"] == sha
    assert all(f["verified"] for f in manifest["files"].values())
    d = load_dataset("ml-25m", None, cache_dir=cache, min_rating=4)
    assert d.n_interactions == sum(r >= 4 for _, _, r, _ in fixture_rows())


def test_an_ml10m_archive_unpacks_where_the_loader_reads_it(tmp_path, monkeypatch):
    archive = _archive(tmp_path, "ml-10m")
    with zipfile.ZipFile(archive) as zf:
        assert "ml-10M100K/ratings.dat" in zf.namelist()
    official = dl.REGISTRY["ml-10m"]
    monkeypatch.setitem(dl.REGISTRY, "ml-10m", dl.Source(official.url, official.files))
    cache = tmp_path / "cache"
    folder, manifest = dl.download("ml-10m", cache, url=f"file://{archive}")
    assert not manifest["archive_verified"] and "archive_md5" not in manifest
    assert load_dataset("ml-10m", None, cache_dir=cache).n_interactions == 48
    assert dataset_problem("ml-10m", None, cache_dir=cache) is None
