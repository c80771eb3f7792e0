"""hetbench under the launcher the suite runs with (MPICH's hydra under `make test`, Open MPI's mpirun under `make
test-openmpi`): the MPI library the ranks load, local ranks, the example hostfiles launched as shipped, the Slurm
script, and plain output where Open MPI hands ranks a terminal."""

from __future__ import annotations

import json
import shutil
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import MPIEXEC, MPIEXEC_KIND, REPO, Run, run_cli, run_in_group, run_python

HOSTFILES = REPO / "hostfiles"
SLURM_SCRIPT = HOSTFILES / "slurm-nvidia-amd.sbatch"

needs_known_launcher = pytest.mark.skipif(MPIEXEC_KIND is None,
                                          reason=f"no mpiexec, or {MPIEXEC} is neither MPICH nor Open MPI")


def rows(run) -> list[dict]:
    assert run.returncode == 0, f"exit {run.returncode}\nstdout: {run.stdout}\nstderr: {run.stderr}"
    return json.loads(run.stdout)["rows"]


def outputs(tmp_path: Path) -> list[str]:
    return ["--out", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")]


def fake_command(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@needs_known_launcher
def test_ranks_load_the_launchers_mpi_library(tmp_path):
    """The venv the suite runs from pairs its mpi4py with the launcher: under Open MPI's mpirun an MPICH libmpi
    would abort at start-up ("unsupported PMI version"), so a passing run must report Open MPI, and vice versa."""
    run = run_cli(["matmul", "--size", "16", "--backend", "host", "--json", *outputs(tmp_path)], nprocs=2,
                  cwd=tmp_path)
    assert len(rows(run)) == 2
    library = json.loads(run.stdout)["metadata"]["mpi_library"]
    assert library.startswith({"openmpi": "Open MPI", "mpich": "MPICH"}[MPIEXEC_KIND]), library


LOCAL_RANKS = """
import json, os
from hetbench.comm.world import World
w = World()
env = {k: os.environ[k] for k in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK") if k in os.environ}
record = {"rank": w.rank, "local_rank": w.local_rank, "local_size": w.local_size, "env": env}
with open(f"rank{w.rank}.json", "w") as f:  # one file per rank: ranks' stdout lines can interleave in the pipe
    json.dump(record, f)
"""


@needs_known_launcher
def test_local_rank_matches_the_launchers_own(tmp_path):
    """World.local_rank (MPI_Comm_split_type SHARED) agrees with the local rank the launcher itself exports
    (hydra's MPI_LOCALRANKID, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), for three ranks on one node."""
    run = run_python(["-c", LOCAL_RANKS], nprocs=3, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    name = {"openmpi": "OMPI_COMM_WORLD_LOCAL_RANK", "mpich": "MPI_LOCALRANKID"}[MPIEXEC_KIND]
    assert [r["local_rank"] for r in seen] == [0, 1, 2]
    assert [r["local_size"] for r in seen] == [3, 3, 3]
    assert [int(r["env"][name]) for r in seen] == [0, 1, 2]


def hostfile_args(kind: str, hostfile: Path) -> list[str]:
    return ["--hostfile", str(hostfile)] if kind == "openmpi" else ["-f", str(hostfile)]


@needs_known_launcher
def test_localhost_hostfile_launches_two_ranks_on_one_node(tmp_path):
    """hostfiles/localhost.{openmpi,mpich} as shipped: two ranks on this node, so the simulated devices they
    open without an index are the local ranks 0 and 1."""
    hostfile = HOSTFILES / f"localhost.{MPIEXEC_KIND}"
    run = run_cli(["matmul", "--size", "64", "--backend", "sim:h100", "--json", *outputs(tmp_path)], nprocs=2,
                  cwd=tmp_path, launcher_args=hostfile_args(MPIEXEC_KIND, hostfile))
    got = rows(run)
    assert [r["device_info"]["index"] for r in got] == [0, 1]
    assert all(r["verified"] for r in got)


@needs_known_launcher
def test_two_node_hostfile_as_shipped_puts_one_rank_on_each_node(tmp_path):
    """hostfiles/nvidia-amd.{openmpi,mpich} as shipped, with an ssh that runs the remote command here: the launcher
    reads both placeholder addresses from the file and starts one rank through each; each rank then finds itself
    alone on its node (local rank 0, so each opens simulated device 0), and the ranks talk over TCP."""
    log = tmp_path / "ssh.log"
    # each "node" its own /tmp, as two machines have: Open MPI's two daemons here made one session folder at once,
    # and one failed ("mkdir ... File exists", exit 213). Short: Open MPI keeps its sockets there
    nodes_tmp = Path(tempfile.mkdtemp(prefix="hb-nodes-"))
    fake_ssh = fake_command(tmp_path / "ssh", f"""
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
echo "$1" >> '{log}'
mkdir -p '{nodes_tmp}'/"$1" && export TMPDIR='{nodes_tmp}'/"$1"
shift
exec /bin/sh -c "$*"
""")
    hostfile = HOSTFILES / f"nvidia-amd.{MPIEXEC_KIND}"
    if MPIEXEC_KIND == "openmpi":
        # both "nodes" are this machine: their daemons and ranks must talk over loopback, which Open MPI skips;
        # and the second daemon must not map the first one's shared hwloc topology (Open MPI 4.1.4's orted then
        # segfaults in hwloc_shmem_topology_write about one launch in three; two real nodes never share it)
        launcher = ["--hostfile", str(hostfile), "--map-by", "node", "--mca", "plm_rsh_agent", str(fake_ssh),
                    "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                    "--mca", "rtc", "^hwloc"]
    else:
        launcher = ["-f", str(hostfile), "-launcher", "ssh", "-launcher-exec", str(fake_ssh)]
    try:
        run = run_cli(["matmul", "--size", "64", "--backend", "sim:h100", "--json", *outputs(tmp_path)], nprocs=2,
                      cwd=tmp_path, launcher_args=launcher, timeout=60)
    finally:
        shutil.rmtree(nodes_tmp, ignore_errors=True)
    got = rows(run)
    assert [r["device_info"]["index"] for r in got] == [0, 0]
    assert all(r["verified"] for r in got)
    assert sorted(log.read_text().split()) == ["10.0.0.11", "10.0.0.12"]


def run_bash(script: Path, args: list[str], cwd: Path, env: dict[str, str]):
    """`bash SCRIPT ARGS` with this checkout on the Python path, as run_python does for Python."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env)
    start = time.monotonic()
    proc = run_in_group(["bash", str(script), *args], 120, cwd=cwd, capture_output=True, text=True,
                        env=full_env, stdin=subprocess.DEVNULL)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


VENV = Path(sys.executable).parent.parent
SLURM_LAUNCHES = [
    # srun --mpi=pmix, here an srun that starts its tasks through this suite's launcher
    pytest.param("openmpi", marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")),
    # Open MPI's own mpirun inside the allocation
    pytest.param("openmpi-mpirun", marks=pytest.mark.skipif(
        MPIEXEC_KIND != "openmpi" or not os.path.exists("/usr/bin/mpirun")
        or not os.path.samefile(MPIEXEC, "/usr/bin/mpirun"),
        reason="the suite does not run under /usr/bin/mpirun (make test-openmpi)")),
    # the MPICH wheel's mpiexec in the venv
    pytest.param("mpich", marks=pytest.mark.skipif(
        MPIEXEC_KIND != "mpich" or not (VENV / "bin" / "mpiexec").exists(),
        reason="no MPICH mpiexec in this venv (make test)")),
]


@pytest.mark.parametrize("mpi", SLURM_LAUNCHES)
def test_slurm_script_runs_the_job(tmp_path, mpi):
    """hostfiles/slurm-nvidia-amd.sbatch run as Slurm runs it (its environment, in the submit folder): it launches
    hetbench from the venv with the arguments given, one task per node, and the results land in the submit
    folder. Each of its three ways to start the ranks, as far as this suite's launcher allows."""
    if not (VENV / "bin" / "hetbench").exists():
        pytest.skip(f"hetbench is not installed in {VENV}")
    srun_log = tmp_path / "srun.log"
    fake_command(tmp_path / "srun", f"""
echo "$@" > '{srun_log}'
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
exec '{MPIEXEC}' -n "$SLURM_NTASKS" "$@"
""")
    env = {
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        "HETBENCH_VENV": str(VENV),
        "HETBENCH_MPI": mpi,
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_NTASKS": "2",
        "SLURM_CPUS_ON_NODE": "1",
        "SLURM_JOB_ID": "1",
    }
    args = ["matmul", "--size", "64", "--backend", "0=sim:h100,1=sim:mi300x"]
    run = run_bash(SLURM_SCRIPT, args, cwd=REPO, env=env)
    assert run.returncode == 0, f"stdout: {run.stdout}\nstderr: {run.stderr}"
    if mpi == "openmpi":
        srun_args = srun_log.read_text().split()
        assert "--mpi=pmix" in srun_args and "--ntasks-per-node=1" in srun_args
        assert srun_args[-6:] == [f"{VENV}/bin/hetbench", *args]
    else:
        assert not srun_log.exists()
    docs = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("*.json")]
    assert len(docs) == 1
    assert [r["backend"] for r in docs[0]["rows"]] == ["sim:h100", "sim:mi300x"]
    assert docs[0]["verified"] is True


def test_slurm_script_refuses_a_missing_venv(tmp_path):
    run = run_bash(SLURM_SCRIPT, [], cwd=tmp_path,
                   env={"HETBENCH_VENV": str(tmp_path / "none"), "SLURM_SUBMIT_DIR": str(tmp_path)})
    assert run.returncode == 2
    assert f"no {tmp_path / 'none'}/bin/hetbench" in run.stderr


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_output_through_the_launcher_is_plain_and_not_cut_to_80_columns(tmp_path):
    """Open MPI gives each rank a pseudo-terminal of 0 columns whatever mpirun's own output is: rich took it for a
    terminal, wrote colour codes into the captured output and wrapped lines at 80 columns."""
    # a "results written to" line of about 150 columns: past 80, within the 200 hetbench gives a file or a pipe
    line_without_folder = len(f"results written to: {tmp_path}/r.json, {tmp_path}/r.csv")
    out = tmp_path / ("f" * max(1, (150 - line_without_folder) // 2))
    out.mkdir()
    run = run_cli(["matmul", "--size", "32", "--backend", "0=host,1=sim:mi300x", "--out", str(out / "r.json"),
                   "--csv", str(out / "r.csv")], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "\x1b[" not in run.stdout
    assert f"results written to: {out / 'r.json'}, {out / 'r.csv'}" in run.stdout.splitlines()
