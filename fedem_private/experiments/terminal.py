"""The finished points as a compact table in the terminal, after ``sweep``, ``report``,
``tune`` and the ladder.

One row per setting (method variant, privacy mode, target epsilon; dataset and protocol
when several), with HR@10 and NDCG@10 under full and sampled ranking as mean ± std over
seeds. The rows are the report's own (:func:`~fedem_private.experiments.report.
split_settings` and :func:`~fedem_private.experiments.report.aggregate`, formatted as
report.md formats them), so the terminal and report.md agree. Drawn with ``rich`` when
standard output is a terminal, as plain aligned text otherwise (a pipe, a log file).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fedem_private.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

# (header, the aggregated column shown as mean ± std)
METRICS = (("HR@10 full", "hr10_full"), ("NDCG@10 full", "ndcg10_full"),
           ("HR@10 sampled", "hr10_sampled"), ("NDCG@10 sampled", "ndcg10_sampled"))
MISSING = "–"  # report.md's mark of a value the runs do not have
LIMIT = 40  # rows shown at most; the rest are counted in a last line


@dataclass(frozen=True)
class ResultsTable:
    """A table to show: its title, header, rows (text cells) and a note under it."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def results_table(frame: pd.DataFrame, title: str, limit: int = LIMIT) -> ResultsTable:
    """The compact table of the runs in ``frame`` (a results table, as
    :func:`~fedem_private.experiments.results.collect` or ``results.csv`` gives it).

    Runs with the same resolved config (``config_id``) count once. Raises
    :class:`UserError` where the report would (two runs of one setting share a seed).
    """
    from fedem_private.experiments.report import _eps_label, _pm, _sort, aggregate, split_settings

    if frame.empty:
        return ResultsTable(title, (), (), "no finished runs")
    if "config_id" in frame.columns:
        known = frame["config_id"].notna()
        frame = frame[~(known & frame["config_id"].duplicated())]
    agg = _sort(aggregate(split_settings(frame.reset_index(drop=True))[0]))
    keys = [(name, column) for name, column in (("dataset", "dataset"),
                                                ("protocol", "protocol"))
            if agg[column].nunique(dropna=False) > 1]
    shown = [(name, column) for name, column in METRICS
             if f"{column}_mean" in agg.columns and agg[f"{column}_mean"].notna().any()]
    header = (*(name for name, _ in keys), "method", "privacy", "ε", "seeds",
              *(name for name, _ in shown))
    rows = []
    for _, r in agg.iterrows():
        rows.append((*(str(r[column]) for _, column in keys), str(r["variant"]),
                     str(r["mode"]), _eps_label(r), str(int(r["n_seeds"])),
                     *(_pm(r, column, 4) for _, column in shown)))
    note = ""
    if len(rows) > limit:
        note = f"... and {len(rows) - limit} more (report.md and results.csv list them all)"
        rows = rows[:limit]
    return ResultsTable(title, header, tuple(rows), note)


def plain_text(table: ResultsTable) -> str:
    """The table as plain text: its title, then columns padded to a common width (text
    left-aligned, numbers right-aligned), then its note."""
    lines = [table.title]
    if table.header:
        widths = [max(len(cell) for cell in column)
                  for column in zip(table.header, *table.rows, strict=True)]
        right = [i >= table.header.index("seeds") for i in range(len(table.header))]
        for cells in (table.header, *table.rows):
            lines.append("  ".join(
                cell.rjust(w) if r else cell.ljust(w)
                for cell, w, r in zip(cells, widths, right, strict=True)).rstrip())
    if table.note:
        lines.append(table.note)
    return "\n".join(lines)


def rich_renderable(table: ResultsTable) -> Any:
    """The table as a ``rich`` Table (numbers right-aligned; the note as its caption)."""
    from rich.table import Table

    out = Table(title=table.title, caption=table.note or None, title_justify="left",
                caption_justify="left")
    numbers = table.header.index("seeds") if "seeds" in table.header else len(table.header)
    for i, name in enumerate(table.header):
        out.add_column(name, justify="right" if i >= numbers else "left",
                       no_wrap=i >= numbers)
    for cells in table.rows:
        out.add_row(*cells)
    return out


def show(table: ResultsTable, console: Any = None, stream: TextIO | None = None) -> None:
    """Print ``table``: on ``console`` (a ``rich`` Console) when given; else with ``rich``
    when ``stream`` (default: standard output) is a terminal, as :func:`plain_text`
    otherwise."""
    stream = sys.stdout if stream is None else stream
    if console is None and stream.isatty():
        from rich.console import Console

        console = Console(file=stream)
    if console is None or not table.header:
        print(plain_text(table), file=stream, flush=True)
        return
    console.print(rich_renderable(table))


def show_results(frame: pd.DataFrame, title: str, console: Any = None,
                 limit: int = LIMIT) -> None:
    """Print the compact table of ``frame``'s runs (:func:`results_table`, :func:`show`);
    where the runs cannot be tabled, one line on standard error says why instead."""
    try:
        table = results_table(frame, title, limit)
    except UserError as exc:
        print(f"(no table of the runs: {exc})", file=sys.stderr)
        return
    show(table, console)


def show_runs_under(folder: str | Path, title: str, console: Any = None) -> None:
    """:func:`show_results` of every run directory under ``folder`` (none: nothing)."""
    from fedem_private.experiments.results import collect

    base = Path(folder)
    if base.is_dir():
        frame = collect(base)
        if not frame.empty:
            show_results(frame, title, console)
