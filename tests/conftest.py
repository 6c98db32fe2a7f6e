"""Shared fixtures: the reference datasets beside the project, when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def dataset_dir(name: str) -> Path:
    """Path of a reference dataset, or skip the test with the reason."""
    path = SHARED / name
    if not path.is_dir():
        pytest.skip(f"reference dataset {name} not found at {path} (../shared/datasets is "
                    f"absent; these tests need it)")
    return path


@pytest.fixture
def ml100k_dir() -> Path:
    return dataset_dir("ml-100k")


@pytest.fixture
def filmtrust_dir() -> Path:
    return dataset_dir("filmtrust")
