"""The Markdown pages link only to files that exist, and BENCHMARKS.md indexes every page
under docs/ (issue 41, item 6)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").glob("*.md"))

# an inline link or image: [text](target) or ![alt](target "title")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# a reference definition: [label]: target
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1)[^\n]|\n(?!\s*\n))+?\1")  # within one paragraph
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")  # http:, https:, mailto:, ...


def link_targets(text: str) -> list[str]:
    """Every link target in Markdown text, outside fenced blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + REFERENCE.findall(text)


def broken_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` that name no file or folder on disk."""
    missing = []
    for target in link_targets(page.read_text()):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            missing.append(target)
    return missing


def test_the_pages_exist():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    for name in ("README.md", "BENCHMARKS.md", "docs/history.md", "docs/utility.md",
                 "docs/privacy.md", "docs/attacks.md", "docs/reproduction.md", "docs/speed.md"):
        assert name in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)} links to missing files"


def test_benchmarks_index_links_every_docs_page():
    index = ROOT / "BENCHMARKS.md"
    linked = {(index.parent / t.split("#", 1)[0]).resolve()
              for t in link_targets(index.read_text()) if not EXTERNAL.match(t)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"BENCHMARKS.md does not link {unlinked}"


def test_the_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok too](there.md#a-heading) [anchor](#top) [web](https://example.org)\n"
        "[mail](mailto:a@b.c) ![gone](figures/gone.png) [also gone](../nowhere.md#x)\n"
        "`[not a link](missing-in-code.md)`\n\n```\n[nor this](missing-in-fence.md)\n```\n"
        "[ref]: missing-ref.md\n")
    assert broken_links(page) == ["figures/gone.png", "../nowhere.md#x", "missing-ref.md"]
