"""A newcomer's third pass (issue 67): nothing finished is lost without a word."""

from __future__ import annotations

import pytest

from fedem_private.errors import UserError
from fedem_private.experiments.rundir import RunDir


def test_a_run_that_finishes_into_a_folder_another_run_filled_meanwhile_keeps_both(tmp_path):
    out = tmp_path / "run"
    first = RunDir(out)  # both start while the folder does not exist
    second = RunDir(out)
    with first:
        first.write_text("who", "first")
        with second:
            second.write_text("who", "second")
            second.commit()
        with pytest.raises(UserError, match=r"another run finished into .*run-2"):
            first.commit()
    assert (out / "who").read_text() == "second"
    assert (tmp_path / "run-2" / "who").read_text() == "first"


def test_force_still_replaces_what_stood_there_when_the_run_began(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "who").write_text("old")
    with RunDir(out, force=True) as rd:
        rd.write_text("who", "new")
        rd.commit()
    assert (out / "who").read_text() == "new"
    with pytest.raises(UserError, match="--force"):
        RunDir(out)
