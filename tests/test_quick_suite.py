"""``tox -e quick`` (issue 80): the contributor's pass leaves out the tests that conftest.py
names heavy; every name it gives must still be a test file or function, or the quick suite
would quietly take a renamed heavy test back in."""

from __future__ import annotations

import configparser
from pathlib import Path

from conftest import HEAVY_FILES, HEAVY_TESTS

ROOT = Path(__file__).resolve().parent.parent


def test_every_heavy_name_is_a_test_file_or_function():
    tests = ROOT / "tests"
    missing = sorted(name for name in HEAVY_FILES if not (tests / name).is_file())
    assert missing == []
    for name, function in HEAVY_TESTS:
        assert name not in HEAVY_FILES, name  # named twice
        assert f"def {function}(" in (tests / name).read_text(), (name, function)


def test_tox_quick_selects_the_suite_without_slow_and_heavy_tests_and_the_readme_says_so():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    assert '-m "not slow and not heavy"' in tox["testenv:quick"]["commands"]
    readme = (ROOT / "README.md").read_text()
    assert "tox -e quick" in readme and "pip install tox && tox" in readme
