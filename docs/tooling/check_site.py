"""Look at the built site in headless Chromium: each page below must render.

    python docs/tooling/check_site.py build/site [--screenshots DIR] [--tutorial-executed]
    python docs/tooling/check_site.py --browser-only   # is Chromium there? (exit 1 if not)

Serves the site on 127.0.0.1 (a free port, this process only), loads each page with
``chromium --headless --dump-dom`` (the DOM after the page's scripts ran) and fails
unless the page has its title and heading, mkdocs-material's header, navigation and
search, the theme's scripts ran (the ``no-js`` class replaced), and its own content: the
home page's figures are served as images, the API page shows ``fedem_private.api.run``,
the tutorial its plots (with ``--tutorial-executed``). ``--screenshots`` saves a PNG of
each page. Exits 1 with an install hint when Chromium is missing (Debian: ``apt-get
install chromium``).
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
TIMEOUT = 90  # seconds for one page load (a loaded machine is slow, never this slow)


def first_h1(path: Path) -> str:
    """The text of the first ``# `` heading of a Markdown file."""
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise SystemExit(f"{path}: no '# ' heading")


@dataclass
class Page:
    url: str  # under the site's root
    h1: str  # the heading the page must show
    needs: tuple[str, ...] = ()  # regular expressions the rendered DOM must match
    images: bool = False  # every <img> of the content must be served as an image


def pages(tutorial_executed: bool) -> list[Page]:
    tutorial = ["Elastic merging"]
    if tutorial_executed:  # the executed notebook's matplotlib figures, inline
        tutorial.append(r'<img[^>]+src="data:image/png;base64,')
    return [
        Page("", first_h1(ROOT / "README.md"), images=True),
        Page("privacy/", first_h1(ROOT / "docs" / "privacy.md"),
             needs=(r'href="[^"]*dp-ftrl[^"]*"',)),  # the split guide lists its pieces
        Page("reference/api/", "Python API", needs=(r'id="fedem_private\.api\.run"',)),
        Page("reference/cli/", "Command line", needs=(r"usage: fedem-private run",)),
        Page("tutorials/elastic-merging-tradeoff/", "", needs=tuple(tutorial)),
    ]


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    sys.exit("check_site: no Chromium found (looked for " + ", ".join(BROWSERS) + "); "
             "install it, on Debian: apt-get install chromium")


def chromium(exe: str, *args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                               "--no-first-run", f"--user-data-dir={profile}",
                               "--virtual-time-budget=8000", *args],
                              capture_output=True, text=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).replace("¶", "").strip()


def problems(dom: str, page: Page, base: str) -> list[str]:
    """What is wrong with the rendered ``dom`` of ``page`` (empty: it rendered)."""
    out = []
    title = re.search(r"<title>(.*?)</title>", dom, re.DOTALL)
    if not title or "fedem-private" not in text_of(title.group(1)):
        out.append(f"title {title.group(1) if title else None!r} lacks the site name")
    h1s = [text_of(h) for h in re.findall(r"<h1[^>]*>(.*?)</h1>", dom, re.DOTALL)]
    if page.h1 and page.h1 not in h1s:
        out.append(f"heading {page.h1!r} not among the h1s {h1s}")
    for piece, what in ((r'data-md-component="header"', "material's header"),
                        (r'class="md-nav[ "]', "the navigation"),
                        (r'data-md-component="search"', "the search box"),
                        (r'<html[^>]*class="(?![^"]*no-js)[^"]*\bjs\b', "the theme's scripts "
                         "(the html element still has class no-js)")):
        if not re.search(piece, dom):
            out.append(f"missing {what}")
    for pattern in page.needs:
        if not re.search(pattern, dom):
            out.append(f"missing {pattern!r}")
    if page.images:
        content = dom[dom.find('class="md-content"'):]
        sources = re.findall(r'<img[^>]+src="([^"]+)"', content)
        if not sources:
            out.append("no image in the content")
        for src in sources:
            url = urllib.request.urljoin(base + page.url, html.unescape(src))
            with urllib.request.urlopen(url, timeout=30) as resp:
                kind = resp.headers.get("Content-Type", "")
                if not kind.startswith("image/") or not resp.read(16):
                    out.append(f"image {src} served as {kind!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, nargs="?",
                        help="the built site (mkdocs.yml's site_dir)")
    parser.add_argument("--browser-only", action="store_true",
                        help="only check that Chromium is installed (before a long build)")
    parser.add_argument("--screenshots", type=Path, help="save a PNG of each page here")
    parser.add_argument("--tutorial-executed", action="store_true",
                        help="the tutorial was built with its outputs: require its plots")
    args = parser.parse_args(argv)
    if args.browser_only:
        print(f"check_site: browser {browser()}")
        return 0
    if args.site is None:
        parser.error("give the built site's folder")
    if not (args.site / "index.html").is_file():
        sys.exit(f"check_site: {args.site}/index.html not found; run mkdocs build first")
    exe = browser()
    handler = functools.partial(_QuietHandler, directory=str(args.site))
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    failed = 0
    try:
        for page in pages(args.tutorial_executed):
            dom = chromium(exe, "--dump-dom", base + page.url)
            found = problems(dom, page, base)
            print(f"{'ok  ' if not found else 'FAIL'} /{page.url}"
                  + "".join(f"\n     {p}" for p in found))
            failed += bool(found)
            if args.screenshots:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                name = (page.url.strip("/").replace("/", "-") or "home") + ".png"
                chromium(exe, f"--screenshot={args.screenshots.resolve() / name}",
                         "--window-size=1280,1400", "--hide-scrollbars", base + page.url)
    finally:
        server.shutdown()
    print(f"check_site: {failed} of {len(pages(args.tutorial_executed))} pages failed")
    return 1 if failed else 0


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a browser that closes a connection early is no failure of the page


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would drown the result
        pass


if __name__ == "__main__":
    sys.exit(main())
