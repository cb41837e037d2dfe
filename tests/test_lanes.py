"""The fast lane (``pytest -m "not slow"``) touches every test module: each tests/test_*.py
keeps at least one test that is not marked ``slow`` (by a decorator, or for the whole module
by ``pytestmark``), and the marker is the one pyproject.toml registers."""

import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_slow(node: ast.expr) -> bool:
    """``pytest.mark.slow`` (or a list of marks holding it)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(is_slow(n) for n in node.elts)
    return ast.unparse(node) == "pytest.mark.slow"


def fast_tests(path: str) -> list[str]:
    """The module's test functions (and test methods) without the slow mark."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            if is_slow(node.value):
                return []
    nodes = [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body] + tree.body
    return [n.name for n in nodes if isinstance(n, ast.FunctionDef) and
            n.name.startswith("test") and not any(is_slow(d) for d in n.decorator_list)]


@pytest.mark.slow  # a walk over every test module; CI runs it
def test_every_module_has_a_fast_test():
    modules = sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
    assert len(modules) > 50
    assert [os.path.basename(m) for m in modules if not fast_tests(m)] == []


def test_the_slow_marker_is_registered():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        markers = tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)
