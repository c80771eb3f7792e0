"""`hetbench collectives`: an nccl-tests-style sweep of MPI collectives over sizes, on every rank's device. The op
records are in ops.py, the run on a rank in run.py, the run's configuration in config.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import click
from click.core import ParameterSource

from hetbench.benchmarks.base import MODELLED_WITH_COPIES, SHOW_FILES, SHOW_WIDE, Column, RankResult
from hetbench.benchmarks.base import register as register_benchmark
from hetbench.benchmarks.collectives import run as sweep
from hetbench.benchmarks.collectives.ops import OP_NAMES, OPS
from hetbench.benchmarks.collectives.present import PRESENTATION
from hetbench.benchmarks.collectives.config import (
    COLLECTIVE_DTYPES,
    PATHS,
    STAGE_METHODS,
    CollectivesConfig,
    check_collective_sizes,
    check_stage_chunk,
    parse_ops,
)
from hetbench.config import OutputConfig, parse_bytes, parse_dtype
from hetbench.options import MAX_RANK, MAX_REPEAT, MAX_WARMUP, int_range, parse_backends

DEFAULT_MAX_BYTES = "16M"

_COPIES = MODELLED_WITH_COPIES
COLUMNS: tuple[Column, ...] = (
    Column("op", "op", text=True, show=SHOW_FILES),
    Column("path", "path", text=True, show=SHOW_FILES),
    Column("size_bytes", "size", "B", text=True),
    Column("count_elements", "count", "elements", text=True),
    Column("dtype", "type", text=True, show=SHOW_WIDE),
    Column("redop", "redop", text=True, show=SHOW_WIDE),
    Column("root", "root", text=True, show=SHOW_WIDE),
    Column("ranks", "ranks", text=True, show=SHOW_FILES),
    Column("op_us_median", "time", "us", digits=4, better="lower"),
    Column("op_us_min", "time min", "us", digits=4, show=SHOW_FILES, better="lower"),
    Column("op_us_max", "time max", "us", digits=4, show=SHOW_FILES, better="lower"),
    Column("algbw_gbps", "algbw", "GB/s", better="higher"),
    Column("busbw_factor", "busbw factor", show=SHOW_FILES),
    Column("busbw_gbps", "busbw", "GB/s", better="higher"),
    Column("wrong", "#wrong", text=True),
    Column("d2h_us_median", "d2h", "us", digits=4, modelled=_COPIES, show=SHOW_WIDE, better="lower"),
    Column("h2d_us_median", "h2d", "us", digits=4, modelled=_COPIES, show=SHOW_WIDE, better="lower"),
    Column("end_to_end_us_median", "end-to-end", "us", digits=4, modelled=_COPIES, better="lower"),
    Column("end_to_end_algbw_gbps", "end-to-end algbw", "GB/s", modelled=_COPIES, show=SHOW_WIDE,
           better="higher"),
    Column("copy_timing", "copy timing", text=True, show=SHOW_FILES),
    # the host path's pipelined staging: chunk (bytes of a rank's part), chunks per call, and how they were chosen
    Column("stage_chunk_bytes", "stage chunk", "B", text=True, show=SHOW_FILES),
    Column("stage_chunks", "stage chunks", text=True, show=SHOW_FILES),
    Column("stage_method", "stage method", text=True, show=SHOW_FILES),
    Column("stage_chosen_by", "stage chunk chosen by", text=True, show=SHOW_FILES),
    Column("stragglers", "straggler", text=True),
)


class ByteSize(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Collectives:
    name = "collectives"
    summary = "Collective benchmarks across the ranks' devices, with nccl-tests' algbw and busbw."
    columns = COLUMNS
    presentation = PRESENTATION  # report, compare, the page

    def options(self) -> list[click.Parameter]:
        return [
            click.Option(["--op", "op_texts"], multiple=True, metavar="OP[,OP...]",
                         help=f"{', '.join(OP_NAMES)}, or all (the default). Repeat or separate with commas."),
            click.Option(["--min-bytes"], type=ByteSize(), default=None,
                         help="First size (8, 1K, 16M, 1G; powers of 1024). Default: the smallest size every op "
                              "can take (one element, or one per rank for ops whose size is split over the ranks)."),
            click.Option(["--max-bytes"], type=ByteSize(), default=DEFAULT_MAX_BYTES, show_default=True,
                         help="Last size, at most."),
            click.Option(["--factor"], type=int_range(), default=2, show_default=True,
                         help="Each size is the last one times this."),
            click.Option(["--dtype"], type=click.Choice(COLLECTIVE_DTYPES), default="fp32", show_default=True,
                         help="Element type (MPI has no half-precision reductions, so no fp16 or bf16)."),
            click.Option(["--warmup"], type=int_range(0, MAX_WARMUP), default=5, show_default=True,
                         help="Untimed iterations first."),
            click.Option(["--iters"], type=int_range(1, MAX_REPEAT), default=20, show_default=True,
                         help="Timed iterations."),
            click.Option(["--root"], type=int_range(0, MAX_RANK), default=0, show_default=True,
                         help="Root of reduce, bcast, gather and scatter."),
            click.Option(["--check/--no-check"], default=True, show_default=True,
                         help="Count wrong elements against the exactly known result."),
            click.Option(["--path", "path"], type=click.Choice([*PATHS, "both"]), default="host", show_default=True,
                         help="host: copy device -> host, MPI on host buffers, copy back. device: hand device "
                              "buffers to a GPU-aware MPI directly. both: one after the other."),
            click.Option(["--stage-chunk-bytes"], default="auto", show_default=True, metavar="auto|BYTES",
                         help="Host path: the pipeline's chunk (bytes of a rank's part: 256K, 4M). auto: the "
                              "fastest of a few sizes, measured per op and size before its timed iterations."),
            click.Option(["--stage-method"], type=click.Choice(STAGE_METHODS), default="auto", show_default=True,
                         help="Host path: how a chunk reaches the host. copy: a ring of host buffers; map: a view of "
                              "the device buffer where the device's memory is the host's (else copy); auto: measured."),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> CollectivesConfig:
        try:
            names = parse_ops(params["op_texts"])
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--op'") from None
        dt = parse_dtype(params["dtype"])
        min_bytes, max_bytes, factor = params["min_bytes"], params["max_bytes"], params["factor"]
        if min_bytes is None:
            min_bytes = dt.itemsize * (world.size if any(OPS[o].size_is_total for o in names) else 1)
        try:
            check_collective_sizes(names, min_bytes, max_bytes, factor, dt, world.size)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        root = params["root"]
        if root >= world.size:
            raise click.BadParameter(f"{root} is not a rank of this job; ranks are 0..{world.size - 1}",
                                     param_hint="'--root'")
        path = params["path"]
        try:
            stage_chunk = check_stage_chunk(params["stage_chunk_bytes"], dt)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--stage-chunk-bytes'") from None
        if path == "device":
            ctx = click.get_current_context()
            given = [f"--{n.replace('_', '-')}" for n in ("stage_chunk_bytes", "stage_method")
                     if ctx.get_parameter_source(n) is not ParameterSource.DEFAULT]
            if given:
                raise click.UsageError(f"{' and '.join(given)} apply to the host path only (host-staged copies); "
                                       "--path device hands device buffers to MPI: use --path host or both")
        return CollectivesConfig(
            ops=names, min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, dtype=dt,
            backends=parse_backends(world, click.get_current_context().params["backend"]),
            paths=PATHS if path == "both" else (path,), warmup=params["warmup"], iters=params["iters"], root=root,
            check=params["check"], output=output, stage_chunk_bytes=stage_chunk, stage_method=params["stage_method"],
        )

    def output_paths(self, cfg: CollectivesConfig) -> dict[str, tuple[Any, int]]:
        return {}

    def dtype(self, cfg: CollectivesConfig) -> Any:
        return cfg.dtype

    def prepare(self, cfg: CollectivesConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        return sweep.prepare(cfg, world, device)

    def check(self, cfg: CollectivesConfig, world: Any, state: Any) -> list[str]:
        return []

    def run(self, cfg: CollectivesConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        # the sweep gathers each point's times to rank 0 as it goes: rank 0's data is every row
        rows = sweep.run_sweep(cfg, world, state, on_step)
        return RankResult(rows, description=sweep.memory_description(state))

    def rows(self, cfg: CollectivesConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        return gathered[0]

    def summarize(self, cfg: CollectivesConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        return sweep.summarize(rows)


register_benchmark(Collectives())
