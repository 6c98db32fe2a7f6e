"""What the wheel holds (pyproject.toml), and what tox -e wheel runs (tests/wheel_smoke.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages
from wheel_smoke import WHEEL_TOPS, main_job

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_packages_are_the_library_and_the_attacks_only():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setup = config["tool"]["setuptools"]
    packages = find_packages(str(ROOT), include=setup["packages"]["find"]["include"])
    assert {p.split(".")[0] for p in packages} == WHEEL_TOPS
    assert "fedem_private.experiments" in packages and "attacks" in packages
    assert "py.typed" in setup["package-data"]["fedem_private"]
    assert (ROOT / "fedem_private" / "py.typed").is_file()


def test_the_tests_import_the_checkouts_benchmarks():
    import benchmarks

    assert Path(benchmarks.__file__).resolve().parent == ROOT / "benchmarks"


def test_the_wheel_check_runs_the_readme_main_job():
    job = main_job((ROOT / "README.md").read_text(encoding="utf-8"))
    assert job.startswith("fedem-private ") and "pip install" not in job
    assert main_job("## Set up\n\n```sh\npip install -e . && \\\n  fedem-private sweep\n```\n") \
        == "fedem-private sweep"
