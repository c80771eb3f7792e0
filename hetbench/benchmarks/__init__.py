"""Benchmarks: one package each (hetbench/benchmarks/<name>/), declaring what it computes, its options, rows,
summary and columns (see base.py), its run on a rank (run.py) and its presentation.

Each package registers its benchmark when imported. `load()` imports the built-in ones, then those other
installed packages declare in the entry point group "hetbench.benchmarks" (as pyperf loads its hooks), e.g. in
their pyproject.toml:

    [project.entry-points."hetbench.benchmarks"]
    mybench = "my_package.mybench"

and, for a module that is not installed (a script beside the job), those named in HETBENCH_BENCHMARKS (module
names, comma-separated).
"""

from __future__ import annotations

import importlib
import os

BUILTIN = (
    "hetbench.benchmarks.matmul",
    "hetbench.benchmarks.collectives",
    "hetbench.benchmarks.calibrate",
    "hetbench.benchmarks.split",
    "hetbench.benchmarks.train",
    "hetbench.benchmarks.tune",
)
ENTRY_POINT_GROUP = "hetbench.benchmarks"
PLUGINS_ENV = "HETBENCH_BENCHMARKS"


def plugin_modules() -> list[str]:
    """The modules of benchmarks from other packages: the entry points, then HETBENCH_BENCHMARKS."""
    from importlib.metadata import entry_points

    found = [ep.module for ep in entry_points(group=ENTRY_POINT_GROUP)]
    found += [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    return list(dict.fromkeys(found))


class PluginError(ImportError):
    """A benchmark module from another package that does not import. The message names it and why."""


def load() -> None:
    """Import every benchmark module, so that each registers itself. A plugin module that fails raises
    PluginError (the `hetbench` command says it in one line and exits 2)."""
    for module in BUILTIN:
        importlib.import_module(module)
    for module in plugin_modules():
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as e:  # a module that calls sys.exit() at import is as broken
            raise PluginError(f"benchmark module {module!r} (from an entry point in group {ENTRY_POINT_GROUP!r} or "
                              f"{PLUGINS_ENV}) cannot be imported: {type(e).__name__}: {e}") from None
