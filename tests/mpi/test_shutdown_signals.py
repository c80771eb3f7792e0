"""Issue 33, point 6: a SIGINT or SIGTERM that comes while a run shuts down (its work done, its files written: Python's
exit callbacks, MPI_Finalize, the interpreter's end) ends the job as a signal does elsewhere: exit 128 + N and one
line naming the rank and the signal. Before: in Python's exit callbacks it was lost ("Exception ignored", exit 0);
in MPI_Finalize (mpi4py runs it after Python has put the default actions back) it killed the rank with nothing said.

The moment is chosen, not timed: the command runs inside a wrapper whose exit callback (registered before the
command's, so among the last to run) does the hook: `self` sends the rank its own signal there; `held` has the
target rank write its pid to a file there and go on to MPI_Finalize, which waits for rank 0, held in its own
callback until the test has sent the signal to the target's pid (or 30 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import MPIEXEC, MPIEXEC_KIND, REPO, needs_mpi

WRAPPER = """
import atexit, os, signal, sys, time
rank = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK") if os.environ.get(v)), "0")
mode, target, signum = os.environ["HB_TEST_HOOK"], os.environ["HB_TEST_RANK"], int(os.environ["HB_TEST_SIGNAL"])
marker, release = os.environ["HB_TEST_MARKER"], os.environ["HB_TEST_MARKER"] + ".release"


def at_exit():  # the run is over: its output said, its files written
    if mode == "self" and rank == target:
        os.kill(os.getpid(), signum)
        time.sleep(0.5)  # the rest of a slow shutdown
    elif mode == "held" and rank == target:
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
    elif mode == "held" and rank == "0":
        deadline = time.monotonic() + 30
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)


atexit.register(at_exit)
sys.argv = ["hetbench", *sys.argv[1:]]
from hetbench.__main__ import run
run()
"""
RUN = ["matmul", "--size", "32", "--repeat", "2", "--backend", "host", "--out", "r.json"]


def _launch(tmp_path, mode, signum, nprocs=None, target=0):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    marker = tmp_path / "reached"
    env.update(OMP_NUM_THREADS="1", HB_TEST_HOOK=mode, HB_TEST_RANK=str(target), HB_TEST_SIGNAL=str(int(signum)),
               HB_TEST_MARKER=str(marker))
    cmd = [sys.executable, "-c", WRAPPER, *RUN]
    if nprocs is not None:
        cmd = [MPIEXEC, "-n", str(nprocs), *cmd]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if mode == "held":
            deadline = time.monotonic() + 90
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert marker.exists(), proc.communicate(timeout=60)
            os.kill(int(marker.read_text()), signum)  # the rank is in its shutdown: MPI_Finalize, waiting for rank 0
        out, err = proc.communicate(timeout=90)
    finally:
        (tmp_path / "reached.release").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def _check(tmp_path, code, out, err, signum, who):
    name = signal.Signals(signum).name
    assert code == 128 + signum, (code, err)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {who}interrupted by {name}"] or (
        MPIEXEC_KIND == "openmpi" and f"Error: {who}interrupted by {name}" in errors), err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "hetbench matmul" in out and (tmp_path / "r.json").exists()  # the run had finished: its output stays


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_one_process_shuts_down(tmp_path, signum):
    code, out, err = _launch(tmp_path, "self", signum)
    _check(tmp_path, code, out, err, signum, "")


@needs_mpi
@pytest.mark.parametrize("nprocs, target, signum", [(2, 1, signal.SIGTERM), (3, 0, signal.SIGINT)])
def test_a_signal_while_a_rank_runs_its_exit_callbacks(tmp_path, nprocs, target, signum):
    code, out, err = _launch(tmp_path, "self", signum, nprocs, target)
    _check(tmp_path, code, out, err, signum, f"rank {target} ({os.uname().nodename}) ")


@needs_mpi
@pytest.mark.parametrize("nprocs, target, signum", [(2, 1, signal.SIGINT), (3, 2, signal.SIGTERM)])
def test_a_signal_while_a_rank_waits_in_its_shutdown(tmp_path, nprocs, target, signum):
    code, out, err = _launch(tmp_path, "held", signum, nprocs, target)
    _check(tmp_path, code, out, err, signum, f"rank {target} ({os.uname().nodename}) ")


ENDS_THROUGH_C_EXIT = """
import ctypes, os, sys
from mpi4py import MPI  # a singleton: MPI is up, finalised by `finish`
ran = lambda code, arg: os.write(1, b"a C exit handler ran\\n")
handler = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)(ran)
ctypes.CDLL(None).on_exit(handler, None)  # glibc's; MPICH registers its own handlers alike
from hetbench import signals
signals.install()
signals.finish(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 2])
def test_the_end_after_mpi_finalize_runs_the_c_exit_handlers(tmp_path, code):
    """Once MPI is finalised `finish` ends through C's exit(), whose handlers include MPICH's telling its launcher
    the rank ended well: ended by os._exit, one 3-rank job in four (a usage error, or a good run) ended with 9, the
    launcher killing a rank still leaving. Seen here by C stdio's buffer, which only exit() flushes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-c", ENDS_THROUGH_C_EXIT, str(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == code, done.stderr
    assert done.stdout == "a C exit handler ran\n", (done.stdout, done.stderr)


SIGNALLED_IN_C_EXIT = """
import ctypes, os, signal, sys
from mpi4py import MPI
def ran(code, arg):  # past hetbench's last check: the process's end, where a signal can no longer be said
    status = open("/proc/self/status").read()
    ignored = int(next(l.split()[1] for l in status.splitlines() if l.startswith("SigIgn:")), 16)
    os.write(1, b"ignored %d\\n" % (ignored >> (signal.SIGTERM - 1) & ignored >> (signal.SIGINT - 1) & 1))
    os.kill(os.getpid(), signal.SIGTERM)
handler = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)(ran)
ctypes.CDLL(None).on_exit(handler, None)
from hetbench import signals
signals.install()
signals.finish(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 2])
def test_a_signal_past_the_last_check_is_ignored_and_the_exit_is_the_runs(tmp_path, code):
    """After `finish`'s last check the process is ending with its own code: SIGINT and SIGTERM are ignored there,
    which /proc shows (SigIgn), as the hostile battery reads it to tell a signal that came too late from a lost one."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-c", SIGNALLED_IN_C_EXIT, str(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout, done.stderr) == (code, "ignored 1\n", "")
