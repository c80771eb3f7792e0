"""docs/figures.md lists every derived figure with the tests that pin it: each test it names must exist, so the
list cannot drift from the suite (a renamed or deleted pin test fails here), and every pin file is named in it."""

from __future__ import annotations

import ast
import re

from helpers import REPO

DOC = REPO / "docs" / "figures.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _tests(path):
    tree = ast.parse((REPO / path).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


def test_every_test_the_figures_list_names_exists():
    named = NAMED.findall(DOC.read_text())
    assert len(named) > 50
    missing = [f"{path}::{name}" for path, name in named
               if not (REPO / path).exists() or name not in _tests(path)]
    assert not missing, missing


def test_every_pin_file_is_in_the_figures_list():
    text = DOC.read_text()
    unnamed = [p.name for p in sorted((REPO / "tests").rglob("test_pin_*.py")) if f"{p.relative_to(REPO)}::" not in text]
    assert not unnamed, unnamed
