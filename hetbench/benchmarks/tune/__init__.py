"""`hetbench tune`: search the self-tuning OpenCL GEMM's parameters (kernels/gemm_tuned.cl) on each rank's device
for one dtype and the shape classes asked, every candidate's product checked against NumPy; cache each winner (the
user's cache folder, keyed by the device's platform, name and driver version) and measure CLBlast and
kernels/gemm.cl at the same shape, which `HETBENCH_OPENCL_GEMM=auto` reads to pick the faster. The search itself is
hetbench/backends/opencl_tune.py; a device that has no tunable GEMM is a usage error."""

from __future__ import annotations

import math
from typing import Any, Sequence

import click

from hetbench.benchmarks.base import RANK_COLUMNS, SHOW_FILES, SHOW_WIDE, Column, RankResult, register
from hetbench.config import DTYPE_NAMES, OutputConfig, parse_dtype
from hetbench.options import parse_backends

# the classes a tune searches by default, and their representative shapes (opencl_tune.SHAPE_CLASSES)
SHAPE_CLASS_NAMES = ("small", "thin", "medium", "large")
MAX_BUDGET_SECONDS = 3600.0

COLUMNS: tuple[Column, ...] = (
    *RANK_COLUMNS,
    Column("dtype", "Dtype", text=True),
    Column("shape_class", "Shape class", text=True),
    Column("shape", "m x n x k", text=True, show=SHOW_WIDE),
    Column("winner", "Winner", text=True),
    Column("tuned_gflops", "Tuned", "GFLOP/s", better="higher"),
    Column("default_gflops", "Default point", "GFLOP/s", show=SHOW_WIDE, better="higher"),
    Column("kernel_gflops", "gemm.cl", "GFLOP/s", better="higher"),
    Column("clblast_gflops", "CLBlast", "GFLOP/s", better="higher"),
    Column("auto_gemm", "auto uses", text=True),
    Column("candidates", "Candidates", text=True, show=SHOW_WIDE),
    Column("search_seconds", "Search", "s", better="lower", show=SHOW_WIDE),
    Column("cache_path", "Cache", text=True, show=SHOW_FILES),
    Column("params", "Parameters", text=True, show=SHOW_FILES),
    Column("verified", "Check", text=True),
)


class TuneConfig:
    def __init__(self, dtype_name: str, classes: tuple[str, ...], budget_seconds: float, backends: tuple,
                 output: OutputConfig) -> None:
        self.dtype = parse_dtype(dtype_name)
        self.classes, self.budget_seconds, self.backends, self.output = classes, budget_seconds, backends, output

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name, "shape_classes": list(self.classes), "budget_seconds": self.budget_seconds,
                "backends": [str(b) for b in self.backends]}


def _classes(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if names == ("all",):
        return SHAPE_CLASS_NAMES
    wrong = [n for n in names if n not in SHAPE_CLASS_NAMES]
    if not names or wrong:
        raise click.BadParameter(f"{text!r}: accepted shape classes are {', '.join(SHAPE_CLASS_NAMES)} or all, "
                                 "comma-separated", param_hint="'--shape-class'")
    return names


class Tune:
    name = "tune"
    summary = "Tune the OpenCL GEMM kernel to each rank's device (per dtype and shape class) and cache the winner."
    columns = COLUMNS

    def options(self) -> list[click.Parameter]:
        return [
            click.Option(["--dtype"], type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
                         help="Element type to tune for; checked against every rank's device."),
            click.Option(["--shape-class", "shape_classes"], default="all", show_default=True, metavar="LIST",
                         help="Shape classes to tune, comma-separated: small (under 384^3 flops/2, tuned at 256^3), "
                              "thin (fewer than 256 rows or columns, at 128 x 1024 x 1024), medium (at 1024^3), "
                              "large (from 1536^3, at 2048^3), or all."),
            click.Option(["--budget", "budget_seconds"], type=click.FloatRange(1.0, MAX_BUDGET_SECONDS),
                         default=60.0, show_default=True,
                         help="Seconds per shape class after which no new candidate is started."),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> TuneConfig:
        if not math.isfinite(params["budget_seconds"]):  # FloatRange lets nan through: no comparison is true of it
            raise click.BadParameter(f"{params['budget_seconds']} is not a number of seconds in 1..3600",
                                     param_hint="'--budget'")
        backends = parse_backends(world, click.get_current_context().params["backend"])
        return TuneConfig(params["dtype"], _classes(params["shape_classes"]), params["budget_seconds"], backends,
                          output)

    def output_paths(self, cfg: TuneConfig) -> dict[str, tuple[Any, int]]:
        return {}

    def dtype(self, cfg: TuneConfig) -> Any:
        return cfg.dtype

    def prepare(self, cfg: TuneConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        # a backend with a tunable GEMM says so by having tune_gemm (the OpenCL backend's); no name is tested
        if not callable(getattr(device.backend, "tune_gemm", None)):
            return device, [f"rank {world.rank} ({world.host}): {device.info.label} has no tunable GEMM; `hetbench "
                            "tune` tunes OpenCL devices (--backend opencl)"]
        return device, []

    def check(self, cfg: TuneConfig, world: Any, state: Any) -> list[str]:
        return []

    def run(self, cfg: TuneConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        device = state
        backend = device.backend
        rows = []
        for i, cls in enumerate(cfg.classes):
            def step(done: int, total: int, label: str, i: int = i) -> None:
                if on_step:
                    on_step(i * total + done, len(cfg.classes) * total, label)

            entry = backend.tune_gemm(cfg.dtype, cls, on_step=step, budget_seconds=cfg.budget_seconds)
            m, n, k = entry["shape"]
            path, _ = backend.gemm_path(cfg.dtype, m, n, k)
            rows.append({
                "rank": world.rank, "host": world.host, "backend": device.spec, "vendor": device.info.vendor,
                "device": device.info.name, "device_timing": backend.timing, "dtype": cfg.dtype.name,
                "shape_class": cls, "shape": f"{m} x {n} x {k}", "m": m, "n": n, "k": k,
                "winner": entry["label"], "params": " ".join(f"{k}={v}" for k, v in entry["params"].items()),
                "tuned_gflops": entry["tuned_gflops"],
                "default_gflops": entry["default_gflops"], "kernel_gflops": entry["kernel_gflops"],
                "clblast_gflops": entry["clblast_gflops"], "auto_gemm": path,
                "candidates": entry["candidates"], "candidates_tried": entry["candidates_tried"],
                "search_seconds": entry["search_seconds"], "cache_path": entry["cache_path"],
                "verified_shapes": entry["verified_shapes"], "verified": True,
            })
        return RankResult(rows, description={"tuning_cache": str(backend.tuning_key.path())})

    def rows(self, cfg: TuneConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        return [row for rank_rows in gathered for row in rank_rows]

    def summarize(self, cfg: TuneConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        # a winner is only cached after its product was checked: a failed check raises, it never makes a row
        return {"ranks": len(gathered), "shape_classes": len(cfg.classes), "verified": all(r["verified"] for r in rows)}


register(Tune())
