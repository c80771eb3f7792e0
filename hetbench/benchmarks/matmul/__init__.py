"""`hetbench matmul`: every rank multiplies its own A_r @ B_r on its own device, the products are summed to the
root over MPI, and every figure goes to a table, JSON and CSV.

This module declares the benchmark (its options, config, columns, rows and summary); the timed run on each rank is
hetbench/benchmarks/matmul/run.py, the inputs hetbench/harness/gemm.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import click

from hetbench.benchmarks.base import (
    RANK_COLUMNS,
    MODELLED_WITH_DEVICE,
    SHOW_FILES,
    SHOW_WIDE,
    Column,
    RankResult,
    register,
)
from hetbench.benchmarks.matmul import run
from hetbench.benchmarks.matmul.config import MatmulConfig
from hetbench.benchmarks.matmul.present import PRESENTATION
from hetbench.config import DTYPE_NAMES, OutputConfig, expand_rank_path, parse_dtype
from hetbench.options import (
    output_file,
    MAX_RANK,
    MAX_REPEAT,
    MAX_SEED,
    MAX_WARMUP,
    SizeList,
    int_range,
    parse_backends,
    shape_options,
    shape_sources,
)

_M = MODELLED_WITH_DEVICE
COLUMNS: tuple[Column, ...] = (
    *RANK_COLUMNS,
    Column("dtype", "Dtype", text=True, show=SHOW_WIDE),
    Column("shape", "m x n x k", text=True, show=SHOW_WIDE, derived=True),
    Column("m", "m", text=True, show=SHOW_FILES),
    Column("n", "n", text=True, show=SHOW_FILES),
    Column("k", "k", text=True, show=SHOW_FILES),
    Column("gemm_flops", "GEMM flops", show=SHOW_FILES),
    Column("gemm_seconds_median", "GEMM median", "ms", 1e3, modelled=_M, better="lower", short_label="GEMM"),
    Column("gemm_seconds_min", "GEMM min", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("gemm_seconds_max", "GEMM max", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("gemm_seconds_mean", "GEMM mean", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("gemm_seconds_cv", "GEMM CV", "%", 100.0, digits=2, show=SHOW_WIDE),
    Column("gemm_tflops", "TFLOP/s", modelled=_M, better="higher"),
    Column("peak_tflops", "Peak", "TFLOP/s", show=SHOW_FILES),
    Column("peak_percent", "% of peak", modelled=_M, better="higher", short_label="% of\npeak"),
    Column("h2d_bytes", "H2D bytes", "B", show=SHOW_FILES),
    Column("h2d_seconds", "H2D", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("h2d_gbps", "H2D", "GB/s", modelled=_M, show=SHOW_WIDE, better="higher"),
    Column("d2h_bytes", "D2H bytes", "B", show=SHOW_FILES),
    Column("d2h_seconds", "D2H", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("d2h_gbps", "D2H", "GB/s", modelled=_M, show=SHOW_WIDE, better="higher"),
    Column("reduce_bytes", "Reduce bytes", "B", show=SHOW_FILES),
    Column("reduce_seconds_median", "Reduce median", "ms", 1e3, better="lower", short_label="Reduce"),
    Column("reduce_seconds_min", "Reduce min", "ms", 1e3, show=SHOW_FILES, better="lower"),
    Column("reduce_seconds_max", "Reduce max", "ms", 1e3, show=SHOW_FILES, better="lower"),
    Column("reduce_seconds_mean", "Reduce mean", "ms", 1e3, show=SHOW_FILES, better="lower"),
    Column("reduce_seconds_cv", "Reduce CV", "%", 100.0, digits=2, show=SHOW_FILES),
    Column("reduce_algbw_gbps", "Reduce", "GB/s", show=SHOW_WIDE, better="higher"),
    Column("verified", "Check", text=True),
    Column("max_residual_over_tolerance", "Residual / tolerance", show=SHOW_FILES, better="lower"),
)


class Matmul:
    name = "matmul"
    summary = "Per-rank GEMM on each rank's device, summed to the root over MPI, verified and timed."
    columns = COLUMNS
    presentation = PRESENTATION  # report, compare, the page

    def options(self) -> list[click.Parameter]:
        return [
            *shape_options("each rank's product", "_r"),
            click.Option(["--sizes"], type=SizeList(), default=None, metavar="LIST|MIN:MAX[:FACTOR]",
                         help="A size sweep: square products of each size in turn, e.g. 256,512,1024 or 256:4096 "
                              "(doubling; 256:4096:4 multiplies by 4). Every size is a whole run: its own inputs, "
                              "warm-up, repeats, checks and reduce; its rows in the same table and files."),
            click.Option(["--dtype"], type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
                         help="Element type; checked against every rank's device."),
            click.Option(["--warmup"], type=int_range(0, MAX_WARMUP), default=2, show_default=True,
                         help="Untimed runs first."),
            click.Option(["--repeat"], type=int_range(1, MAX_REPEAT), default=10, show_default=True,
                         help="Timed runs; every one is kept."),
            click.Option(["--seed"], type=int_range(0, MAX_SEED), default=0, show_default=True,
                         help="Seeds the generated A_r, B_r (with the rank) and the verification vectors."),
            click.Option(["--reduce", "reduce_op"], type=click.Choice(["sum", "none"]), default="sum",
                         show_default=True, help="Sum the products to the root over MPI, or not."),
            click.Option(["--root"], type=int_range(0, MAX_RANK), default=0, show_default=True,
                         help="The rank that receives (and with --save stores) the sum."),
            click.Option(["--a", "a_path"], metavar="PATH", default=None,
                         help="Load A_r from this .npy file; {rank} and {host} in the path are replaced per rank."),
            click.Option(["--b", "b_path"], metavar="PATH", default=None, help="Load B_r likewise (needs --a)."),
            click.Option(["--save"], type=output_file(), default=None,
                         help="Write the summed result to this .npy file at the root."),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> MatmulConfig:
        ctx = click.get_current_context()
        a_path, b_path = params["a_path"], params["b_path"]
        sized = shape_sources(params)
        sizes = params["sizes"] or ()
        if sizes:
            given = sized + (["--a/--b"] if a_path is not None else []) + \
                (["--save"] if params["save"] is not None else [])
            if given:
                raise click.UsageError(f"--sizes cannot be combined with {', '.join(given)}: a sweep multiplies "
                                       "square inputs it makes for each size, and keeps no single sum to --save")
        if params["save"] is not None and params["reduce_op"] != "sum":
            raise click.UsageError("--save stores the summed result, so it needs --reduce sum")
        root = params["root"]
        if root >= world.size:
            raise click.BadParameter(f"{root} is not a rank of this job; ranks are 0..{world.size - 1}",
                                     param_hint="'--root'")
        size = max(sizes) if sizes else params["size"]
        return MatmulConfig(
            m=params["m"] or size, n=params["n"] or size, k=params["k"] or size, dtype=parse_dtype(params["dtype"]),
            backends=parse_backends(world, ctx.params["backend"]), warmup=params["warmup"], repeat=params["repeat"],
            seed=params["seed"], reduce=params["reduce_op"], root=root, a_path=a_path, b_path=b_path,
            save=params["save"], output=output, sizes=sizes,
        )

    def output_paths(self, cfg: MatmulConfig) -> dict[str, tuple[Any, int]]:
        return {"--save": (cfg.save, cfg.root)}

    def input_paths(self, cfg: MatmulConfig, world: Any) -> dict[str, Any]:
        """The files this rank reads (an output naming one is refused)."""
        return {option: expand_rank_path(path, world.rank, world.host)
                for option, path in (("--a", cfg.a_path), ("--b", cfg.b_path)) if path is not None}

    def dtype(self, cfg: MatmulConfig) -> Any:
        return cfg.dtype

    def prepare(self, cfg: MatmulConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        if cfg.sizes:
            return run.prepare_sweep(cfg, world, device)
        return run.prepare_inputs(cfg, world, device)

    def check(self, cfg: MatmulConfig, world: Any, state: Any) -> list[str]:
        # a sweep's sizes are the same on every rank
        return [] if cfg.sizes else run.shape_errors(cfg, world, state)

    def notices(self, cfg: MatmulConfig, world: Any, state: Any) -> list[str]:
        if cfg.sizes:
            return run.slow_host_fp16_notices(cfg, world, state.opened.info, state.mnks)
        return run.slow_host_fp16_notices(cfg, world, state.info, [state.mnk])

    def run(self, cfg: MatmulConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        """data: (row, verdict of the sum) per size, smallest first; one pair without a sweep."""
        outcomes = run.run_sweep(cfg, world, state, on_step) if cfg.sizes else [run.run_rank(cfg, world, state,
                                                                                             on_step)]
        files = []
        if outcomes[0].reduced is not None and cfg.save is not None:
            files.append(("--save", cfg.save, outcomes[0].reduced))
        return RankResult([(o.row, o.reduced_verdict) for o in outcomes], files)

    def rows(self, cfg: MatmulConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        """Every rank's row of the first size, then of the next: one row per rank and size."""
        return [ranks[i][0] for i in range(len(gathered[0])) for ranks in gathered]

    def summarize(self, cfg: MatmulConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        """The job's figures; for a sweep, those of its largest size, with every size's under "sizes" and the
        checks of them all."""
        per_size = [run.summarize_job(cfg, [ranks[i][0] for ranks in gathered], gathered[cfg.root][i][1])
                    for i in range(len(gathered[0]))]
        if not cfg.sizes:
            return per_size[0]
        summary = dict(per_size[-1])
        summary["sizes"] = [{"m": r["m"], "n": r["n"], "k": r["k"], **s}
                            for s, r in zip(per_size, rows[::len(gathered)])]
        summary["products_verified"] = all(s["products_verified"] for s in per_size)
        if "reduced_verified" in summary:
            summary["reduced_verified"] = all(s["reduced_verified"] for s in per_size)
        summary["verified"] = all(s["verified"] for s in per_size)
        return summary


register(Matmul())
