"""No import circles among fedem_private's modules (docs/design.md sections 1 and 15).

The graph is grimp's (import-linter's own library): every ``import`` statement of the
package, those inside functions (lazy imports) and under ``if TYPE_CHECKING`` included,
so a circle cannot hide behind a function-level import. A registry reaches its parts by
``"module:Class"`` names (importlib), which no import statement shows; the registered
modules do not import their registry back.

A failure lists every circle as a path of imports with their lines, e.g.
``fedem_private.a (line 3) -> fedem_private.b (line 9) -> fedem_private.a``: move the
records or protocols both sides need into a module low in the room that imports neither
(as ``privacy/types.py``, ``privacy/bounds.py``, ``client/adapter.py``,
``simulation/run_config.py`` and ``baselines/base.py`` do).
"""

from __future__ import annotations

from collections import deque

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (import-linter's graph library) is not "
                                            "installed: pip install 'fedem-private[dev]'")

PACKAGE = "fedem_private"


def _graph() -> tuple[dict[str, set[str]], object]:
    """(module -> the package's modules it imports by any import statement, grimp's graph)
    of the package as imported here (the checkout's, or the copy tox installed)."""
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    return {m: {t for t in graph.find_modules_directly_imported_by(m)
                if t == PACKAGE or t.startswith(PACKAGE + ".")}
            for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + ".")}, graph


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def a_cycle(edges: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest circle through the component's first module, as a list of modules that
    ends where it starts."""
    members, start = set(component), component[0]
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if child not in came:
                came[child] = node
                queue.append(child)
    raise AssertionError(f"no circle through {start}")  # a component always has one


def describe(graph: object, cycle: list[str]) -> str:
    """``a (line 3) -> b (line 9) -> a``: each import's line in its importer."""
    parts = []
    for importer, imported in zip(cycle, cycle[1:], strict=False):
        details = graph.get_import_details(importer=importer, imported=imported)
        lines = ",".join(str(d["line_number"]) for d in details)
        parts.append(f"{importer} (line {lines})")
    return " -> ".join([*parts, cycle[-1]])


def test_the_helpers_find_a_planted_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert a_cycle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_circles_among_the_package_modules() -> None:
    edges, graph = _graph()
    assert len(edges) > 100  # the whole package was read, not an installed stub
    circles = [describe(graph, a_cycle(edges, c)) for c in strongly_connected(edges)]
    assert not circles, (f"{len(circles)} import circle(s) in {PACKAGE} (lazy and "
                         f"TYPE_CHECKING imports count):\n" + "\n".join(circles))
