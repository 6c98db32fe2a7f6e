"""Issue 18, a newcomer's friction list: umask, resolved configs, sweeps that never overwrite,
reports that never mix, light validation, rating columns."""

from __future__ import annotations

import os
import stat

import pytest

from fedem_private.cli import main

TINY = ["--rounds", "2", "--local-epochs", "1", "--dim", "4", "--no-progress"]


def _synthetic_toml(path, **train):
    lines = ["[data.synthetic]", "n_users = 40", "n_items = 60", "mean_activity = 8", "",
             "[train]"] + [f"{k} = {v}" for k, v in train.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def umask():
    """Set the process umask for one test, then put the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _modes(root):
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode)
            for p in [root, *root.rglob("*")]}


# ----------------------------------------------------------------- 8: the user's umask
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path, umask, mask):
    from attacks._atomic import write_json
    from fedem_private.report import write_report

    umask(mask)
    cfg = _synthetic_toml(tmp_path / "c.toml", rounds=1)
    root = tmp_path / "runs"
    assert main(["run", "--config", str(cfg), "--out", str(root / "a"), *TINY]) == 0
    write_json(root / "a" / "attacks.json", {"records": []})
    write_report(str(root))
    modes = _modes(root)
    assert {"a", "a/config.toml", "a/attacks.json", "report.md", "results.csv"} <= set(modes)
    for name, mode in modes.items():
        want = (0o777 if (root / name).is_dir() else 0o666) & ~mask
        assert mode == want, f"{name}: {oct(mode)} != {oct(want)}"
