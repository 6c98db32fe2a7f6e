"""The documentation site's page plan (docs/tooling/: issue 67, item 3), without MkDocs:
no page over the limit, nothing lost in a split, links follow their targets, the
navigation names every page, and the generated reference pages follow the code."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "tooling"))

import pages  # noqa: E402
import reference  # noqa: E402


@pytest.fixture(scope="module")
def plan():
    return pages.plan(ROOT)


def test_no_page_of_the_site_is_over_the_limit(plan):
    long = {p.src_uri: p.lines for pieces in plan.pages.values() for p in pieces
            if p.lines > pages.LIMIT}
    assert long == {}, "split these sections further (one page per '## ' section)"
    assert len(plan.pages["docs/design.md"]) > 1  # the long pages are split ...
    assert (ROOT / "docs" / "design.md").is_file()  # ... and their files stay where cited


def unsplit(pieces):
    """The source text back from its pieces: headings lowered again, added lines dropped."""
    first = pieces[0].text.split("\n## Sections of this page\n")[0]
    rest = []
    for piece in pieces[1:]:
        lines = piece.text.splitlines()
        del lines[1:3]  # the blank line and the "A section of ..." line after the heading
        code = pages.fenced(lines)
        rest += ["#" + ln if not c and pages.HEADING.match(ln) else ln
                 for ln, c in zip(lines, code, strict=True)]
    return first.splitlines() + rest


@pytest.mark.parametrize("name", ["design.md", "privacy.md", "history.md"])
def test_a_split_loses_no_line(plan, name):
    pieces = plan.pages[f"docs/{name}"]
    assert len(pieces) > 2
    assert unsplit(pieces) == (ROOT / "docs" / name).read_text().splitlines()


def test_links_follow_their_targets_to_the_pieces(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "fig.png").write_bytes(b"\x89PNG")
    (tmp_path / "docs" / "long.md").write_text(
        "# Long\n\nintro\n\n## Contents\n\n- [B](#b-part)\n\n## A part\n\n"
        "see [b](#b-part), [here](#a-part) and `[code](#b-part)`\n\n"
        "```\n## not a heading\n```\n\n## B part\n\n![fig](../benchmarks/fig.png)\n")
    (tmp_path / "docs" / "other.md").write_text(
        "# Other\n\n[to B](long.md#b-part) [to long](long.md) [`x` in text](long.md#a-part)\n")
    (tmp_path / "README.md").write_text("# Home\n\n[B](docs/long.md#b-part) "
                                        "[report](benchmarks/report.md)\n")
    (tmp_path / "benchmarks" / "report.md").write_text("# Report\n\n![f](fig.png)\n")
    site = pages.plan(tmp_path, limit=5)
    pieces = site.pages["docs/long.md"]
    assert [p.src_uri for p in pieces] == ["long.md", "long/a-part.md", "long/b-part.md"]
    assert "[B](long/b-part.md#b-part)" in site.rewrite(pieces[0].text, "long.md")
    a_part = site.rewrite(pieces[1].text, "long/a-part.md")
    assert "[b](b-part.md#b-part)" in a_part and "[here](#a-part)" in a_part
    assert "`[code](#b-part)`" in a_part and "## not a heading" in a_part
    assert pieces[1].text.startswith("# A part\n")  # raised to the page's title
    assert "![fig](../assets/repo/benchmarks/fig.png)" in site.rewrite(pieces[2].text,
                                                                      "long/b-part.md")
    assert site.assets == {"benchmarks/fig.png": "assets/repo/benchmarks/fig.png"}
    other = site.rewrite((tmp_path / "docs" / "other.md").read_text(), "other.md")
    assert "(long/b-part.md#b-part)" in other and "[to long](long.md)" in other
    assert "[`x` in text](long/a-part.md#a-part)" in other
    home = site.pages["README.md"][0]
    assert home.src_uri == "index.md"
    assert "[B](long/b-part.md#b-part)" in site.rewrite(home.text, "index.md")
    assert "[report](repo/benchmarks/report.md)" in site.rewrite(home.text, "index.md")
    report = site.pages["benchmarks/report.md"][0]  # a linked report: a page, links followed
    assert "![f](../../assets/repo/benchmarks/fig.png)" in site.rewrite(
        report.text, "repo/benchmarks/report.md")


def nav_entries():
    """The page paths mkdocs.yml's nav names (no YAML parser: the file holds a Python tag)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r":\s+(\S+\.(?:md|ipynb))\s*$", nav, re.MULTILINE)


def test_the_navigation_names_every_page_once(plan):
    import hooks

    named = nav_entries()
    assert len(named) == len(set(named))
    sources = {p.src_uri for pieces in plan.pages.values() for p in pieces[:1]
               if not p.src_uri.startswith(f"{pages.REPORTS}/")}  # linked reports: no nav
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*")
               if p.suffix in (".md", ".ipynb") and "tooling" not in p.parts}
    available = sources | on_disk | set(hooks.GENERATED)
    assert [n for n in named if n not in available] == []
    assert sorted(available - set(named)) == []  # no page only a link reaches


def test_the_cli_page_shows_every_command():
    from fedem_private import cli

    text = reference.cli_markdown()
    for line, _ in reference._subcommands(cli.build_parser(), "fedem-private"):
        assert f"## {line}\n" in text
        assert f"usage: {line}" in text
    assert "--record-rounds" in text and "fedem-private datasets download" in text


def test_the_configuration_page_lists_every_key_with_its_default():
    from fedem_private.simulation.config import RunConfig

    text = reference.config_markdown()
    cfg = RunConfig()
    for section in dataclasses.fields(RunConfig):
        value = getattr(cfg, section.name)
        assert f"## [{section.name}]" in text
        for f in dataclasses.fields(value):
            sub = getattr(value, f.name)
            if dataclasses.is_dataclass(sub):
                assert f"## [{section.name}.{f.name}]" in text
                continue
            shown = "none" if sub is None else repr(sub) if isinstance(sub, str) else str(sub)
            assert f"| `{section.name}.{f.name}` | `{shown}` |" in text
    assert "| `train.rounds` | `50` | `--rounds` |" in text


def test_a_field_comment_is_read_from_the_source():
    from fedem_private.simulation.sections import DataConfig

    comments = reference.field_comments(DataConfig)
    assert comments["min_rating"].startswith("implicit positives: None keeps every rated pair")
    assert comments["dataset"] == ""
