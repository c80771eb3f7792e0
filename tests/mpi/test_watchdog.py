"""The watchdog (--timeout): a rank that has waited that long in one MPI operation ends the job with one line naming
the rank, its host and the operation, exit 1; what was already committed is kept. Before it, a stopped peer left
every other rank spinning in MPI for ever (neither MPICH nor Open MPI ends such a job)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import MPIEXEC, MPIEXEC_KIND, REPO, alive, descendants, kill_group, needs_mpi, rank_of, \
    require_mpi_mark, run_cli, run_in_group, run_python

TIMEOUT = 3  # --timeout in these tests
# the bound: the job ends within the timeout plus this
WITHIN_SECONDS = TIMEOUT + 10


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _launch(args: list[str], nprocs: int, cwd: Path) -> subprocess.Popen:
    require_mpi_mark()
    assert MPIEXEC is not None
    return subprocess.Popen([MPIEXEC, "-n", str(nprocs), sys.executable, "-m", "hetbench", *args], cwd=cwd,
                            env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _ranks(proc: subprocess.Popen, nprocs: int) -> dict[int, int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = {rank_of(pid): pid for pid in descendants(proc.pid)}
        found = {r: p for r, p in found.items() if r is not None and
                 Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode()}
        if len(found) == nprocs:
            return found
        time.sleep(0.05)
    kill_group(proc)
    out, err = proc.communicate()
    pytest.fail(f"the ranks did not start: exit {proc.returncode}\n{out}\n{err}")


def _stop_and_wait(proc: subprocess.Popen, pid: int, ranks: dict[int, int]) -> tuple[int, str, str, float]:
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        out, err = proc.communicate(timeout=WITHIN_SECONDS + 30)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"the job still ran {WITHIN_SECONDS + 30} s after a rank stopped (a hang)\n{out}\n{err}")
    finally:
        for p in ranks.values():  # a stopped rank that outlived the job must not stay stopped for ever
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
    while any(alive(p) for p in ranks.values()) and time.monotonic() - stopped < WITHIN_SECONDS + 30:
        time.sleep(0.05)
    seconds = time.monotonic() - stopped
    kill_group(proc)
    return proc.returncode, out, err, seconds


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("Error:")]


@pytest.mark.slow
@needs_mpi
def test_a_stopped_peer_ends_the_job_with_the_waiting_ranks_line(tmp_path):
    """2 ranks, an allreduce sweep; rank 1 stopped mid-sweep: rank 0 waits in Allreduce and ends the job."""
    proc = _launch(["collectives", "--backend", "host", "--op", "allreduce", "--min-bytes", "64K",
                    "--max-bytes", "64K", "--iters", "1000000", "--timeout", str(TIMEOUT), "--out", "r.json"],
                   2, tmp_path)
    try:
        ranks = _ranks(proc, 2)
        time.sleep(4)  # into the timed iterations
        assert proc.poll() is None, proc.communicate()
        code, out, err, seconds = _stop_and_wait(proc, ranks[1], ranks)
    finally:
        kill_group(proc)
    assert seconds < WITHIN_SECONDS, (seconds, err)
    assert code == 1, (code, err)
    lines = _error_lines(err)
    assert lines and re.fullmatch(
        rf"Error: rank 0 \(\S+\) waited {TIMEOUT} s in MPI (Allreduce|Barrier|allreduce) with no answer from its peers "
        rf"\(--timeout {TIMEOUT}\); ending the job \(a peer stopped, or the link to it cut\?\)", lines[0]), err
    if MPIEXEC_KIND == "mpich":  # Open MPI stops the other ranks with SIGTERM, and they say so too
        assert len(lines) == 1, err
    assert not any("waited" in line for line in lines[1:]), err  # rank 1, woken, was not waiting: it was stopped
    assert "Traceback" not in err
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob("*.tmp*"))


def _latest(ckpt: Path) -> int:
    """The step `latest` names (0 before it exists)."""
    try:
        return int((ckpt / "latest").read_text().strip().removeprefix("step-"))
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
@needs_mpi
def test_a_stopped_rank_0_ends_a_3_rank_training_keeping_its_checkpoints(tmp_path):
    """3 ranks train with a checkpoint each step; rank 0 stopped after the second is committed: ranks 1 and 2 wait
    on it, the lowest of them says so, the job ends, and the committed checkpoints resume."""
    ckpt = tmp_path / "ckpt"
    proc = _launch(["train", "--backend", "host", "--steps", "10000000", "--checkpoint", str(ckpt),
                    "--checkpoint-every", "1", "--timeout", str(TIMEOUT), "--out", "t.json"], 3, tmp_path)
    try:
        ranks = _ranks(proc, 3)
        deadline = time.monotonic() + 60
        while _latest(ckpt) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert _latest(ckpt) >= 2, proc.communicate()
        code, out, err, seconds = _stop_and_wait(proc, ranks[0], ranks)
    finally:
        kill_group(proc)
    assert seconds < WITHIN_SECONDS, (seconds, err)
    assert code == 1, (code, err)
    lines = _error_lines(err)
    # rank 1 speaks first unless rank 2 began its wait enough earlier (each waits 1 s a rank before it speaks)
    assert lines and re.match(rf"Error: rank [12] \(\S+\) waited {TIMEOUT} s in MPI \w+", lines[0]), err
    if MPIEXEC_KIND == "mpich":  # Open MPI stops the other ranks with SIGTERM, and they say so too
        assert len(lines) == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "t.json").exists()
    step = _latest(ckpt)
    assert step >= 2
    resumed = run_cli(["train", "--backend", "host", "--resume", str(ckpt), "--steps", str(step + 1),
                       "--out", "r.json"], cwd=tmp_path, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["verified"] is True


STUCK = """
import sys
import numpy as np
from mpi4py import MPI
from hetbench.comm import watchdog
watchdog.arm(float(sys.argv[1]))
comm = watchdog.watched(MPI.COMM_WORLD)
assert isinstance(comm, MPI.Intracomm) and MPI.Comm.Compare(comm, MPI.COMM_WORLD) == MPI.IDENT
dup = comm.Dup()
assert type(dup) is type(comm), type(dup)  # communicators made from a watched one are watched
how = sys.argv[2]
buf = np.empty(1)
print("waiting", flush=True)
if how == "recv":
    comm.Recv(buf, source=0, tag=7)  # nobody sends: blocked for ever
elif how == "wait":
    dup.Irecv(buf, source=0, tag=7).Wait()
elif how == "waitall":
    watchdog.wait_all([dup.Irecv(buf, source=0, tag=8)])
else:  # a healthy operation, then the watchdog off: no firing
    comm.Barrier()
    watchdog.disarm()
    print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how, operation", [("recv", "Recv"), ("wait", "Wait (a non-blocking operation)"),
                                            ("waitall", "Waitall (non-blocking operations)")])
def test_one_process_stuck_in_a_watched_operation_ends(tmp_path, how, operation):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    start = time.monotonic()
    run = run_python([str(script), "1", how], cwd=tmp_path, timeout=30)
    assert time.monotonic() - start < 1 + 10
    assert run.returncode == 1, run.stderr
    assert run.stdout == "waiting\n"
    assert _error_lines(run.stderr) == [
        f"Error: this process waited 1 s in MPI {operation} with no answer from its peers (--timeout 1); ending the "
        "job (a peer stopped, or the link to it cut?)"], run.stderr


def test_a_healthy_operation_does_not_fire(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text(STUCK)
    run = run_python([str(script), "0.5", "barrier"], cwd=tmp_path, timeout=30)
    assert run.returncode == 0 and run.stdout == "waiting\ndone\n" and run.stderr == "", run


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc", "١٠"])
@pytest.mark.parametrize("command", [["matmul", "--size", "8", "--backend", "host"], ["devices"]])
def test_a_bad_timeout_is_a_usage_error(tmp_path, value, command):
    run = run_cli([*command, "--timeout", value], cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert len(_error_lines(run.stderr)) == 1 and "--timeout" in run.stderr and repr(value)[1:-1] in run.stderr, \
        run.stderr


def test_every_mpi_command_takes_timeout():
    from click.testing import CliRunner
    from hetbench.cli import cli

    for command in ("matmul", "collectives", "calibrate", "split", "train", "devices"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 0
        assert "--timeout SECONDS" in result.output and "600" in result.output, (command, result.output)


EARLY_EXIT = """
import os, sys
from hetbench.signals import RANK_ENV
rank = int(next(os.environ[n] for n in RANK_ENV if os.environ.get(n)))
if rank == int(sys.argv[1]):
    sys.exit(3)  # as a rank does that a signal ends while Python itself starts: before MPI_Init, by an exit code
from hetbench.comm import watchdog
from hetbench.comm.world import World
watchdog.arm(2)
World()
print("started", flush=True)
"""


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("nprocs, gone", [(2, 1), (3, 0)])
def test_a_rank_gone_before_mpi_init_ends_the_job(tmp_path, nprocs, gone):
    """A rank that ended before MPI_Init left the others in it for ever (MPICH: its launcher ends a job for a rank
    gone by an exit code only after MPI has started). mpi4py holds Python's lock through MPI_Init, so the watchdog
    thread cannot run: a sentinel process guards MPI_Init, says the line and ends the rank."""
    script = tmp_path / "early.py"
    script.write_text(EARLY_EXIT)
    start = time.monotonic()
    run = run_python([str(script), str(gone)], nprocs=nprocs, cwd=tmp_path, timeout=60)
    assert time.monotonic() - start < 2 + 10, run
    assert run.returncode != 0 and "started" not in run.stdout, run
    lines = _error_lines(run.stderr)
    if MPIEXEC_KIND == "openmpi":  # mpirun ends the job itself for a rank gone with a non-zero code
        assert "exited with non-zero status" in run.stderr, run.stderr
        return
    assert lines and all(re.fullmatch(r"Error: rank \d \(\S+\) waited 2 s in MPI_Init with no answer from its peers "
                                      r"\(--timeout 2\); ending the job \(a rank that did not start, or a link cut\?\)",
                                      line) for line in lines), run.stderr
    assert f"rank {gone} " not in " ".join(lines)
    assert "Traceback" not in run.stderr


@pytest.mark.slow
@needs_mpi
def test_a_rank_gone_before_the_command_starts_ends_the_command(tmp_path):
    """The same through the command: its MPI starts first thing (to learn the rank), before --timeout is parsed by
    click, and is watched with --timeout's value read ahead (hostile battery: rank 0 of split ended by SIGINT in
    Python's own start-up left rank 1 in MPI_Init for good)."""
    require_mpi_mark()
    assert MPIEXEC is not None
    script = "r=${PMI_RANK:-$OMPI_COMM_WORLD_RANK}; [ \"$r\" = 0 ] && exit 1; exec \"$0\" \"$@\""
    cmd = [MPIEXEC, "-n", "2", "sh", "-c", script, sys.executable, "-m", "hetbench", "split", "--size", "64",
           "--backend", "host", "--timeout", "3", "--out", "s.json"]
    start = time.monotonic()
    proc = run_in_group(cmd, 60, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                        stdin=subprocess.DEVNULL)
    assert time.monotonic() - start < 3 + 10, proc.stderr
    assert proc.returncode != 0 and not (tmp_path / "s.json").exists(), proc.stderr
    if MPIEXEC_KIND == "mpich":
        assert _error_lines(proc.stderr) == [line for line in _error_lines(proc.stderr) if re.fullmatch(
            r"Error: rank 1 \(\S+\) waited 3 s in MPI_Init .*", line)] != [], proc.stderr
    assert "Traceback" not in proc.stderr
