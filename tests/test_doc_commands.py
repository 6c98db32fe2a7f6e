"""The commands the README, the guide and the tutorial show run as written (issue 80, item 4):
every ``fedem-private`` command in a ```sh block parses with the real CLI parser, every flag
written anywhere in them (inline code too) is one its subcommand has, and a file named like
one committed in the checkout is given by its path there. Nothing is run: parsing only."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from fedem_private.cli import build_parser
from fedem_private.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/guide.md",
         *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs/tutorials").glob("*.ipynb"))]
HELP = {"-h", "--help", "--help-all", "--version"}
# committed files a command may name: a bare name of one of these is a path that is not there
COMMITTED = {p.name: p for folder in ("benchmarks", "examples", "docs")
             for p in (ROOT / folder).rglob("*.toml")}


def page_text(page: str) -> str:
    """A page's text; a notebook's markdown cells (its code calls the Python API)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if page.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return text


def commands(text: str) -> list[tuple[bool, list[str]]]:
    """(whole, the tokens after ``fedem-private``) of each command in ``text``: ``whole``
    for a shell block's (continued lines joined, comments dropped, split at ``&&``), not
    for an inline code span's, which may name a command without its arguments."""
    out: list[tuple[bool, list[str]]] = []
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            tokens = shlex.split(line.strip().removeprefix("$ "), comments=True)
            part: list[str] = []
            for token in [*tokens, "&&"]:
                if token in ("&&", ";"):
                    if part[:1] == ["fedem-private"]:
                        out.append((True, part[1:]))
                    part = []
                else:
                    part.append(token)
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    out += [(False, shlex.split(span)[1:]) for span in re.findall(r"`(fedem-private [^`]*)`",
                                                                   outside)]
    return out


def subparser(parser: argparse.ArgumentParser, tokens: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser the leading subcommand words of ``tokens`` select."""
    for token in tokens:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or token not in subs[0].choices:
            break
        parser = subs[0].choices[token]
    return parser


def flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--") and t not in HELP]


DOCUMENTED = [(page, whole, tokens) for page in PAGES
              for whole, tokens in commands(page_text(page))]


def test_the_pages_show_commands():
    """The collector finds what the pages hold: a vacuous pass would check nothing."""
    by_page = {page: sum(1 for p, _, _ in DOCUMENTED if p == page) for page in PAGES}
    assert by_page["README.md"] >= 30 and by_page["docs/guide.md"] >= 10
    assert all(by_page[p] >= 1 for p in PAGES if p.endswith(".ipynb"))


@pytest.mark.parametrize("page, whole, tokens", DOCUMENTED,
                         ids=[f"{p}:{' '.join(t)[:60]}" for p, _, t in DOCUMENTED])
def test_a_documented_command_parses(page, whole, tokens):
    parser = build_parser()
    own = subparser(parser, tokens)
    unknown = [f for f in flags(tokens) if f not in own._option_string_actions]
    assert not unknown, f"{page}: `fedem-private {' '.join(tokens)}`: no such flag {unknown}"
    bare = [t for t in tokens if t in COMMITTED and not (ROOT / t).is_file()]
    assert not bare, (f"{page}: `fedem-private {' '.join(tokens)}` names {bare[0]}, which is "
                      f"{COMMITTED[bare[0]].relative_to(ROOT)} in the checkout")
    if whole and not HELP.intersection(tokens):
        try:
            parser.parse_args([t for t in tokens if t != "..."])
        except UserError as exc:
            pytest.fail(f"{page}: `fedem-private {' '.join(tokens)}`: {exc}")


def test_the_check_catches_what_the_pages_once_held():
    """The tutorial's ``sweep --quick`` (no such flag) and the guide's bare
    ``--tuned fedmf-ml-100k-best.toml`` (not found where the command runs)."""
    quick = commands("built-in quick sweep (`fedem-private sweep --quick`)")
    assert quick == [(False, ["sweep", "--quick"])]
    assert "--quick" not in subparser(build_parser(), ["sweep"])._option_string_actions
    [(whole, tokens)] = commands("```sh\nfedem-private ladder --dataset csv --data-dir r.csv "
                                 "--out o \\\n    --tuned fedmf-ml-100k-best.toml  # x\n```\n")
    assert whole and tokens[-1] == "fedmf-ml-100k-best.toml"
    assert "fedmf-ml-100k-best.toml" in COMMITTED
    assert not (ROOT / tokens[-1]).is_file()
