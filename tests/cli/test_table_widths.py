"""Issue 19 (part): no table cuts a key or a number at any width. Every table kind (each benchmark's, split --plan,
report's table of runs, compare's table with its verdict) is rendered at COLUMNS=60..160 from real results
documents, and every key (rank, --backend spec, split, size, run id, rank map) and every figure must appear whole on
one line, or its column be named under the table as not shown; nothing ends in "…". Before, report's summary
tables were one character wide at 80 columns, split --plan lost its device column without a word, and compare's
verdict read "not significa…". Also: the width a rank prints at under mpiexec (COLUMNS, else the terminal
mpiexec writes to, found through /proc, else the log width)."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from helpers import MPIEXEC, REPO, needs_mpi, opencl_devices, require_mpi_mark

import hetbench.report.console as console_module
from hetbench.backends import sim
from hetbench.backends.base import spec_of
from hetbench.benchmarks.base import columns_of
from hetbench.report.compare import compare_documents
from hetbench.report.console import cell, launching_terminal_columns, render_document
from hetbench.report.figures import for_benchmark
from hetbench.results import load_results
from hetbench.results.runs import Run

WIDTHS = [60, 80, 100, 120, 160]

# each benchmark run small in one process (a simulated GPU: fast, and its figures are modelled, so marked "~");
# split --plan for three simulated devices
JOBS = {
    "matmul": ["matmul", "--size", "64", "--repeat", "2", "--warmup", "0", "--backend", "sim:mi300x"],
    "collectives": ["collectives", "--op", "allreduce,allgather", "--max-bytes", "256", "--iters", "2", "--warmup",
                    "0", "--backend", "sim:h100"],
    "calibrate": ["calibrate", "--size", "64", "--min-seconds", "0.001", "--backend", "sim:mi300x"],
    "split": ["split", "--size", "64", "--repeat", "2", "--warmup", "0", "--backend", "sim:mi300x"],
    "train": ["train", "--steps", "4", "--layers", "2", "--hidden", "8", "--batch", "8", "--backend", "sim:h100"],
    "plan": ["split", "--plan", "--size", "4096", "--backend", "0=sim:h100,1=sim:mi300x,2=sim:a10g"],
}
if opencl_devices():  # hetbench tune needs a real OpenCL device (PoCL here): its small class, a short search
    JOBS["tune"] = ["tune", "--backend", "opencl", "--shape-class", "small", "--budget", "3"]
# the commands' entry point through a pipe (as a rank's output under mpiexec) with COLUMNS set, after the runs:
# split --plan at 80 columns, report at 100, compare at 80
COMMANDS = {"plan at 80": ("80", JOBS["plan"] + ["--out", "plan-80.json"]),
            "report at 100": ("100", ["report", "plan-80.json", "train.json"]),
            "compare at 80": ("80", ["compare", "train.json", "train.json"]),
            "devices at 80": ("80", ["devices", "--sim"]), "devices at 100": ("100", ["devices", "--sim"])}
RUNNER = """
import os, sys
from hetbench.cli import main
for label, columns, args in {jobs!r}:
    os.environ["COLUMNS"] = columns
    print("=== " + label, flush=True)
    try:
        main(args)
    except SystemExit as e:
        if e.code:
            sys.exit(f"{{args}}: exit {{e.code}}")
"""
# ranks added to the one-process runs' rows: other backends, long device and host names
MORE_RANKS = [("sim:h100", "NVIDIA H100 SXM5 80GB (simulated)", "gpu-node-with-a-long-name.example.org"),
              ("opencl:1", "pthread-haswell-AMD EPYC 7R13 48-Core Processor", "ip-172-31-20-15.ec2.internal")]


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results files of JOBS, and the output of COMMANDS (<label>.txt), all run in one process (a few
    seconds)."""
    folder = tmp_path_factory.mktemp("widths")
    jobs = [(name, "200", [*args, "--out", f"{name}.json"]) for name, args in JOBS.items()]
    jobs += [(label, columns, args) for label, (columns, args) in COMMANDS.items()]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(jobs=jobs)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=folder, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    for part in proc.stdout.split("=== ")[1:]:
        label, output = part.split("\n", 1)
        (folder / f"{label}.txt").write_text(output)
    return folder


@pytest.fixture(scope="module")
def documents(runs_folder: Path) -> dict[str, dict]:
    """The results documents of JOBS, with two more ranks added to each per-rank table."""
    docs = {name: load_results(runs_folder / f"{name}.json") for name in JOBS}
    for name in ("matmul", "calibrate", "split", "train"):  # rows per rank: two more ranks beside the one run
        rows = docs[name]["rows"]
        for rank, (backend, device, host) in enumerate(MORE_RANKS, start=1):
            for row in [r for r in rows if r["rank"] == 0]:
                rows.append({**copy.deepcopy(row), "rank": rank, "backend": backend, "device": device, "host": host})
    return docs


def _render(monkeypatch, capsys, width: int, draw) -> tuple[str, list]:
    """What `draw` prints at COLUMNS=width (stdout a pipe, as under mpiexec), and the tables it printed."""
    monkeypatch.setenv("COLUMNS", str(width))
    tables = []
    original = console_module.print_table

    def recording(out, table, wide=False):
        tables.append(table)
        original(out, table, wide)

    monkeypatch.setattr(console_module, "print_table", recording)
    capsys.readouterr()
    draw()
    return capsys.readouterr().out, tables


def _segments(text: str) -> set[str]:
    """Every cell line of every table: the text between two borders, stripped."""
    cells = set()
    for line in text.splitlines():
        if line[:1] in "│┃":
            cells.update(part.strip() for part in re.split(r"[│┃]", line)[1:-1])
    return cells


def _not_shown(text: str) -> str:
    """The names of the columns said not to be shown, on one line."""
    notes = [part for part in text.split("not shown at this width:")[1:]]
    return " ".join(" ".join(note.split(")\n")[0].split()) for note in notes)


def _assert_whole(text: str, width: int, expected: dict[str, list[str]]) -> None:
    """No "…"; every line within the width (from 80 columns: below, a table that cannot fit even with its least
    needed columns dropped is printed whole, wider); each expected key or figure (header -> cells) whole on one line
    of a table, or its header named as not shown."""
    assert "…" not in text, text
    if width >= 80:
        assert max(len(line) for line in text.splitlines()) <= width, text
    cells, dropped = _segments(text), _not_shown(text)
    for header, values in expected.items():
        if " ".join(header.split()) in dropped:
            continue
        for value in values:
            for line in value.splitlines():
                assert line in cells, (width, header, line, text)


def _rank_table_cells(benchmark: str, rows: list[dict], skip: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Each compact column's cells (keys and figures; the names that may wrap left out), by header."""
    expected = {}
    for column in columns_of(benchmark):
        if not column.shown(False) or column.key in ("device", "host", "stragglers", "winner", "verified") + skip:
            continue
        values = [re.sub(r"\[/?[a-z ]*\]", "", cell(column, r, False)) for r in rows]
        expected[column.header(False).replace("\n", " ")] = values
    return expected


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(JOBS))
def test_each_benchmarks_tables_keep_every_key_and_number_whole(documents, monkeypatch, capsys, name, width):
    document = documents[name]
    text, tables = _render(monkeypatch, capsys, width, lambda: render_document(document))
    assert tables, "nothing printed through print_table"
    benchmark = "split" if name == "plan" else name
    rows = document["rows"]
    skip = ("comm_seconds_median",) if name == "plan" else ()
    if benchmark == "collectives":  # one table per op and path: size, count and the figures of each
        expected = _rank_table_cells("collectives", rows)
    else:
        expected = _rank_table_cells(benchmark, rows, skip)
    if name == "matmul":  # one shape and dtype: said in the title
        expected.pop("k", None)
    _assert_whole(text, width, expected)
    # the keys never go: every rank's backend spec and the ranks themselves are in every per-rank table
    if benchmark != "collectives":
        cells = _segments(text)
        for r in rows:
            assert str(r["backend"]).removesuffix(" (auto)") in cells and str(r["rank"]) in cells, (width, text)
    if width <= 80 and benchmark in ("split", "train", "calibrate"):
        assert "Device" in _not_shown(text) or "Device" in text  # dropped, it is said so (split --plan lost it)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_runs_table_of_report_keeps_ids_rank_maps_and_figures_whole(documents, monkeypatch, capsys, width,
                                                                        tmp_path):
    from hetbench.report.tables import runs_table

    runs = []
    for name, document in documents.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        runs.append(Run(path, document))
    by_benchmark: dict[str, list[Run]] = {}
    for run in runs:
        by_benchmark.setdefault(run.benchmark, []).append(run)

    def draw():
        out = console_module.console()
        for benchmark, group in by_benchmark.items():
            console_module.print_table(out, runs_table(benchmark, group))

    text, _ = _render(monkeypatch, capsys, width, draw)
    expected: dict[str, list[str]] = {"Run": [run.run_id for run in runs],
                                      "Rank map": [run.rank_map.replace(",", "\n") for run in runs]}
    for run in runs:
        for figure in for_benchmark(run.benchmark).run_figures(run.document):
            if figure.table and not isinstance(figure.value, str):
                expected.setdefault(figure.title, []).append(figure.text)
    _assert_whole(text, width, expected)
    assert all(run.run_id in _segments(text) for run in runs)  # the id never goes
    for run in runs:  # nor the checks, where a benchmark has them
        for checks in [f.text for f in for_benchmark(run.benchmark).run_figures(run.document) if f.title == "checks"]:
            assert checks in _segments(text), (width, checks, text)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["matmul", "split", "train"])
def test_compare_keeps_figures_and_verdicts_whole(documents, monkeypatch, capsys, width, name):
    from hetbench.report.tables import compare_table

    document = documents[name]
    comparison = compare_documents(for_benchmark(name), document, copy.deepcopy(document),
                                   "results/a-rather-long-folder-name/base.json", "results/new.json")

    def draw():
        console_module.print_table(console_module.console(), compare_table(comparison))

    text, _ = _render(monkeypatch, capsys, width, draw)
    expected: dict[str, list[str]] = {"Base": [], "New": [], "Change (%)": [], "p": []}
    table = compare_table(comparison)
    for column in table.columns:
        if str(column.header) in expected:
            expected[str(column.header)] = [str(c) for c in column.cells]
    _assert_whole(text, width, expected)
    cells = _segments(text)
    for change in comparison.changes:  # the verdict whole, or wrapped between its words: each word whole
        assert change.verdict in cells or all(any(word in c.split() for c in cells)
                                              for word in change.verdict.split()), (width, change.verdict, text)


def test_the_commands_through_a_pipe_with_columns_set(runs_folder):
    """The commands' entry point writing to a pipe (as a rank's output under mpiexec) with COLUMNS set."""
    plan = (runs_folder / "plan at 80.txt").read_text()
    _assert_whole(plan, 80, {"Backend": ["sim:h100", "sim:mi300x", "sim:a10g"], "Part": ["1066", "2531", "499"]})
    assert "Device" in _not_shown(plan)  # it went, and it is said so
    report = (runs_folder / "report at 100.txt").read_text()
    _assert_whole(report, 100, {"Run": [load_results(runs_folder / f)["metadata"]["run_id"]
                                        for f in ("plan-80.json", "train.json")]})
    compare = (runs_folder / "compare at 80.txt").read_text()
    _assert_whole(compare, 80, {})
    assert "not significant" in _segments(compare), compare  # was "not significa…"
    specs = ["host:0"] + [spec_of(info) for info in sim.list_devices()]
    for width in (80, 100):  # devices: every --backend value whole (80 showed "sim…", 100 "sim:a1…")
        devices = (runs_folder / f"devices at {width}.txt").read_text()
        _assert_whole(devices, width, {"Backend": specs})


# --- the width under an MPI launcher ------------------------------------------------------------------------------


def _fake_proc(root: Path, chain: list[tuple[int, str, str]]) -> None:
    """A /proc of processes (pid, comm, what fd 1 points to), each the parent of the one before it."""
    for (pid, comm, fd1), parent in zip(chain, [p for p, _, _ in chain[1:]] + [1]):
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {parent} 0 0\n")
        os.symlink(fd1, root / str(pid) / "fd" / "1")


@pytest.fixture
def terminal():
    """A pseudo-terminal 93 columns wide: the launching user's."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 93, 0, 0))
    yield os.ttyname(slave)
    os.close(slave)
    os.close(master)


def test_the_launching_terminal_is_found_through_the_launchers_processes(tmp_path, terminal):
    # MPICH's hydra: rank -> hydra_pmi_proxy (pipe) -> mpiexec (the user's terminal)
    _fake_proc(tmp_path, [(10, "python", "pipe:[5]"), (9, "hydra_pmi_proxy", "pipe:[4]"), (8, "mpiexec", terminal),
                          (7, "bash", terminal)])
    assert launching_terminal_columns(1, tmp_path, 10) == 93


def test_a_launcher_writing_to_a_file_keeps_the_log_width(tmp_path, terminal):
    log = tmp_path / "log.txt"
    log.write_text("")
    _fake_proc(tmp_path, [(10, "python", "pipe:[5]"), (9, "hydra_pmi_proxy", "pipe:[4]"), (8, "mpiexec", str(log)),
                          (7, "bash", terminal)])
    assert launching_terminal_columns(1, tmp_path, 10) is None


def test_the_walk_stops_at_a_process_that_is_not_the_launchers(tmp_path, terminal):
    # `mpiexec ... | less`: mpiexec writes to a pipe; the shell's terminal is not where the tables go
    _fake_proc(tmp_path, [(10, "python", "pipe:[5]"), (9, "hydra_pmi_proxy", "pipe:[4]"), (8, "mpiexec", "pipe:[3]"),
                          (7, "bash", terminal)])
    assert launching_terminal_columns(1, tmp_path, 10) is None
    # a process that no launcher started
    _fake_proc(tmp_path / "b", [(10, "python", "pipe:[5]"), (9, "bash", terminal)])
    assert launching_terminal_columns(1, tmp_path / "b", 10) is None


def test_open_mpi_size_less_pseudo_terminal_leads_to_mpiruns_terminal(tmp_path, terminal):
    master, slave = os.openpty()  # the rank's: no size
    try:
        _fake_proc(tmp_path, [(10, "python", os.ttyname(slave)), (9, "mpirun.openmpi", terminal),
                              (8, "bash", terminal)])
        assert launching_terminal_columns(1, tmp_path, 10) == 93
    finally:
        os.close(slave)
        os.close(master)


def _run_in_terminal(cmd: list[str], cwd: Path, columns: int, env: dict, timeout: float = 90) -> str:
    """`cmd` as a user's shell runs it on a terminal of `columns` (its session's controlling terminal)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))

    def session():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, preexec_fn=session)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    proc.wait(timeout=10)
    return b"".join(chunks).decode().replace("\r\n", "\n")


@needs_mpi
def test_mpiexec_on_a_terminal_prints_at_its_terminals_width(tmp_path):
    require_mpi_mark()
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    args = [MPIEXEC, "-n", "2", sys.executable, "-m", "hetbench", *JOBS["plan"], "--out", "plan.json"]
    # Open MPI sizes each rank's pseudo-terminal as mpirun's terminal (colour then, as on any terminal)
    text = re.sub(r"\x1b\[[0-9;]*m", "", _run_in_terminal(args, tmp_path, 93, env))
    assert "Split" in text and "…" not in text, text
    assert max(len(line) for line in text.splitlines()) == 93, text  # was 102: the fixed log width's table
    # mpiexec writing to a file keeps the log width: test_a_launcher_writing_to_a_file_keeps_the_log_width
