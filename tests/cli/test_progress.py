"""`matmul` says how far it is: a progress bar through every GEMM and reduce (rank 0, stderr, where asked or on a
terminal), fed by a callback so the harness never imports rich; and one notice before a slow host fp16 run."""

from __future__ import annotations

import re

import pytest
from helpers import needs_mpi, run_cli, run_python

from hetbench.backends.base import Elapsed
from hetbench.harness.timing import time_repeats

FAST = ["--size", "64", "--warmup", "2", "--repeat", "3"]


class _CountingBackend:
    """Counts the runs each timer block holds, to show that progress is reported outside the timed region."""

    def __init__(self) -> None:
        self.runs = 0
        self.in_timer = False

    def timer(self):
        backend = self

        class _Timer:
            def __enter__(self):
                backend.in_timer = True
                return Elapsed(0.001)

            def __exit__(self, *exc):
                backend.in_timer = False

        return _Timer()


def test_time_repeats_reports_every_run_outside_the_timer():
    backend = _CountingBackend()
    seen = []

    def op():
        backend.runs += 1

    def on_run(done):
        assert not backend.in_timer  # the callback's time is never counted
        seen.append((done, backend.runs))

    seconds = time_repeats(backend, op, warmup=2, repeat=3, on_run=on_run)
    assert len(seconds) == 3
    assert seen == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]


def test_harness_does_not_import_rich():
    code = ("import sys, hetbench.benchmarks.matmul.run, hetbench.benchmarks.collectives.run, hetbench.harness.timing; "
            "print('rich' in sys.modules)")
    run = run_python(["-c", code])
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


def _steps(stderr: str) -> list[str]:
    return re.findall(r"(GEMM (?:warm-up|timed) \d+/\d+|reduce \d+/\d+)", stderr)


@pytest.mark.parametrize("backend", ["host", "sim:h100"])
def test_matmul_progress_bar_on_stderr_when_asked(tmp_path, backend):
    args = ["matmul", *FAST, "--backend", backend, "--out", str(tmp_path / "r.json")]
    quiet = run_cli(args, cwd=tmp_path)
    shown = run_cli([*args, "--progress"], cwd=tmp_path)
    assert quiet.returncode == 0 and shown.returncode == 0, shown.stderr
    assert _steps(quiet.stderr) == []  # stderr is a pipe here: no bar by default
    steps = _steps(shown.stderr)
    assert steps, shown.stderr
    # the bar counts 5 GEMMs and 5 reduces; the last state it drew is the last reduce
    assert steps[-1] == "reduce 5/5"
    assert "10/10" in shown.stderr
    assert _steps(shown.stdout) == [] and "all checks passed" in shown.stdout


def test_matmul_no_progress_wins(tmp_path):
    run = run_cli(["matmul", *FAST, "--backend", "host", "--no-progress", "--out", str(tmp_path / "r.json")],
                  cwd=tmp_path)
    assert run.returncode == 0 and _steps(run.stderr) == []


def test_matmul_progress_without_reduce_counts_the_gemms(tmp_path):
    run = run_cli(["matmul", *FAST, "--backend", "host", "--reduce", "none", "--progress",
                   "--out", str(tmp_path / "r.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    steps = _steps(run.stderr)
    assert steps and steps[-1] == "GEMM timed 5/5" and not any(s.startswith("reduce") for s in steps)


def test_json_stdout_has_no_progress(tmp_path):
    run = run_cli(["matmul", *FAST, "--backend", "host", "--progress", "--json"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.json()["verified"] is True and _steps(run.stderr) == []


@needs_mpi
def test_matmul_progress_under_mpiexec_when_asked(tmp_path):
    # a rank's stderr is a pipe under mpiexec: --progress draws the bar anyway (rank 0's), the table stays alone
    run = run_cli(["matmul", *FAST, "--backend", "0=host,1=sim:mi300x", "--progress",
                   "--out", str(tmp_path / "r.json")], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert _steps(run.stderr)[-1] == "reduce 5/5"
    assert run.stdout.count("hetbench matmul") == 1 and _steps(run.stdout) == []


# --- host fp16 -----------------------------------------------------------------------------------------------

def _notes(run) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("Note:")]


def test_host_fp16_warns_once_before_running(tmp_path):
    run = run_cli(["matmul", "--size", "48", "--dtype", "fp16", "--backend", "host", "--repeat", "2",
                   "--out", str(tmp_path / "r.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    notes = _notes(run)
    assert len(notes) == 1, run.stderr
    assert "rank 0" in notes[0] and "fp16" in notes[0] and "no BLAS" in notes[0] and "fp32" in notes[0]
    assert "4 GEMMs" in notes[0]  # 2 warm-up + 2 timed
    assert "Note:" not in run.stdout


@pytest.mark.parametrize("args", [["--dtype", "fp32", "--backend", "host"],
                                  ["--dtype", "fp16", "--backend", "sim:h100"]])
def test_no_fp16_notice_where_there_is_blas_or_a_model(tmp_path, args):
    run = run_cli(["matmul", "--size", "48", *args, "--repeat", "1", "--out", str(tmp_path / "r.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert _notes(run) == []


class _World:
    def __init__(self, size: int) -> None:
        self.size = size

    def gather(self, obj):
        return [obj] * self.size


def _info(backend: str):
    return type("Info", (), {"backend": backend})()


@pytest.mark.parametrize("size, estimate", [(2048, "~3 min"), (1024, "~26 s"), (48, "under 1 s")])
def test_host_fp16_notice_estimates_the_time_before_spending_it(capsys, size, estimate):
    from hetbench.benchmarks.matmul.config import MatmulConfig
    from hetbench.config import parse_dtype
    from hetbench.benchmarks.matmul.run import slow_host_fp16_notices

    cfg = MatmulConfig(m=size, n=size, k=size, dtype=parse_dtype("fp16"), backends=(), warmup=2, repeat=10)
    notices = slow_host_fp16_notices(cfg, _World(1), _info("host"), [(size, size, size)])
    # 2 * 2048^3 flop x 12 runs at about 1 GFLOP/s (NumPy's fp16 on one core: 0.7 GFLOP/s measured here)
    assert len(notices) == 1 and f"12 GEMMs may take {estimate}" in notices[0]
    assert slow_host_fp16_notices(cfg, _World(2), _info("sim"), [(size, size, size)]) == []


def test_host_fp16_notice_counts_every_size_of_a_sweep():
    from hetbench.benchmarks.matmul.config import MatmulConfig
    from hetbench.config import parse_dtype
    from hetbench.benchmarks.matmul.run import slow_host_fp16_notices

    cfg = MatmulConfig(m=1024, n=1024, k=1024, dtype=parse_dtype("fp16"), backends=(), warmup=2, repeat=10,
                       sizes=(512, 1024))
    notices = slow_host_fp16_notices(cfg, _World(1), _info("host"), [(512,) * 3, (1024,) * 3])
    # (2 * 512^3 + 2 * 1024^3) flop x 12 runs at 1 GFLOP/s: 29 s
    assert len(notices) == 1 and "24 GEMMs may take ~29 s" in notices[0], notices


@needs_mpi
def test_host_fp16_notice_names_the_host_ranks_once(tmp_path):
    run = run_cli(["matmul", "--size", "48", "--dtype", "fp16", "--backend", "0=sim:h100,1=host,2=host",
                   "--repeat", "1", "--out", str(tmp_path / "r.json")], nprocs=3, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    notes = _notes(run)
    assert len(notes) == 1, run.stderr
    assert notes[0].startswith("Note: ranks 1,2 compute fp16 on the host")

