"""The shape issue 34 asks of hetbench's code: no function over 80 lines (a def to its last line, nested ones
counted on their own), no line over 120 columns, and each import of a hetbench module inside a function says why it is there (a comment on
its line or the line above: the module must not load at the command's start)."""

from __future__ import annotations

import ast

from helpers import REPO

MAX_FUNCTION_LINES = 80
MAX_COLUMNS = 120


def _trees():
    for path in sorted((REPO / "hetbench").rglob("*.py")):
        text = path.read_text()
        yield path.relative_to(REPO), text.splitlines(), ast.parse(text)


def long_functions(tree: ast.AST) -> list[tuple[str, int, int]]:
    return [(f.name, f.lineno, f.end_lineno - f.lineno + 1) for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]


def unexplained_imports(lines: list[str], tree: ast.AST) -> list[int]:
    out = set()
    for f in ast.walk(tree):
        if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(f):
            own = ((isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").startswith("hetbench")))
                   or (isinstance(n, ast.Import) and any(a.name.startswith("hetbench") for a in n.names)))
            if own and not ("#" in " ".join(lines[n.lineno - 1:n.end_lineno])
                            or lines[n.lineno - 2].strip().startswith("#")):
                out.add(n.lineno)
    return sorted(out)


def test_no_function_over_80_lines():
    found = [f"{path}:{line} {name} ({n} lines)" for path, _, tree in _trees() for name, line, n in long_functions(tree)]
    assert not found, found


def test_no_line_over_120_columns():
    found = [f"{path}:{i + 1}" for path, lines, _ in _trees() for i, line in enumerate(lines) if len(line) > MAX_COLUMNS]
    assert not found, found


def test_every_import_of_a_hetbench_module_inside_a_function_says_why():
    found = [f"{path}:{line}" for path, lines, tree in _trees() for line in unexplained_imports(lines, tree)]
    assert not found, found


def test_the_checks_see_a_long_function_and_a_bare_import():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = f"def f():\n{body}\n\ndef g():\n    from hetbench import dtypes\n    import json\n" \
             "    from hetbench import signals  # why\n"
    tree = ast.parse(source)
    assert long_functions(tree) == [("f", 1, 81)]
    assert unexplained_imports(source.splitlines(), tree) == [84]
