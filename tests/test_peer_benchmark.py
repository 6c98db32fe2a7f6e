"""benchmarks/probes/peer.py without the peer's checkout: the refusal line and exit code, the
ML-100K conversion, the compatibility shims and the summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the benchmarks package

from benchmark_cli import run_module  # noqa: E402

from benchmarks.probes import peer  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("benchmarks.probes.peer", *args)


def test_without_peer_dir_one_line_and_exit_2():
    res = _run()
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "jundongchen13/FedEM" in lines[0] and "--peer-dir" in lines[0]
    assert "Traceback" not in res.stderr


def test_peer_dir_without_train_py_exit_2(tmp_path):
    res = _run("--peer-dir", str(tmp_path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.py" in lines[0] and str(tmp_path) in lines[0]
    assert "Traceback" not in res.stderr


def test_peer_problem():
    assert peer.peer_problem(None) == peer.NEEDS
    assert peer.peer_problem("") == peer.NEEDS


def test_peer_problem_accepts_a_checkout_shape(tmp_path):
    for f in peer.PEER_FILES:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    assert peer.peer_problem(str(tmp_path)) is None
    (tmp_path / "model" / "engine.py").unlink()
    assert "model/engine.py" in peer.peer_problem(str(tmp_path))


def test_write_peer_ml100k(tmp_path):
    src = tmp_path / "ml-100k"
    src.mkdir()
    (src / "u.data").write_text("196\t242\t3\t881250949\n186\t302\t3\t891717742\n\n")
    out = peer.write_peer_ml100k(src, tmp_path / "work")
    assert out == tmp_path / "work" / "datasets" / "ml-100k" / "ratings.dat"
    assert out.read_text() == "196,242,3,881250949\n186,302,3,891717742\n"


def test_write_peer_ml100k_read_as_the_peer_reads_it(tmp_path):
    pd = pytest.importorskip("pandas")
    src = tmp_path / "src"
    src.mkdir()
    (src / "u.data").write_text("1\t10\t5\t100\n1\t11\t4\t90\n2\t10\t1\t95\n")
    out = peer.write_peer_ml100k(src, tmp_path)
    # utils.loadData's ml-100k branch
    frame = pd.read_csv(out, sep=",", header=None, names=["uid", "mid", "rating", "timestamp"],
                        engine="python")
    assert frame.values.tolist() == [[1, 10, 5, 100], [1, 11, 4, 90], [2, 10, 1, 95]]


def test_write_peer_ml100k_refuses_a_bad_line(tmp_path):
    (tmp_path / "u.data").write_text("1\t2\t3\n")
    with pytest.raises(ValueError, match="line 1"):
        peer.write_peer_ml100k(tmp_path, tmp_path / "w")


def test_compat_shims_restore_the_old_behaviour():
    """Run in a subprocess: the shims patch numpy, pandas and random for good."""
    code = """
import random
import numpy as np, pandas as pd
from benchmarks.probes.peer import _compat_shims
_compat_shims()
assert np.in1d([1, 5], [5]).tolist() == [False, True]
frame = pd.DataFrame({"u": [1, 0, 1], "t": [3, 2, 1]})
out = frame.groupby("u", group_keys=False).apply(lambda g: g.sort_values("t"))
assert out.columns.tolist() == ["u", "t"], out.columns
assert out.index.tolist() == [1, 2, 0] and out["t"].tolist() == [2, 1, 3]
assert sorted(random.sample({1, 2, 3}, 3)) == [1, 2, 3]
import coloredlogs
coloredlogs.install()
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_summarise():
    res = peer.summarise({"peer": [80.0, 70.0], "paper-code": [8.0, 7.0],
                          "default": [2.0, 3.5]})
    assert res["mean_s"]["peer"] == 75.0
    assert res["ratio"]["paper-code"] == pytest.approx(10.0)
    assert res["ratio"]["default"] == pytest.approx(75.0 / 2.75)
    assert res["ratio_per_round"]["default"] == pytest.approx([40.0, 20.0])
