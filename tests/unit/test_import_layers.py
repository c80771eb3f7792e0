"""The import graph's layers (issue 18): no import cycle among module-level imports, and no import (module-level or
inside a function) from a lower layer to a higher one beyond those counted in UPWARD, which records the crossings
the code has today and may only shrink: a new one fails here. When the packages per benchmark land, UPWARD empties
and the layers below become the ones docs/architecture.md names."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

# lowest first; a module's layer is that of its longest prefix listed here
LAYERS = [
    ["hetbench", "hetbench.dtypes", "hetbench.kernels_path", "hetbench.signals", "hetbench.pytorch_support"],
    ["hetbench.backends", "hetbench.comm"],
    ["hetbench.results"],
    ["hetbench.harness", "hetbench.config", "hetbench.options"],
    ["hetbench.pytorch"],
    ["hetbench.train"],
    ["hetbench.benchmarks"],
    ["hetbench.outputs", "hetbench.report"],
    ["hetbench.driver", "hetbench.cli", "hetbench.overhead", "hetbench.bench", "hetbench.__main__"],
]

# (importer's package, imported package): how many imports cross upward there today (module-level and inside
# functions); a count may only go down, and a pair gone must leave the list (package = the LAYERS entry)
UPWARD: dict[tuple[str, str], int] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (REPO / "hetbench").rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported hetbench module, at module level) for each import in the file; a function's imports are not at
    module level, an `if` or `try` at the top is."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            if t in known and t != name:
                out.append((t, id(node) not in inner))
    return out


def _package(module: str) -> tuple[int, str]:
    best = max((p for layer in LAYERS for p in layer if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer), best


def _graph():
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def test_every_module_has_a_layer():
    for name in _modules():
        _package(name)  # raises where no layer names it


def test_no_cycle_among_module_level_imports():
    graph = {m: {t for t, top in edges if top} for m, edges in _graph().items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_new_import_from_a_lower_layer_to_a_higher_one():
    crossings = {}
    for m, edges in _graph().items():
        low, p = _package(m)
        for t, _ in edges:
            high, q = _package(t)
            if high > low:
                crossings.setdefault((p, q), []).append(f"{m} -> {t}")
    grown = {k: v for k, v in crossings.items() if len(v) > UPWARD.get(k, 0)}
    assert not grown, f"imports up the layers beyond those there before (tests/unit/test_import_layers.py): {grown}"
    shrunk = {k: (n, len(crossings.get(k, []))) for k, n in UPWARD.items() if len(crossings.get(k, [])) < n}
    assert not shrunk, f"fewer crossings than UPWARD records (was, now): lower them so they cannot come back: {shrunk}"


def test_the_check_sees_a_function_level_import_and_a_relative_one(tmp_path):
    fake = tmp_path / "hetbench" / "harness" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from . import stats\n\ndef f():\n    from hetbench.report import html\n")
    known = {"hetbench.harness.stats", "hetbench.report.html", "hetbench.harness.x"}
    assert sorted(_imports("hetbench.harness.x", fake, known)) == [("hetbench.harness.stats", True),
                                                                   ("hetbench.report.html", False)]
    assert _package("hetbench.report.html") == (7, "hetbench.report")
