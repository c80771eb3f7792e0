"""Backends declare capabilities (hetbench/backends/base.py: Capabilities), and nothing outside backends/ tests a
backend's name: a comparison of a backend name or family with a built-in backend's name fails here. The accepted
lists in messages come from the registry."""

from __future__ import annotations

import ast

import pytest
from helpers import REPO

from hetbench.backends.base import BACKEND_NAMES, BUILTIN_MODULES, Capabilities, accepted_specs, capabilities

# the expressions that hold a backend's name in hetbench's code
_NAME_HOLDERS = ("backend", "name", "family", "spec.name", "info.backend", "backend.name", "opened.spec")


def _holds_a_backend_name(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text in _NAME_HOLDERS or text.endswith((".backend", ".spec.name", "backend.name")) or \
        text.startswith("getattr(backend, 'name'")


def _name_checks(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literals = set()
        for side in sides:
            if isinstance(side, ast.Constant) and isinstance(side.value, str):
                literals.add(side.value)
            elif isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                literals |= {e.value for e in side.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if literals & set(BUILTIN_MODULES) and any(_holds_a_backend_name(s) for s in sides):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_backends_tests_a_backend_name():
    found = {}
    for path in sorted((REPO / "hetbench").rglob("*.py")):
        if (REPO / "hetbench" / "backends") in path.parents:
            continue
        checks = _name_checks(ast.parse(path.read_text()))
        if checks:
            found[str(path.relative_to(REPO))] = checks
    assert not found, f"backend names tested outside backends/ (declare a capability instead): {found}"


def test_the_check_sees_a_name_test():
    tree = ast.parse('if info.backend in ("host", "sim"): pass\nif backend.name != "host": pass\n'
                     'if cfg.path == "host": pass\n')
    assert [c.split(":")[0] for c in _name_checks(tree)] == ["line 1", "line 2"]


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_every_backend_declares_its_capabilities(name):
    caps = capabilities(name)
    assert isinstance(caps, Capabilities)
    assert caps.array_module and "{name}" in caps.spec_syntax


def test_what_the_built_in_backends_declare():
    host, sim, opencl, cupy = (capabilities(n) for n in ("host", "sim", "opencl", "cupy"))
    assert host.computes_on_host_arrays and host.memory_is_the_hosts and host.limits_own_threads
    assert not host.native_low_precision and host.torch_device == "cpu"
    assert sim.simulated and sim.buffers_in_host_memory and not sim.memory_is_the_hosts
    assert not opencl.buffers_in_host_memory and opencl.torch_device is None
    assert cupy.gpu_aware_mpi and cupy.torch_device == "cuda" and cupy.array_module == "cupy"
    assert [n for n in BACKEND_NAMES if capabilities(n).simulated] == ["sim"]


def test_the_accepted_list_comes_from_the_registry():
    assert accepted_specs() == "auto, host, opencl[:INDEX], cupy[:INDEX], sim:MODEL[:INDEX]"
