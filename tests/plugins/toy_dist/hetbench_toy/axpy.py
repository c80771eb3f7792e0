"""A toy benchmark, `hetbench axpy`: y = 2 x on each rank's device, checked against NumPy. It is the whole of
what adding a command takes: this one module, registered the way hetbench's own benchmarks are (the tests import
it through HETBENCH_BENCHMARKS=toy_benchmark)."""

from __future__ import annotations

from typing import Any, Sequence

import click
import numpy as np

from hetbench.benchmarks.base import MODELLED_WITH_DEVICE, Column, RankResult, register
from hetbench.config import OutputConfig, parse_dtype
from hetbench.harness.stats import summarize
from hetbench.harness.timing import time_repeats
from hetbench.options import parse_backends


class AxpyConfig:
    def __init__(self, n: int, repeat: int, backends: tuple, output: OutputConfig) -> None:
        self.n, self.repeat, self.backends, self.output = n, repeat, backends, output
        self.dtype = parse_dtype("fp32")

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "repeat": self.repeat, "dtype": "fp32", "backends": [str(b) for b in self.backends]}


class Axpy:
    name = "axpy"
    summary = "A toy: y = 2 x on each rank's device."
    columns = (
        Column("rank", "Rank", text=True),
        Column("backend", "Backend", text=True),
        Column("axpy_seconds_median", "AXPY median", "us", 1e6, modelled=MODELLED_WITH_DEVICE, better="lower"),
        Column("verified", "Check", text=True),
    )

    def options(self) -> list[click.Parameter]:
        return [click.Option(["--n"], type=click.IntRange(min=1), default=1000, show_default=True),
                click.Option(["--repeat"], type=click.IntRange(min=1), default=3, show_default=True)]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> AxpyConfig:
        backends = parse_backends(world, click.get_current_context().params["backend"])
        return AxpyConfig(params["n"], params["repeat"], backends, output)

    def output_paths(self, cfg: AxpyConfig) -> dict[str, tuple[Any, int]]:
        return {}

    def dtype(self, cfg: AxpyConfig) -> Any:
        return cfg.dtype

    def prepare(self, cfg: AxpyConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        x = np.arange(cfg.n, dtype=np.float32) + world.rank
        return (device, x), []

    def check(self, cfg: AxpyConfig, world: Any, state: Any) -> list[str]:
        return []

    def run(self, cfg: AxpyConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        device, x = state
        backend, dtype = device.backend, cfg.dtype
        col = backend.upload(x.reshape(cfg.n, 1), dtype)
        two = backend.upload(np.full((1, 1), 2.0, dtype=np.float32), dtype)
        y_dev = backend.empty((cfg.n, 1), dtype)
        # y = x @ [[2]]: the device's own GEMM does the scaling, so any backend runs the toy
        seconds = time_repeats(backend, lambda: backend.matmul(col, two, y_dev, dtype), 1, cfg.repeat)
        got = backend.download(y_dev, dtype).ravel()
        ok = bool(np.array_equal(got, 2 * x))
        row = {"rank": world.rank, "backend": device.spec, "device_timing": backend.timing,
               **summarize(seconds, "axpy_seconds"), "verified": ok}
        return RankResult(row)

    def rows(self, cfg: AxpyConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        return list(gathered)

    def summarize(self, cfg: AxpyConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        return {"ranks": len(rows), "verified": all(r["verified"] for r in rows)}


register(Axpy())
