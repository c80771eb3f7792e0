"""`hetbench report`: saved runs (made here by real short runs on host, OpenCL and simulated ranks, plus the
committed v1 files) shown again, merged into one CSV, drawn as PNG/SVG plots and one HTML page whose plotted
numbers match the JSON; and bad input refused with one line, exit 2, nothing written."""

from __future__ import annotations

import base64
import csv
import importlib.util
import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from helpers import HAVE_OPENCL, MPIEXEC, REPO, Run, run_cli, run_cli_batch, run_cli_stages
from hetbench.results import SCHEMA_VERSION, load_results, write_json_atomic
from hetbench.results import io as results_io
from hetbench.results import schema
from hetbench.results.runs import RUN_COLUMNS, find_results, run_id

DATA = REPO / "tests" / "data"
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")
SECOND = "opencl" if HAVE_OPENCL else "sim:h100"  # a real second device kind where OpenCL is there
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="no matplotlib (pip install 'hetbench[report]')")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Four real short runs: matmul on host + OpenCL + simulated MI300X (3 ranks) and on host + simulated MI300X
    at another size; collectives on the same 3 ranks, and on 2 host ranks over both paths; and a matmul size
    sweep on 2 ranks."""
    folder = tmp_path_factory.mktemp("runs")
    jobs = {
        "mm3.json": (3, ["matmul", "--size", "64", "--repeat", "3", "--backend", f"0=host,1={SECOND},2=sim:mi300x"]),
        "mm2.json": (2, ["matmul", "--size", "96", "--repeat", "3", "--backend", "0=host,1=sim:mi300x"]),
        "c3.json": (3, ["collectives", "--op", "allreduce,allgather", "--max-bytes", "1K", "--iters", "3",
                        "--warmup", "1", "--backend", f"0=host,1={SECOND},2=sim:mi300x"]),
        "c2.json": (2, ["collectives", "--op", "allreduce", "--path", "both", "--max-bytes", "1K", "--iters", "3",
                        "--warmup", "1", "--backend", "host"]),
        # test_a_size_sweep_is_drawn_against_size's run
        "sweep.json": (2, ["matmul", "--sizes", "32,64,128", "--repeat", "2", "--warmup", "1", "--backend",
                           "0=host,1=sim:h100"]),
    }
    # one launch per rank count (helpers.run_cli_batch), each command in this folder as alone
    for nprocs in (3, 2):
        named = [(name, args) for name, (n, args) in jobs.items() if n == nprocs]
        runs = run_cli_batch([([*args, "--out", name], folder) for name, args in named], nprocs,
                             tmp_path_factory.mktemp(f"batch-{nprocs}"), timeout=240)
        for run in runs:
            assert run.returncode == 0, run.stderr
    return {name: folder / name for name in jobs}


@pytest.fixture(scope="module")
def runs(launched: dict[str, Path]) -> dict[str, Path]:
    """The four short runs (the size sweep has a test of its own)."""
    return {name: path for name, path in launched.items() if name != "sweep.json"}


def _trained_doc() -> dict:
    doc = load_results(DATA / "matmul-v1.json")
    doc["steps"] = [{"step": i, "loss": 2.0 / (i + 1), "tokens_per_second": 1000.0 + 10 * i} for i in range(5)]
    return doc


@pytest.fixture(scope="module")
def pages(launched: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Run, Path]]:
    """The `report` commands that draw (matplotlib imported once, not once a command: helpers.run_cli_stages,
    one process), each in its own folder: NAME -> (its Run, its folder)."""
    root = tmp_path_factory.mktemp("pages")
    shown = [str(path) for name, path in launched.items() if name != "sweep.json"]
    (root / "sweep").mkdir()
    shutil.copy(launched["sweep.json"], root / "sweep" / "sweep.json")
    (root / "steps").mkdir()
    write_json_atomic(root / "steps" / "trained.json", _trained_doc())
    return run_cli_stages(root, [(None, [
        ("html", ["report", "--brief", *shown, "--html", "report.html"], {}),
        ("plots", ["report", "--brief", str(launched["mm3.json"]), str(launched["c2.json"]), "--plots", "plots/new"],
         {}),
        ("sweep", ["report", "--brief", "sweep.json", "--html", "sweep.html"], {}),
        ("steps", ["report", "--brief", "trained.json", "--html", "page.html"], {}),
    ])], timeout=240)


def docs(runs: dict[str, Path]) -> dict[str, dict]:
    return {name: load_results(path) for name, path in runs.items()}


def test_report_shows_each_run_and_one_table_per_benchmark(runs: dict[str, Path], tmp_path: Path) -> None:
    run = run_cli(["report", *map(str, runs.values())], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    loaded = docs(runs)
    # each run's tables as its command printed them
    assert out.count("hetbench matmul: ") >= 2 and "aggregate GEMM:" in out and "result: all checks passed" in out
    assert "allreduce  (path: host, 3 ranks" in out and "allgather  (path: host, 3 ranks" in out
    assert "allreduce  (path: device, 2 ranks" in out
    assert "AMD Instinct MI300X" in out and "~" in out
    # then one table of all runs per benchmark
    assert "hetbench matmul: 2 run(s)" in out and "hetbench collectives: 2 run(s)" in out
    for doc in loaded.values():
        assert run_id(doc) in out
    assert "0=host" in out and f"1={SECOND}" in out and "2=sim:mi300x" in out
    assert "aggregate GEMM" in out and "avg busbw (GB/s)" in out
    brief = run_cli(["report", "--brief", *map(str, runs.values())], cwd=tmp_path)
    assert brief.returncode == 0 and "aggregate GEMM:" not in brief.stdout and "hetbench matmul: 2 run(s)" in brief.stdout


def test_report_of_the_committed_v1_files(tmp_path: Path) -> None:
    run = run_cli(["report", str(DATA), "--csv", "merged.csv"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "hetbench matmul: 1 run(s)" in run.stdout and "hetbench collectives: 1 run(s)" in run.stdout
    with open(tmp_path / "merged.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 + 6


def test_run_id_is_stable_and_metadata_wins() -> None:
    doc = load_results(DATA / "matmul-v1.json")
    first = run_id(doc)
    assert len(first) == 10 and int(first, 16) >= 0 and run_id(load_results(DATA / "matmul-v1.json")) == first
    assert run_id(load_results(DATA / "collectives-v1.json")) != first
    doc["metadata"]["run_id"] = "nvidia-node-42"
    assert run_id(doc) == "nvidia-node-42"


def test_merged_csv(runs: dict[str, Path], tmp_path: Path) -> None:
    run = run_cli(["report", "--brief", *map(str, runs.values()), "--csv", "merged.csv"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "merged CSV written to: merged.csv" in run.stdout
    with open(tmp_path / "merged.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        rows = list(reader)
    assert header is not None and tuple(header[:len(RUN_COLUMNS)]) == RUN_COLUMNS
    for column in ("rank", "backend", "device", "gemm_tflops", "op", "size_bytes", "busbw_gbps"):
        assert column in header
    assert not any(c in header for c in ("raw", "device_info", "process", "rank_op_us_median"))  # JSON-only detail
    loaded = docs(runs)
    assert len(rows) == sum(len(d["rows"]) for d in loaded.values())
    by_file = {name: [r for r in rows if Path(r["source_file"]).name == name] for name in loaded}
    for name, doc in loaded.items():
        mine = by_file[name]
        assert len(mine) == len(doc["rows"])
        benchmark = doc["schema"].removeprefix("hetbench.")
        assert {r["run_id"] for r in mine} == {run_id(doc)} and {r["benchmark"] for r in mine} == {benchmark}
        assert {r["date_utc"] for r in mine} == {doc["metadata"]["date_utc"]}
        assert {r["command"] for r in mine} == {doc["metadata"]["command_line"]}
        assert {r["ranks"] for r in mine} == {str(doc["metadata"]["world_size"])}
        figure = "gemm_tflops" if benchmark == "matmul" else "busbw_gbps"
        assert [float(r[figure]) for r in mine] == [row[figure] for row in doc["rows"]]
    assert {r["rank_map"] for r in by_file["mm3.json"]} == {f"0=host,1={SECOND},2=sim:mi300x"}
    assert [r["device"] for r in by_file["mm3.json"]] == [row["device"] for row in loaded["mm3.json"]["rows"]]


class Figures(HTMLParser):
    """The page's <figure> elements (attributes, and the image inside) and its tables."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict] = []
        self.tables: list[dict] = []
        self.remote: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        for key in ("src", "href"):
            if a.get(key, "").startswith(("http:", "https:", "//")):
                self.remote.append(a[key])
        if tag == "figure":
            self.figures.append({**a, "img": None})
        elif tag == "img" and self.figures:
            self.figures[-1]["img"] = a["src"]
        elif tag == "table":
            self.tables.append(a)


def parse_page(path: Path) -> Figures:
    parser = Figures()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def points(figure: dict, label_part: str, panel: str | None = None) -> list[dict]:
    series = json.loads(figure["data-values"])
    found = [p for s in series if label_part in s["label"] and (panel is None or s["panel"] == panel)
             for p in s["points"]]
    assert found, (label_part, [s["label"] for s in series])
    return found


@needs_matplotlib
def test_html_page(runs: dict[str, Path], pages) -> None:
    run, tmp_path = pages["html"]  # `report --brief RUNS --html report.html`, in its folder
    assert run.returncode == 0, run.stderr
    assert "report page written to: report.html" in run.stdout
    page = parse_page(tmp_path / "report.html")
    loaded = docs(runs)
    ids = {name: run_id(doc) for name, doc in loaded.items()}
    figures = {f["data-plot"]: f for f in page.figures}
    expected = {f"matmul-throughput-{ids['mm3.json']}", f"matmul-time-{ids['mm3.json']}",
                f"matmul-throughput-{ids['mm2.json']}", f"matmul-time-{ids['mm2.json']}",
                "matmul-size", "collectives-allreduce", "collectives-allgather"}
    assert set(figures) == expected and len(page.figures) == len(expected)
    # self-contained: every plot is inline SVG data, nothing is fetched, nothing runs
    assert page.remote == [] and "script" not in page.tags and "link" not in page.tags
    for f in page.figures:
        assert f["id"] == f"plot-{f['data-plot']}"
        assert f["img"].startswith("data:image/svg+xml;base64,")
        assert b"<svg" in base64.b64decode(f["img"].split(",", 1)[1])
    assert {t.get("data-run-id") for t in page.tables if t.get("class") == "rows"} == set(ids.values())
    assert {t.get("data-benchmark") for t in page.tables if t.get("class") == "runs"} == {"matmul", "collectives"}

    # the numbers drawn are the JSON's
    mm3 = loaded["mm3.json"]["rows"]
    throughput = figures[f"matmul-throughput-{ids['mm3.json']}"]
    rate = points(throughput, "GEMM")
    assert [p["y"] for p in rate] == [r["gemm_tflops"] for r in mm3]
    assert [p["modelled"] for p in rate] == [r["device_timing"] == "modelled" for r in mm3] == [
        False, SECOND.startswith("sim:"), True]
    assert [p["y"] for p in points(throughput, "% of peak")] == [r["peak_percent"] for r in mm3]
    time = figures[f"matmul-time-{ids['mm3.json']}"]
    for label, key in (("upload", "h2d_seconds"), ("GEMM", "gemm_seconds_median"), ("download", "d2h_seconds"),
                       ("reduce", "reduce_seconds_median")):
        assert [p["y"] for p in points(time, label)] == pytest.approx([r[key] * 1e3 for r in mm3], rel=1e-12)
    reduce_points = points(time, "reduce")
    assert not any(p["modelled"] for p in reduce_points)  # MPI's reduce is measured, also beside a simulated GPU
    size = points(figures["matmul-size"], "sim:mi300x")
    assert sorted((p["m"], p["y"]) for p in size) == sorted(
        (r["m"], r["gemm_tflops"]) for name in ("mm3.json", "mm2.json") for r in loaded[name]["rows"]
        if r["backend"] == "sim:mi300x")
    assert all(p["modelled"] for p in size)

    allreduce = figures["collectives-allreduce"]
    for name, path, label in (("c3.json", "host", f"run {ids['c3.json']} host-staged"),
                              ("c2.json", "host", f"run {ids['c2.json']} host-staged"),
                              ("c2.json", "device", f"run {ids['c2.json']} device-direct")):
        rows = [r for r in loaded[name]["rows"] if r["op"] == "allreduce" and r["path"] == path]
        bus = points(allreduce, f"{label} busbw", panel="bandwidth")
        assert [(p["x"], p["y"]) for p in bus] == [(r["size_bytes"], r["busbw_gbps"]) for r in rows]
        op_time = points(allreduce, f"{label} op time", panel="time")
        assert [p["y"] for p in op_time] == [r["op_us_median"] for r in rows]
        assert not any(p["modelled"] for p in bus + op_time)
    # with a simulated rank, the host path's end-to-end time has modelled copies, drawn as such
    e2e = points(allreduce, f"run {ids['c3.json']} host-staged end-to-end", panel="time")
    assert [p["y"] for p in e2e] == [r["end_to_end_us_median"] for r in loaded["c3.json"]["rows"]
                                     if r["op"] == "allreduce"]
    assert all(p["modelled"] for p in e2e)
    # allgather over 3 ranks has busbw factor 2/3, so algbw is drawn beside busbw
    gather_rows = [r for r in loaded["c3.json"]["rows"] if r["op"] == "allgather"]
    assert [p["y"] for p in points(figures["collectives-allgather"], "algbw")] == [r["algbw_gbps"] for r in gather_rows]


@needs_matplotlib
def test_steps_are_plotted(pages) -> None:
    doc = _trained_doc()
    run, tmp_path = pages["steps"]  # `report --brief trained.json --html page.html` beside this doc
    assert load_results(tmp_path / "trained.json") == doc
    assert run.returncode == 0, run.stderr
    figures = {f["data-plot"]: f for f in parse_page(tmp_path / "page.html").figures}
    steps = figures[f"steps-{run_id(doc)}"]
    assert [(p["x"], p["y"]) for p in points(steps, "loss")] == [(s["step"], s["loss"]) for s in doc["steps"]]
    assert [p["y"] for p in points(steps, "tokens_per_second")] == [s["tokens_per_second"] for s in doc["steps"]]


@needs_matplotlib
def test_plot_files(runs: dict[str, Path], pages) -> None:
    run, tmp_path = pages["plots"]  # `report --brief MM3 C2 --plots plots/new`, in its folder
    assert run.returncode == 0, run.stderr
    ident = run_id(load_results(runs["mm3.json"]))
    names = {p.name for p in (tmp_path / "plots" / "new").iterdir()}
    stems = [f"matmul-throughput-{ident}", f"matmul-time-{ident}", "collectives-allreduce"]
    assert names == {f"{s}.{ext}" for s in stems for ext in ("png", "svg")}
    for stem in stems:
        png = (tmp_path / "plots" / "new" / f"{stem}.png").read_bytes()
        svg = (tmp_path / "plots" / "new" / f"{stem}.svg").read_text(encoding="utf-8")
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
        assert "<svg" in svg and len(svg) > 10_000


def test_folder_input_skips_other_json(runs: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(runs["mm2.json"], folder / "a.json")
    shutil.copy(runs["c2.json"], folder / "b.json")
    (folder / "notes.json").write_text('{"comment": "not a run"}', encoding="utf-8")
    (folder / "b.csv").write_text("x\n1\n", encoding="utf-8")
    run = run_cli(["report", "--brief", "results", str(folder / "a.json")], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "hetbench matmul: 1 run(s)" in run.stdout and "hetbench collectives: 1 run(s)" in run.stdout
    assert "skipped 1 JSON file(s) that are not hetbench results: results/notes.json" in run.stderr
    found, skipped = find_results([folder])
    assert [r.path.name for r in found] == ["a.json", "b.json"] and [p.name for p in skipped] == ["notes.json"]


def assert_refused(run: Run, folder: Path, before: set[str], *needles: str) -> None:
    """One line naming what is wrong, exit 2, nothing on stdout, and no file written or left behind."""
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert len(run.error_lines) == 1, run.stderr
    for needle in needles:
        assert needle in run.error_lines[0], run.error_lines[0]
    assert {str(p.relative_to(folder)) for p in folder.rglob("*")} == before


def bad_inputs(folder: Path) -> dict[str, str]:
    good = (DATA / "matmul-v1.json").read_text(encoding="utf-8")
    newer = json.loads(good)
    newer["schema_version"] = 99
    files = {
        "list.json": "[1, 2, 3]",
        "other.json": '{"name": "someone else\'s results"}',
        "newer.json": json.dumps(newer),
        "truncated.json": good[: len(good) // 2],
        "empty.json": "",
    }
    for name, content in files.items():
        (folder / name).write_text(content, encoding="utf-8")
    return files


@pytest.mark.parametrize("name,needles", [
    ("list.json", ["'list.json'", "not a results object"]),
    ("other.json", ["'other.json'", "not a hetbench results file"]),
    ("newer.json", ["'newer.json'", "schema_version 99", f"version {SCHEMA_VERSION}", "upgrade hetbench"]),
    ("truncated.json", ["'truncated.json'", "not JSON", "truncated"]),
    ("empty.json", ["'empty.json'", "is empty"]),
    ("absent.json", ["'absent.json'", "does not exist"]),
])
def test_report_refuses_bad_files(tmp_path: Path, name: str, needles: list[str]) -> None:
    bad_inputs(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    run = run_cli(["report", str(DATA / "matmul-v1.json"), name, "--csv", "m.csv", "--html", "r.html"], cwd=tmp_path)
    assert_refused(run, tmp_path, before, *needles)


def test_report_folder_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "others").mkdir()
    (tmp_path / "others" / "x.json").write_text('{"a": 1}', encoding="utf-8")
    (tmp_path / "broken").mkdir()
    shutil.copy(DATA / "matmul-v1.json", tmp_path / "broken" / "good.json")
    (tmp_path / "broken" / "cut.json").write_text('{"schema": "hetbench.matmul", "rows": [', encoding="utf-8")
    before = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    assert_refused(run_cli(["report", "empty"], cwd=tmp_path), tmp_path, before,
                   "folder 'empty' holds no hetbench results file")
    assert_refused(run_cli(["report", "others"], cwd=tmp_path), tmp_path, before,
                   "folder 'others' holds no hetbench results file", "1 other JSON file(s) skipped")
    # inside a folder too, a file that may be a broken results file is an error, not skipped
    assert_refused(run_cli(["report", "broken", "--csv", "m.csv"], cwd=tmp_path), tmp_path, before,
                   "cut.json", "truncated")


def test_report_refuses_unwritable_outputs(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    shutil.copy(DATA / "matmul-v1.json", tmp_path / "in.json")
    before = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    for args, needles in (
        (["--html", "missing/r.html"], ["--html 'missing/r.html'", "folder 'missing' does not exist"]),
        (["--csv", "adir"], ["--csv 'adir' is a directory"]),
        (["--plots", "afile"], ["--plots 'afile' is not a folder"]),
        (["--plots", "afile/sub"], ["--plots 'afile/sub' cannot be made", "'afile' is not a folder"]),
        (["--csv", "in.json"], ["--csv 'in.json' is one of the results files read"]),
        # a good output beside a bad one: neither is written
        (["--csv", "ok.csv", "--plots", "p", "--html", "adir"], ["--html 'adir' is a directory"]),
    ):
        run = run_cli(["report", "in.json", *args], cwd=tmp_path)
        assert_refused(run, tmp_path, before, *needles)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_report_refuses_read_only_folder(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        run = run_cli(["report", str(DATA / "matmul-v1.json"), "--html", "ro/r.html"], cwd=tmp_path)
        assert run.returncode == 2 and "no write permission" in run.stderr
    finally:
        ro.chmod(0o755)


def test_without_matplotlib(tmp_path: Path) -> None:
    """Tables and the CSV need no matplotlib; plots and the page say how to get it, exit 2, write nothing."""
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named matplotlib (test shim)')\n")
    env = {"PYTHONPATH": f"{tmp_path / 'shim'}{os.pathsep}{REPO}"}
    work = tmp_path / "work"
    work.mkdir()
    ok = run_cli(["report", str(DATA), "--csv", "m.csv"], cwd=work, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "hetbench matmul: 1 run(s)" in ok.stdout and (work / "m.csv").exists()
    before = {p.name for p in work.iterdir()}
    for args in (["--html", "r.html"], ["--plots", "plots"], ["--csv", "m2.csv", "--html", "r.html"]):
        run = run_cli(["report", str(DATA), *args], cwd=work, env=env)
        assert_refused(run, work, before, "matplotlib", "pip install 'hetbench[report]'")


def test_loader_upgrades_an_older_version_in_one_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 1 files load as version 2 (stragglers as a list of ranks); a further version would add one step:
    pretend this hetbench writes version 3 with a step from 2, and read the v1 file through both steps; a version
    without a step is refused with the versions named."""
    doc = load_results(DATA / "collectives-v1.json")
    assert doc["schema_version"] == 2
    assert all(isinstance(r["stragglers"], list) and all(isinstance(x, int) for x in r["stragglers"])
               for r in doc["rows"])
    raw = json.loads((DATA / "collectives-v1.json").read_text())
    assert [[int(x) for x in r["stragglers"].split(",") if x] for r in raw["rows"]] == [r["stragglers"] for r in doc["rows"]]

    def v2_to_v3(document: dict) -> dict:
        document["metadata"]["run_id"] = "upgraded"
        return document

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(results_io, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(schema, "UPGRADES", {**schema.UPGRADES, 2: v2_to_v3})
    doc = load_results(DATA / "matmul-v1.json")
    assert doc["schema_version"] == 3 and run_id(doc) == "upgraded"
    monkeypatch.setattr(schema, "UPGRADES", {2: v2_to_v3})
    with pytest.raises(results_io.ResultsFileError, match="schema_version 1 is older than any this hetbench can read"):
        load_results(DATA / "matmul-v1.json")


@needs_matplotlib
def test_a_size_sweep_is_drawn_against_size(pages) -> None:
    """One `matmul --sizes` run (in the module's 2-rank launch): its page has the throughput-against-size plot,
    whose points are the run's rows, and its per-rank plots show the largest size."""
    page_run, tmp_path = pages["sweep"]  # `report --brief sweep.json --html sweep.html` beside a copy of the run
    assert page_run.returncode == 0, page_run.stderr
    doc = load_results(tmp_path / "sweep.json")
    figures = {f["data-plot"]: f for f in parse_page(tmp_path / "sweep.html").figures}
    rid = run_id(doc)
    assert set(figures) == {f"matmul-throughput-{rid}", f"matmul-time-{rid}", "matmul-size"}
    for backend in ("host", "sim:h100"):
        drawn = points(figures["matmul-size"], backend)
        assert sorted((p["m"], p["y"]) for p in drawn) == sorted(
            (r["m"], r["gemm_tflops"]) for r in doc["rows"] if r["backend"] == backend)
        assert len(drawn) == 3 and all(p["modelled"] == (backend != "host") for p in drawn)
    largest = [r for r in doc["rows"] if r["m"] == 128]
    assert [p["y"] for p in points(figures[f"matmul-throughput-{rid}"], "GEMM")] == [r["gemm_tflops"]
                                                                                     for r in largest]
