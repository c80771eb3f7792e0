"""The tables a user reads: the default ones fit 100 columns without cutting a number or a name, `--wide` shows
every column, and nothing but plain text reaches a file, a pipe or a launcher's pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import time

import pytest
from helpers import REPO, needs_mpi, run_cli
from rich.console import Console

from hetbench.report import console as report
from hetbench.report.console import matmul_table, print_table, short_device_name

XEON = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"
RANKS = [  # backend as the row names it, device name as the backend reports it, device timing
    ("host:0 (auto)", XEON, "measured"),
    ("opencl:0 (auto)", "pthread-" + XEON, "measured"),
    ("sim:mi250x", "AMD Instinct MI250X GCD (simulated)", "modelled"),
]
ANSI = re.compile(r"\x1b\[")


def _matmul_row(rank: int, backend: str, device: str, timing: str) -> dict:
    """A row as harness.matmul.run_rank makes it, with figures of awkward lengths."""
    return {
        "rank": rank, "host": "ip-172-31-20-15.ec2.internal", "backend": backend, "vendor": "Intel",
        "device": device, "device_timing": timing, "dtype": "fp32", "m": 4096, "n": 4096, "k": 4096,
        "gemm_flops": 2 * 4096**3, "gemm_seconds_median": 0.000123456, "gemm_seconds_cv": 0.0123,
        "gemm_tflops": 0.00864321 * (rank + 1), "peak_tflops": 47.9 if timing == "modelled" else None,
        "peak_percent": 98.7654 if timing == "modelled" else None, "h2d_gbps": 12.3456, "d2h_gbps": 0.98765,
        "reduce_seconds_median": 0.00456789, "reduce_algbw_gbps": 1.23456, "verified": True,
    }


def _render(table, width: int = 100, wide: bool = False) -> str:
    out = Console(width=width, record=True, file=open(os.devnull, "w"))
    print_table(out, table, wide=wide)
    text = out.export_text()
    _assert_whole(text)
    return text


def _assert_whole(text: str) -> None:
    """Every line of every table ends in its right border: rich crops a table wider than the console."""
    for line in text.splitlines():
        if line[:1] in "┏┃┡│└":
            assert line.rstrip()[-1] in "┓┃┩│┘", f"cropped: {line!r}"


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_compact_matmul_table_fits_100_columns_without_cutting(ranks):
    rows = [_matmul_row(r, *RANKS[r]) for r in range(ranks)]
    text = _render(matmul_table(rows, {"reduce": "sum"}))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    assert "…" not in text, text
    # every figure whole: GEMM ms, TFLOP/s, % of peak (modelled ones marked ~), reduce ms (always measured)
    for r, row in enumerate(rows):
        line = next(line for line in lines if re.match(rf"│\s+{r} │", line))
        mark = "~" if row["device_timing"] == "modelled" else ""
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[-5:] == [f"{mark}0.123", f"{mark}{row['gemm_tflops']:.3g}", "~98.8" if mark else "-", "4.57",
                              "ok"], line
    assert "Intel Xeon Platinum 8375C" in text and XEON not in text  # a short name; the JSON keeps the full one
    for header in ("Rank", "Backend", "Device", "GEMM", "TFLOP/s", "peak", "Reduce", "Check"):
        assert header in text
    for wide_only in ("H2D", "D2H", "CV", "Timing", "ip-172"):
        assert wide_only not in text
    assert "4096x4096x4096 fp32" in lines[0]  # one shape and dtype: said once, in the title


def test_compact_matmul_table_has_a_host_column_for_ranks_on_several_hosts():
    rows = [_matmul_row(r, *RANKS[r]) for r in range(3)]
    rows[1]["host"] = "ip-172-31-20-16.ec2.internal"
    text = _render(matmul_table(rows, {"reduce": "sum"}))
    assert max(len(line) for line in text.splitlines()) <= 100 and "…" not in text, text
    assert "Host" in text and "ip-172-31-20-15 " in text and "ip-172-31-20-16 " in text
    assert "4096x4096x4096 fp32" in text.splitlines()[0]


def test_compact_matmul_table_shows_k_where_ranks_differ_in_it():
    rows = [_matmul_row(r, *RANKS[r]) for r in range(3)]
    rows[1]["k"] = 1024  # --a/--b files: k may differ per rank, C_r's shape may not (the sum needs one)
    text = _render(matmul_table(rows, {"reduce": "sum"}))
    assert max(len(line) for line in text.splitlines()) <= 100 and "…" not in text, text
    assert "hetbench matmul: fp32, 3 ranks" in text
    assert [line.split("│")[4].strip() for line in text.splitlines() if re.match(r"│\s+\d │", line)] == \
        ["4096", "1024", "4096"]
    rows[2]["m"] = 512  # --reduce none: every rank's shape may differ
    text = _render(matmul_table(rows, {"reduce": "none"}))
    assert "512x4096x4096" in text and "4096x4096x1024" in text and "…" not in text


def test_wide_matmul_table_shows_every_column_even_on_a_narrow_console():
    rows = [_matmul_row(r, *RANKS[r]) for r in range(3)]
    text = _render(matmul_table(rows, {"reduce": "sum"}, wide=True), width=80, wide=True)
    assert "…" not in text
    for header in ("Host", "Dtype", "m x n x k", "GEMM median (ms)", "GEMM CV (%)", "TFLOP/s", "% of peak",
                   "H2D (GB/s)", "D2H (GB/s)", "Reduce median (ms)", "Reduce (GB/s)", "Timing", "Check"):
        assert header in text
    assert XEON in text and "ip-172-31-20-15.ec2.internal" in text


@pytest.mark.parametrize(
    "name, short",
    [
        (XEON, "Intel Xeon Platinum 8375C"),
        ("pthread-" + XEON, "Intel Xeon Platinum 8375C"),
        ("pthread-skylake-avx512-AMD EPYC", "AMD EPYC"),  # PoCL: driver and LLVM CPU name first
        ("AMD EPYC 7R13 48-Core Processor", "AMD EPYC 7R13"),
        ("NVIDIA H100 SXM5 80GB (simulated)", "NVIDIA H100 SXM5 80GB"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
        ("gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack-"),
        ("Intel(R) Data Center GPU Max 1550", "Intel Data Center GPU Max 1550"),
    ],
)
def test_short_device_name(name, short):
    assert short_device_name(name) == short


def test_short_device_name_cuts_only_what_no_table_can_hold():
    assert short_device_name("X" * 60) == "X" * 31 + "…"


def _collectives_rows(ranks: int, path: str, stragglers: list[int]) -> list[dict]:
    factor = 2 * (ranks - 1) / ranks
    rows = []
    for size in (4, 4096, 16777216, 1073741824):
        rows.append({
            "op": "allreduce", "path": path, "size_bytes": size, "count_elements": size // 4, "dtype": "fp32",
            "redop": "sum", "root": None, "ranks": ranks, "op_us_median": 123456.789, "algbw_gbps": 0.0123456,
            "busbw_factor": factor, "busbw_gbps": 0.0123456 * factor, "wrong": 0, "d2h_us_median": 12345.6789,
            "h2d_us_median": 12345.6789, "end_to_end_us_median": 123456.789, "end_to_end_algbw_gbps": 0.0123456,
            "copy_timing": "modelled" if path == "host" else "none", "stragglers": stragglers,
        })
    return rows


def _collectives_text(monkeypatch, rows: list[dict], wide: bool = False, width: int = 100) -> str:
    recording = Console(width=width, record=True, file=open(os.devnull, "w"))
    monkeypatch.setattr(report, "console", lambda *a, **k: recording)
    summary = {"avg_busbw_gbps": {"allreduce/host": 1.0}, "checked": True, "wrong_total": 0}
    ranks = [{"rank": r, "backend": "host", "device_info": {"name": XEON}, "device_timing": "measured"}
             for r in range(rows[0]["ranks"])]
    report.collectives_report(rows, summary, ranks, wide=wide)
    text = recording.export_text()
    _assert_whole(text)
    return text


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("path", ["host", "device"])
def test_compact_collectives_table_fits_100_columns(monkeypatch, ranks, path):
    text = _collectives_text(monkeypatch, _collectives_rows(ranks, path, [0, 2]))
    table = [line for line in text.splitlines() if not line.startswith("ranks:")]
    assert max(len(line) for line in table) <= 100, text
    assert "…" not in text
    assert "1073741824" in text and "268435456" in text and "123457" in text
    assert "ranks 0,2" in text
    assert "fp32, redop sum" in text  # what every row shares is in the title
    if path == "host":
        assert "end-to-end" in text and "d2h" not in text  # the copies are --wide columns


def test_wide_collectives_table_has_every_column(monkeypatch):
    text = _collectives_text(monkeypatch, _collectives_rows(3, "host", [1]), wide=True, width=80)
    assert "…" not in text
    for header in ("size (B)", "count (elements)", "type", "redop", "root", "time (us)", "algbw (GB/s)",
                   "busbw (GB/s)", "#wrong", "d2h (us)", "h2d (us)", "end-to-end (us)", "end-to-end algbw (GB/s)",
                   "straggler"):
        assert header in text


def test_single_rank_collectives_say_why_busbw_is_zero(tmp_path):
    run = run_cli(["collectives", "--op", "allreduce,bcast", "--max-bytes", "64", "--backend", "host",
                   "--warmup", "0", "--iters", "1", "--out", str(tmp_path / "r.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    allreduce, bcast = run.stdout.split("bcast  (path")
    assert "busbw is 0: with 1 rank no data crosses a link" in allreduce
    assert "busbw is 0" not in bcast  # bcast's factor is 1: its busbw is its algbw, even alone


@needs_mpi
def test_two_rank_collectives_do_not_explain_a_zero_busbw(tmp_path):
    run = run_cli(["collectives", "--op", "allreduce", "--max-bytes", "64", "--backend", "host",
                   "--warmup", "0", "--iters", "1", "--out", str(tmp_path / "r.json")], nprocs=2, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "busbw is 0" not in run.stdout and "2 ranks" in run.stdout


# --- what reaches a file, a pipe, a launcher's pseudo-terminal or a real terminal --------------------------------

MATMUL = ["-m", "hetbench", "matmul", "--size", "64", "--backend", "sim:h100", "--repeat", "1", "--warmup", "0"]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE",
                                                            "NO_COLOR")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _run_on_pty(args: list[str], cwd, columns: int | None, env: dict, timeout: float = 60) -> str:
    """Run with stdout on a pseudo-terminal: of `columns` x 40 like a user's, or of 0 x 0 (None) like each rank's
    under Open MPI's mpirun (measured: isatty() is true and the size 0 x 0 even when mpirun writes to a file)."""
    master, slave = os.openpty()
    if columns is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    assert os.get_terminal_size(slave).columns == (columns or 0)
    proc = subprocess.Popen([sys.executable, *args], stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            cwd=cwd, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_pipe_gets_plain_text_at_log_width_even_with_columns_0(tmp_path):
    run = run_cli([*MATMUL[2:], "--wide", "--out", str(tmp_path / "r.json")], cwd=tmp_path,
                  env={"COLUMNS": "0", "TERM": "xterm-256color"})
    assert run.returncode == 0, run.stderr
    assert not ANSI.search(run.stdout) and not ANSI.search(run.stderr)
    assert "…" not in run.stdout and "GEMM median (ms)" in run.stdout and "Reduce (GB/s)" in run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) > 100  # the wide table on one line per row


def test_open_mpi_pseudo_terminal_of_width_0_gets_plain_unsquashed_text(tmp_path):
    text = _run_on_pty([*MATMUL, "--wide", "--out", str(tmp_path / "r.json")], tmp_path, None,
                       _env(TERM="xterm-256color"))
    assert not ANSI.search(text), repr(text[:300])
    assert "…" not in text and "GEMM median (ms)" in text
    row = next(line for line in text.splitlines() if line.startswith("│    0 │"))
    assert "sim:h100" in row and "modelled" in row and "ok" in row  # one line: not squashed to 80 columns


def test_open_mpi_pseudo_terminal_takes_a_sane_columns(tmp_path):
    text = _run_on_pty([*MATMUL, "--out", str(tmp_path / "r.json")], tmp_path, None,
                       _env(TERM="xterm", COLUMNS="90"))
    assert not ANSI.search(text)
    assert max(len(line) for line in text.splitlines()) <= 90 and "…" not in text


@pytest.mark.parametrize("columns_env", [None, "0", "99999"])
def test_a_real_terminal_keeps_colour_and_its_own_width(tmp_path, columns_env):
    env = _env(TERM="xterm-256color", **({"COLUMNS": columns_env} if columns_env else {}))
    text = _run_on_pty([*MATMUL, "--out", str(tmp_path / "r.json")], tmp_path, 100, env)
    assert ANSI.search(text)  # colour on a terminal, as before
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "…" not in plain and "sim:h100" in plain
    assert max(len(line) for line in plain.splitlines()) <= 100  # a COLUMNS of 0 or 99999 is not believed


def test_no_color_is_honoured_on_a_terminal(tmp_path):
    text = _run_on_pty([*MATMUL, "--out", str(tmp_path / "r.json")], tmp_path, 100,
                       _env(TERM="xterm-256color", NO_COLOR="1"))
    assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", text)  # no foreground colours


@needs_mpi
def test_mpiexec_rank_output_is_plain(tmp_path):
    # under mpiexec a rank's stdout is a pipe: no escape codes reach the file the user redirects to
    run = run_cli([*MATMUL[2:], "--out", str(tmp_path / "r.json")], nprocs=2, cwd=tmp_path,
                  env={"TERM": "xterm-256color"})
    assert run.returncode == 0, run.stderr
    assert not ANSI.search(run.stdout) and "…" not in run.stdout
