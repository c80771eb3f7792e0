"""pytest's hooks and the autouse fixture; the tests' helpers are in tests/helpers.py (`from helpers import ...`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers import (_CURRENT, _FORKSERVER, _RANK_SERVERS, NO_MPIEXEC, SESSION_MARK, _checkout_entries, check_run_group,
                     remove_left_segments, shm_segments, unignore_sigint, wait_gone)

# how long the processes of a finished test session may take to end before they count as orphans
ORPHAN_GRACE_SECONDS = 15.0


def pytest_configure(config):
    """The tuned OpenCL GEMM's winners go to a cache of the test session's own (HETBENCH_CACHE_DIR), never to the
    user's ~/.cache/hetbench; the commands the tests launch inherit it."""
    os.environ["HETBENCH_CACHE_DIR"] = _session_folder("hetbench-test-cache-")
    # The interpreters the tests launch (hundreds: every rank of every mpiexec job) read hetbench's modules from
    # their __pycache__ (gitignored), as Python does by default: where the environment sets PYTHONDONTWRITEBYTECODE
    # none is ever written, and every one of them compiled hetbench from source again (0.15 s of each start-up for
    # the command line alone, more for what a command imports; a quarter of some files' time).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    unignore_sigint()
    if not hasattr(config, "workerinput"):  # the session's first process (pytest-xdist's workers inherit the mark)
        os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"
        _SHM_BEFORE.update(shm_segments())
        if os.environ.get("HETBENCH_TEST_SPIN") != "1":
            _preload_yield_backoff(config)
    else:
        # each pytest-xdist worker, and every process it launches, on one core (workers share them round the cores):
        # a job's ranks take turns there, a waiting one yielding to the one that computes (docs/testing.md)
        cores = sorted(os.sched_getaffinity(0))
        index = int(config.workerinput["workerid"].removeprefix("gw"))
        try:
            os.sched_setaffinity(0, {cores[index % len(cores)]})
        except OSError:  # a sandbox that forbids it: the worker runs unpinned, slower, not different
            pass


def _session_folder(prefix: str) -> str:
    """A temporary folder of this process's, removed when it exits (every test session made two and left them)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _preload_yield_backoff(config) -> None:
    """Every process the session launches gets tests/spin/yield_backoff.c preloaded (built here with cc into the
    session's temporary folder): waiting MPI ranks back off from spinning (the file says how). Where there is no C
    compiler the ranks spin, and the header says so. HETBENCH_TEST_SPIN=1 leaves them spinning."""
    import shutil
    import subprocess
    import tempfile

    from helpers import TESTS

    compiler = shutil.which("cc") or shutil.which("gcc")
    library = Path(_session_folder("hetbench-test-spin-")) / "libyield_backoff.so"
    built = compiler is not None and subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(TESTS / "spin" / "yield_backoff.c")],
        capture_output=True, timeout=60).returncode == 0
    if built:
        os.environ["LD_PRELOAD"] = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD")]))
    config._hetbench_spin = "waiting MPI ranks back off (tests/spin/yield_backoff.c)" if built else \
        "waiting MPI ranks spin: no C compiler to build tests/spin/yield_backoff.c"


def pytest_report_header(config):
    said = getattr(config, "_hetbench_spin", None)
    return [said] if said else []


_SHM_BEFORE: set[str] = set()  # the shared-memory segments there before the session (helpers.shm_segments)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """No orphan: once the session is over (xdist's workers ended), no process it started may still be alive. Those
    left are listed, killed, and fail the run."""
    import signal

    _FORKSERVER.stop()
    _RANK_SERVERS.stop()
    if hasattr(session.config, "workerinput") or SESSION_MARK not in os.environ:
        return
    left = wait_gone(f"{SESSION_MARK}={os.environ[SESSION_MARK]}", ORPHAN_GRACE_SECONDS, exclude=(os.getpid(),))
    remove_left_segments(_SHM_BEFORE)
    if not left:
        return
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"the test session left {len(left)} process(es) running (killed now):",
             *(f"  pid {pid}: {cmd[:200]}" for pid, cmd in left)]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# pytest-xdist (`make test` runs the suite on several workers, -n): a test file's tests stay on one worker (its
# module-scoped batches are launched once), files that share a session cache are one group, and the longest groups
# start first so that none is left running alone at the end (pytest_xdist_make_scheduler below)
SHARED_GROUPS = {"mpi/test_torch_train.py": "torch-scripts", "mpi/test_torch_fsdp.py": "torch-scripts",
                 "mpi/test_torch_backend.py": "torch-lib", "mpi/test_torch_misuse.py": "torch-lib",
                 # two "nodes" each (fake ssh, network namespaces): one Open MPI launch of them at a time
                 "mpi/test_launchers.py": "two-node", "mpi/test_two_node.py": "two-node"}
# files whose tests go out one by one (each its own launches, nothing shared worth a worker): the docs' examples
SPREAD = {"cli/test_docs_examples.py"}
# files whose tests go out in groups named by their parameter (helpers.check_run_group: each one shared launch)
SPLIT_BY_PARAM = {"mpi/test_train_check_runs.py"}
FIRST = ("cli/test_makefile_demo.py", *(f"mpi/test_train_check_runs.py[torch-{s}]" for s in ("fsdp2", "fsdp", "ddp")),
         "mpi/test_train_check_runs.py[np]", "mpi/test_train_check_runs.py[gpt]",
         "torch-scripts", "torch-lib", "mpi/test_split_overlap.py", "cli/test_report_benchmarks.py",
         "cli/test_makefile_bench.py", "mpi/test_staged_collectives.py", "mpi/test_train_checkpoint.py",
         "cli/test_environment_faults.py", "cli/test_strict_input.py")


def worker_group(nodeid: str) -> str:
    """The group a test runs in on one worker: its file (relative to tests/), or the group of files sharing a cache."""
    path = nodeid.split("::")[0].removeprefix("tests/")
    if path in SPREAD:
        return nodeid.removeprefix("tests/")
    if path in SPLIT_BY_PARAM and "[" in nodeid:
        return f"{path}[{check_run_group(nodeid.split('[', 1)[1])}]"
    return SHARED_GROUPS.get(path, path)


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduling with worker_group as the scope, the groups sent in collection order (FIRST's
    first: pytest_collection_modifyitems), not by their count of tests. (Its loadgroup marks cannot do it: with
    pytest 9.2 the node id they rename is no longer the one it reports.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(str(m.kwargs.get("reason", "")).startswith(NO_MPIEXEC) for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.mpi)
    rank = {group: i for i, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(worker_group(item.nodeid), len(FIRST)))


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
