"""The generated reference pages: the command line (from the argparse parser) and the
configuration keys (from the configuration dataclasses), as Markdown.

Both read the code as it stands, so the pages cannot drift from it: a flag or key added to
the code appears on the next build.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import os
import tokenize
import typing
from pathlib import Path

WIDTH = 100  # the help text's width, fixed so the page does not depend on the terminal


def _subcommands(parser: argparse.ArgumentParser, prefix: str):
    """(command line, parser) of ``parser`` and of each subcommand under it, depth first."""
    yield prefix, parser
    for action in parser._actions:  # argparse keeps the subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix} {name}")


def cli_markdown() -> str:
    """Each command's and subcommand's ``--help``, as the installed program prints it."""
    from fedem_private import cli

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parser = cli.build_parser()
        commands = list(_subcommands(parser, parser.prog))
        parts = ["# Command line\n",
                 "Generated from the parser of `fedem_private.cli` when the site is built: "
                 "each section is what `--help` prints for that command.\n",
                 "\n".join(f"- [`{line}`](#{_anchor(line)})" for line, _ in commands) + "\n"]
        for line, sub in commands:
            parts.append(f"## {line}\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def _anchor(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def field_comments(cls: type) -> dict[str, str]:
    """The comments written beside or just above each field of dataclass ``cls``."""
    source = Path(inspect.getsourcefile(cls)).read_text()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#: ").strip()
    lines = source.splitlines()
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    out: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above, row = [], stmt.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments.get(row, ""))
            row -= 1
        beside = comments.get(stmt.lineno, "") if stmt.end_lineno == stmt.lineno else ""
        out[stmt.target.id] = " ".join(t for t in (*above, beside) if t)
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(table)"
    else:
        return "(required)"
    if value is None:
        return "none"
    return repr(value) if isinstance(value, str) else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flags(parser: argparse.ArgumentParser) -> dict[str, tuple[str, str]]:
    """config key -> (flag, help) for ``fedem-private run``'s flags that set one."""
    run = next(sub for line, sub in _subcommands(parser, "") if line.strip() == "run")
    out = {}
    for action in run._actions:
        if "." in action.dest and action.option_strings:
            text = (action.help or "").replace("%%", "%")
            out[action.dest] = (action.option_strings[-1], text)
    return out


def _part_options() -> dict[str, type]:
    """``federation.<key>`` -> the part's options class that reads it."""
    from fedem_private.models.options import OPTIONS
    from fedem_private.simulation import sections  # noqa: F401  (registers every part)

    return {f"federation.{cls.key(f.name)}": cls
            for cls in OPTIONS for f in dataclasses.fields(cls)}


def config_markdown() -> str:
    """One table per TOML section of a run's configuration: key, default, flag, meaning."""
    from fedem_private import cli
    from fedem_private.simulation.config import RunConfig

    flags = _flags(cli.build_parser())
    owners = _part_options()
    parts = ["# Configuration keys\n",
             "Generated from the configuration dataclasses (`RunConfig` in "
             "`fedem_private/simulation/config.py` and the sections of "
             "`fedem_private/simulation/sections.py`) when the site is built. A key is "
             "written `section.name` in overrides (`fp.run(cfg, overrides={\"train.rounds\": "
             "5})`) and as `name = value` under `[section]` in a TOML file; the flag, where "
             "there is one, sets it on the command line. The meaning is the flag's help or "
             "the comment beside the field; a part's options name the class that checks "
             "them.\n"]
    queue: list[tuple[str, type]] = [(f.name, _type_of(RunConfig, f))
                                     for f in dataclasses.fields(RunConfig)]
    while queue:
        section, cls = queue.pop(0)
        doc = inspect.getdoc(cls) or ""
        parts.append(f"## [{section}]\n\n`{cls.__module__}.{cls.__qualname__}`: "
                     f"{doc.splitlines()[0] if doc else ''}\n")
        comments = field_comments(cls)
        rows = ["| key | default | flag | meaning |", "| --- | --- | --- | --- |"]
        nested = []
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            sub = _type_of(cls, f)
            if sub is not None:
                nested.append((key, sub))
                rows.append(f"| `{key}` | table `[{key}]` | | see below |")
                continue
            flag, text = flags.get(key, ("", ""))
            meaning = text or comments.get(f.name, "")
            if key in owners:
                meaning = f"{meaning} (`{owners[key].__name__}`)".strip()
            rows.append(f"| `{key}` | `{_cell(_default(f))}` | "
                        f"{f'`{flag}`' if flag else ''} | {_cell(meaning)} |")
        parts.append("\n".join(rows) + "\n")
        queue[:0] = nested
    return "\n".join(parts)


def _type_of(owner: type, f: dataclasses.Field) -> type | None:
    """The dataclass a field of ``owner`` holds (a nested table), else None."""
    hint = typing.get_type_hints(owner).get(f.name)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
