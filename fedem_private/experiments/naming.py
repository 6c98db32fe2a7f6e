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


def check_report_sources(names: list[str], out_dir: str | None) -> None:
    """The checks of ``report``'s arguments that need no table: sources exist, --out given."""
    from fedem_private.errors import UserError

    if not names:
        raise UserError("report: name at least one folder of runs or results.csv")
    for name in names:
        if not Path(name).expanduser().exists():
            raise UserError(f"not a directory: {name} (no such file or directory)")
    if out_dir is None and (len(names) > 1 or Path(names[0]).expanduser().is_file()):
        raise UserError("report: give --out when combining several sources or reading a "
                        "results.csv")
