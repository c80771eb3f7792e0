"""`report`, the HTML page and `compare` for every benchmark (issue 18): real short runs of matmul, collectives,
calibrate, split and train (both front ends), reported once; each run's headline figures in the terminal and on
the page's summary are the ones recomputed here from the document's raw values (so a wrong formula, unit or
rounding fails), its tables and its plots are on the page, and compare runs on it: a copy of itself is not
significantly different, a copy whose repeats were slowed is a significant slowdown, and a figure held once per run
gets its change without a verdict."""

from __future__ import annotations

import base64
import copy
import json
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import MPIEXEC, NO_MPIEXEC, REPO, run_cli, run_cli_batch

from hetbench.pytorch_support import torch_problem
from hetbench.report.compare import NOT_SIGNIFICANT, ONE_VALUE, SLOWER, compare_documents
from hetbench.report.figures import for_benchmark
from hetbench.results import load_results, write_json_atomic
from hetbench.results.runs import run_id

pytestmark = [pytest.mark.skipif(MPIEXEC is None, reason=f"{NO_MPIEXEC} (pip install mpich)"),
              pytest.mark.skipif(__import__("importlib").util.find_spec("matplotlib") is None,
                                 reason="no matplotlib (pip install 'hetbench[report]')")]
TORCH = torch_problem() is None
needs_torch = pytest.mark.skipif(not TORCH, reason="no torch (pip install 'hetbench[torch]')")

# each benchmark run small on a host rank beside a simulated GPU (the torch front end on two host ranks)
JOBS = {
    "matmul": ["matmul", "--size", "64", "--repeat", "3", "--warmup", "1", "--backend", "0=host,1=sim:mi300x"],
    "collectives": ["collectives", "--op", "allreduce,allgather", "--max-bytes", "256", "--iters", "3", "--warmup",
                    "1", "--backend", "0=host,1=sim:h100"],
    "calibrate": ["calibrate", "--size", "128", "--min-seconds", "0.001", "--link-bytes", "4K", "--backend",
                  "0=host,1=sim:mi300x"],
    "split": ["split", "--size", "128", "--repeat", "3", "--warmup", "1", "--weights", "1,3",
              "--backend", "0=host,1=sim:mi300x"],  # listed weights: parts other than even, always (auto met them once)
    "train": ["train", "--steps", "12", "--layers", "2", "--hidden", "16", "--batch", "16", "--backend",
              "0=host,1=sim:h100"],
    "torch": ["train", "--frontend", "torch", "--steps", "4", "--layers", "2", "--hidden", "16", "--batch", "16",
              "--no-check", "--backend", "host"],
}
NAMES = [pytest.param(n, marks=[needs_torch]) if n == "torch" else n for n in JOBS]


FAILED: dict[str, str] = {}  # a job that did not run: its own tests fail with its error, the others go on


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every job's results (torch's where torch is here), and `report`'s console output and HTML page of them all."""
    folder = tmp_path_factory.mktemp("benchmarks")
    names = [name for name in JOBS if name != "torch" or TORCH]
    # one MPI job runs them all (helpers.run_cli_batch): the launcher's and each rank's start-up (torch's import
    # among them) paid once
    runs = run_cli_batch([([*JOBS[name], "--out", f"{name}.json"], folder) for name in names], 2,
                         tmp_path_factory.mktemp("benchmarks-job"), timeout=300)
    for name, run in zip(names, runs):
        if run.returncode != 0:
            FAILED[name] = f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    files = [f"{name}.json" for name in JOBS if (folder / f"{name}.json").exists()]
    report = run_cli(["report", *files, "--html", "page.html"], cwd=folder)
    assert report.returncode == 0, report.stderr
    (folder / "report.txt").write_text(report.stdout, encoding="utf-8")
    return folder


def doc(folder: Path, name: str) -> dict:
    assert name not in FAILED, f"hetbench {' '.join(JOBS[name])} failed: {FAILED[name]}"
    return load_results(folder / f"{name}.json")


def g(value: float, digits: int = 3) -> str:
    """How report writes a figure, written here by hand: `digits` significant digits, whole numbers from 10**digits."""
    return f"{value:.{digits}g}" if abs(float(f"{value:.{digits}g}")) < 10**digits else f"{value:.0f}"


def median(values: list[float]) -> float:
    return statistics.median(values)


# --- the headline figures, recomputed from each document's raw values -------------------------------------------


def headline(name: str, d: dict) -> dict[str, tuple[str, str]]:
    """key -> (label, the text shown with its unit), recomputed from the document's raw values with the units
    written out by hand; "~" before a figure of a simulated device."""
    rows, s = d["rows"], d["summary"]
    if name == "matmul":
        # every rank's GEMM at once: all flops over the slowest rank's median GEMM; then the slowest GEMM + copy,
        # then the slowest reduce
        gemm = [median(r["raw"]["gemm_seconds"]) for r in rows]
        tflops = sum(r["gemm_flops"] for r in rows) / max(gemm) / 1e12
        e2e = max(g_ + r["d2h_seconds"] for g_, r in zip(gemm, rows)) + max(median(r["raw"]["reduce_seconds"])
                                                                               for r in rows)
        return {"aggregate_gemm_tflops": ("aggregate GEMM", f"~{g(tflops)} TFLOP/s"),
                "end_to_end_seconds": ("end-to-end", f"~{g(e2e * 1e3)} ms")}
    if name == "collectives":
        out = {}
        busbw: dict[str, list[float]] = {}
        factor = {"allreduce": 2 * (2 - 1) / 2, "allgather": (2 - 1) / 2}  # nccl-tests' factors for 2 ranks
        for r in rows:
            slowest = median([max(t) for t in zip(*r["raw"]["op_us"])])  # each iteration's slowest rank
            busbw.setdefault(f"{r['op']}/{r['path']}", []).append(r["size_bytes"] / (slowest * 1e-6) / 1e9
                                                                  * factor[r["op"]])
        out["peak_busbw_gbps"] = ("peak busbw", f"{g(max(max(v) for v in busbw.values()))} GB/s")
        for key, values in busbw.items():
            out[f"avg_busbw_gbps.{key}"] = (f"avg busbw {key}", f"{g(statistics.fmean(values))} GB/s")
        return out
    if name == "calibrate":
        out = {}
        for dtype in s["dtypes"]:
            for strategy in s["strategies"]:
                mine = [r for r in rows if r["dtype"] == dtype and r["strategy"] == strategy]
                total = sum(r["gemm_flops"] / median(r["raw"]["gemm_seconds"]) / 1e9 for r in mine)
                out[f"sum_gemm_gflops.{dtype} {strategy}"] = (f"summed GEMM {dtype} {strategy}",
                                                              f"~{g(total)} GFLOP/s")  # a simulated rank's rate in it
        links = [r["link_gbps"] for r in rows if r["link_gbps"] is not None]
        out["slowest_link_gbps"] = ("slowest link to root", f"{g(min(links))} GB/s")
        return out
    if name == "split":
        m, n, k = (rows[0][x] for x in "mnk")
        flops = 2 * m * n * k

        def achieved(split: str) -> float:
            return flops / median(s["splits"][split]["raw"]["end_to_end_seconds"]) / 1e9

        e2e = median(s["splits"]["weighted"]["raw"]["end_to_end_seconds"])
        return {"achieved_gflops": ("achieved", f"~{g(achieved('weighted'))} GFLOP/s"),
                "efficiency_end_to_end": ("efficiency vs summed solo",
                                          f"~{g(achieved('weighted') / s['sum_solo_gflops'])}"),
                "speedup_over_even": ("weighted over even", f"~{g(achieved('weighted') / achieved('even'))}x"),
                "end_to_end_seconds_median": ("end-to-end", f"~{g(e2e * 1e3)} ms"),
                "predicted_seconds": ("predicted end-to-end",
                                      f"{g(s['splits']['weighted']['predicted']['seconds'] * 1e3)} ms")}
    # train, either front end: the step log's first and last loss, the global batch over the median step
    steps = d["steps"]
    batch = d["config"]["batch"]
    out = {"loss_first": ("loss at step 0", g(steps[0]["loss"], 4)),
           "loss_last": ("loss at the last step", g(steps[-1]["loss"], 4)),
           "samples_per_second": ("throughput", f"{g(batch / median([x['step_seconds'] for x in steps]))} samples/s"),
           "shares": ("shares", "samples " + ", ".join(str(r["samples_per_step"]) for r in rows))}
    # the share of the prefetched gathers' time hidden is read as the command wrote it: its per-step gather count
    # is not in the document
    out["comm_hidden_percent"] = ("comm hidden", f"{g(s['comm_hidden_percent'])} %" if name == "train" else "-")
    return out


class Page(HTMLParser):
    """The summary's headline items (per run), every table (attributes, header, rows) and every <figure>."""

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[str, dict[str, dict]] = {}
        self.tables: list[dict] = []
        self.figures: list[dict] = []
        self._run: str | None = None
        self._item: dict | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-run-id" in a:
            self._run = a["data-run-id"]
            self.items.setdefault(self._run, {})
        elif tag == "li" and "data-key" in a and self._run is not None:
            self._item = {**a, "text": []}
            self.items[self._run][a["data-key"]] = self._item
        elif tag == "table":
            self.tables.append({"attrs": a, "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "figure":
            self.figures.append({**a, "img": None})
        elif tag == "img" and self.figures:
            self.figures[-1]["img"] = a["src"]

    def handle_data(self, data):
        if self._item is not None:
            self._item["text"].append(data)
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag == "li" and self._item is not None:
            self._item["text"] = "".join(self._item["text"])
            self._item = None
        elif tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]["rows"]:
            self.tables[-1]["rows"][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._run = None


@pytest.fixture(scope="module")
def page(folder: Path) -> Page:
    parser = Page()
    parser.feed((folder / "page.html").read_text(encoding="utf-8"))
    for t in parser.tables:
        t["head"], *body = t["rows"] or [[]]
        t["rows"] = [dict(zip(t["head"], r)) for r in body]
    return parser


@pytest.mark.parametrize("name", NAMES)
def test_headline_figures_in_the_terminal_and_on_the_page(folder: Path, page: Page, name: str) -> None:
    d = doc(folder, name)
    want = headline(name, d)
    # the terminal: after the run's own tables, one line of its headline figures
    report = (folder / "report.txt").read_text(encoding="utf-8")
    block = report[report.index(f"run {run_id(d)}"):]
    line = next(x for x in block.splitlines() if x.startswith("headline: "))
    for label, text in want.values():
        assert f"{label} {text}" in line.removeprefix("headline: ").split("; "), (name, label, text, line)
    # the page opens with the summary: each headline figure under its key, label, value and unit
    items = page.items[run_id(d)]
    for key, (label, text) in want.items():
        item = items[key]
        assert item["text"] == label + text, (name, key, item["text"], label + text)
        assert (item["class"] == "modelled") == text.startswith("~"), (name, key)
    if name in ("train", "torch"):
        assert items["frontend"]["text"].endswith("numpy, fsdp" if name == "train" else "torch, fsdp2, model mlp")
    html = (folder / "page.html").read_text(encoding="utf-8")
    assert html.index('<section class="summary"') < html.index('<section class="benchmark"')


# --- tables and plots on the page ------------------------------------------------------------------------------


def expected_tables(name: str, d: dict) -> dict[str, tuple[int, str, list[str]]]:
    """table -> (rows, a figure's column title, that column's cells): 4 significant digits, "~" where modelled."""
    rows = d["rows"]
    mod = ["~" if r.get("device_timing") == "modelled" else "" for r in rows]
    if name == "matmul":
        return {"rows": (len(rows), "GEMM (TFLOP/s)", [m + g(r["gemm_tflops"], 4) for m, r in zip(mod, rows)])}
    if name == "collectives":
        return {"rows": (len(rows), "busbw (GB/s)", [g(r["busbw_gbps"], 4) for r in rows])}
    if name == "calibrate":
        return {"rows": (len(rows), "GEMM rate (GFLOP/s)", [m + g(r["gemm_gflops"], 4) for m, r in zip(mod, rows)])}
    if name == "split":
        splits = d["summary"]["splits"]
        return {"splits": (len(splits), "achieved (GFLOP/s)", [
                    ("~" if s["timing"] == "modelled" else "") + g(s["achieved_gflops"], 4) for s in splits.values()]),
                "rows": (len(rows), "Compute (ms)", [m + g(r["compute_seconds_median"] * 1e3, 4)
                                                     for m, r in zip(mod, rows)])}
    return {"rows": (len(rows), "Step (ms)", [g(r["step_seconds_median"] * 1e3, 4) for r in rows])}


def expected_plots(name: str, d: dict) -> dict[str, list[tuple[str, list]]]:
    """plot id -> (a series' label, the values it draws) per series checked."""
    rid = run_id(d)
    rows = d["rows"]
    if name == "matmul":
        return {f"matmul-throughput-{rid}": [("GEMM", [r["gemm_tflops"] for r in rows])],
                f"matmul-time-{rid}": [("download", [r["d2h_seconds"] * 1e3 for r in rows])]}
    if name == "collectives":
        return {f"collectives-{op}": [("busbw", [r["busbw_gbps"] for r in rows if r["op"] == op])]
                for op in ("allreduce", "allgather")}
    if name == "calibrate":
        return {f"calibrate-rates-{rid}": [("GEMM rate", [r["gemm_gflops"] for r in rows]),
                                            ("Link", [r["link_gbps"] for r in rows])]}
    if name == "split":
        splits = d["summary"]["splits"].values()
        return {f"split-throughput-{rid}": [("achieved", [s["achieved_gflops"] for s in splits]),
                                             ("predicted", [s["predicted"]["seconds"] * 1e3 for s in splits])],
                f"split-time-{rid}": [("Idle", [r["idle_seconds_median"] * 1e3 for r in rows])]}
    return {f"train-time-{rid}": [("Comm", [r["comm_seconds_median"] * 1e3 for r in rows])],
            f"steps-{rid}": [("loss", [s["loss"] for s in d["steps"]])]}


@pytest.mark.parametrize("name", NAMES)
def test_tables_and_plots_on_the_page(folder: Path, page: Page, name: str) -> None:
    d = doc(folder, name)
    rid = run_id(d)
    for table, (count, title, cells) in expected_tables(name, d).items():
        (found,) = [t for t in page.tables if t["attrs"].get("data-run-id") == rid
                    and t["attrs"].get("data-table") == table]
        assert len(found["rows"]) == count, (name, table)
        assert [r[title] for r in found["rows"]] == cells, (name, table, title)
    # the runs table of the benchmark holds this run's figures too
    runs = next(t for t in page.tables if t["attrs"].get("class") == "runs"
                and t["attrs"].get("data-benchmark") == d["schema"].removeprefix("hetbench."))
    assert rid in [r["Run"] for r in runs["rows"]]
    figures = {f["data-plot"]: f for f in page.figures}
    for plot, checks in expected_plots(name, d).items():
        figure = figures[plot]
        assert figure["img"].startswith("data:image/svg+xml;base64,")
        assert b"<svg" in base64.b64decode(figure["img"].split(",", 1)[1])
        series = json.loads(figure["data-values"])
        for label, values in checks:
            drawn = [p["y"] for s in series if label in s["label"] and s["points"][0].get("run_id") in (rid, None)
                     for p in s["points"]]
            assert [x is None for x in drawn] == [x is None for x in values], (plot, label)
            assert [x for x in drawn if x is not None] == pytest.approx([x for x in values if x is not None],
                                                                        rel=1e-12), (plot, label)


# --- compare --------------------------------------------------------------------------------------------------


def slowed(name: str, d: dict) -> tuple[dict, str]:
    """A copy whose repeats of one timed figure all take longer by one amount (so the samples' spread stays as
    measured), far beyond their spread (an outlier among three repeats must not hide it), its median with them; and
    that figure's key."""
    new = copy.deepcopy(d)

    def shift(values: list[float]) -> list[float]:
        by = 9 * median(values) + 100 * (max(values) - min(values))
        return [v + by for v in values]

    if name == "matmul":
        for r in new["rows"]:
            r["raw"]["gemm_seconds"] = shift(r["raw"]["gemm_seconds"])
            r["gemm_seconds_median"] = median(r["raw"]["gemm_seconds"])
        return new, "gemm_seconds_median"
    if name == "collectives":
        for r in new["rows"]:
            slowest = [max(t) for t in zip(*r["raw"]["op_us"])]  # each iteration's slowest rank: what is tested
            by = shift(slowest)[0] - slowest[0]
            r["raw"]["op_us"] = [[t + by for t in rank] for rank in r["raw"]["op_us"]]
            r["op_us_median"] = median([max(t) for t in zip(*r["raw"]["op_us"])])
        return new, "op_us_median"
    if name == "calibrate":
        for r in new["rows"]:
            r["raw"]["gemm_seconds"] = shift(r["raw"]["gemm_seconds"])
            r["gemm_seconds_median"] = median(r["raw"]["gemm_seconds"])
        return new, "gemm_seconds_median"
    if name == "split":
        for s in new["summary"]["splits"].values():
            s["raw"]["end_to_end_seconds"] = shift(s["raw"]["end_to_end_seconds"])
            s["end_to_end_seconds_median"] = median(s["raw"]["end_to_end_seconds"])
        return new, "end_to_end_seconds_median"
    steps = [s["step_seconds"] for s in new["steps"]]
    for s, v in zip(new["steps"], shift(steps)):
        s["step_seconds"] = v
    new["summary"]["step_seconds_median"] = median([s["step_seconds"] for s in new["steps"]])
    new["summary"]["loss_last"] *= 1.5
    return new, "step_seconds_median"


@pytest.mark.parametrize("name", NAMES)
def test_compare_runs_for_each_benchmark(folder: Path, tmp_path: Path, name: str) -> None:
    d = doc(folder, name)
    path = str(folder / f"{name}.json")
    same = run_cli(["compare", path, path, "--json", "--fail-on-slowdown", "0"], cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    changes = json.loads(same.stdout)["changes"]
    assert changes and {c["verdict"] for c in changes} <= {NOT_SIGNIFICANT, ONE_VALUE}
    assert any(c["verdict"] == NOT_SIGNIFICANT for c in changes)  # the timed figures are tested
    assert all(c["change_percent"] in (0.0, None) for c in changes)

    new, key = slowed(name, d)
    comparison = compare_documents(for_benchmark(d["schema"].removeprefix("hetbench.")), d, new, "base", "new")
    tested = [c for c in comparison.changes if c.key == key]
    assert tested and {c.verdict for c in tested} == {SLOWER}, [(c.row, c.verdict, c.p_value) for c in tested]
    if name in ("train", "torch"):
        # the last loss is one value a run: its change, without a verdict
        (loss,) = [c for c in comparison.changes if c.key == "loss_last"]
        assert loss.verdict == ONE_VALUE and loss.p_value is None and loss.change_percent == pytest.approx(50.0)
        write_json_atomic(tmp_path / "new.json", new)
        table = run_cli(["compare", path, "new.json", "--fail-on-slowdown", "100"], cwd=tmp_path)
        assert table.returncode == 1, table.stdout + table.stderr
        assert "without a significance verdict" in table.stdout and ONE_VALUE in table.stdout


def test_old_schema_files_get_a_summary(tmp_path: Path) -> None:
    """The committed schema-version-1 documents: the page's summary shows their headline figures."""
    data = REPO / "tests" / "data"
    run = run_cli(["report", "--brief", str(data / "matmul-v1.json"), str(data / "collectives-v1.json"), "--html",
                   "p.html"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    parser = Page()
    parser.feed((tmp_path / "p.html").read_text(encoding="utf-8"))
    mm = load_results(data / "matmul-v1.json")
    items = parser.items[run_id(mm)]
    assert items["aggregate_gemm_tflops"]["text"] == "aggregate GEMM" + (
        "~" if mm["summary"]["end_to_end_timing"] == "modelled" else "") + \
        f"{g(mm['summary']['aggregate_gemm_tflops'])} TFLOP/s"
    assert "peak_busbw_gbps" in parser.items[run_id(load_results(data / "collectives-v1.json"))]
