"""`hetbench report`'s headline figures pinned (issue 17): the runs table's key figures (in the terminal and on the
HTML page), each run's rows on the page and the closing lines shown again, recomputed here from the documents'
own fields with the units written out by hand (seconds shown in ms, us as us, GB/s as GB/s), on the committed v1
documents and on copies whose figures differ run to run, so that a figure put under another run's or another
title's column shows."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import REPO

from hetbench.benchmarks.collectives.present import describe as describe_collectives
from hetbench.report.figures import for_benchmark
from hetbench.results import load_results
from hetbench.results.runs import Run

DATA = REPO / "tests" / "data"
# the unit each row figure is shown in, and the factor from the stored unit: written here, not read from hetbench
SHOWN = {
    "gemm_seconds_median": ("ms", 1e3), "gemm_tflops": ("TFLOP/s", 1.0), "peak_percent": ("%", 1.0),
    "h2d_seconds": ("ms", 1e3), "d2h_seconds": ("ms", 1e3), "reduce_seconds_median": ("ms", 1e3),
    "h2d_gbps": ("GB/s", 1.0), "d2h_gbps": ("GB/s", 1.0),
    "op_us_median": ("us", 1.0), "algbw_gbps": ("GB/s", 1.0), "busbw_gbps": ("GB/s", 1.0),
    "end_to_end_us_median": ("us", 1.0), "end_to_end_algbw_gbps": ("GB/s", 1.0),
}
# which row field says a figure was modelled: a simulated device's GEMM and copies, a host path's modelled copies;
# MPI's times (the reduce, a collective's own time and bandwidths) are measured always
MODELLED_BY = {
    "gemm_seconds_median": "device_timing", "gemm_tflops": "device_timing", "peak_percent": "device_timing",
    "h2d_seconds": "device_timing", "d2h_seconds": "device_timing", "h2d_gbps": "device_timing",
    "d2h_gbps": "device_timing", "end_to_end_us_median": "copy_timing", "end_to_end_algbw_gbps": "copy_timing",
}


def run_figures(doc: dict) -> dict[str, str]:
    """The runs table's cells of a document, by title."""
    benchmark = doc["schema"].removeprefix("hetbench.")
    return {f.title: f.text for f in for_benchmark(benchmark).run_figures(doc) if f.table}


def g3(value: float) -> str:
    """Three significant digits, whole numbers from 1000 up: how the report writes a headline figure."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def g4(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 10_000 else f"{value:.0f}"


def _matmul(name: str = "matmul-v1.json", **summary) -> dict:
    doc = load_results(DATA / name)
    doc["summary"].update(summary)
    return doc


def _collectives() -> dict:
    """The v1 document with rows in an order where neither the first nor the last row holds the smallest size,
    the largest size or the peak busbw, and a summary whose averages differ from any one row's."""
    doc = load_results(DATA / "collectives-v1.json")
    rows = doc["rows"]  # allreduce 256, 512, 1024; bcast 256, 512, 1024
    for i, r in enumerate(rows):
        r["busbw_gbps"] = [0.5, 2.75, 1.25, 0.125, 6.5, 0.0625][i]
    doc["rows"] = [rows[1], rows[2], rows[4], rows[0], rows[3], rows[5]]
    doc["rows"][-1]["size_bytes"] = 768
    doc["summary"]["avg_busbw_gbps"] = {"allreduce/host": 1.5, "bcast/host": 2.25}
    doc["summary"]["wrong_total"] = 7
    return doc


def test_matmul_run_figures_recompute_from_the_summary():
    doc = _matmul(aggregate_gemm_tflops=0.123456, end_to_end_seconds=0.0123456, end_to_end_timing="measured")
    figures = run_figures(doc)
    assert figures["m x n x k"] == "64x64x64" and figures["dtype"] == "fp32"
    assert figures["aggregate GEMM (TFLOP/s)"] == "0.123"
    assert figures["end-to-end (ms)"] == "12.3"  # 0.0123456 s
    assert figures["checks"] == "passed"
    modelled = run_figures(_matmul(end_to_end_seconds=2.5e-4, end_to_end_timing="modelled"))
    assert modelled["end-to-end (ms)"] == "~0.25" and modelled["aggregate GEMM (TFLOP/s)"] == "~0.105"
    assert run_figures(_matmul(verified=False))["checks"] == "FAILED"


def test_collectives_run_figures_recompute_from_the_rows_and_summary():
    doc = _collectives()
    figures = run_figures(doc)
    assert figures["ops/paths"] == "allreduce/host, bcast/host"
    sizes = [r["size_bytes"] for r in doc["rows"]]
    assert (min(sizes), max(sizes)) == (256, 1024) and sizes[0] != 256 and sizes[-1] != 1024
    assert figures["sizes"] == "256 B .. 1 KiB"
    assert figures["avg busbw (GB/s)"] == "allreduce/host 1.5, bcast/host 2.25"
    peak = max(r["busbw_gbps"] for r in doc["rows"])
    assert peak == 6.5 and doc["rows"][0]["busbw_gbps"] != peak and doc["rows"][-1]["busbw_gbps"] != peak
    assert figures["peak busbw (GB/s)"] == "6.5"
    assert figures["#wrong"] == "7"
    doc["summary"]["checked"] = False
    assert run_figures(doc)["#wrong"] == "not checked"


def _runs() -> list[Run]:
    a = _matmul(aggregate_gemm_tflops=1.5, end_to_end_seconds=0.002, end_to_end_timing="measured")
    b = _matmul(aggregate_gemm_tflops=0.75, end_to_end_seconds=0.25, verified=False)
    return [Run(Path("a.json"), a), Run(Path("b.json"), b)]


def test_the_runs_table_puts_each_runs_figures_under_their_titles():
    from hetbench.report.tables import runs_table

    runs = _runs()
    table = runs_table("matmul", runs)
    cells = {str(c.header): [str(x) for x in c.cells] for c in table.columns}
    assert cells["aggregate GEMM (TFLOP/s)"] == ["1.5", "~0.75"]
    assert cells["end-to-end (ms)"] == ["2", "~250"]
    assert cells["checks"] == ["passed", "FAILED"]
    assert cells["Run"] == [run.run_id for run in runs]


class _Tables(HTMLParser):
    """Every <table>'s attributes, header and body rows (cell text and class)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self._cell: list[str] | None = None
        self._class = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append({"attrs": a, "head": [], "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell, self._class = [], a.get("class") or ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1]["rows"][-1].append(("".join(self._cell), self._class, tag))
            self._cell = None


def _html_tables(html: str) -> list[dict]:
    parser = _Tables()
    parser.feed(html)
    for t in parser.tables:
        head, *body = t["rows"]
        t["head"] = [c[0] for c in head]
        t["rows"] = [dict(zip(t["head"], row)) for row in body]
    return parser.tables


def test_the_page_shows_the_same_run_figures_and_each_rows_figures_in_their_units():
    from hetbench.report.html import rows_table, runs_section

    runs = _runs()
    (section,) = _html_tables(runs_section("matmul", runs))
    assert [r["aggregate GEMM (TFLOP/s)"][0] for r in section["rows"]] == ["1.5", "~0.75"]
    assert [r["end-to-end (ms)"][0] for r in section["rows"]] == ["2", "~250"]
    for run in (Run(Path("m.json"), _matmul()), Run(Path("c.json"), _collectives())):
        (declared,) = for_benchmark(run.benchmark).tables(run.document)
        titles = {c.key: c.header(True) for c in declared.columns}
        (table,) = _html_tables(rows_table(run))
        assert len(table["rows"]) == len(run.rows)
        for row, cells in zip(run.rows, table["rows"]):
            for key, (unit, scale) in SHOWN.items():
                if key not in row:
                    continue
                title = next(t for t in table["head"] if t.endswith(f"({unit})") and t == titles[key])
                text, css, _ = cells[title]
                value = row[key]
                modelled = key in MODELLED_BY and row.get(MODELLED_BY[key]) == "modelled"
                want = "-" if value is None else ("~" if modelled else "") + g4(value * scale)
                assert text == want, (run.benchmark, key, text, want)
                assert ("modelled" in css) == modelled, key


def test_the_closing_lines_shown_again(capsys, monkeypatch):
    from hetbench.report.console import collectives_report, matmul_summary_lines

    # tables as wide as they need: with no terminal (a pytest-xdist worker) the console falls back to a narrow one
    monkeypatch.setenv("COLUMNS", "200")

    doc = _matmul(aggregate_gemm_tflops=0.123456, end_to_end_seconds=0.0123456, end_to_end_timing="measured")
    lines = matmul_summary_lines(doc["summary"])
    assert lines[0].startswith("end-to-end: 12.3 ms (slowest GEMM + copy to host, then reduce; measured)")
    assert lines[1] == "aggregate GEMM: 0.123 TFLOP/s over 2 rank(s)"

    c = _collectives()
    collectives_report(c["rows"], c["summary"], c["metadata"].get("ranks") or [])
    out = capsys.readouterr().out
    assert "avg bus bandwidth allreduce/host: 1.5 GB/s" in out and "avg bus bandwidth bcast/host: 2.25 GB/s" in out
    assert "out of bounds values (#wrong, all ops and sizes): 7" in out
    # every table row shows its own time, algbw and busbw (the times in us)
    for row in c["rows"]:
        pattern = (rf"│\s+{row['size_bytes']}\s+│\s+{row['count_elements']}\s+│"
                   rf"\s+{re.escape(g4(row['op_us_median']))}\s+│\s+{re.escape(g3(row['algbw_gbps']))}\s+│"
                   rf"\s+{re.escape(g3(row['busbw_gbps']))}\s+│")
        assert re.search(pattern, out), (pattern, out)


# --- the number formatting a reader sees, sizes in words, which rows are modelled, which series are drawn ----------


@pytest.mark.parametrize("tflops, shown", [
    (45.67, "45.7"),  # three significant digits below 1000
    (999.4, "999"),
    (999.7, "1000"),  # rounds up to 1000: a whole number, not "1e+03"
    (1000.0, "1000"),  # from 1000 up, whole numbers
    (1234.4, "1234"),
    (12345.6, "12346"),
    (0.0001234, "0.000123"),
])
def test_the_run_figures_number_format(tflops, shown):
    doc = _matmul(aggregate_gemm_tflops=tflops, end_to_end_timing="measured")
    assert run_figures(doc)["aggregate GEMM (TFLOP/s)"] == shown
    # the same format after the unit's scale: seconds shown in ms
    doc = _matmul(end_to_end_seconds=tflops / 1e3, end_to_end_timing="measured")
    assert run_figures(doc)["end-to-end (ms)"] == shown


@pytest.mark.parametrize("nbytes, shown", [
    (1 << 30, "1 GiB"), (3 << 30, "3 GiB"), (1 << 31, "2 GiB"),
    (1 << 20, "1 MiB"), (3 << 20, "3 MiB"), (1536 << 20, "1536 MiB"),
    (1 << 10, "1 KiB"), (1536 << 10, "1536 KiB"), (3 << 10, "3 KiB"),
    (1000, "1000 B"), (1023, "1023 B"), (4, "4 B"),
])
def test_sizes_in_words(nbytes, shown):
    """A size in the largest binary unit it is a whole number of: what a collectives row's label and the runs
    table's size range say."""
    row = {"op": "allreduce", "path": "host", "size_bytes": nbytes, "dtype": "fp32"}
    assert describe_collectives(row) == f"allreduce host {shown} fp32"
    doc = _collectives()
    doc["rows"][0]["size_bytes"] = nbytes  # the smallest size of the others is 256 B, the largest 1 KiB
    smallest, largest = (shown, "1 KiB") if nbytes < 256 else ("256 B", shown if nbytes > 1024 else "1 KiB")
    assert run_figures(doc)["sizes"] == f"{smallest} .. {largest}"


def test_a_collectives_rows_end_to_end_figures_are_modelled_exactly_where_its_copies_are():
    """The end-to-end time and algbw add the host path's copies: modelled (shown with "~") where the copies' timing
    is modelled, measured where it is measured or where the device path has no copies; the op's own time and
    bandwidths are MPI's, measured always. Written out by hand, not read from hetbench."""
    from hetbench.report.html import rows_table

    doc = _collectives()
    timings = ["modelled", "measured", "none", "modelled", "measured", "none"]
    for row, timing in zip(doc["rows"], timings):
        row["copy_timing"] = timing
    run = Run(Path("c.json"), doc)
    (table,) = _html_tables(rows_table(run))
    for timing, cells in zip(timings, table["rows"]):
        for title in ("end-to-end time (us)", "end-to-end algbw (GB/s)"):
            assert cells[title][0].startswith("~") == (timing == "modelled"), (title, timing, cells[title])
        for title in ("time (us)", "algbw (GB/s)", "busbw (GB/s)"):
            assert not cells[title][0].startswith("~"), (title, timing)
    (rows,) = for_benchmark("collectives").tables(doc)
    end_to_end = next(c for c in rows.columns if c.key == "end_to_end_us_median")
    assert [end_to_end.is_modelled(r) for r in doc["rows"]] == \
        [t == "modelled" for t in timings]


def test_the_step_series_drawn():
    """The numeric fields logged over steps, besides `step`, in first-seen order; one that never changes over a run
    of two steps or more is left out (nothing to draw), but every one is kept for a run of one step."""
    from hetbench.report.figures import numeric_series_keys

    two = [{"step": 1, "loss": 2.0, "loss_scale": 1.0, "lr": 0.1, "note": "a", "skipped": False},
           {"step": 2, "loss": 1.5, "loss_scale": 1.0, "lr": 0.2, "note": "b", "skipped": True}]
    assert numeric_series_keys(two) == ["loss", "lr"]
    assert numeric_series_keys(two[:1]) == ["loss", "loss_scale", "lr"]
    assert numeric_series_keys([]) == []
    # two distinct values among three steps are a series
    three = [*two, {"step": 3, "loss": 1.5, "loss_scale": 2.0, "lr": 0.2}]
    assert numeric_series_keys(three) == ["loss", "loss_scale", "lr"]
