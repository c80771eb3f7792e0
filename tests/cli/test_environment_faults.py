"""Issue 19: faults of the environment, not of the input. A working directory that was deleted is one line and exit
2 (a FileNotFoundError with exit 1 before); a reader that goes away (`hetbench devices | head -1`) ends every command
quietly by SIGPIPE (a shell's 141), as `yes | head -1` and mpiexec end (a silent exit 1 before, the files already
written either way); a full disk names the file and, in a one-process command, no rank ("rank 0 (host) failed:
OSError: [Errno 28] No space left on device" before)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import MPIEXEC, MPIEXEC_KIND, REPO, needs_mpi, run_cli, run_in_group

DATA = REPO / "tests" / "data"
ENDED_BY_SIGPIPE = -signal.SIGPIPE  # what subprocess says of it; a shell says 128 + 13 = 141


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # no empty entry: Python itself cannot start with one (the working directory) where that directory is gone
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture
def deleted(tmp_path):
    """A working directory that no longer exists (`mkdir d; cd d; rmdir ../d`)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    return gone


def _run_in(folder, args, env=None, timeout=60):
    """hetbench ARGS run as a user does it: `cd d; rmdir ../d; hetbench ARGS`."""
    script = 'cd "$1" && rmdir "../$(basename "$1")" && shift && exec "$@"'
    proc = subprocess.run(["sh", "-c", script, "sh", str(folder), sys.executable, "-m", "hetbench", *args],
                          env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("args", [
    ["matmul", "--size", "16"],
    ["matmul", "--size", "16", "--out", "{abs}/m.json"],
    ["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8"],
    ["report", "runs.json"],
    ["report", "."],
    ["compare", "a.json", "b.json"],
    ["compare", str(DATA / "matmul-v1.json"), str(DATA / "matmul-v1.json"), "--json"],
], ids=["matmul", "matmul-absolute-out", "train", "report", "report-dot", "compare", "compare-absolute"])
def test_a_deleted_working_directory_is_one_line(deleted, tmp_path, args):
    """Each a FileNotFoundError with exit 1, before, or a message that blamed the file ("folder '.' holds no
    hetbench results file")."""
    args = [a.replace("{abs}", str(tmp_path)) for a in args]
    code, out, err = _run_in(deleted, args, env={"PWD": str(deleted)})
    assert code == 2, (code, out, err)
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0] == (f"Error: the working directory {str(deleted)!r} no longer exists (deleted or moved away): "
                        "cd to a folder that exists and run the command again")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_commands_that_need_no_folder_still_run_there(deleted):
    """devices reads and writes no file; --help and --version neither."""
    for args, needle in ((["devices", "--json"], '"devices"'), (["matmul", "--help"], "Usage: hetbench matmul"),
                         (["--version"], "hetbench, version")):
        deleted.mkdir(exist_ok=True)
        code, out, err = _run_in(deleted, args, env={"PWD": str(deleted)})
        assert code == 0 and needle in out and "Error" not in err, (args, code, err)


# --- a reader that went away ----------------------------------------------------------------------------------

def _closed_reader(args, cwd, nprocs=None):
    """The command with its stdout a pipe whose reader closed before it wrote (`hetbench ... | true`)."""
    cmd = [sys.executable, "-m", "hetbench", *args]
    if nprocs is not None:
        cmd = [MPIEXEC, "-n", str(nprocs), *cmd]
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    return proc.returncode, err


CLOSED_READER = {  # each exit 1 and silent before (click's and rich's own answer to EPIPE)
    "devices": ["devices", "--sim"],
    "devices-json": ["devices", "--json"],
    "matmul": ["matmul", "--size", "16", "--out", "m.json"],
    "matmul-json": ["matmul", "--size", "16", "--json", "--out", "m.json"],
    "train": ["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8", "--out", "m.json"],
    "report": ["report", str(DATA / "matmul-v1.json"), str(DATA / "collectives-v1.json")],
    "compare": ["compare", str(DATA / "matmul-v1.json"), str(DATA / "matmul-v1.json")],
    "help": ["--help"],
    "command-help": ["collectives", "--help"],
    "version": ["--version"],
}


@pytest.mark.parametrize("name", sorted(CLOSED_READER))
def test_a_reader_that_went_away_ends_the_command_quietly_by_sigpipe(tmp_path, name):
    code, err = _closed_reader(CLOSED_READER[name], tmp_path)
    assert code == ENDED_BY_SIGPIPE, (code, err)
    assert err == ""  # no "Exception ignored ... BrokenPipeError" at exit either
    if "--out" in CLOSED_READER[name]:  # the results were committed before the table was shown
        assert (tmp_path / "m.json").is_file()


def test_an_error_said_to_a_reader_that_went_away_ends_by_sigpipe_too(tmp_path):
    """`hetbench matmul --size abc 2>&1 | true`: the error line met EPIPE inside the error handling, and Python's
    own traceback of it went nowhere: exit 1 before."""
    proc = subprocess.Popen([sys.executable, "-m", "hetbench", "matmul", "--size", "abc"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    proc.stdout.close()
    assert proc.wait(timeout=60) == ENDED_BY_SIGPIPE


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_reader_that_went_away_under_mpiexec_ends_it_alike(tmp_path, nprocs):
    """MPICH's mpiexec's own answer, which a one-process command now matches. Open MPI's mpirun takes the broken
    pipe itself (the ranks write to it, never to the pipe) and ends the job as it would have ended: exit 0."""
    code, err = _closed_reader(["matmul", "--size", "16", "--out", "m.json", "--backend", "host"], tmp_path, nprocs)
    assert code == (0 if MPIEXEC_KIND == "openmpi" else ENDED_BY_SIGPIPE) and "Traceback" not in err, (code, err)
    assert (tmp_path / "m.json").is_file()


# --- a full disk --------------------------------------------------------------------------------------------------

@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled; skipped where mounting is not allowed."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        with open(mnt / "filler", "wb", buffering=0) as f:  # to the last byte
            try:
                while True:
                    f.write(b"\0" * 1024)
            except OSError:
                pass
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_names_the_file_and_no_rank_in_one_process(tmp_path, full_disk):
    for option, name in (("--csv", "merged.csv"), ("--html", "page.html")):
        target = full_disk / name
        run = run_cli(["report", str(DATA / "collectives-v1.json"), option, str(target)], cwd=tmp_path)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
        assert run.error_lines == [f"Error: cannot write {str(target)!r}: No space left on device"], run.stderr
        assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # nothing half-written, no staged copy


def test_a_checkpoint_on_a_full_disk_names_its_step_and_file(tmp_path, full_disk):
    run = run_cli(["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8", "--checkpoint",
                   str(full_disk / "ck"), "--out", str(tmp_path / "t.json")], cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.error_lines == [f"Error: cannot write checkpoint {str(full_disk / 'ck' / 'step-2')!r} "
                               "(rank-0.param.npy): No space left on device; the previous checkpoint, if any, is "
                               "kept"], run.stderr


def _said(stderr: str) -> list[str]:
    """hetbench's error lines; under Open MPI without the lines of the ranks its mpirun ends with SIGTERM after an
    abort (as tests/mpi/test_signals.py has them)."""
    return [x for x in stderr.splitlines() if x.startswith("Error:") and not (
        MPIEXEC_KIND == "openmpi" and x.endswith(") interrupted by SIGTERM"))]


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_plugin_that_does_not_import_is_said_once_under_mpiexec(tmp_path, nprocs):
    """Hostile finding F12: every rank said it (the same line 2 or 3 times). Issue 33: such a plugin is out alone
    (it ended every command with exit 2 before): `devices` works and lists it once per rank, with why."""
    (tmp_path / "plugin_boom.py").write_text("raise RuntimeError('boom')\n")
    env = {**_env(), "HETBENCH_BENCHMARKS": "plugin_boom"}
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))
    proc = run_in_group([MPIEXEC, "-n", str(nprocs), sys.executable, "-m", "hetbench", "devices", "--json"], 120,
                        cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert _said(proc.stderr) == [] and "Traceback" not in proc.stderr, proc.stderr
    listed = [(u["rank"], u["benchmark"], u["reason"]) for u in json.loads(proc.stdout)["unavailable_benchmarks"]]
    assert listed == [(r, "plugin_boom", "module plugin_boom (from HETBENCH_BENCHMARKS) cannot be imported: "
                       "RuntimeError: boom") for r in range(nprocs)], proc.stdout


@needs_mpi
@pytest.mark.parametrize("nprocs, failing", [(2, 1), (3, 2), (3, 0)])
def test_a_plugin_missing_on_one_node_ends_the_job_at_once(tmp_path, nprocs, failing):
    """One rank cannot import a plugin (a package missing on its node), the others can: that rank used to leave
    before MPI started, and MPICH's other ranks waited in MPI_Init for ever. Issue 33: the plugin is out on that
    rank alone; the command runs on every rank (a command of the plugin's: one line naming the rank,
    tests/plugins/test_plugin_containment.py)."""
    (tmp_path / "plugin_half.py").write_text(
        "import os\n"
        f"if os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')) == '{failing}':\n"
        "    raise ImportError('No module named torch_directml')\n"
        "from hetbench.benchmarks.base import Benchmark\n")
    env = {**_env(), "HETBENCH_BENCHMARKS": "plugin_half"}
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))
    start = time.monotonic()
    proc = run_in_group([MPIEXEC, "-n", str(nprocs), sys.executable, "-m", "hetbench", "devices", "--json"], 120,
                        cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert time.monotonic() - start < 30, proc.stderr
    # issue 33: the plugin is out on that rank alone, `devices` works and says so (it ended the job, exit 2, before)
    assert proc.returncode == 0, proc.stderr
    assert _said(proc.stderr) == [] and "Traceback" not in proc.stderr, proc.stderr
    listed = json.loads(proc.stdout)["unavailable_benchmarks"]
    assert [(u["rank"], u["benchmark"]) for u in listed] == [(failing, "plugin_half")], proc.stdout
    assert "torch_directml" in listed[0]["reason"]
