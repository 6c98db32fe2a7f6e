"""How the repository's Markdown becomes the documentation site's pages (no MkDocs import).

The Markdown files stay where they are and keep their section numbers, so every citation
such as ``docs/design.md section 5`` stays valid. The site shows them differently:

* a page of ``docs/`` longer than :data:`LIMIT` lines is split at its ``## `` headings:
  ``privacy.md`` keeps its preamble (and a leading "In short" or "Contents" section) and
  each further section becomes ``privacy/<slug>.md``, its headings raised one level;
* README.md is the home page, BENCHMARKS.md the results page, benchmarks/README.md the
  results' layout page;
* a file outside ``docs/`` that a page links to (a figure under ``benchmarks/results/``)
  is copied into the site under ``assets/repo/``, a Markdown report there becomes a page
  under ``repo/`` (outside the navigation) and its own links are followed the same way;
* every relative link is rewritten to where its target lands, an anchor to the piece that
  holds that heading.

:func:`plan` decides all this from the files; ``hooks.py`` hands it to MkDocs.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

LIMIT = 600  # the most lines a page of the site may have
ASSETS = "assets/repo"  # where files outside docs/ that pages link to are copied
REPORTS = "repo"  # where Markdown outside docs/ that pages link to becomes a page
# pages from outside docs/: repository path -> the page it becomes on the site
OUTSIDE_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "results.md",
                 "benchmarks/README.md": "results-layout.md"}
# leading sections a split page keeps on its first piece
KEPT_ON_INDEX = re.compile(r"^(contents|in short)\b", re.IGNORECASE)

FENCE_OPEN = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# an inline link or image: [text](target "title"), the target in group 2
INLINE = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
# a reference definition: [label]: target
REFERENCE = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(>?(?:\s.*)?)$", re.MULTILINE)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1)[^\n]|\n(?!\s*\n))+?\1")
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
TAGS = re.compile(r"<[^>]+>")
INVALID_SLUG = re.compile(r"[^\w\- ]")


def slugify(text: str) -> str:
    """A heading's anchor as GitHub makes it, which the pages' own links were written
    against (and which mkdocs.yml sets for the site, pymdownx.slugs with case lower):
    lower case, punctuation dropped, each space a hyphen."""
    text = TAGS.sub("", text).strip().lower()
    return INVALID_SLUG.sub("", text).replace(" ", "-")


def page_slug(heading: str, most: int = 50) -> str:
    """A short file name for a section's page: its heading's slug without parenthesised
    remarks (issue numbers, dates), cut at a word boundary."""
    plain = re.sub(r"\([^)]*\)", "", CODE_SPAN.sub(lambda s: s.group(0).strip("`"), heading))
    words = [w for w in slugify(plain).split("-") if w]
    slug = ""
    for word in words:
        if slug and len(slug) + 1 + len(word) > most:
            break
        slug = f"{slug}-{word}" if slug else word
    return slug[:most] or "section"


def fenced(lines: list[str]) -> list[bool]:
    """For each line, whether it lies inside (or opens or closes) a fenced code block."""
    inside, marker, out = False, "", []
    for line in lines:
        m = FENCE_OPEN.match(line)
        if not inside and m:
            inside, marker = True, m.group(1)
            out.append(True)
        elif inside:
            out.append(True)
            if line.strip().startswith(marker[0] * len(marker)) and \
                    line.strip().strip(marker[0]) == "":
                inside = False
        else:
            out.append(False)
    return out


def headings(text: str) -> list[tuple[int, str, str]]:
    """(level, title, anchor) of each heading outside code blocks, in order."""
    lines = text.splitlines()
    out = []
    for line, in_code in zip(lines, fenced(lines), strict=True):
        m = None if in_code else HEADING.match(line)
        if m:
            title = m.group(2)
            out.append((len(m.group(1)), title, slugify(CODE_SPAN.sub(
                lambda s: s.group(0).strip("`"), title))))
    return out


@dataclass
class Piece:
    """One page of the site cut from a Markdown file."""

    src_uri: str  # where it lands in the site's sources, e.g. "privacy/in-short.md"
    title: str
    text: str
    anchors: set[str] = field(default_factory=set)

    @property
    def lines(self) -> int:
        return len(self.text.splitlines())


def split(text: str, name: str, limit: int = LIMIT, source: str | None = None) -> list[Piece]:
    """``name`` (``privacy.md``) as site pages: itself when it has at most ``limit``
    lines, else its first piece (preamble and leading "In short"/"Contents" sections) and
    one piece per further ``## `` section, under ``<stem>/``."""
    lines = text.splitlines()
    title = next((t for level, t, _ in headings(text) if level == 1), Path(name).stem)
    if len(lines) <= limit:
        return [Piece(name, title, text, {a for _, _, a in headings(text)})]
    starts = [i for i, (line, in_code) in enumerate(zip(lines, fenced(lines), strict=True))
              if not in_code and line.startswith("## ")]
    bounds = list(zip(starts, starts[1:] + [len(lines)], strict=True))
    while bounds and KEPT_ON_INDEX.match(lines[bounds[0][0]][3:].strip()):
        bounds.pop(0)
    first_end = bounds[0][0] if bounds else len(lines)
    stem = posixpath.splitext(name)[0]
    pieces = [Piece(name, title, "\n".join(lines[:first_end]) + "\n")]
    taken: set[str] = set()
    for start, end in bounds:
        body = lines[start:end]
        heading = body[0][3:].strip()
        slug = page_slug(heading)
        base, n = slug, 2
        while slug in taken:
            slug, n = f"{base}-{n}", n + 1
        taken.add(slug)
        raised = [line[1:] if not code and HEADING.match(line) and line.startswith("##")
                  else line for line, code in zip(body, fenced(body), strict=True)]
        back = (f"\n*A section of [{title}](../{posixpath.basename(name)}) "
                f"(`{source or 'docs/' + name}`).*")
        pieces.append(Piece(f"{stem}/{slug}.md", heading,
                            "\n".join([raised[0], back, *raised[1:]]) + "\n"))
    for piece in pieces:
        piece.anchors = {a for _, _, a in headings(piece.text)}
    has_contents = any(level == 2 and t.lower().startswith("contents")
                       for level, t, _ in headings(pieces[0].text))
    if len(pieces) > 1 and not has_contents:
        here = posixpath.dirname(name) or "."
        listing = "\n".join(f"- [{p.title}]({posixpath.relpath(p.src_uri, here)})"
                            for p in pieces[1:])
        pieces[0].text += f"\n## Sections of this page\n\n{listing}\n"
    return pieces


@dataclass
class SitePlan:
    """Every page and copied file of the site, keyed by where it comes from."""

    root: Path
    pages: dict[str, list[Piece]] = field(default_factory=dict)  # repo path -> pieces
    assets: dict[str, str] = field(default_factory=dict)  # repo path -> site src_uri
    origin: dict[str, str] = field(default_factory=dict)  # site src_uri -> repo path

    def piece(self, repo_path: str, anchor: str) -> Piece:
        """The piece of ``repo_path`` that holds ``anchor`` (the first without one)."""
        pieces = self.pages[repo_path]
        return next((p for p in pieces if anchor and anchor in p.anchors), pieces[0])

    def rewrite(self, text: str, src_uri: str) -> str:
        """``text`` of the page at ``src_uri`` with each relative link pointing at where its
        target is on the site; code blocks and spans are left alone."""
        repo_path = self.origin.get(src_uri, f"docs/{src_uri}")
        here = posixpath.dirname(src_uri)

        def target(t: str) -> str:
            if EXTERNAL.match(t):
                return t
            path, _, anchor = t.partition("#")
            if not path:  # an anchor on the same source page: maybe now on another piece
                if repo_path not in self.pages:
                    return t
                dest = self.piece(repo_path, anchor).src_uri
                return t if dest == src_uri else f"{posixpath.relpath(dest, here)}#{anchor}"
            repo = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
            if (self.root / repo).is_dir() and f"{repo}/README.md" in self.pages:
                repo = f"{repo}/README.md"
            if repo in self.pages:
                dest = self.piece(repo, anchor).src_uri
            elif repo in self.assets:
                dest = self.assets[repo]
            elif repo.startswith("docs/"):
                dest = repo[len("docs/"):]
            else:
                return t  # left for MkDocs to report
            link = posixpath.relpath(dest, here or ".")
            return f"{link}#{anchor}" if anchor else link

        def links(chunk: str) -> str:
            # find links with code spans blanked out (a link's text may hold code; code
            # never holds a link), then replace each target in the text itself
            masked = CODE_SPAN.sub(lambda m: "\0" * len(m.group(0)), chunk)
            spans = sorted((m.start(2), m.end(2)) for pattern in (INLINE, REFERENCE)
                           for m in pattern.finditer(masked))
            out, pos = [], 0
            for start, end in spans:
                out += [chunk[pos:start], target(chunk[start:end])]
                pos = end
            return "".join(out) + chunk[pos:]

        lines = text.splitlines(keepends=True)
        out, prose = [], []
        for line, code in zip(lines, fenced([ln.rstrip("\n") for ln in lines]), strict=True):
            if code:
                if prose:
                    out.append(links("".join(prose)))
                    prose = []
                out.append(line)
            else:
                prose.append(line)
        if prose:
            out.append(links("".join(prose)))
        return "".join(out)


def link_targets(text: str) -> list[str]:
    """Every link target outside code, as :meth:`SitePlan.rewrite` sees them."""
    found: list[str] = []
    lines = text.splitlines()
    prose = "\n".join(line for line, code in zip(lines, fenced(lines), strict=True)
                      if not code)
    prose = CODE_SPAN.sub("", prose)
    found += [m.group(2) for m in INLINE.finditer(prose)]
    found += [m.group(2) for m in REFERENCE.finditer(prose)]
    return found


def plan(root: Path, limit: int = LIMIT) -> SitePlan:
    """The site's pages from the Markdown of ``root`` (the repository)."""
    site = SitePlan(root)
    docs = root / "docs"
    for path in sorted(docs.rglob("*.md")):
        rel = path.relative_to(docs).as_posix()
        if rel.startswith("tooling/"):
            continue
        site.pages[f"docs/{rel}"] = split(path.read_text(), rel, limit)
    for repo, dest in OUTSIDE_PAGES.items():
        if (root / repo).is_file():
            text = (root / repo).read_text()
            site.pages[repo] = [Piece(dest, repo, text, {a for _, _, a in headings(text)})]
    todo = list(site.pages)
    while todo:  # what the pages link to outside docs/, and what those pages link to
        repo = todo.pop()
        for piece in site.pages[repo]:
            for t in link_targets(piece.text):
                if EXTERNAL.match(t) or t.startswith("#"):
                    continue
                dest = posixpath.normpath(posixpath.join(posixpath.dirname(repo),
                                                         t.partition("#")[0]))
                if dest.startswith(("docs/", "..")) or dest in site.pages \
                        or not (root / dest).is_file():
                    continue
                if dest.endswith(".md"):  # a report outside docs/: a page of its own
                    site.pages[dest] = split((root / dest).read_text(),
                                             f"{REPORTS}/{dest}", limit, source=dest)
                    todo.append(dest)
                else:
                    site.assets[dest] = f"{ASSETS}/{dest}"
    for repo, pieces in site.pages.items():
        for piece in pieces:
            site.origin[piece.src_uri] = repo
    return site
