"""Which of a benchmark's figures `report` draws and tables and `compare` tests, read from the columns the
benchmark declares (hetbench/benchmarks/: key, unit, scale, digits, whether modelled, which way is better); what is
here is only what those declarations do not say: the words a plot uses for a figure, which figures compare tests
on which raw per-repeat values, which row fields match two runs' rows, and a run's key figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Figure:
    key: str  # the row's field (or summary's, for run figures)
    label: str
    unit: str = ""
    scale: float = 1.0  # shown value = stored value * scale (e.g. 1e3 for seconds shown in ms)
    digits: int = 3
    modelled: bool = False  # modelled, not measured, when the row's device (or copy) timing is modelled
    better: str = "lower"  # which way is better, for compare: "lower" or "higher"

    @property
    def title(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def value(self, row: dict[str, Any]) -> float | None:
        """The row's figure in the shown unit, or None where it has none."""
        v = row.get(self.key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            return None
        return v * self.scale


@dataclass(frozen=True)
class Compared:
    """A figure compare tests, and the per-repeat times it is computed from (None where the row has none). A rate
    (TFLOP/s, GB/s) is work over one of these times, so it is tested on the times, as pyperf tests timings: the
    time and the rate of a row then always get the same verdict."""

    figure: Figure
    times: Callable[[dict[str, Any]], list[float] | None]


@dataclass(frozen=True)
class BenchmarkFigures:
    name: str
    rows: tuple[Figure, ...]  # a row's key figures: the HTML page's tables and the plots' axes
    match: tuple[str, ...]  # the row fields that say two runs' rows measured the same thing
    compared: tuple[Compared, ...]
    row_modelled: Callable[[dict[str, Any]], bool]  # whether this row's modelled figures are modelled
    run_figures: Callable[[dict[str, Any]], list[tuple[str, str]]]  # (title, text) for the runs table
    describe: Callable[[dict[str, Any]], str]  # a row in a few words: which rank, op, size

    def figure(self, key: str) -> Figure:
        return next(f for f in self.rows if f.key == key)

    def is_modelled(self, figure: Figure, row: dict[str, Any]) -> bool:
        return figure.modelled and self.row_modelled(row)

    def row_label(self, row: dict[str, Any]) -> str:
        return self.describe(row)


def _numbers(values: Any) -> list[float] | None:
    if not isinstance(values, list) or not values:
        return None
    out = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return out if len(out) == len(values) and all(math.isfinite(v) for v in out) else None


def _raw(row: dict[str, Any], key: str) -> list[float] | None:
    return _numbers((row.get("raw") or {}).get(key))


def _fmt(value: Any, digits: int = 3, scale: float = 1.0) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "-"
    v = value * scale
    short = f"{v:.{digits}g}"
    # whole numbers from 10**digits up, also where rounding to `digits` digits reaches it (999.7 is "1000", not "1e+03")
    return short if abs(float(short)) < 10**digits else f"{v:.0f}"


def declared(benchmark: str, key: str, label: str | None = None, unit: str | None = None) -> Figure:
    """The figure of `key` as benchmark `benchmark` declares its column; `label` (and `unit`, for a column whose
    label is its unit, such as "TFLOP/s") where a plot words it otherwise."""
    from hetbench.benchmarks.base import columns_of

    column = next((c for c in columns_of(benchmark) if c.key == key), None)
    if column is None:
        raise LookupError(f"benchmark {benchmark!r} declares no column {key!r}")
    return Figure(key, label if label is not None else column.label, column.unit if unit is None else unit,
                  column.scale, column.digits, modelled=bool(column.modelled), better=column.better or "lower")


# --- matmul -------------------------------------------------------------------------------------------------------

GEMM_SECONDS = declared("matmul", "gemm_seconds_median")
GEMM_TFLOPS = declared("matmul", "gemm_tflops", "GEMM", "TFLOP/s")
PEAK_PERCENT = declared("matmul", "peak_percent", unit="%")
H2D_SECONDS = declared("matmul", "h2d_seconds", "upload (H2D)")
D2H_SECONDS = declared("matmul", "d2h_seconds", "download (D2H)")
REDUCE_SECONDS = declared("matmul", "reduce_seconds_median", "reduce median")  # MPI on the host: always measured
H2D_GBPS = declared("matmul", "h2d_gbps")
D2H_GBPS = declared("matmul", "d2h_gbps")

# Where one matmul's time goes, in order: upload A_r and B_r, the GEMM, download C_r, the reduce over MPI
MATMUL_TIME_PARTS = (H2D_SECONDS, GEMM_SECONDS, D2H_SECONDS, REDUCE_SECONDS)


def _matmul_run_figures(document: dict[str, Any]) -> list[tuple[str, str]]:
    rows, summary = document["rows"], document.get("summary") or {}
    sizes = list(dict.fromkeys(f"{r.get('m')}x{r.get('n')}x{r.get('k')}" for r in rows))
    dtypes = list(dict.fromkeys(str(r.get("dtype")) for r in rows))
    mod = "~" if summary.get("end_to_end_timing") == "modelled" else ""
    verified = summary.get("verified", document.get("verified"))
    return [
        ("m x n x k", ", ".join(sizes)),
        ("dtype", ", ".join(dtypes)),
        ("aggregate GEMM (TFLOP/s)", mod + _fmt(summary.get("aggregate_gemm_tflops"))),
        ("end-to-end (ms)", mod + _fmt(summary.get("end_to_end_seconds"), scale=1e3)),
        ("checks", "passed" if verified else "FAILED"),
    ]


MATMUL = BenchmarkFigures(
    name="matmul",
    rows=(GEMM_SECONDS, GEMM_TFLOPS, PEAK_PERCENT, H2D_SECONDS, D2H_SECONDS, REDUCE_SECONDS, H2D_GBPS, D2H_GBPS),
    match=("rank", "backend", "device", "dtype", "m", "n", "k"),
    compared=(
        Compared(GEMM_SECONDS, lambda r: _raw(r, "gemm_seconds")),
        Compared(GEMM_TFLOPS, lambda r: _raw(r, "gemm_seconds")),
        Compared(REDUCE_SECONDS, lambda r: _raw(r, "reduce_seconds")),
    ),
    row_modelled=lambda r: r.get("device_timing") == "modelled",
    run_figures=_matmul_run_figures,
    describe=lambda r: f"rank {r.get('rank')} {r.get('backend')} {r.get('device')} {r.get('dtype')} "
                       f"{r.get('m')}x{r.get('n')}x{r.get('k')}",
)

# --- collectives --------------------------------------------------------------------------------------------------

OP_US = declared("collectives", "op_us_median")  # MPI's time: measured, also beside simulated devices
ALGBW = declared("collectives", "algbw_gbps")
BUSBW = declared("collectives", "busbw_gbps")
END_TO_END_US = declared("collectives", "end_to_end_us_median", "end-to-end time")
END_TO_END_ALGBW = declared("collectives", "end_to_end_algbw_gbps")


def slowest_rank_op_us(row: dict[str, Any]) -> list[float] | None:
    """Per iteration, the slowest rank's time (raw.op_us is ranks x iterations), as the row's median is built."""
    op_us = (row.get("raw") or {}).get("op_us")
    if not isinstance(op_us, list) or not op_us:
        return None
    per_rank = [_numbers(r) for r in op_us]
    if any(r is None for r in per_rank) or len({len(r) for r in per_rank if r is not None}) != 1:
        return None
    return [max(values) for values in zip(*[r for r in per_rank if r is not None])]


def _size_text(nbytes: Any) -> str:
    if not isinstance(nbytes, int):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _collectives_run_figures(document: dict[str, Any]) -> list[tuple[str, str]]:
    rows, summary = document["rows"], document.get("summary") or {}
    sizes = [r["size_bytes"] for r in rows if isinstance(r.get("size_bytes"), int)]
    avg = summary.get("avg_busbw_gbps") or {}
    wrong = summary.get("wrong_total")
    return [
        ("ops/paths", ", ".join(dict.fromkeys(f"{r.get('op')}/{r.get('path')}" for r in rows))),
        ("sizes", f"{_size_text(min(sizes))} .. {_size_text(max(sizes))}" if sizes else "-"),
        ("avg busbw (GB/s)", ", ".join(f"{k} {_fmt(v)}" for k, v in avg.items()) or "-"),
        ("peak busbw (GB/s)", _fmt(max((r["busbw_gbps"] for r in rows
                                        if isinstance(r.get("busbw_gbps"), (int, float))), default=None))),
        ("#wrong", "not checked" if not summary.get("checked", True) else str(wrong)),
    ]


COLLECTIVES = BenchmarkFigures(
    name="collectives",
    rows=(OP_US, ALGBW, BUSBW, END_TO_END_US, END_TO_END_ALGBW),
    match=("op", "path", "size_bytes", "dtype"),
    compared=(
        Compared(OP_US, slowest_rank_op_us),
        Compared(BUSBW, slowest_rank_op_us),
    ),
    row_modelled=lambda r: r.get("copy_timing") == "modelled",
    run_figures=_collectives_run_figures,
    describe=lambda r: f"{r.get('op')} {r.get('path')} {_size_text(r.get('size_bytes'))} {r.get('dtype')}",
)

BENCHMARKS: dict[str, BenchmarkFigures] = {b.name: b for b in (MATMUL, COLLECTIVES)}


def for_benchmark(name: str) -> BenchmarkFigures | None:
    return BENCHMARKS.get(name)


def numeric_series_keys(steps: Sequence[dict[str, Any]]) -> list[str]:
    """The numeric fields logged over steps (besides `step` itself), in first-seen order; a field that holds one
    value at every step of a run of several steps (train's loss_scale without fp16) is left out: nothing to draw."""
    keys: dict[str, set[float]] = {}
    for s in steps:
        for k, v in s.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.setdefault(k, set()).add(v)
    return [k for k, values in keys.items() if len(values) > 1 or len(steps) < 2]
