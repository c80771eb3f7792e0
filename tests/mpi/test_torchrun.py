"""The hetbench backend under PyTorch's own launchers, with no MPI launcher: `torchrun --standalone` and
torch.multiprocessing.spawn (tests/torch_workers/spawn.py). init_process_group("hetbench") makes MPI's world from
torch's rendezvous (hetbench/pytorch/join.py); DDP, FSDP2 and shard_module then train what one process trains, a
join that cannot complete ends every rank within its timeout with one line, and nothing is left running: under MPICH
(the mpich extra) and Open MPI (mpi4py's openmpi ABI over Debian's openmpi-bin)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO, TESTS, needs_mpi, run_in_group

pytest.importorskip("torch")

WORKERS = TESTS / "torch_workers"
JOIN_TIMEOUT_S = 4


def _library(env: dict[str, str]) -> str:
    """The MPI library mpi4py loads with ENV, asked without starting MPI ("" where it cannot load one)."""
    code = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
            "print(MPI.Get_library_version().splitlines()[0])")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return ""
    return out.stdout


# mpi4py loads the MPICH wheel's library here, and Open MPI's (Debian's openmpi-bin) where MPI4PY_MPIABI says so
OPENMPI_ENV = {"MPI4PY_MPIABI": "openmpi", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
LIBRARIES = {"mpich": {}, "openmpi": OPENMPI_ENV}


def _usable(name: str) -> bool:
    wanted = {"mpich": "MPICH", "openmpi": "Open MPI"}[name]
    return wanted in _library(LIBRARIES[name])


USABLE = {name: _usable(name) for name in LIBRARIES}


def case(mpi: str, *values, slow: bool = False):
    """A test case under the MPI library MPI, skipped where mpi4py cannot load it; SLOW: run by `make test-slow` and
    CI only (a second launcher or library for what a faster case already covers)."""
    ids = "-".join([mpi, *(",".join(v) if isinstance(v, list) else str(v) for v in values)])
    marks = [pytest.mark.skipif(not USABLE[mpi], reason=f"mpi4py cannot load {mpi} here")]
    return pytest.param(mpi, *values, id=ids, marks=marks + ([pytest.mark.slow] if slow else []))


def _launch(launcher: str, nprocs: int, script: Path, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 180, mpi: str = "mpich") -> tuple[subprocess.CompletedProcess, float, str]:
    """Run SCRIPT under LAUNCHER with a tag in the environment: (the run, its seconds, the tag)."""
    tag = uuid.uuid4().hex
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nprocs),
               str(script), *args]
    else:
        cmd = [sys.executable, str(WORKERS / "spawn.py"), str(nprocs), str(script), *args]
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_", "MPI_"))}
    full.update(PYTHONPATH=f"{REPO}{os.pathsep}{full.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1",
                HETBENCH_TEST_TAG=tag, **LIBRARIES[mpi], **(env or {}))
    start = time.monotonic()
    run = run_in_group(cmd, timeout, capture_output=True, text=True, env=full, stdin=subprocess.DEVNULL)
    return run, time.monotonic() - start, tag


def _tagged(tag: str) -> list[str]:
    """The processes still running with TAG in their environment: none may outlive the job."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"HETBENCH_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes():
                left.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return left


def _settled(tag: str, seconds: float = 8.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@needs_mpi
@pytest.mark.parametrize("mpi,launcher,nprocs,weights", [
    case("mpich", "torchrun", 2, ["3,1"]), case("mpich", "torchrun", 3, ["0.5,0.3,0.2", "2,1,0"]),
    case("mpich", "spawn", 2, ["3,1"], slow=True), case("mpich", "spawn", 3, ["0.5,0.3,0.2", "2,1,0"]),
    case("openmpi", "torchrun", 2, ["3,1"]), case("openmpi", "torchrun", 3, ["0.5,0.3,0.2", "2,1,0"], slow=True),
    case("openmpi", "spawn", 3, ["0.5,0.3,0.2"], slow=True)])
def test_ddp_and_fsdp2_match_one_process(mpi, launcher, nprocs, weights):
    run, _, tag = _launch(launcher, nprocs, WORKERS / "exact.py", weights, mpi=mpi)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = re.findall(r"CASE (ddp|fsdp2) (\S+) rows=\S+ loss=(\S+) param=(\S+) ok", run.stdout)
    assert sorted((c[0], c[1]) for c in cases) == sorted((s, w) for s in ("ddp", "fsdp2") for w in weights)
    assert all(float(c[2]) <= 1e-5 and float(c[3]) <= 1e-5 for c in cases), cases
    assert not _settled(tag)


@needs_mpi
@pytest.mark.parametrize("mpi,launcher,nprocs,weights", [
    case("mpich", "torchrun", 2, "3,1"), case("mpich", "spawn", 3, "0.5,0.3,0.2", slow=True),
    case("openmpi", "torchrun", 2, "3,1", slow=True), case("openmpi", "spawn", 3, "0.5,0.3,0.2")])
def test_shard_module_matches_one_process(mpi, launcher, nprocs, weights):
    run, _, tag = _launch(launcher, nprocs, WORKERS / "fsdp.py", [weights], mpi=mpi)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = re.findall(r"CASE (\S+) (\S+) loss=(\S+) param=(\S+) elements=(\S+) ok", run.stdout)
    assert sorted((c[0], c[1]) for c in cases) == sorted([("mlp", weights), ("gpt", weights), ("mlp", "even")])
    assert all(float(c[2]) <= 1e-5 and float(c[3]) <= 1e-3 for c in cases), cases
    assert not _settled(tag)


@needs_mpi
@pytest.mark.parametrize("mpi", [case("mpich"), case("openmpi")])
def test_the_world_is_torchs_ranks_in_rank_order(mpi):
    run, _, tag = _launch("torchrun", 3, WORKERS / "join_world.py", [], mpi=mpi)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = sorted(re.findall(r"torch (\d)/(\d) mpi (\d)/(\d) host \S+ sum (\d+\.\d)", run.stdout))
    assert lines == [(str(r), "3", str(r), "3", "6.0") for r in range(3)], run.stdout
    assert not _settled(tag)


@needs_mpi
@pytest.mark.parametrize("mpi,launcher,case", [
    case("mpich", "torchrun", "late"), case("mpich", "torchrun", "killed"), case("mpich", "spawn", "late"),
    case("mpich", "spawn", "killed"), case("openmpi", "torchrun", "late"), case("openmpi", "spawn", "killed")])
def test_a_join_that_cannot_complete_ends_the_job_within_the_timeout(mpi, launcher, case):
    env = {"HETBENCH_JOIN_TIMEOUT": str(JOIN_TIMEOUT_S), "JOIN_CASE": case, "LATE_RANK": "1"}
    run, _, tag = _launch(launcher, 3, WORKERS / "join_late.py", [], env=env, timeout=90, mpi=mpi)
    ended = time.time()
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    # from the first rank's call of init_process_group to the job's end (its imports not counted); a killed rank's
    # launcher may stop the others before any calls it
    joined = [float(t) for t in re.findall(r"rank \d joins at (\d+\.\d+)", run.stdout)]
    assert joined or case == "killed", out
    assert not joined or ended - min(joined) <= JOIN_TIMEOUT_S + 10, (ended - min(joined), out)
    assert "joined" not in run.stdout
    if case == "late":  # the ranks that arrived say which did not, in one line each
        said = re.findall(r"JoinError: (hetbench join: .*)", out)
        assert said and all(s == said[0] for s in said), out
        missing = re.match(rf"hetbench join: rank\(s\) ([\d,]+) of 3 did not join within {JOIN_TIMEOUT_S} s "
                           r"\(HETBENCH_JOIN_TIMEOUT\); rank\(s\) ([\d,]+) did", said[0])
        assert missing, said
        # under spawn torch's env:// store holds rank 0 until every rank has called init_process_group
        assert "1" in missing[1].split(",") and "2" in missing[2].split(","), said
    assert not _settled(tag), out


@needs_mpi
def test_a_bad_join_timeout_is_refused_in_one_line():
    run, _, tag = _launch("torchrun", 2, WORKERS / "join_world.py", [], env={"HETBENCH_JOIN_TIMEOUT": "soon"},
                          timeout=60)
    assert run.returncode != 0
    assert "JoinError: HETBENCH_JOIN_TIMEOUT='soon' is not a number of seconds" in run.stderr, run.stderr
    assert not _settled(tag)
