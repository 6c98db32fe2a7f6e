"""Issue 40, a newcomer's second pass: bad input is one line and exit 2, nothing is silently
misread or replaced."""

from __future__ import annotations

import errno
import os

import pytest

from fedem_private.cli import main
from fedem_private.data import load_dataset
from fedem_private.errors import UserError

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def one_line_error(capsys, needle: str) -> str:
    """The command's stderr, checked to be one line holding ``needle`` and no traceback."""
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------- 2: tracebacks become one line
@pytest.mark.parametrize("text,needle", [
    ("u1,i1\nu1,i2\nu1,i3\nu1,i4\n", "its only user (u1) interacted with every one of its 4"),
    ("u1,i1\nu1,i2\nu1,i3\nu2,i1\nu2,i2\nu2,i3\nu3,i1\nu3,i2\n",
     "2 of its 3 users (e.g. u1) interacted with every one of its 3 items"),
])
def test_a_user_with_every_item_is_a_one_line_error(tmp_path, capsys, text, needle):
    (tmp_path / "d.csv").write_text(text)
    out = tmp_path / "out"
    assert main(["run", "--dataset", "csv", "--data-dir", str(tmp_path / "d.csv"), *TINY,
                 "--out", str(out)]) == 2
    one_line_error(capsys, needle)
    assert not out.exists()


def test_run_into_a_folder_it_cannot_write_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """A read-only filesystem (or a folder without write permission): root ignores chmod, so
    the refusal is simulated where the run directory is made."""
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if ".tmp-" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    assert main(["run", *TINY, "--out", str(tmp_path / "run")]) == 2
    one_line_error(capsys, f"cannot write in {tmp_path}: Read-only file system")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ 3: CSV headers are read by name
def write_csv(tmp_path, text: str):
    path = tmp_path / "d.csv"
    path.write_text(text)
    return path


def test_csv_header_columns_are_read_by_name_in_any_order(tmp_path):
    rows = "item,user,rating\n10,1,5\n11,1,3\n10,2,4\n12,2,1\n"
    d = load_dataset("csv", write_csv(tmp_path, rows), min_rating=3)
    assert d.user_ids.tolist() == ["1", "2"] and d.item_ids.tolist() == ["10", "11"]
    d = load_dataset("csv", write_csv(tmp_path, "userId,movieId,timestamp\n1,10,5\n1,11,3\n"))
    assert d.item_ids.tolist() == ["10", "11"] and d.timestamps.tolist() == [5.0, 3.0]
    # no header: user,item[,rating][,timestamp] by position, as before
    d = load_dataset("csv", write_csv(tmp_path, "1,10,5\n1,11,3\n"), min_rating=4)
    assert d.item_ids.tolist() == ["10"]


@pytest.mark.parametrize("text,needle", [
    ("customer,product\n1,10\n1,11\n", "the first line 'customer,product' looks like a header"),
    ("customer,product\nann,x\nann,y\nbob,x\n", "names no known column"),
    ("a,b,score_of_it\n1,10,5\n", "looks like a header"),
    ("user,rating\n1,5\n2,3\n", "header 'user,rating' names no item column"),
    ("item,rating\n1,5\n", "names no user column"),
    ("user,item,genre\n1,10,x\n", "unknown column 'genre'"),
    ("user,item,item_id\n1,10,11\n", "names the item column twice"),
])
def test_csv_headers_that_are_not_understood_are_refused(tmp_path, capsys, text, needle):
    path = write_csv(tmp_path, text)
    with pytest.raises(UserError, match=None) as err:
        load_dataset("csv", path)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert main(["run", "--dataset", "csv", "--data-dir", str(path), *TINY,
                 "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, needle)
