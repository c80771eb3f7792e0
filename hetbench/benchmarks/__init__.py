"""Benchmarks: one package each (hetbench/benchmarks/<name>/), declaring what it computes, its options, rows,
summary and columns (see base.py), its run on a rank (run.py) and its presentation.

Each package registers its benchmark when imported. `load()` imports the built-in ones, then those other
installed packages declare in the entry point group "hetbench.benchmarks" (as pyperf loads its hooks), e.g. in
their pyproject.toml:

    [project.entry-points."hetbench.benchmarks"]
    mybench = "my_package.mybench"

and, for a module that is not installed (a script beside the job), those named in HETBENCH_BENCHMARKS (module
names, comma-separated).

A plugin that fails (its import raises or exits, its command cannot be built) is out alone: `hetbench --help` and
`hetbench devices` list it with why, naming it is one line (exit 2), and every other command works.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from hetbench.backends.base import plugin_broke, plugin_failure
from hetbench.benchmarks.base import REGISTRY, set_loader

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
    return list(dict.fromkeys(module for _, module in _plugins()))


def _plugins() -> list[tuple[str, str]]:
    """(name, module) of every benchmark plugin: an entry point's name, or for HETBENCH_BENCHMARKS the module's."""
    from importlib.metadata import entry_points

    found = [(ep.name.strip(), ep.module) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    found += [(m.strip(), m.strip()) for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    return found


@dataclass(frozen=True)
class Unavailable:
    """A benchmark plugin that is out: its name (the entry point's; HETBENCH_BENCHMARKS: the module's), its module
    and why, as `hetbench --help` and `hetbench devices` list it."""

    name: str
    module: str
    reason: str


# the benchmark plugins that failed, in the order found; one that failed is not imported again
UNAVAILABLE: list[Unavailable] = []
BUILTIN_NAMES: set[str] = set()  # the commands the built-in modules register


def load() -> None:
    """Import every benchmark module, so that each registers itself. A plugin module that fails to import (raises
    any Exception, or calls sys.exit: backends.base.plugin_broke) registers nothing and is listed in UNAVAILABLE
    with why; the others load. A signal is not caught."""
    for module in BUILTIN:
        importlib.import_module(module)
    BUILTIN_NAMES.update(REGISTRY)
    failed = {u.module for u in UNAVAILABLE}
    for name, module in _plugins():
        if module in failed:
            continue
        before = dict(REGISTRY)
        try:
            importlib.import_module(module)
        except BaseException as e:  # one that calls sys.exit() at import is as broken; a signal is not caught
            if not plugin_broke(e):
                raise

            for registered in set(REGISTRY) - set(before):  # what it registered before it failed goes with it
                del REGISTRY[registered]
            where = "an entry point" if name != module else PLUGINS_ENV
            failed.add(module)
            mark_unavailable(name, module, f"module {module} (from {where}) cannot be imported: {plugin_failure(e)}")


def mark_unavailable(name: str, module: str, reason: str) -> None:
    """List benchmark plugin `name` as unavailable: `reason` says why."""
    UNAVAILABLE.append(Unavailable(name, module, reason))


set_loader(load)
