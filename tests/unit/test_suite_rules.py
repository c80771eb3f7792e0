"""The suite's own rules (tests/conftest.py, tests/helpers.py): a test that launches mpiexec is marked `mpi`, so the
Open MPI pass (`make test-openmpi`: pytest -m mpi) runs it; every test runs in its own folder and leaves nothing in
the checkout; tests live in a folder of their kind and take their helpers from helpers.py, never from conftest."""

from __future__ import annotations

import pytest
from helpers import (REPO, SESSION_MARK, _checkout_entries, needs_mpi, processes_with, require_mpi_mark, run_python,
                     wait_gone)


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


def test_a_file_left_in_results_is_seen(tmp_path):
    """What the after-test check compares, on a checkout of this test's own (a stray file in the real checkout's
    results/ would fail a test running beside this one on another pytest-xdist worker): a file made in results/ and
    one in the top folder show, and are gone once removed."""
    (tmp_path / "results").mkdir()
    (tmp_path / "Makefile").write_text("")
    before = _checkout_entries(tmp_path)
    assert before == {"results", "Makefile"}
    stray = tmp_path / "results" / "stray.json"
    stray.write_text("{}")
    (tmp_path / "stray.csv").write_text("")
    assert _checkout_entries(tmp_path) - before == {"results/stray.json", "stray.csv"}
    stray.unlink()
    (tmp_path / "stray.csv").unlink()
    assert _checkout_entries(tmp_path) == before
    assert _checkout_entries() >= {"Makefile", "hetbench", "tests"}  # the real checkout's by default


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


def test_a_process_the_session_left_running_is_found():
    """What the session's end checks (conftest's pytest_sessionfinish): a process started by a test, in a session of
    its own, is found by the session's mark while it lives, and not once it has ended."""
    import os
    import subprocess
    import sys

    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert proc.pid in [pid for pid, _ in processes_with(mark)]
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in [pid for pid, _ in processes_with(mark)]


@needs_mpi
def test_a_launch_that_times_out_leaves_no_rank_running(tmp_path):
    """A job that hangs (rank 0 sleeps, the others wait for it in a barrier) is ended whole at the test's timeout:
    mpiexec, its proxies and every rank (a kill of mpiexec alone left the ranks spinning)."""
    import uuid

    script = tmp_path / "hang.py"
    script.write_text("import time\nfrom mpi4py import MPI\n"
                      "if MPI.COMM_WORLD.Get_rank() == 0:\n    time.sleep(600)\nMPI.COMM_WORLD.Barrier()\n")
    tag = f"HETBENCH_TEST_HANG={uuid.uuid4().hex}"
    name, _, value = tag.partition("=")
    with pytest.raises(pytest.fail.Exception, match="did not finish within 3 s"):
        run_python([str(script)], nprocs=2, timeout=3, env={name: value})
    assert wait_gone(tag, 5) == []
