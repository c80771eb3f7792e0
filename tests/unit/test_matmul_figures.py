"""Every figure matmul derives, checked against its definition on hand-made inputs: the job summary from given rows,
and one rank's row from a run on a backend whose clock the test controls."""

from __future__ import annotations

import contextlib
import statistics
from typing import Iterator

import numpy as np
import pytest

from hetbench.backends.base import TIMING_MEASURED, BackendSpec, DeviceInfo, Elapsed
from hetbench.comm.world import World
from hetbench.benchmarks.matmul.config import MatmulConfig
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.matmul import run
from hetbench.harness.stats import summarize
from hetbench.harness.timing import time_repeats
from doubles import HostArrays


def _row(rank: int, gemm_s: float, d2h_s: float, reduce_s: float, flops: int, timing: str = "measured") -> dict:
    return {"rank": rank, "gemm_seconds_median": gemm_s, "d2h_seconds": d2h_s, "reduce_seconds_median": reduce_s,
            "gemm_flops": flops, "device_timing": timing, "verified": True}


def _cfg(reduce: str = "sum", warmup: int = 2, repeat: int = 5, m: int = 6, n: int = 5, k: int = 4) -> MatmulConfig:
    return MatmulConfig(m=m, n=n, k=k, dtype=DTYPES["fp32"], backends=(BackendSpec("host"),), warmup=warmup,
                        repeat=repeat, reduce=reduce)


def test_summary_end_to_end_is_slowest_gemm_plus_its_copy_then_slowest_reduce() -> None:
    # rank 1's GEMM is faster but its copy to the host is slow: the copy must count
    rows = [_row(0, 2.0, 0.1, 0.5, 100), _row(1, 1.5, 1.0, 0.25, 100)]
    summary = run.summarize_job(_cfg(), rows, None)
    assert summary["end_to_end_seconds"] == pytest.approx(max(2.0 + 0.1, 1.5 + 1.0) + max(0.5, 0.25))
    assert summary["end_to_end_timing"] == "measured"


def test_summary_end_to_end_without_reduce_has_no_reduce_term() -> None:
    rows = [_row(0, 2.0, 0.3, 9.0, 100)]
    assert run.summarize_job(_cfg(reduce="none"), rows, None)["end_to_end_seconds"] == pytest.approx(2.3)


def test_summary_aggregate_rate_is_all_flops_over_the_slowest_rank() -> None:
    rows = [_row(0, 2.0, 0.0, 0.0, 4_000_000_000_000), _row(1, 0.5, 0.0, 0.0, 2_000_000_000_000)]
    summary = run.summarize_job(_cfg(), rows, None)
    assert summary["total_gemm_flops"] == 6_000_000_000_000
    assert summary["aggregate_gemm_tflops"] == pytest.approx(6.0 / 2.0)


def test_summary_is_modelled_when_any_rank_is() -> None:
    rows = [_row(0, 1.0, 0.0, 0.0, 1), _row(1, 1.0, 0.0, 0.0, 1, timing="modelled")]
    assert run.summarize_job(_cfg(), rows, None)["end_to_end_timing"] == "modelled"


def test_summary_verified_needs_every_product_and_the_sum() -> None:
    rows = [_row(0, 1.0, 0.0, 0.0, 1), _row(1, 1.0, 0.0, 0.0, 1)]
    assert run.summarize_job(_cfg(reduce="none"), rows, None)["verified"] is True
    rows[1]["verified"] = False
    assert run.summarize_job(_cfg(reduce="none"), rows, None)["verified"] is False


def test_stats_cv_is_stdev_over_mean() -> None:
    values = [1.0, 2.0, 4.0]
    stats = summarize(values, "x")
    assert stats["x_cv"] == pytest.approx(statistics.stdev(values) / statistics.fmean(values))
    assert stats["x_median"] == 2.0 and stats["x_min"] == 1.0 and stats["x_max"] == 4.0
    assert summarize([3.0], "x")["x_cv"] == 0.0


class ScriptedBackend(HostArrays):
    """A host backend whose timer reports scripted durations: every call of matmul, upload and download is
    counted, and each timed block lasts the next scripted number of seconds."""

    name = "host"
    timing = TIMING_MEASURED

    def __init__(self, durations: list[float], backend: str = "host") -> None:
        self.backend = backend  # "opencl": a device that copies A and B in and C out (the host computes in place)
        self.durations = list(durations)
        self.matmul_calls = 0
        self.timed_blocks: list[float] = []

    def info(self) -> DeviceInfo:
        return DeviceInfo(backend=self.backend, index=0, vendor="test", name="scripted", kind="cpu", memory_bytes=None,
                          dtypes=("fp32",), runtime="test", peak_tflops={"fp32": 2e-9})

    def free_memory_bytes(self) -> int | None:
        return None

    def max_allocation_bytes(self) -> int | None:
        return None

    def matmul(self, a, b, out, dtype) -> None:
        self.matmul_calls += 1
        super().matmul(a, b, out, dtype)

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        elapsed = Elapsed()
        yield elapsed
        elapsed.seconds = self.durations.pop(0)
        self.timed_blocks.append(elapsed.seconds)

    def mpi_buffer(self, array):
        return array

    def close(self) -> None:
        pass


def test_time_repeats_runs_the_warmup_untimed_then_keeps_each_repeat() -> None:
    backend = ScriptedBackend([9.0, 9.0, 1.0, 2.0, 3.0])
    calls = []
    seconds = time_repeats(backend, lambda: calls.append(1), warmup=2, repeat=3)
    assert len(calls) == 5
    assert seconds == [1.0, 2.0, 3.0]


@pytest.fixture(scope="module")
def world() -> World:
    return World()


def test_rank_row_figures(world: World) -> None:
    m, n, k = 6, 5, 4
    cfg = _cfg(warmup=2, repeat=3, m=m, n=n, k=k)
    # timed blocks in run order: upload, 2 warm-ups, 3 repeats, download (of a device that copies: see
    # test_pin_matmul for the host, which computes in place and times no copy)
    h2d_s, gemm_s, d2h_s = 0.5, [0.002, 0.004, 0.003], 0.25
    backend = ScriptedBackend([h2d_s, 1.0, 1.0, *gemm_s, d2h_s], backend="opencl")
    rng = np.random.default_rng(1)
    a = rng.random((m, k), dtype=np.float32)
    b = rng.random((k, n), dtype=np.float32)
    prepared = run.Prepared(backend, backend.info(), "host", a, b, (m, n, k), 0, None)
    a, b = a.copy(), b.copy()  # the run releases its inputs once they are checked
    outcome = run.run_rank(cfg, world, prepared)
    row = outcome.row

    assert backend.matmul_calls == cfg.warmup + cfg.repeat
    assert row["raw"]["gemm_seconds"] == gemm_s
    assert row["gemm_seconds_median"] == pytest.approx(0.003)
    assert row["gemm_seconds_cv"] == pytest.approx(statistics.stdev(gemm_s) / statistics.fmean(gemm_s))
    flops = 2 * m * n * k
    assert row["gemm_flops"] == flops
    assert row["gemm_tflops"] == pytest.approx(flops / 0.003 / 1e12)
    assert row["peak_tflops"] == 2e-9
    assert row["peak_percent"] == pytest.approx(100 * row["gemm_tflops"] / 2e-9)
    assert row["h2d_bytes"] == (m * k + k * n) * 4
    assert row["h2d_seconds"] == h2d_s
    assert row["h2d_gbps"] == pytest.approx(row["h2d_bytes"] / h2d_s / 1e9)
    assert row["d2h_bytes"] == m * n * 4
    assert row["d2h_seconds"] == d2h_s
    assert row["d2h_gbps"] == pytest.approx(m * n * 4 / d2h_s / 1e9)
    assert row["reduce_bytes"] == m * n * 4
    assert len(row["raw"]["reduce_seconds"]) == cfg.repeat
    assert row["reduce_algbw_gbps"] == pytest.approx(m * n * 4 / row["reduce_seconds_median"] / 1e9)
    assert row["verified"] is True
    np.testing.assert_allclose(outcome.reduced, a.astype(np.float64) @ b, rtol=1e-5)


@pytest.mark.parametrize("wide", [False, True])
def test_table_shows_each_figure_under_its_own_header(wide: bool) -> None:
    """Every figure cell of the matmul table holds the row's own figure in the header's unit: % of peak is the
    percent, TFLOP/s the rate, GEMM the milliseconds (a table that put the rate under "% of peak" fails)."""
    from hetbench.report.console import matmul_table

    row = {"rank": 0, "host": "h", "backend": "sim:h100", "vendor": "NVIDIA", "device": "H100", "device_timing":
           "measured", "dtype": "fp32", "m": 8, "n": 8, "k": 8, "gemm_flops": 1024, "gemm_seconds_median": 0.0125,
           "gemm_seconds_cv": 0.5, "gemm_tflops": 7.25, "peak_tflops": 50.0, "peak_percent": 14.5,
           "h2d_gbps": 3.5, "d2h_gbps": 4.5, "reduce_seconds_median": 0.0625, "reduce_algbw_gbps": 9.5,
           "verified": True}
    table = matmul_table([row], {"reduce": "sum"}, wide=wide)
    cells = {str(c.header).replace("\n", " "): list(c.cells)[0] for c in table.columns}
    percent = next(v for h, v in cells.items() if h.startswith("% of"))
    assert percent == "14.5"
    assert cells["TFLOP/s"] == "7.25"
    assert next(v for h, v in cells.items() if h.startswith("GEMM") and "CV" not in h) == "12.5"
    assert next(v for h, v in cells.items() if h.startswith("Reduce") and "ms" in h) == "62.5"
    if wide:
        assert cells["GEMM CV (%)"] == "50" and cells["H2D (GB/s)"] == "3.5" and cells["D2H (GB/s)"] == "4.5"
