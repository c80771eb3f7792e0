"""Memory checks (issue 6): one reader of host memory (MemAvailable, cgroup v1/v2, RLIMIT_AS/RLIMIT_DATA), pre-checks
that count what the run really holds (compared with the rank's measured peak RSS), and refusals under a real
RLIMIT_AS."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MPIEXEC, MPIEXEC_KIND, REPO, needs_mpi, require_mpi_mark, run_cli

from hetbench.backends import host

MIB = 1024**2


# --- the reader -------------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")


def test_cgroup_v2_headroom_is_the_least_over_the_hierarchy(tmp_path):
    _write(tmp_path / "proc", "0::/job/step\n")
    root = tmp_path / "cg"
    _write(root / "job/step/memory.max", "1000000\n")
    _write(root / "job/step/memory.current", "600000\n")
    _write(root / "job/step/memory.stat", "anon 500000\ninactive_file 100000\nactive_file 0\n")
    _write(root / "job/memory.max", "800000\n")
    _write(root / "job/memory.current", "700000\n")
    _write(root / "memory.max", "max\n")  # the root: no limit
    _write(root / "memory.current", "5\n")
    # the step may take 1000000 - (600000 - 100000 reclaimable) = 500000, but its parent only 100000
    assert host.cgroup_headroom_bytes(str(tmp_path / "proc"), str(root)) == 100000


def test_cgroup_v2_without_limits_is_unknown(tmp_path):
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg/memory.max", "max\n")
    _write(tmp_path / "cg/memory.current", "123\n")
    assert host.cgroup_headroom_bytes(str(tmp_path / "proc"), str(tmp_path / "cg")) is None


def test_cgroup_v1_limit_and_namespace_root(tmp_path):
    # a cgroup namespace names a path the mount does not show: the mount's own files are this cgroup's
    _write(tmp_path / "proc", "9:pids:/x\n4:cpu,memory:/not/here\n1:name=systemd:/\n")
    _write(tmp_path / "cg/memory/memory.limit_in_bytes", "2000000\n")
    _write(tmp_path / "cg/memory/memory.usage_in_bytes", "1500000\n")
    _write(tmp_path / "cg/memory/memory.stat", "cache 9\ntotal_inactive_file 250000\n")
    assert host.cgroup_headroom_bytes(str(tmp_path / "proc"), str(tmp_path / "cg")) == 750000
    _write(tmp_path / "cg/memory/memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    assert host.cgroup_headroom_bytes(str(tmp_path / "proc"), str(tmp_path / "cg")) is None


def test_reader_takes_the_least_and_splits_only_what_ranks_share(monkeypatch):
    monkeypatch.setattr(host, "meminfo_available_bytes", lambda: 8000)
    monkeypatch.setattr(host, "cgroup_headroom_bytes", lambda: 6000)
    monkeypatch.setattr(host, "rlimit_headroom_bytes", lambda: 5000)
    assert host.host_memory_available_bytes() == 5000
    assert host.host_memory_share_bytes(2) == 3000  # the cgroup, shared by two ranks; each has its own rlimit
    assert host.host_memory_share_bytes(4) == 1500
    monkeypatch.setattr(host, "cgroup_headroom_bytes", lambda: None)
    monkeypatch.setattr(host, "rlimit_headroom_bytes", lambda: None)
    assert host.host_memory_available_bytes() == 8000
    assert host.HostBackend().free_memory_bytes() == 8000  # the host backend reads the same place


def _python(code: str, limit_as: int | None = None) -> str:
    def cap() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                          preexec_fn=cap, timeout=60).stdout


def test_rlimit_as_is_read_against_the_virtual_size():
    code = ("from hetbench.backends import host; print(host.rlimit_headroom_bytes(), host._status_bytes('VmSize'), "
            "host.host_memory_available_bytes())")
    assert _python(code).split()[0] == "None"
    limit = 3 * 1024**3
    headroom, vmsize, available = map(int, _python(code, limit).split())
    assert 0 < headroom <= limit - vmsize + 16 * MIB
    assert available <= headroom


# --- real runs: what the pre-check counted against the rank's measured peak -------------------------------------


def _baseline_vmsize() -> int:
    """Virtual size of a hetbench process ready to run (MPI up, one BLAS thread): rlimits are set above it."""
    code = ("import hetbench.cli, hetbench.benchmarks.matmul.run, hetbench.benchmarks.collectives.run\n"
            "from hetbench.comm.world import World\nWorld()\n"
            "from hetbench.backends import host\nprint(host._status_bytes('VmSize'))")
    return int(_python(code))


def run_capped(args: list[str], cwd: Path, limit_as: int, nprocs: int | None = None):
    cmd = [sys.executable, "-m", "hetbench", *args]
    if nprocs is not None:
        assert MPIEXEC is not None
        require_mpi_mark()
        cmd = [MPIEXEC, "-n", str(nprocs), *cmd]

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, preexec_fn=cap, timeout=120,
                          stdin=subprocess.DEVNULL)


def _ratios(memory_records: list[dict]) -> list[float]:
    return [(m["peak_rss_bytes"] - m["rss_at_start_bytes"]) / m["host_memory_planned_bytes"] for m in memory_records]


def _ratios_without_scratch(memory_records: list[dict]) -> list[float]:
    """The measured peak against what was counted less the runtime's allowance (RUNTIME_SCRATCH_BYTES: BLAS's
    workspace, which a GEMM of small k hardly touches): the count is not far above what the data needs."""
    from hetbench.backends.host import RUNTIME_SCRATCH_BYTES

    return [(m["peak_rss_bytes"] - m["rss_at_start_bytes"]) / (m["host_memory_planned_bytes"] - RUNTIME_SCRATCH_BYTES)
            for m in memory_records]


@pytest.mark.parametrize("args, nprocs", [
    (["--size", "2048"], None),
    # the reduce's phase at its largest: C, the sum at the root, MPI's temporary
    pytest.param(["--m", "2048", "--n", "2048", "--k", "32"], 2, marks=needs_mpi),
])
def test_matmul_peak_rss_is_what_the_check_counted(tmp_path, args, nprocs):
    run = run_cli(["matmul", *args, "--backend", "host", "--repeat", "1", "--warmup", "0", "--out", "r.json"],
                  nprocs=nprocs, cwd=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    memory = [row["memory"] for row in json.loads((tmp_path / "r.json").read_text())["rows"]]
    for m in memory:
        assert m["host_memory_planned_bytes"] > 0 and m["peak_rss_bytes"] > m["rss_at_start_bytes"] > 0
    # at most 1.1 x what was counted (the bound), and not far below it either: the reduce's temporaries
    # counted are MPICH's, measured; Open MPI's are smaller (a non-root rank read 0.64 of the count)
    assert all(r <= 1.1 for r in _ratios(memory)), (_ratios(memory), memory)
    if MPIEXEC_KIND != "openmpi" or nprocs is None:
        assert all(r >= 0.8 for r in _ratios_without_scratch(memory)), (_ratios_without_scratch(memory), memory)


@needs_mpi
def test_collectives_peak_rss_is_what_the_check_counted(tmp_path):
    run = run_cli(["collectives", "--op", "allreduce", "--min-bytes", "40M", "--max-bytes", "40M", "--backend",
                   "host", "--path", "both", "--iters", "2", "--warmup", "1", "--out", "r.json"], nprocs=2,
                  cwd=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    memory = [rank["memory"] for rank in doc["metadata"]["ranks"]]
    assert len(memory) == 2
    assert all(r <= 1.1 for r in _ratios(memory)), (_ratios(memory), memory)
    assert all(r >= 0.8 for r in _ratios_without_scratch(memory)), (_ratios_without_scratch(memory), memory)


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_matmul_that_cannot_fit_under_rlimit_as_is_refused(tmp_path, nprocs):
    """8192^2 fp32 on the host holds 0.8 GiB at its peak (A, B, C and the check's blocks; 1.3 GiB before the host
    computed in place); with 512 MiB left under RLIMIT_AS it is refused before anything is made (the old check read
    MemAvailable only, and the run died of a MemoryError), while 512^2 runs under the same limit."""
    limit = _baseline_vmsize() + 512 * MIB
    run = run_capped(["matmul", "--size", "8192", "--backend", "host", "--repeat", "1"], tmp_path, limit, nprocs)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, run.stderr
    assert "host memory per rank" in lines[0] and "RLIMIT_AS" in lines[0] and "MemoryError" not in run.stderr
    fits = run_capped(["matmul", "--size", "512", "--backend", "host", "--repeat", "1", "--out", "r.json"], tmp_path,
                      limit, nprocs)
    assert fits.returncode == 0, fits.stderr


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_collectives_size_that_cannot_fit_under_rlimit_as_is_refused(tmp_path, nprocs):
    """allreduce at 512 MiB holds about 3 GiB per rank (send, receive, their device copies, the staged copy and
    MPI's temporary: the old check counted 1 GiB); refused under RLIMIT_AS with 768 MiB left, where 16 MiB runs."""
    limit = _baseline_vmsize() + 768 * MIB
    args = ["collectives", "--op", "allreduce", "--backend", "host", "--iters", "1", "--warmup", "0"]
    run = run_capped([*args, "--max-bytes", "512M"], tmp_path, limit, nprocs)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, run.stderr
    assert "536870912 bytes" in lines[0] and "host memory per rank" in lines[0] and "lower --max-bytes" in lines[0]
    assert "allreduce on the host path" in lines[0]
    fits = run_capped([*args, "--max-bytes", "16M", "--out", "r.json"], tmp_path, limit, nprocs)
    assert fits.returncode == 0, fits.stderr
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["wrong_total"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("size, reduce", [(4096, "sum"), (4096, "none"), (6144, "sum")])
def test_matmul_on_the_host_holds_little_beyond_its_data(tmp_path, size, reduce):
    """Issue 20's bound: a host rank's peak above its start is at most 1.1 x (A + B + C, + the sum received at the
    root), besides the BLAS library's own workspace (RUNTIME_SCRATCH_BYTES, allocated on the first GEMM). Before,
    the host backend copied A and B beside the inputs and C back, and the check converted 2048 rows to float64 at a
    time: 5.2 matrices of 4096^2 fp32 where A, B and C are 3."""
    from hetbench.backends.host import RUNTIME_SCRATCH_BYTES

    run = run_cli(["matmul", "--size", str(size), "--backend", "host", "--repeat", "1", "--warmup", "0",
                   "--reduce", reduce, "--out", "r.json"], cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    row = json.loads((tmp_path / "r.json").read_text())["rows"][0]
    matrix = size * size * 4
    data = 3 * matrix + (matrix if reduce == "sum" else 0)  # one rank: it is the root, and receives the sum
    above = row["memory"]["peak_rss_bytes"] - row["memory"]["rss_at_start_bytes"]
    assert above - RUNTIME_SCRATCH_BYTES <= 1.1 * data, (above / matrix, row["memory"])
    assert above >= 3 * matrix  # A, B and C were there: the measure is real
    # nothing was copied, and the row says so
    assert row["h2d_bytes"] == row["d2h_bytes"] == 0 and row["h2d_gbps"] is None and row["d2h_gbps"] is None


@pytest.mark.slow
@needs_mpi
def test_a_512_mib_allreduce_on_the_host_holds_at_most_three_buffers(tmp_path):
    """Issue 20's bound: send, receive and MPI's temporary, nothing else (the host backend's buffers are the host's:
    no device copies, no staging on the host path; the check builds the expected sum after the send buffer is
    freed). Before: 6.3 buffers, 3.1 GiB per rank."""
    size = 512 * MIB
    run = run_cli(["collectives", "--op", "allreduce", "--min-bytes", "512M", "--max-bytes", "512M", "--backend",
                   "host", "--iters", "2", "--warmup", "1", "--out", "r.json"], nprocs=2, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    row = doc["rows"][0]
    assert row["wrong"] == 0 and row["copy_timing"] == "none" and row["d2h_us_median"] == row["h2d_us_median"] == 0
    for rank in doc["metadata"]["ranks"]:
        above = rank["memory"]["peak_rss_bytes"] - rank["memory"]["rss_at_start_bytes"]
        assert 2 * size <= above <= 3 * size, above / size  # send and receive at least; never more than three
