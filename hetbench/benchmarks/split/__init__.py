"""`hetbench split`: ONE GEMM, C = A @ B with A and B at the root, sliced across the ranks' unequal devices in
proportion to their measured speed (or given weights), computed at once and gathered at the root; the even split is
measured beside it, and every figure says how close the split came to the devices' combined speed.

This module declares the benchmark; the run on each rank is hetbench/benchmarks/split/run.py, the cost model and the
shares hetbench/harness/split_plan.py, the probes hetbench/harness/probe.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import click
from click.core import ParameterSource

from hetbench.harness import split_plan as plan
from hetbench.benchmarks.base import (
    RANK_COLUMNS,
    MODELLED_WITH_DEVICE,
    SHOW_FILES,
    SHOW_WIDE,
    Column,
    RankResult,
    register,
)
from hetbench.benchmarks.split import run
from hetbench.benchmarks.split.config import DEFAULT_LINK_GBIT, DEFAULT_LINK_LATENCY_US, SPLIT_STRATEGIES, SplitConfig
from hetbench.benchmarks.split.present import PRESENTATION
from hetbench.benchmarks.split.stream import AUTO_CHUNK_MIN_COLUMNS, AUTO_CHUNKS, MAX_CHUNKS
from hetbench.config import DTYPE_NAMES, OutputConfig, parse_backend_map, parse_dtype
from hetbench.options import (
    output_file,
    float_range,
    MAX_REPEAT,
    MAX_SEED,
    MAX_WARMUP,
    AutoOrIntRange,
    int_range,
    parse_backends,
    shape_options,
    shape_sources,
)

MAX_REBALANCE = 100

_M = MODELLED_WITH_DEVICE
COLUMNS: tuple[Column, ...] = (
    Column("split", "Split", text=True),
    *RANK_COLUMNS,
    Column("strategy", "Strategy", text=True, show=SHOW_WIDE),
    Column("dtype", "Dtype", text=True, show=SHOW_FILES),
    Column("m", "m", text=True, show=SHOW_FILES),
    Column("n", "n", text=True, show=SHOW_FILES),
    Column("k", "k", text=True, show=SHOW_FILES),
    Column("part", "Part", text=True, short_label="Part"),
    Column("share_percent", "Share", "%", digits=3),
    Column("gemm_flops", "GEMM flops", show=SHOW_FILES),
    Column("solo_gflops", "Solo", "GFLOP/s", modelled=_M, better="higher"),
    Column("solo_part", "Solo probe part", text=True, show=SHOW_FILES),
    Column("rate_gflops", "Rate beside the others", "GFLOP/s", modelled=_M, show=SHOW_WIDE, better="higher"),
    Column("compute_seconds_median", "Compute", "ms", 1e3, modelled=_M, better="lower"),  # the GEMM
    Column("compute_seconds_min", "Compute min", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("compute_seconds_max", "Compute max", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("compute_seconds_mean", "Compute mean", "ms", 1e3, modelled=_M, show=SHOW_FILES, better="lower"),
    Column("compute_seconds_cv", "Compute CV", "%", 100.0, show=SHOW_FILES),
    Column("h2d_seconds_median", "H2D", "ms", 1e3, modelled=_M, show=SHOW_WIDE, better="lower"),
    Column("d2h_seconds_median", "D2H", "ms", 1e3, modelled=_M, show=SHOW_WIDE, better="lower"),
    Column("gemm_gflops", "GEMM rate", "GFLOP/s", modelled=_M, show=SHOW_WIDE, better="higher"),
    Column("comm_seconds_median", "Comm", "ms", 1e3, better="lower"),
    Column("idle_seconds_median", "Idle", "ms", 1e3, modelled=_M, better="lower"),
    Column("link_gbps", "Link to root", "GB/s", show=SHOW_WIDE, better="higher"),
    Column("link_latency_us", "Link latency", "us", show=SHOW_FILES, better="lower"),
)


def _parse_weights(text: str, ranks: int) -> Any:
    try:
        return plan.parse_weights(text, ranks)
    except plan.WeightsError as e:
        raise click.BadParameter(str(e), param_hint="'--weights'") from None


class Split:
    name = "split"
    summary = ("One GEMM sliced across the ranks' devices by their measured speed, gathered at the root, verified, "
               "and measured beside the even split.")
    columns = COLUMNS
    presentation = PRESENTATION  # report, compare, the page

    def options(self) -> list[click.Parameter]:
        return [
            *shape_options("the one product"),
            click.Option(["--dtype"], type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
                         help="Element type; checked against every rank's device."),
            click.Option(["--strategy"], type=click.Choice(SPLIT_STRATEGIES), default="auto", show_default=True,
                         help="rows: row blocks of A to the ranks, C's rows gathered; k: column blocks of A and "
                              "row blocks of B, the partial products summed; auto: the one the cost model "
                              "predicts faster from the measured rates and links."),
            click.Option(["--weights"], default="auto", show_default=True, metavar="even|auto|PROFILE|W0,W1,..",
                         help="The shares: even; auto (each rank's measured solo GEMM rate, capped by its free "
                              "memory); a profile from `hetbench calibrate`; or one weight >= 0 per rank."),
            click.Option(["--rebalance"], type=int_range(1, MAX_REBALANCE), default=None,
                         help="Re-weight from each rank's measured compute time, up to N iterations, until the "
                              "imbalance (slowest / mean - 1) is under 5 %."),
            click.Option(["--overlap/--no-overlap"], default=True, show_default=True,
                         help="Stream A's block and B's column chunks to the ranks while they compute, each chunk "
                              "of C sent back as it is done (a progress thread moves MPI meanwhile); "
                              "--no-overlap: distribute, compute and collect in turn, between barriers."),
            click.Option(["--chunks"], type=AutoOrIntRange(1, MAX_CHUNKS), default="auto", show_default=True,
                         metavar="auto|N",
                         help=f"With --overlap: the column chunks B and C are streamed in (auto: "
                              f"{AUTO_CHUNKS}, fewer where a chunk would be narrower than "
                              f"{AUTO_CHUNK_MIN_COLUMNS} columns; at most the product's columns)."),
            click.Option(["--zero-copy/--no-zero-copy"], default=True, show_default=True,
                         help="With --overlap, strategy rows: where every rank is on the root's node and computes "
                              "in host memory (host BLAS, a CPU OpenCL device), A, B and C live in one MPI "
                              "shared-memory window at the root and nothing is sent; --no-zero-copy: messages."),
            click.Option(["--compare-even/--no-compare-even"], default=True, show_default=True,
                         help="Measure the even split beside the chosen one, in the same run."),
            click.Option(["--warmup"], type=int_range(0, MAX_WARMUP), default=1, show_default=True,
                         help="Untimed iterations of each split first."),
            click.Option(["--repeat"], type=int_range(1, MAX_REPEAT), default=5, show_default=True,
                         help="Timed iterations of each split; every one is kept."),
            click.Option(["--seed"], type=int_range(0, MAX_SEED), default=0, show_default=True,
                         help="Seeds the generated A, B and the verification vectors."),
            click.Option(["--a", "a_path"], metavar="PATH", default=None, help="Load A from this .npy at the root."),
            click.Option(["--b", "b_path"], metavar="PATH", default=None, help="Load B likewise (needs --a)."),
            click.Option(["--save"], type=output_file(), default=None,
                         help="Write C to this .npy file at the root."),
            click.Option(["--plan"], is_flag=True,
                         help="Compute the split and its predicted times without running, for the rank map of "
                              "--backend (simulated devices, or a --weights profile for real ones); modelled."),
            click.Option(["--link-gbps", "link_gbit_per_s"], type=float_range(min=0, min_open=True),
                         default=None, help=f"With --plan: the link between the root and each other rank, in "
                                            f"gigabits per second as links are rated (default {DEFAULT_LINK_GBIT:g}, "
                                            f"e.g. AWS EFA)."),
            click.Option(["--link-latency-us"], type=float_range(min=0), default=None,
                         help=f"With --plan: the link's latency in microseconds "
                              f"(default {DEFAULT_LINK_LATENCY_US:g})."),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> SplitConfig:
        ctx = click.get_current_context()
        a_path, b_path = params["a_path"], params["b_path"]
        shape_sources(params)  # --a/--b together, and no shape option beside them
        linked = [o for o, p in (("--link-gbps", "link_gbit_per_s"), ("--link-latency-us", "link_latency_us"))
                  if params[p] is not None]
        if linked and not params["plan"]:
            raise click.UsageError(f"{', '.join(linked)} model the link for --plan; a run measures its links")
        if (not params["overlap"] and params["zero_copy"]
                and ctx.get_parameter_source("zero_copy") not in (None, ParameterSource.DEFAULT)):
            raise click.UsageError("--zero-copy shares the streamed split's window; --no-overlap sends each slice "
                                   "in phases (leave --zero-copy out, or drop --no-overlap)")
        if params["chunks"] is not None and not params["overlap"]:
            raise click.UsageError(f"--chunks {params['chunks']} streams the chunks of --overlap; --no-overlap "
                                   "moves each slice whole (leave --chunks out, or drop --no-overlap)")
        if params["plan"] and (a_path is not None or params["save"] is not None or params["rebalance"]):
            raise click.UsageError("--plan runs nothing: it cannot be combined with --a/--b, --save or --rebalance")
        size = params["size"]
        ranks = plan_ranks(ctx.params["backend"], world.size) if params["plan"] else world.size
        weights = _parse_weights(params["weights"], ranks)
        if params["plan"]:
            try:
                backends = tuple(parse_backend_map(ctx.params["backend"], ranks))
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="'--backend'") from None
        else:
            backends = parse_backends(world, ctx.params["backend"])
        return SplitConfig(
            m=params["m"] or size, n=params["n"] or size, k=params["k"] or size, dtype=parse_dtype(params["dtype"]),
            backends=backends, strategy=params["strategy"], weights=weights, rebalance=params["rebalance"] or 0,
            compare_even=params["compare_even"], warmup=params["warmup"], repeat=params["repeat"],
            seed=params["seed"], a_path=a_path, b_path=b_path, save=params["save"], plan=params["plan"],
            link_gbit_per_s=params["link_gbit_per_s"], link_latency_us=params["link_latency_us"], output=output,
            overlap=params["overlap"], chunks=params["chunks"], zero_copy=params["zero_copy"],
        )

    def output_paths(self, cfg: SplitConfig) -> dict[str, tuple[Any, int]]:
        return {"--save": (cfg.save, 0)}

    def input_paths(self, cfg: SplitConfig, world: Any) -> dict[str, Any]:
        """The files the root reads (an output naming one is refused)."""
        return {option: path for option, path in (("--a", cfg.a_path), ("--b", cfg.b_path))
                if path is not None and world.is_root}

    def dtype(self, cfg: SplitConfig) -> Any:
        return cfg.dtype

    def prepare(self, cfg: SplitConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        return run.prepare(cfg, world, device)

    def check(self, cfg: SplitConfig, world: Any, state: Any) -> list[str]:
        return run.check(cfg, world, state)

    def run(self, cfg: SplitConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        outcome = run.plan_only(cfg, world, state) if cfg.plan else run.measure(cfg, world, state, on_step)
        files = []
        if outcome.c is not None and cfg.save is not None:
            files.append(("--save", cfg.save, outcome.c))
        outcome.c = None  # not gathered
        return RankResult(outcome, files)

    def rows(self, cfg: SplitConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        return run.rows(cfg, gathered)

    def summarize(self, cfg: SplitConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        return run.summarize_job(cfg, rows, gathered)


def plan_ranks(backend_text: str, world_size: int) -> int:
    """The ranks a --plan is for: those its rank map names (the highest rank + 1), or the job's."""
    highest = -1
    for item in backend_text.split(","):
        rank, eq, _ = item.partition("=")
        if eq and rank.strip().isascii() and rank.strip().isdigit():
            highest = max(highest, int(rank.strip()))
    return max(world_size, highest + 1)


register(Split())
