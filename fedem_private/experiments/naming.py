"""Names and counts in the experiment commands' messages (a leaf: imports nothing of ours)."""

from __future__ import annotations

from pathlib import Path

QUICK_OUT = "runs/quick-sweep"


def plural(n: int, word: str) -> str:
    """``"1 run"``, ``"3 runs"``: a count and an English noun, for the command's messages."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def default_out(spec_path: str | None) -> str:
    """Where a sweep writes when ``--out`` is not given."""
    return QUICK_OUT if spec_path is None else f"runs/sweep-{Path(spec_path).stem}"
