"""The import graph's layers (issues 18, 34): no import circle and no import from a lower layer to a higher one,
counting the imports inside functions too, with no exception list; fewer than 40 imports of hetbench's own modules
inside functions. The layers are those docs/architecture.md names."""

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

# imports of hetbench's own modules inside functions, at most: each one where the module must not load at the
# command's start (mpi4py.MPI, torch, rich), with its reason on the line
MAX_FUNCTION_IMPORTS = 39


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


def test_no_cycle_among_imports():
    """No circle, counting the imports inside functions too (they hide circles as well as module-level ones)."""
    graph = {m: {t for t, _ in edges} for m, edges in _graph().items()}
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


def test_no_import_from_a_lower_layer_to_a_higher_one():
    crossings = []
    for m, edges in _graph().items():
        low, _ = _package(m)
        crossings += [f"{m} -> {t}" for t, _ in edges if _package(t)[0] > low]
    assert not crossings, f"imports up the layers (tests/unit/test_import_layers.py LAYERS): {crossings}"


def test_few_imports_of_hetbench_modules_inside_functions():
    inside = sorted(f"{m} -> {t}" for m, edges in _graph().items() for t, top in edges if not top)
    assert len(inside) <= MAX_FUNCTION_IMPORTS, (len(inside), inside)


def test_the_check_sees_a_function_level_import_and_a_relative_one(tmp_path):
    fake = tmp_path / "hetbench" / "harness" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from . import stats\n\ndef f():\n    from hetbench.report import html\n")
    known = {"hetbench.harness.stats", "hetbench.report.html", "hetbench.harness.x"}
    assert sorted(_imports("hetbench.harness.x", fake, known)) == [("hetbench.harness.stats", True),
                                                                   ("hetbench.report.html", False)]
    assert _package("hetbench.report.html") == (7, "hetbench.report")
