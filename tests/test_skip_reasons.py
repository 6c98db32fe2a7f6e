"""A skip for want of a GPU says so in its reason, which tests/conftest.py's summary groups by."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# a GPU skip: it needs one ("needs a CUDA GPU", "no CUDA device"), or there is one here and
# the test is for machines without ("... available here", "... resolves to cuda here")
SAYS_SO = re.compile(r"needs a CUDA GPU|no CUDA device|(available|cuda) here")


def _reasons(tree: ast.AST) -> list[str]:
    """The literal reasons of pytest.skip(...) and skipif(..., reason=...) calls."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        args = [k.value for k in node.keywords if k.arg in ("reason", "msg")]
        if name.endswith("pytest.skip") and node.args:
            args.append(node.args[0])
        if not name.endswith(("pytest.skip", "skipif")):
            continue
        for arg in args:
            text = "".join(c.value for c in ast.walk(arg)
                           if isinstance(c, ast.Constant) and isinstance(c.value, str))
            if text:
                out.append(text)
    return out


def test_every_gpu_skip_says_it_is_one():
    gpu = []
    for path in sorted(TESTS.glob("*.py")):
        for reason in _reasons(ast.parse(path.read_text(encoding="utf-8"))):
            if re.search(r"cuda|gpu", reason, re.I):
                gpu.append((path.name, reason))
    assert len(gpu) >= 4  # test_backbones, test_plan, test_rng_keyed, test_device, ...
    unclear = [(name, reason) for name, reason in gpu if not SAYS_SO.search(reason)]
    assert not unclear
