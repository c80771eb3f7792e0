"""pytest's hooks and the autouse fixture; the tests' helpers are in tests/helpers.py (`from helpers import ...`)."""

from __future__ import annotations

import pytest
from helpers import _CURRENT, NO_MPIEXEC, _checkout_entries


def pytest_configure(config):
    """The tuned OpenCL GEMM's winners go to a cache of the test session's own (HETBENCH_CACHE_DIR), never to the
    user's ~/.cache/hetbench; the commands the tests launch inherit it."""
    import os
    import tempfile

    os.environ["HETBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="hetbench-test-cache-")
    # The interpreters the tests launch (hundreds: every rank of every mpiexec job) read hetbench's modules from
    # their __pycache__ (gitignored), as Python does by default: where the environment sets PYTHONDONTWRITEBYTECODE
    # none is ever written, and every one of them compiled hetbench from source again (0.15 s of each start-up for
    # the command line alone, more for what a command imports; a quarter of some files' time).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(str(m.kwargs.get("reason", "")).startswith(NO_MPIEXEC) for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.mpi)


@pytest.fixture(autouse=True)
def _outside_the_checkout(tmp_path, monkeypatch, request):
    """Every test runs in its own temporary folder, so a command's default outputs (results/<command>-<time>.json)
    land there and never in the checkout; after the test, the checkout's top folder and results/ hold nothing new."""
    before = _checkout_entries()
    monkeypatch.chdir(tmp_path)
    _CURRENT["item"] = request.node
    yield
    _CURRENT.pop("item", None)
    added = _checkout_entries() - before
    assert not added, f"the test wrote into the checkout: {sorted(added)}"
