"""The hostile battery's rank fork server (tests/hostile/forkserver.py --ranks, tests/hostile/rank_stub.py): each rank
of an MPI job, started by mpiexec as a stub, is a child forked from the preloaded server, that is MPI's rank as a
process started by mpiexec would be (its rank, its output, its exit code), and that never outlives its stub."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import MPIEXEC, MPIEXEC_KIND, TESTS, alive, descendants, needs_mpi, run_in_group

sys.path.insert(0, str(TESTS / "hostile"))
from forkserver import ForkServer  # noqa: E402

pytestmark = [needs_mpi, pytest.mark.skipif(MPIEXEC_KIND != "mpich", reason="the battery runs under MPICH's hydra")]

RANK = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
# one write a line: the launcher passes on the ranks' writes as they come, and print's two (unbuffered) could mix
os.write(1, f"rank {comm.rank} of {comm.size} sum {total} parent {os.getppid()} cwd {os.getcwd()} "
         f"var {os.environ.get('RANK_TEST_VAR')}\\n".encode())
os.write(2, f"rank {comm.rank} to stderr\\n".encode())
if sys.argv[1:] == ["sleep"]:
    open(f"pid-{comm.rank}", "w").write(str(os.getpid()))
    time.sleep(120)
code = int(sys.argv[1]) if sys.argv[1:] and comm.rank == 1 else 0
MPI.Finalize()
sys.exit(code)
"""


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    started = ForkServer(sys.executable, str(script), False, env, str(tmp_path), ranks=True)
    yield started, script
    started.close()


def _job(server_and_script, nprocs, *args, env=None, tmp_path=None):
    started, script = server_and_script
    stub = [*started.stub_command(sys.executable), str(script)]
    return [MPIEXEC, "-n", str(nprocs), *stub, *args], {**os.environ, **(env or {})}


@pytest.mark.parametrize("nprocs", [2, 3])
def test_each_rank_is_a_child_of_the_server_with_its_rank_output_and_folder(server, tmp_path, nprocs):
    cmd, env = _job(server, nprocs, env={"RANK_TEST_VAR": "given"})
    done = run_in_group(cmd, 60, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    total = nprocs * (nprocs + 1) // 2
    assert lines == [f"rank {r} of {nprocs} sum {total} parent {server[0].pid} cwd {tmp_path} var given"
                     for r in range(nprocs)]
    assert sorted(done.stderr.splitlines()) == [f"rank {r} to stderr" for r in range(nprocs)]


def test_a_ranks_exit_code_is_the_jobs(server, tmp_path):
    cmd, env = _job(server, 2, "3")
    done = run_in_group(cmd, 60, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 3, done.stderr


def _children(started: ForkServer, tmp_path: Path, nprocs: int, seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = [tmp_path / f"pid-{r}" for r in range(nprocs)]
        if all(p.exists() and p.read_text() for p in pids):
            return [int(p.read_text()) for p in pids]
        time.sleep(0.05)
    raise AssertionError("the ranks never started")


def _gone(started: ForkServer, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while started.descendants() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not started.descendants()


def test_a_killed_launch_leaves_no_rank(server, tmp_path):
    """mpiexec's whole session SIGKILLed (a test's timeout): the stubs die with it, and the server kills their
    children, which nothing else would end."""
    cmd, env = _job(server, 2, "sleep")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    children = _children(server[0], tmp_path, 2)
    assert set(children) <= set(server[0].descendants())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _gone(server[0]), f"left under the server: {server[0].descendants()}"


def test_a_signal_to_a_stub_reaches_its_rank(server, tmp_path):
    """SIGTERM to one rank's stub ends its child by SIGTERM, so the stub and the job end as a real rank's would."""
    cmd, env = _job(server, 2, "sleep")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    child = _children(server[0], tmp_path, 2)[1]
    stubs = [pid for pid in descendants(proc.pid) if _is_stub(pid)]
    assert len(stubs) == 2
    for stub in stubs:
        try:
            os.kill(stub, signal.SIGTERM)
        except ProcessLookupError:  # mpiexec ended the job, this stub too, after the first stub's end
            pass
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    # the job ends as its stubs do; their ranks a moment later (the server kills or reaps them): within seconds
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    assert _gone(server[0])


def _is_stub(pid: int) -> bool:
    try:
        return b"rank_stub.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False

