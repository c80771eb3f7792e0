"""The suite's own rules (tests/conftest.py, tests/helpers.py): a test that launches mpiexec is marked `mpi`, so the
Open MPI pass (`make test-openmpi`: pytest -m mpi) runs it; every test runs in its own folder and leaves nothing in
the checkout; tests live in a folder of their kind and take their helpers from helpers.py, never from conftest."""

from __future__ import annotations

import pytest
from helpers import REPO, _checkout_entries, needs_mpi, require_mpi_mark


def test_an_unmarked_test_may_not_launch_mpiexec():
    with pytest.raises(pytest.fail.Exception, match="launches mpiexec but is not marked needs_mpi"):
        require_mpi_mark()


@needs_mpi
def test_needs_mpi_marks_a_test_mpi(request):
    assert request.node.get_closest_marker("mpi") is not None
    require_mpi_mark()  # no failure


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_a_parameter_is_marked_alone(request, nprocs):
    assert (request.node.get_closest_marker("mpi") is not None) == (nprocs is not None)


def test_each_test_runs_outside_the_checkout(tmp_path):
    from pathlib import Path

    assert Path.cwd() == tmp_path and REPO not in tmp_path.parents


def test_a_file_left_in_results_is_seen():
    """What the after-test check compares: a file made in the checkout's results/ shows, and is gone once removed
    (removed here before the check runs)."""
    before = _checkout_entries()
    stray = REPO / "results" / "stray-from-test_suite_rules.json"
    stray.write_text("{}")
    try:
        assert _checkout_entries() - before == {"results/stray-from-test_suite_rules.json"}
    finally:
        stray.unlink()
    assert _checkout_entries() == before


def test_the_openmpi_pass_runs_the_mpi_tests():
    text = (REPO / "Makefile").read_text()
    recipe = text[text.index("\ntest-openmpi:"):].split("\n\n")[0]
    assert "pytest -q -m mpi" in recipe


KINDS = ("unit", "backends", "cli", "mpi", "plugins")


def test_tests_are_laid_out_by_kind_and_import_helpers_not_conftest():
    tests = REPO / "tests"
    files = sorted(tests.rglob("test_*.py"))
    assert files and all(p.relative_to(tests).parts[0] in KINDS for p in files), \
        [str(p.relative_to(tests)) for p in files if p.relative_to(tests).parts[0] not in KINDS]
    names = [p.name for p in files]
    assert len(names) == len(set(names)), "two test files of one name: pytest imports them as one module"
    module = "conf" + "test"  # not spelt whole, or this file would name it
    importing = [str(p.relative_to(tests)) for p in tests.rglob("*.py")
                 if p.name != f"{module}.py" and (f"from {module} import" in p.read_text() or
                                                  f"import {module}" in p.read_text())]
    assert not importing, importing
