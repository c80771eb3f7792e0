"""Issue 19, round two of hardening: values parsed strictly (finite numbers in ASCII digits, ASCII rank numbers,
paths ending in / are folders), every file hetbench reads checked to be a regular file of bounded size before it is
opened (a FIFO blocked report, compare and train --resume for ever), and --help that says what the options do.
Each bad input: exit 2, one line naming the value as typed and what is accepted, nothing written."""

from __future__ import annotations

import json
import os

import pytest
from helpers import REPO, Batches, assert_usage_error, needs_mpi, run_cli

DATA = REPO / "tests" / "data"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "١٫٥", "0x10", ""])
def test_fail_on_slowdown_takes_a_finite_number_only(tmp_path, value):
    run = run_cli(["compare", str(DATA / "matmul-v1.json"), str(DATA / "matmul-v1.json"), "--fail-on-slowdown",
                   value], cwd=tmp_path)
    assert_usage_error(run, tmp_path, "--fail-on-slowdown", repr(value), "accepted: a number, x>=0")


@pytest.mark.parametrize("args, option", [
    (["train", "--lr", "nan"], "--lr"),
    (["train", "--lr", "1e999"], "--lr"),
    (["split", "--plan", "--backend", "sim:h100", "--link-gbps", "inf"], "--link-gbps"),
    (["split", "--plan", "--backend", "sim:h100", "--link-gbps", "10", "--link-latency-us", "nan"],
     "--link-latency-us"),
])
def test_rates_and_rates_of_learning_are_finite(tmp_path, args, option):
    run = run_cli(args, cwd=tmp_path)
    assert_usage_error(run, tmp_path, option, "finite number")


ASCII = [("0=host,١=host", "'١=host'"), ("host:²", "'²'"), ("0=host,１=host", "'１=host'")]
FRONTENDS = ["numpy", "torch"]


def _launched(nprocs, root):
    """This file's commands under mpiexec, one launch per rank count (helpers.Batches): every one is bad input,
    refused alike on every rank, and the job goes on to the next."""
    commands = [(f"ascii-{i}", ["matmul", "--size", "16", "--backend", backend], {})
                for i, (backend, _) in enumerate(ASCII)]
    if nprocs == 2:
        commands += [(f"too-big-{frontend}", ["train", "--frontend", frontend, "--hidden", "65536", "--layers", "100",
                                              "--steps", "2"], {}) for frontend in FRONTENDS]
        (root / "results-a-file").mkdir()
        (root / "results-a-file" / "results").write_text("x")
        commands.append(("results-a-file", ["matmul", "--size", "16", "--backend", "host"], {}))
    return commands


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return Batches(tmp_path_factory.mktemp("strict-launched"), _launched, timeout=240)


def _run(launched, name, nprocs, args, tmp_path, timeout=120):
    """(the command's Run, the folder it ran in): alone in TMP_PATH, or NAME in its rank count's launch."""
    if nprocs is None:
        return run_cli(args, cwd=tmp_path, timeout=timeout), tmp_path
    return launched.get(nprocs)[name]


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi), pytest.param(3, marks=needs_mpi)])
@pytest.mark.parametrize("case", range(len(ASCII)), ids=[b for b, _ in ASCII])
def test_rank_numbers_and_indices_in_ascii_digits_only(tmp_path, launched, nprocs, case):
    backend, needle = ASCII[case]
    run, folder = _run(launched, f"ascii-{case}", nprocs, ["matmul", "--size", "16", "--backend", backend], tmp_path)
    assert_usage_error(run, folder, "--backend", needle)


@pytest.mark.parametrize("args, option", [
    (["matmul", "--size", "16", "--out", "{d}/"], "--out"),
    (["matmul", "--size", "16", "--csv", "{d}/"], "--csv"),
    (["matmul", "--size", "16", "--save", "{d}/"], "--save"),
    (["train", "--steps", "2", "--log", "{d}/"], "--log"),
    (["report", str(DATA / "matmul-v1.json"), "--html", "{d}/"], "--html"),
    (["report", str(DATA / "matmul-v1.json"), "--csv", "{d}/"], "--csv"),
])
@pytest.mark.parametrize("exists", [False, True])
def test_an_output_path_ending_in_a_slash_is_a_folder_and_refused(tmp_path, args, option, exists):
    folder = tmp_path / "out"
    if exists:
        folder.mkdir()
    run = run_cli([a.replace("{d}", str(folder)) for a in args], cwd=tmp_path)
    assert_usage_error(run, tmp_path, option, f"'{folder}/'", "names a folder")
    assert folder.exists() == exists and (not exists or not any(folder.iterdir()))


def _fifo(path):
    os.mkfifo(path)
    return path


def test_report_and_compare_refuse_a_fifo_at_once(tmp_path):
    fifo = _fifo(tmp_path / "runs.json")
    for args in (["report", str(fifo)], ["compare", str(fifo), str(DATA / "matmul-v1.json")],
                 ["compare", str(DATA / "matmul-v1.json"), str(fifo)]):
        run = run_cli(args, cwd=tmp_path, timeout=30)  # blocked for ever before
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert len(run.error_lines) == 1 and "FIFO" in run.error_lines[0] and str(fifo) in run.error_lines[0]


def test_a_folder_of_results_with_a_fifo_in_it_does_not_block(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "m.json").write_text((DATA / "matmul-v1.json").read_text())
    _fifo(folder / "stuck.json")
    run = run_cli(["report", str(folder), "--brief"], cwd=tmp_path, timeout=30)  # never waited on
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "hetbench matmul: 1 run(s)" in run.stdout  # the FIFO is no results file of the folder


def test_a_resume_whose_pieces_are_not_files_is_refused(tmp_path):
    ck = tmp_path / "ck"
    run = run_cli(["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8", "--checkpoint",
                   str(ck), "--out", str(tmp_path / "first.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    step = ck / (ck / "latest").read_text().strip()
    piece = sorted(step.glob("rank-0.*.npy"))[0]
    piece.unlink()
    _fifo(piece)
    run = run_cli(["train", "--steps", "4", "--layers", "2", "--hidden", "8", "--batch", "8", "--resume", str(ck)],
                  cwd=tmp_path, timeout=30)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert len(run.error_lines) == 1 and piece.name in run.error_lines[0] and "FIFO" in run.error_lines[0]
    # a `latest` that is not UTF-8, and one that is a FIFO
    piece.unlink()
    (ck / "latest").write_bytes(b"\xff\xfe step")
    run = run_cli(["train", "--steps", "4", "--layers", "2", "--hidden", "8", "--batch", "8", "--resume", str(ck)],
                  cwd=tmp_path, timeout=30)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "not UTF-8" in run.stderr, run.stderr
    (ck / "latest").unlink()
    _fifo(ck / "latest")
    run = run_cli(["train", "--steps", "4", "--layers", "2", "--hidden", "8", "--batch", "8", "--resume", str(ck)],
                  cwd=tmp_path, timeout=30)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert len(run.error_lines) == 1 and "latest" in run.error_lines[0]


def test_help_says_what_the_options_do(tmp_path):
    env = {"COLUMNS": "80"}
    top = run_cli(["--help"], cwd=tmp_path, env=env).stdout
    commands = top[top.index("Commands:"):]
    assert "..." not in commands, commands  # click cut two command summaries short
    collectives = run_cli(["collectives", "--help"], cwd=tmp_path, env=env).stdout
    factor = " ".join(collectives[collectives.index("--factor"):].split("\n  --")[0].split())
    assert factor.endswith("[default: 2]"), factor  # was "[default: 2; x<=None]"
    matmul = " ".join(run_cli(["matmul", "--help"], cwd=tmp_path, env=env).stdout.split())
    assert "next to --out" not in matmul and "with --out alone, no CSV" in matmul


def test_the_documented_json_still_reads(tmp_path):
    """The checks read nothing differently: a results file and the committed v1 files load as before."""
    run = run_cli(["report", str(DATA / "matmul-v1.json"), str(DATA / "collectives-v1.json"), "--brief"],
                  cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((DATA / "matmul-v1.json").read_text())["schema"] == "hetbench.matmul"


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
@pytest.mark.parametrize("frontend", FRONTENDS)
def test_train_refuses_a_model_the_host_cannot_hold_before_allocating(tmp_path, launched, nprocs, frontend):
    """A MemoryError after allocating, before; now one line at once, every rank alike (torch or not: the check
    comes before the front end makes anything, so it holds where torch is missing too)."""
    run, folder = _run(launched, f"too-big-{frontend}", nprocs, ["train", "--frontend", frontend, "--hidden", "65536",
                                                                 "--layers", "100", "--steps", "2"], tmp_path,
                       timeout=60)
    if frontend == "torch" and "torch" in run.stderr and "needs up to" not in run.stderr:
        pytest.skip("torch is not installed here: the front end's own check speaks first")
    assert_usage_error(run, folder, "--hidden 65536", "needs up to", "bytes of host memory on rank",
                       "lower --batch, --hidden or --layers")


def _doctored(tmp_path, name, change):
    doc = json.loads((DATA / "matmul-v1.json").read_text())
    change(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


SHAPES = {  # each a MemoryError, KeyError, TypeError or OverflowError with exit 1 before
    "null_summary": (lambda d: d.update(summary=None), "'summary' must be an object, not null"),
    "summary_a_list": (lambda d: d.update(summary=[1]), "'summary' must be an object, not list"),
    "null_config": (lambda d: d.update(config=None), "'config' must be an object"),
    "rows_null": (lambda d: d.update(rows=None), "'rows' must be a list of objects"),
    "rows_of_text": (lambda d: d.update(rows=["a"]), "'rows' must be a list of objects"),
    "empty_rows": (lambda d: d.update(rows=[{}, {}]), "row 0 is empty"),
    "raw_text": (lambda d: d["rows"][0].update(raw={"gemm_seconds": "fast"}), "hold 'fast', not a number"),
    "raw_huge": (lambda d: d["rows"][0].update(raw={"gemm_seconds": [1e308] * 3}), "not a measured value"),
    "raw_nan": (lambda d: d["rows"][0].update(raw={"gemm_seconds": [float("nan")]}), "not a measured value"),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_results_document_of_the_wrong_shape_is_one_line(tmp_path, name):
    change, needle = SHAPES[name]
    path = _doctored(tmp_path, name, change)
    for args in (["report", str(path)], ["compare", str(path), str(DATA / "matmul-v1.json")]):
        run = run_cli(args, cwd=tmp_path)
        assert run.returncode == 2 and "Traceback" not in run.stderr and run.stdout == "", (args, run.stderr)
        assert len(run.error_lines) == 1 and needle in run.error_lines[0] and str(path) in run.error_lines[0]


def test_pathological_nesting_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"schema": "hetbench.matmul", "schema_version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    run = run_cli(["report", str(path)], cwd=tmp_path)
    assert run.returncode == 2 and "nested too deeply" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("change, needle", [
    (lambda d: d.update(rows=[{"rank": 0}]), "KeyError"),
    (lambda d: d.update(summary={}), "KeyError"),
])
def test_rows_or_a_summary_without_their_fields_are_refused_before_any_output(tmp_path, change, needle):
    path = _doctored(tmp_path, "lacking", change)
    run = run_cli(["report", str(DATA / "collectives-v1.json"), str(path)], cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr, run.stderr
    assert len(run.error_lines) == 1 and "not of the shape hetbench writes for matmul" in run.error_lines[0]
    assert needle in run.error_lines[0] and str(path) in run.error_lines[0]


@pytest.mark.parametrize("args, option", [
    (["matmul", "--size", "64", "--out", "{long}.json"], "--out"),
    (["matmul", "--size", "64", "--csv", "{long}.csv"], "--csv"),
    (["train", "--steps", "2", "--log", "{long}.jsonl"], "--log"),
    (["report", str(DATA / "matmul-v1.json"), "--html", "{long}.html"], "--html"),
])
def test_an_output_name_too_long_for_the_file_system_is_refused_before_computing(tmp_path, args, option):
    """Found only after computing, before: `File name too long` once the run was done."""
    long = "a" * 250  # 255 bytes is the limit here (ext4, tmpfs), and the staged copy beside it adds 14
    run = run_cli([a.replace("{long}", long) for a in args], cwd=tmp_path)
    assert_usage_error(run, tmp_path, option, "bytes, and the file system takes names of up to")


@pytest.mark.parametrize("args, shown", [
    (["train", "--lr", "1e-400"], "'1e-400' is not in the range x>0 (it is below the smallest number held, and reads "
                                  "as 0)"),
    (["train", "--lr", "-0.0"], "'-0.0' is not in the range x>0"),
    (["matmul", "--repeat", "1_000_000_0"], "'1_000_000_0' is not in the range 1<=x<=1000000"),
    (["matmul", "--size", "-0"], "'-0' is not in the range 1<=x<=2147483647"),
    (["matmul", "--warmup", "01000000"], "'01000000' is not in the range 0<=x<=100000"),
    (["split", "--plan", "--backend", "sim:h100", "--link-gbps", "0"], "'0' is not in the range x>0"),
])
def test_a_value_out_of_range_is_shown_as_typed(tmp_path, args, shown):
    """click showed the number it read: 0.0 for 1e-400, 10000000 for 1_000_000_0, 1000000 for 01000000."""
    run = run_cli(args, cwd=tmp_path)
    assert_usage_error(run, tmp_path, shown)


def test_version_1_stragglers_that_are_not_ranks_are_one_line(tmp_path):
    """Python's own int() text before: "invalid literal for int() with base 10: 'x'"."""
    for value in ("0,x", "٣", "1;2"):
        path = _doctored(tmp_path, "stragglers", lambda d: None)
        doc = json.loads((DATA / "collectives-v1.json").read_text())
        doc["rows"][0]["stragglers"] = value
        path.write_text(json.dumps(doc))
        run = run_cli(["report", str(path)], cwd=tmp_path)
        assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr, run.stderr
        assert run.error_lines == [f"Error: results file {str(path)!r}: row 0's stragglers {value!r} is not a list of "
                                   "ranks (version 1 writes them as rank numbers between commas, e.g. '0,2')"]


@pytest.mark.parametrize("args, option", [
    (["matmul", "--size", "16", "--backend", "host", "--out", "/proc/hetbench-x.json"], "--out"),
    (["matmul", "--size", "16", "--backend", "host", "--out", "{d}/m.json", "--csv", "/proc/hetbench-x.csv"],
     "--csv"),
    (["matmul", "--size", "16", "--backend", "host", "--out", "{d}/m.json", "--save", "/proc/hetbench-x.npy"],
     "--save"),
    (["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8", "--out", "{d}/t.json", "--log",
      "/proc/hetbench-x.jsonl"], "--log"),
    (["report", str(DATA / "matmul-v1.json"), "--html", "/proc/hetbench-x.html"], "--html"),
    (["report", str(DATA / "matmul-v1.json"), "--csv", "/proc/hetbench-x.csv"], "--csv"),
])
def test_an_output_folder_that_takes_no_new_file_is_refused_before_computing(tmp_path, args, option):
    """/proc passes every permission test (root), but takes no new file: found only after computing before
    (report: after printing its tables), exit 1."""
    run = run_cli([a.replace("{d}", str(tmp_path)) for a in args], cwd=tmp_path)
    assert_usage_error(run, tmp_path, option, "cannot be written: no file can be made in folder '/proc'")


@pytest.mark.parametrize("nprocs", [None, pytest.param(2, marks=needs_mpi)])
def test_a_default_results_folder_that_is_a_file_is_one_line(tmp_path, launched, nprocs):
    """Two lines before, one for --out and one for --csv, of the one cause."""
    (tmp_path / "results").write_text("x")
    run, folder = _run(launched, "results-a-file", nprocs, ["matmul", "--size", "16", "--backend", "host"], tmp_path)
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr, run.stderr
    lines = run.error_lines  # (Open MPI adds its banner)
    assert len(lines) == 1 and lines[0].endswith(  # rank 0 checks the outputs
        "the default results folder 'results' is not a folder; move it away, or name the outputs with --out and "
        "--csv"), run.stderr
    assert (folder / "results").read_text() == "x"


def test_an_integer_too_long_to_read_is_one_line(tmp_path):
    """Hostile finding F9: 'ValueError: Exceeds the limit (4300 digits) for integer string conversion', exit 1."""
    path = tmp_path / "long.json"
    path.write_text((DATA / "matmul-v1.json").read_text().replace('"schema_version"', '"x": ' + "9" * 5000
                                                                  + ', "schema_version"', 1))
    for args in (["report", str(path)], ["compare", str(path), str(DATA / "matmul-v1.json")],
                 ["compare", str(DATA / "matmul-v1.json"), str(path)]):
        run = run_cli(args, cwd=tmp_path)
        assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr, (args, run.stderr)
        assert run.error_lines == [f"Error: results file {str(path)!r} holds a number too long to read (an integer "
                                   "of more than 4300 digits): not a measurement"], run.stderr


def test_a_staged_file_that_cannot_be_made_names_the_target():
    """Hostile finding F2: the error named the staged copy ('/proc/.x.json.eiorhvv6.tmp'), not the path given."""
    from hetbench.results.io import stage_text

    with pytest.raises(OSError) as e:
        stage_text("/proc/hetbench-x.json", "{}")
    assert e.value.filename == "/proc/hetbench-x.json"
