"""The application's modules are imported only under the package name: ``causallm.main``,
``causallm.factory``, ``causallm.models``, ``causallm.layers``. An import by the repository's
top-level name would work in the source tree but not in an installed copy, and would load a
second copy of the module beside the first (two registries, two classes of one name)."""

import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_LEVEL = {"main", "factory", "models", "layers"}


def python_files():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in
                   {"__pycache__", "fixtures", "build"}]
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


@pytest.mark.slow
def test_no_import_by_a_top_level_application_name():
    offending = []
    for path in python_files():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     and node.module else [])
            offending += [f"{os.path.relpath(path, ROOT)}:{node.lineno}: {n}" for n in names
                          if n.split(".")[0] in TOP_LEVEL]
    assert offending == []
    assert len(list(python_files())) > 100  # the walk saw the tree


def test_this_process_holds_one_copy_of_each_application_module():
    """What the walk above guards, seen in a running process: ``causallm.main`` and
    ``causallm.factory`` are the root's files, and no module is loaded under a top-level
    application name."""
    import causallm.factory
    import causallm.main

    assert causallm.main.__file__ == os.path.join(ROOT, "main.py")
    assert causallm.factory.__file__ == os.path.join(ROOT, "factory.py")
    assert sorted(TOP_LEVEL & set(sys.modules)) == []
