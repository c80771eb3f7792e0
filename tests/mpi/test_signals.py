"""Ctrl-C (SIGINT) and SIGTERM end the whole job within seconds, on one rank, on every rank, or on the launcher,
even while the ranks are out of step (one computing, the others waiting in MPI), with exit code 130 or 143 and one
line naming the rank, and never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import MPIEXEC, REPO, alive, descendants, handles_sigterm, kill_group, needs_mpi, rank_of, require_mpi_mark

END_WITHIN_SECONDS = 10.0  # the bound, from the signal to the end of every rank

# signals sent at chosen moments and jobs waited on to end: `make test-slow` (and `make test-openmpi`)
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _start(args: list[str], cwd: Path, nprocs: int | None = None) -> subprocess.Popen:
    cmd = [sys.executable, *args]
    if nprocs is not None:
        assert MPIEXEC is not None
        require_mpi_mark()
        cmd = [MPIEXEC, "-n", str(nprocs), *cmd]
    # a session of its own, so that whatever is left after a failure can be killed as a group
    return subprocess.Popen(cmd, cwd=cwd, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _rank_pids(launcher: subprocess.Popen, nprocs: int, timeout: float = 60) -> dict[int, int]:
    """rank -> pid of the Python processes under the launcher, once all have hetbench's handlers in place."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = {}
        for pid in descendants(launcher.pid):
            rank = rank_of(pid)
            if rank is not None and handles_sigterm(pid):
                ranks[rank] = pid
        if len(ranks) == nprocs:
            return ranks
        if launcher.poll() is not None:
            break
        time.sleep(0.05)
    kill_group(launcher)
    out, err = launcher.communicate()
    pytest.fail(f"the ranks did not start: exit {launcher.returncode}\nstdout: {out}\nstderr: {err}")


def _wait_after(proc: subprocess.Popen, signalled_at: float, ranks: dict[int, int] | None = None):
    """(exit code, stdout, stderr, seconds from the signal to the end of the launcher and of every rank)."""
    try:
        out, err = proc.communicate(timeout=END_WITHIN_SECONDS + 20)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"the job still ran {END_WITHIN_SECONDS + 20:.0f} s after the signal (a hang)\n"
                    f"stdout: {out}\nstderr: {err}")
    while ranks and any(alive(pid) for pid in ranks.values()) and time.monotonic() - signalled_at < 30:
        time.sleep(0.05)
    seconds = time.monotonic() - signalled_at
    assert not any(alive(pid) for pid in (ranks or {}).values()), "a rank outlived the launcher"
    return proc.returncode, out, err, seconds


def _launcher_is_hydra() -> bool:
    version = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout if MPIEXEC else ""
    return "HYDRA" in version


@pytest.fixture
def out_of_step(tmp_path: Path) -> list[str]:
    """A matmul in which rank 0 multiplies 512x512 matrices ~forever while the other ranks' 8x8 products are done
    in a moment: they then wait in MPI (the gather of the rows) for rank 0."""
    rng = np.random.default_rng(0)
    for rank, size in ((0, 512), (1, 8), (2, 8)):
        np.save(tmp_path / f"a{rank}.npy", rng.random((size, size), dtype=np.float32))
        np.save(tmp_path / f"b{rank}.npy", rng.random((size, size), dtype=np.float32))
    return ["-m", "hetbench", "matmul", "--a", "a{rank}.npy", "--b", "b{rank}.npy", "--reduce", "none",
            "--warmup", "0", "--repeat", "1000000", "--backend", "host", "--out", "r.json"]


SETTLE_SECONDS = 3.0  # after start-up, time for ranks 1 and 2 to finish their products and wait in MPI


@needs_mpi
@pytest.mark.parametrize("target_rank, signum", [(1, signal.SIGINT), (0, signal.SIGINT), (2, signal.SIGTERM)])
def test_signal_to_one_rank_ends_the_job(tmp_path, out_of_step, target_rank, signum):
    """Rank 1 or 2 waits in MPI while rank 0 computes (before, SIGINT to rank 1 hung the job for ever: its
    handler never ran inside the MPI call, and others waited for it); rank 0 is signalled mid-computation."""
    proc = _start(out_of_step, tmp_path, nprocs=3)
    try:
        ranks = _rank_pids(proc, 3)
        time.sleep(SETTLE_SECONDS)
        assert proc.poll() is None, "the job ended before the signal"
        start = time.monotonic()
        os.kill(ranks[target_rank], signum)
        code, out, err, seconds = _wait_after(proc, start, ranks)
    finally:
        kill_group(proc)
    name = signal.Signals(signum).name
    assert seconds < END_WITHIN_SECONDS, (seconds, err)
    assert code == 128 + signum, (code, err)
    assert f"Error: rank {target_rank} (" in err and f"interrupted by {name}" in err, err
    if _launcher_is_hydra():  # Open MPI stops the other ranks with SIGTERM, and they say so too
        assert len([line for line in err.splitlines() if line.startswith("Error:")]) == 1, err
    assert "Traceback" not in err
    assert out == ""
    assert not (tmp_path / "r.json").exists()


@needs_mpi
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_launcher_ends_the_job(tmp_path, out_of_step, signum):
    proc = _start(out_of_step, tmp_path, nprocs=3)
    try:
        ranks = _rank_pids(proc, 3)
        time.sleep(SETTLE_SECONDS)
        assert proc.poll() is None, "the job ended before the signal"
        start = time.monotonic()
        proc.send_signal(signum)
        code, out, err, seconds = _wait_after(proc, start, ranks)
    finally:
        kill_group(proc)
    assert seconds < END_WITHIN_SECONDS, (seconds, err)
    assert code != 0, err
    if _launcher_is_hydra():  # MPICH's mpiexec hands the signal to every rank: rank 0 aborts with 128 + signal
        assert code == 128 + signum, (code, err)
        assert f"Error: rank 0 (" in err and f"interrupted by {signal.Signals(signum).name}" in err, err
        assert len([line for line in err.splitlines() if line.startswith("Error:")]) == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_a_single_process(tmp_path, signum):
    proc = _start(["-m", "hetbench", "matmul", "--size", "512", "--warmup", "0", "--repeat", "1000000",
                   "--backend", "host", "--out", "r.json"], tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not handles_sigterm(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(2.0)  # into the timed repeats
        start = time.monotonic()
        proc.send_signal(signum)
        code, out, err, seconds = _wait_after(proc, start)
    finally:
        kill_group(proc)
    assert seconds < END_WITHIN_SECONDS
    assert code == 128 + signum, (code, err)
    assert [line for line in err.splitlines() if line.strip()] == [
        f"Error: interrupted by {signal.Signals(signum).name}"], err
    assert out == ""
    assert not (tmp_path / "r.json").exists()


def test_ctrl_c_during_start_up_prints_no_traceback(tmp_path):
    """The signal lands while the commands are still being imported (or just after)."""
    proc = _start(["-m", "hetbench", "matmul", "--size", "64", "--backend", "host", "--out", "r.json"], tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not handles_sigterm(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code, out, err, seconds = _wait_after(proc, start)
    finally:
        kill_group(proc)
    assert code == 130, (code, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Error: interrupted by SIGINT" in err


def test_process_stuck_in_a_c_call_still_ends(tmp_path):
    """The main thread blocked for ever inside MPI (a receive nobody sends): Python's handler never runs, and the
    watchdog ends the process after its grace period."""
    script = tmp_path / "stuck.py"
    script.write_text(
        "import sys\n"
        "from hetbench import signals\n"
        "signals.install()\n"
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "sys.stdout.write('blocked\\n'); sys.stdout.flush()\n"
        "MPI.COMM_WORLD.Recv(np.empty(1), source=0, tag=7)\n"
    )
    proc = _start([str(script)], tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "blocked\n"
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code, out, err, seconds = _wait_after(proc, start)
    finally:
        kill_group(proc)
    assert code == 130, (code, err)
    assert "Error: interrupted by SIGINT" in err
    assert "Traceback" not in err
    assert seconds < END_WITHIN_SECONDS


def _first_instants(launcher: subprocess.Popen, nprocs: int, target: int, handlers: bool,
                    timeout: float = 30) -> int:
    """The pid of rank `target` as soon as it exists (handlers=False: Python has not yet run a line of hetbench) or
    as soon as hetbench's handlers are in place (handlers=True: before MPI starts, before the slow imports)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants(launcher.pid):
            if rank_of(pid) == target and (handles_sigterm(pid) or not handlers):
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode():
                        return pid
                except OSError:
                    continue
        if launcher.poll() is not None:
            break
        time.sleep(0.001)
    kill_group(launcher)
    out, err = launcher.communicate()
    pytest.fail(f"rank {target} did not start: exit {launcher.returncode}\nstdout: {out}\nstderr: {err}")


@needs_mpi
@pytest.mark.parametrize("nprocs, target, signum, after", [
    (2, 1, signal.SIGINT, 0.0), (2, 0, signal.SIGTERM, 0.0), (3, 2, signal.SIGTERM, 0.0), (3, 1, signal.SIGINT, 0.15),
    (2, 1, signal.SIGTERM, 0.3)])
def test_signal_in_a_ranks_first_instants_ends_the_job(tmp_path, nprocs, target, signum, after):
    """Before MPI has started on the signalled rank (its handlers just installed, the commands still importing):
    before, that rank said the one-process line and left; the others then waited for it in MPI for ever (MPICH)."""
    proc = _start(["-m", "hetbench", "matmul", "--size", "64", "--backend", "host", "--repeat", "1000000",
                   "--warmup", "0", "--out", "r.json"], tmp_path, nprocs=nprocs)
    try:
        pid = _first_instants(proc, nprocs, target, handlers=True)
        time.sleep(after)
        start = time.monotonic()
        os.kill(pid, signum)
        code, out, err, seconds = _wait_after(proc, start)
    finally:
        kill_group(proc)
    assert seconds < END_WITHIN_SECONDS, (seconds, err)
    assert code == 128 + signum, (code, err)
    assert f"Error: rank {target} (" in err and f"interrupted by {signal.Signals(signum).name}" in err, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not (tmp_path / "r.json").exists()


@needs_mpi
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_before_a_rank_runs_hetbench_ends_the_job(tmp_path, signum):
    """Before hetbench's first line runs on the rank (Python starting): the signal's default action ends that
    rank; the launcher ends the rest, or (MPICH, where the rank left by an exit code) the others' MPI_Init ends at
    --timeout; no hang either way."""
    proc = _start(["-m", "hetbench", "matmul", "--size", "64", "--backend", "host", "--repeat", "1000000",
                   "--warmup", "0", "--out", "r.json", "--timeout", "5"], tmp_path, nprocs=2)
    try:
        pid = _first_instants(proc, 2, 1, handlers=False)
        start = time.monotonic()
        os.kill(pid, signum)
        code, out, err, seconds = _wait_after(proc, start)
    finally:
        kill_group(proc)
    assert seconds < END_WITHIN_SECONDS + 5, (seconds, err)
    assert code != 0, err
    assert not (tmp_path / "r.json").exists()
