"""Results files (issue 6): unique default names, never replacing what is not a regular file, one file named twice,
all outputs staged and committed together (or none), and modes that follow the umask."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np
import pytest
from helpers import MPIEXEC, REPO, Batches, Run, assert_usage_error, needs_mpi, require_mpi_mark, run_cli

from hetbench.results import io as results_io
from hetbench.results import load_results

RANKS = [None, pytest.param(2, marks=needs_mpi)]
MATMUL = ["matmul", "--size", "16", "--repeat", "1", "--warmup", "0", "--backend", "host"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_limited(args: list[str], cwd: Path, nprocs: int | None = None, umask: int | None = None,
                fsize: int | None = None, timeout: float = 120) -> Run:
    """The CLI like conftest.run_cli, with a umask or a file-size limit (RLIMIT_FSIZE) set in the child: a write
    past the limit fails with EFBIG (Python ignores SIGXFSZ), a real failing write without a full disk."""
    cmd = [sys.executable, "-m", "hetbench", *args]
    if nprocs is not None:
        assert MPIEXEC is not None
        require_mpi_mark()
        cmd = [MPIEXEC, "-n", str(nprocs), *cmd]

    def limit() -> None:
        if umask is not None:
            os.umask(umask)
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(),
                          stdin=subprocess.DEVNULL, preexec_fn=limit)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


# --- unique default names -------------------------------------------------------------------------------------


def test_runs_started_together_never_share_a_name(tmp_path):
    """Six runs started at once in one folder (the same second, on the old code one name for all): six of each."""
    cmd = [sys.executable, "-m", "hetbench", "matmul", "--size", "32", "--repeat", "1", "--backend", "host"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True) for _ in range(6)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, outs
    files = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len([f for f in files if f.endswith(".json")]) == 6, files
    assert len([f for f in files if f.endswith(".csv")]) == 6, files
    assert all(f.startswith("matmul-") for f in files)
    # each JSON and its CSV share a name, and the JSON records where it went
    for f in files:
        if f.endswith(".json"):
            assert f[:-5] + ".csv" in files
            doc = load_results(tmp_path / "results" / f)
            assert doc["config"]["output"]["out_json"] == f"results/{f}"


def _document(stem: str) -> dict:
    return {"schema": "hetbench.matmul", "schema_version": 1, "metadata": {}, "rows": [{"rank": 0, "x": 1.5}],
            "summary": {}, "verified": True,
            "config": {"output": {"out_json": f"results/{stem}.json", "out_csv": f"results/{stem}.csv"}}}


def test_default_name_taken_meanwhile_gets_the_next_name(tmp_path, monkeypatch):
    """Two runs with one stamp (to the microsecond): the second never replaces the first, it takes -2."""
    from hetbench.outputs import emit, resolve_outputs
    from hetbench.comm.world import World

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    world = World()
    shown: list[str] = []
    for _ in range(2):
        output = resolve_outputs("matmul", None, None, False, "20260101T000000.000001Z")
        emit(world, _document("matmul-20260101T000000.000001Z"), output, lambda: shown.append("table"))
    names = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert names == ["matmul-20260101T000000.000001Z-2.csv", "matmul-20260101T000000.000001Z-2.json",
                     "matmul-20260101T000000.000001Z.csv", "matmul-20260101T000000.000001Z.json"]
    second = json.loads((tmp_path / "results" / "matmul-20260101T000000.000001Z-2.json").read_text())
    assert second["config"]["output"]["out_json"] == "results/matmul-20260101T000000.000001Z-2.json"
    assert second["config"]["output"]["out_csv"] == "results/matmul-20260101T000000.000001Z-2.csv"


def test_name_linked_in_exclusively_is_never_replaced(tmp_path):
    """The commit of a file that must be new fails if the name exists by then, and leaves both files as they were."""
    target = tmp_path / "r.json"
    staged = results_io.stage_json(target, {"new": 1}, exclusive=True)
    target.write_text("another run's", encoding="utf-8")
    with pytest.raises(FileExistsError):
        results_io.commit([staged])
    assert target.read_text(encoding="utf-8") == "another run's"
    assert temp_files(tmp_path) == []


def test_explicit_out_may_replace_a_regular_file(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old", encoding="utf-8")
    run = run_cli([*MATMUL, "--out", str(out)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert load_results(out)["schema"] == "hetbench.matmul"


# --- outputs that are not regular files -----------------------------------------------------------------------


SYMLINKED = ["--out", "--csv", "--save"]
TWICE = [
    (["--out", "r.json", "--csv", "r.json"], "--out 'r.json'", "--csv 'r.json'"),
    (["--out", "r.json", "--save", "r.json"], "--out 'r.json'", "--save 'r.json'"),
    (["--out", "r.json", "--csv", "./r.json"], "--out 'r.json'", "--csv 'r.json'"),
    (["--csv", "r.csv", "--save", "sub/../r.csv"], "--csv 'r.csv'", "--save 'sub/../r.csv'"),
    (["--out", "r.json", "--csv", "alias/r.json"], "--out 'r.json'", "--csv 'alias/r.json'"),
]


def _symlinked(folder: Path) -> None:
    (folder / "target.txt").write_text("keep me", encoding="utf-8")
    (folder / "link.json").symlink_to(folder / "target.txt")


def _fifo(folder: Path) -> None:
    os.mkfifo(folder / "r.json")


def _twice(folder: Path) -> None:
    (folder / "sub").mkdir()
    (folder / "alias").symlink_to(folder)


def _launched(nprocs, root):
    """The 2-rank commands of this file, in one launch (helpers.Batches): each in its own folder, made as the
    one-process case makes its tmp_path; all bad input, refused alike on every rank, the job going on."""
    cases = [*[(f"symlink{option}", _symlinked, [option, "link.json"]) for option in SYMLINKED],
             ("fifo", _fifo, ["--out", "r.json"]),
             *[(f"twice-{i}", _twice, args) for i, (args, _, _) in enumerate(TWICE)]]
    for name, setup, _ in cases:
        (root / name).mkdir()
        setup(root / name)
    return [(name, [*MATMUL, *args], {}) for name, _, args in cases]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("outputs-launched"), _launched, timeout=120)


def _run(launched, tmp_path, nprocs, name, setup, args, timeout=120):
    """(the command's Run, the folder it ran in): alone in TMP_PATH (SETUP made there first), or NAME in the
    2-rank launch (its folder made alike)."""
    if nprocs is None:
        setup(tmp_path)
        return run_cli(args, cwd=tmp_path, timeout=timeout), tmp_path
    return launched.get(nprocs)[name]


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("option", SYMLINKED)
def test_symlink_output_is_refused_and_left_alone(tmp_path, launched, nprocs, option):
    run, tmp_path = _run(launched, tmp_path, nprocs, f"symlink{option}", _symlinked, [*MATMUL, option, "link.json"])
    target, link = tmp_path / "target.txt", tmp_path / "link.json"
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.error_lines) == 1, run.stderr
    assert option in run.error_lines[0] and "'link.json'" in run.error_lines[0]
    assert "symbolic link" in run.error_lines[0]
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text(encoding="utf-8") == "keep me"
    assert temp_files(tmp_path) == []
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def device_node(tmp_path: Path, name: str) -> str:
    """A character device like /dev/null or /dev/full to aim --out at. As root a private node with the same
    numbers is made in tmp_path: code that wrongly renames over it then breaks a copy, not the system's /dev/null
    (the old code did just that). Without root the real one is used: a rename over it is refused by /dev's
    permissions."""
    real = f"/dev/{name}"
    if not os.path.exists(real) or not stat.S_ISCHR(os.stat(real).st_mode):
        pytest.skip(f"no {real}")
    if os.geteuid() != 0:
        return real
    node = tmp_path / "dev" / name
    node.parent.mkdir()
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.stat(real).st_rdev)
    except OSError:
        pytest.skip("root without the right to make device nodes: not risking the real /dev")
    return str(node)


@pytest.mark.parametrize("name", ["null", "full"])
@pytest.mark.parametrize("option", ["--out", "--csv"])
def test_device_output_is_refused(tmp_path, name, option):
    device = device_node(tmp_path, name)
    before = os.stat(device)
    run = run_cli([*MATMUL, option, device], cwd=tmp_path)
    assert_usage_error(run, tmp_path, option, repr(device), "a device", "not a regular file")
    after = os.lstat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


@pytest.mark.parametrize("nprocs", RANKS)
def test_fifo_output_is_refused_without_blocking(tmp_path, launched, nprocs):
    run, tmp_path = _run(launched, tmp_path, nprocs, "fifo", _fifo, [*MATMUL, "--out", "r.json"], timeout=60)
    fifo = tmp_path / "r.json"
    assert_usage_error(run, tmp_path, "--out", "'r.json'", "a FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_socket_output_is_refused(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    with contextlib.closing(sock):
        sock.bind(str(tmp_path / "r.csv"))
        run = run_cli([*MATMUL, "--csv", "r.csv"], cwd=tmp_path)
        assert_usage_error(run, tmp_path, "--csv", "'r.csv'", "a socket")
        assert stat.S_ISSOCK(os.lstat(tmp_path / "r.csv").st_mode)


def test_commit_never_renames_over_a_link_made_after_the_check(tmp_path):
    """The last-moment check: a target that became a symbolic link after staging is not replaced."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me", encoding="utf-8")
    path = tmp_path / "r.json"
    staged = results_io.stage_json(path, {"a": 1})
    path.symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        results_io.commit([staged])
    assert path.is_symlink() and target.read_text(encoding="utf-8") == "keep me"
    assert temp_files(tmp_path) == []


# --- one file named twice --------------------------------------------------------------------------------------


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("case", range(len(TWICE)), ids=[f"{a}-{b}" for _, a, b in TWICE])
def test_one_file_named_twice_is_a_usage_error(tmp_path, launched, nprocs, case):
    args, first, second = TWICE[case]
    run, tmp_path = _run(launched, tmp_path, nprocs, f"twice-{case}", _twice, [*MATMUL, *args])
    assert_usage_error(run, tmp_path, first, second, "the same file")


def test_hard_links_to_one_file_are_the_same_file(tmp_path):
    (tmp_path / "r.json").write_text("old", encoding="utf-8")
    os.link(tmp_path / "r.json", tmp_path / "also.json")
    run = run_cli([*MATMUL, "--out", "r.json", "--csv", "also.json"], cwd=tmp_path)
    assert run.returncode == 2 and "the same file" in run.stderr, run.stderr
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == "old"


# --- staged and committed together ------------------------------------------------------------------------------


def _old_outputs(folder: Path) -> dict[str, str]:
    old = {"r.json": "old json", "r.csv": "old csv", "s.npy": "old npy"}
    for name, text in old.items():
        (folder / name).write_text(text, encoding="utf-8")
    return old


def _assert_untouched(folder: Path, old: dict[str, str]) -> None:
    for name, text in old.items():
        assert (folder / name).read_text(encoding="utf-8") == text, name
    assert temp_files(folder) == []


@pytest.mark.parametrize("nprocs, root", [(None, 0), pytest.param(2, 1, marks=needs_mpi)])
def test_failing_write_of_one_output_replaces_none(tmp_path, nprocs, root):
    """The --save file (4096x4096 fp32, 64 MiB, from k = 1 so it is quick) cannot be written past a 48 MiB
    file-size limit (MPI's own shared-memory files fit under it), while the JSON and CSV can: no file is replaced,
    no temporary file is left, one line names the file, exit code 1."""
    old = _old_outputs(tmp_path)
    run = run_limited(["matmul", "--m", "4096", "--n", "4096", "--k", "1", "--repeat", "1", "--warmup", "0",
                       "--backend", "host", "--root", str(root), "--out", "r.json", "--csv", "r.csv", "--save",
                       "s.npy"], cwd=tmp_path, nprocs=nprocs, fsize=48 * 1024**2)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.error_lines) == 1, run.stderr
    line = run.error_lines[0]
    assert "cannot write --save file 's.npy': File too large; no output was written" in line, line
    if nprocs:
        assert line.startswith(f"Error: rank {root} ")
    assert "results written" not in run.stdout
    _assert_untouched(tmp_path, old)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs, where writing more gives the real ENOSPC; skipped where mounting is not allowed."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_no_space_left_names_the_file_and_replaces_nothing(tmp_path, tiny_tmpfs):
    """A --save file larger than the disk: ENOSPC, named; the JSON and CSV beside it are not replaced either."""
    old = _old_outputs(tiny_tmpfs)
    run = run_cli(["matmul", "--size", "128", "--repeat", "1", "--backend", "host", "--out", f"{tiny_tmpfs}/r.json",
                   "--csv", f"{tiny_tmpfs}/r.csv", "--save", f"{tiny_tmpfs}/s.npy"], cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert len(run.error_lines) == 1, run.stderr
    assert run.error_lines[0] == (f"Error: cannot write --save file '{tiny_tmpfs}/s.npy': No space left on device; "
                                  "no output was written")
    _assert_untouched(tiny_tmpfs, old)


def test_full_disk_for_the_results_leaves_the_saved_sum_alone(tmp_path, tiny_tmpfs):
    """The JSON goes to a full disk, the --save file to another: the old sum is not replaced (the issue saw the
    saved sum replaced before the JSON write failed)."""
    old = _old_outputs(tiny_tmpfs)
    (tmp_path / "s.npy").write_text("old npy", encoding="utf-8")
    with open(tiny_tmpfs / "filler", "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 4096)
    run = run_cli(["matmul", "--size", "8", "--repeat", "1", "--backend", "host", "--out", f"{tiny_tmpfs}/r.json",
                   "--csv", f"{tiny_tmpfs}/r.csv", "--save", "s.npy"], cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert len(run.error_lines) == 1, run.stderr
    assert f"cannot write results file '{tiny_tmpfs}/r.json': No space left on device" in run.error_lines[0]
    (tiny_tmpfs / "filler").unlink()
    _assert_untouched(tiny_tmpfs, old)
    assert (tmp_path / "s.npy").read_text(encoding="utf-8") == "old npy"
    assert temp_files(tmp_path) == []


def test_failed_check_still_writes_every_output(tmp_path):
    """A wrong product exits 1, and the files are still written: they record the failure."""
    run = run_cli(["matmul", "--size", "32", "--repeat", "1", "--backend", "sim:a100", "--out", "r.json",
                   "--csv", "r.csv", "--save", "s.npy"], cwd=tmp_path, env={"HETBENCH_SIM_FAULT": "corrupt@0"})
    assert run.returncode == 1, run.stderr
    assert load_results(tmp_path / "r.json")["verified"] is False
    assert (tmp_path / "r.csv").exists() and np.load(tmp_path / "s.npy").shape == (32, 32)


def test_commit_restores_every_target_when_a_later_rename_fails(tmp_path, monkeypatch):
    old = _old_outputs(tmp_path)
    staged = [results_io.stage_json(tmp_path / "r.json", {"a": 1}),
              results_io.stage_csv(tmp_path / "r.csv", [{"a": 1}]),
              results_io.stage_npy(tmp_path / "s.npy", np.zeros(3))]
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("s.npy"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(results_io.os, "replace", failing_replace)
    with pytest.raises(OSError) as excinfo:
        results_io.commit(staged)
    monkeypatch.undo()
    assert excinfo.value.filename == str(tmp_path / "s.npy")
    _assert_untouched(tmp_path, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.json", "s.npy"]


def test_stage_failure_leaves_no_temporary_file(tmp_path, monkeypatch):
    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results_io.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        results_io.stage_json(tmp_path / "r.json", {"a": 1})
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_emit_turns_a_write_failure_into_one_named_error(tmp_path, monkeypatch):
    from hetbench.outputs import emit
    from hetbench.comm.world import World
    from hetbench.config import OutputConfig

    old = _old_outputs(tmp_path)
    real_stage = results_io.stage

    def stage(path, write, binary=False, exclusive=False):
        if str(path).endswith(".csv"):
            raise OSError(28, "No space left on device")
        return real_stage(path, write, binary, exclusive)

    monkeypatch.setattr(results_io, "stage", stage)
    shown = []
    with pytest.raises(click.ClickException) as excinfo:
        emit(World(), _document("r"), OutputConfig(tmp_path / "r.json", tmp_path / "r.csv"), lambda: shown.append(1),
             files=[("--save", tmp_path / "s.npy", np.zeros(3))])
    assert excinfo.value.exit_code == 1
    assert excinfo.value.format_message() == (
        f"cannot write results file '{tmp_path}/r.csv': No space left on device; no output was written")
    assert shown == []
    _assert_untouched(tmp_path, old)


# --- modes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_new_files_follow_the_umask(tmp_path, umask, mode):
    run = run_limited([*MATMUL, "--out", "r.json", "--csv", "r.csv", "--save", "s.npy"], cwd=tmp_path, umask=umask)
    assert run.returncode == 0, run.stderr
    for name in ("r.json", "r.csv", "s.npy"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == mode, name
    run = run_limited(MATMUL, cwd=tmp_path, umask=umask)
    assert run.returncode == 0, run.stderr
    for path in (tmp_path / "results").iterdir():
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, path


@pytest.mark.parametrize("existing", [0o644, 0o600, 0o664])
def test_replaced_file_keeps_its_mode(tmp_path, existing):
    out = tmp_path / "r.json"
    out.write_text("old", encoding="utf-8")
    os.chmod(out, existing)
    run = run_limited([*MATMUL, "--out", "r.json"], cwd=tmp_path, umask=0o022)
    assert run.returncode == 0, run.stderr
    assert load_results(out)["schema"] == "hetbench.matmul"
    assert stat.S_IMODE(os.stat(out).st_mode) == existing
