"""MkDocs hooks (mkdocs.yml ``hooks:``): the site's pages from the repository's Markdown.

* ``on_config``: plan the pages (:func:`pages.plan`) and expand each split page in the
  navigation into a section of its pieces;
* ``on_files``: replace each split page by its pieces, add the home, results and
  reference pages, and copy the files outside ``docs/`` that pages link to;
* ``on_page_markdown``: point each relative link at where its target landed.

With ``FEDEM_DOCS_NOTEBOOKS`` set to a folder (tox -e docs sets it), each tutorial notebook
is taken from there: the copy nbmake executed, so the site shows its outputs while the
repository keeps the notebook without them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pages  # noqa: E402  (beside this file)
import reference  # noqa: E402

ROOT = HERE.parents[1]
# generated reference pages: site path -> the function that writes them
GENERATED = {"reference/cli.md": reference.cli_markdown,
             "reference/configuration.md": reference.config_markdown}

_plan: pages.SitePlan | None = None


def on_config(config, **_):
    global _plan
    _plan = pages.plan(ROOT)
    if config.nav:
        config.nav = [_expand(entry) for entry in config.nav]
    return config


def _expand(entry):
    """A nav entry, with a split page turned into a section of its pieces."""
    if isinstance(entry, dict):
        return {title: _expand_value(title, value) for title, value in entry.items()}
    return entry


def _expand_value(title, value):
    if isinstance(value, list):
        return [_expand(e) for e in value]
    pieces = _plan.pages.get(f"docs/{value}") if isinstance(value, str) else None
    if not pieces or len(pieces) == 1:
        return value
    return [{"Overview": pieces[0].src_uri}, *({p.title: p.src_uri} for p in pieces[1:])]


def on_files(files, config, **_):
    from mkdocs.structure.files import File

    for repo, pieces in _plan.pages.items():
        if repo.startswith("docs/") and len(pieces) == 1:
            continue  # a page of docs/ that is not split stays as MkDocs found it
        if repo.startswith("docs/"):
            files.remove(files.get_file_from_path(repo[len("docs/"):]))
        for piece in pieces:
            files.append(File.generated(config, piece.src_uri, content=piece.text))
    for repo, dest in _plan.assets.items():
        files.append(File.generated(config, dest, abs_src_path=str(ROOT / repo)))
    for dest, render in GENERATED.items():
        files.append(File.generated(config, dest, content=render()))
    executed = os.environ.get("FEDEM_DOCS_NOTEBOOKS")
    if executed:  # tox -e docs: render the notebooks nbmake executed, with their outputs
        for file in [f for f in files if f.src_uri.startswith("tutorials/")
                     and f.src_uri.endswith(".ipynb")]:
            run = Path(executed) / Path(file.src_uri).name
            if not run.is_file():
                raise FileNotFoundError(f"FEDEM_DOCS_NOTEBOOKS: no executed {run}")
            file.abs_src_path = str(run)  # the same file object: mkdocs-jupyter's page
    return files


def on_page_markdown(markdown, page, **_):
    return _plan.rewrite(markdown, page.file.src_uri)


# Sphinx roles and literal-block markers in docstrings, which mkdocstrings shows as typed
ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):(?=<code>)")
LITERAL_MARK = re.compile(r"<p>::</p>\s*|(?<=\w)::(?=</p>)")


def on_page_content(content, page, **_):
    """The API pages without the roles (``:class:``) their docstrings carry for Sphinx."""
    if not page.file.src_uri.startswith("reference/"):
        return content
    return LITERAL_MARK.sub(lambda m: "" if m.group(0).startswith("<p>") else ":",
                            ROLE.sub("", content))
