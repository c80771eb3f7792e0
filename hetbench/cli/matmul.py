"""`hetbench matmul`: every rank multiplies its own A_r @ B_r on its own device, the products are summed to the
root over MPI, and every figure goes to a table, JSON and CSV."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from hetbench.cli.common import (
    agree_or_exit,
    backend_option,
    check_distinct_outputs,
    emit,
    output_options,
    output_path_errors,
    parse_backends,
    resolve_outputs,
    utc_stamp,
)
from hetbench.config import DTYPE_NAMES, MatmulConfig, parse_dtype
from hetbench.results import check_writable, make_document

if TYPE_CHECKING:
    from hetbench.comm.world import World
    from hetbench.harness.matmul import Prepared

DEFAULT_SIZE = 2048
_POSITIVE = click.IntRange(min=1)


@click.command()
@click.option("--size", type=_POSITIVE, default=DEFAULT_SIZE, show_default=True,
              help="m = n = k of each rank's product (each of --m/--n/--k overrides its own).")
@click.option("--m", "m", type=_POSITIVE, default=None, help="Rows of A_r and C_r.")
@click.option("--n", "n", type=_POSITIVE, default=None, help="Columns of B_r and C_r.")
@click.option("--k", "k", type=_POSITIVE, default=None, help="Columns of A_r, rows of B_r.")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
              help="Element type; checked against every rank's device.")
@backend_option
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed runs first.")
@click.option("--repeat", type=_POSITIVE, default=10, show_default=True, help="Timed runs; every one is kept.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seeds the generated A_r, B_r (with the rank) and the verification vectors.")
@click.option("--reduce", "reduce_op", type=click.Choice(["sum", "none"]), default="sum", show_default=True,
              help="Sum the products to the root over MPI, or not.")
@click.option("--root", type=click.IntRange(min=0), default=0, show_default=True,
              help="The rank that receives (and with --save stores) the sum.")
@click.option("--a", "a_path", metavar="PATH", default=None,
              help="Load A_r from this .npy file; {rank} and {host} in the path are replaced per rank.")
@click.option("--b", "b_path", metavar="PATH", default=None, help="Load B_r likewise (needs --a).")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the summed result to this .npy file at the root.")
@click.option("--wide", is_flag=True,
              help="Show every column (host, dtype, shape, CV, copies, reduce bandwidth, timing); the default "
                   "table keeps the figures to compare and fits 100 columns.")
@click.option("--progress/--no-progress", default=None,
              help="A progress bar on stderr through the GEMMs and reduces. Default: when stderr is a terminal; "
                   "under mpiexec, which hands rank output on through pipes, give --progress to see it.")
@output_options
@click.pass_context
def matmul(ctx: click.Context, size: int, m: int | None, n: int | None, k: int | None, dtype: str, backend: str,
           warmup: int, repeat: int, seed: int, reduce_op: str, root: int, a_path: str | None, b_path: str | None,
           save: Path | None, wide: bool, progress: bool | None, out_json: Path | None, out_csv: Path | None,
           json_stdout: bool) -> int:
    """Per-rank GEMM on each rank's device, summed to the root over MPI, verified and timed."""
    from hetbench.comm.world import World
    from hetbench.harness import matmul as run
    from hetbench.harness.metadata import job_metadata

    if (a_path is None) != (b_path is None):
        raise click.UsageError("--a and --b go together: give both .npy paths, or neither")
    sized = [f"--{p}" for p in ("size", "m", "n", "k") if ctx.get_parameter_source(p) != ParameterSource.DEFAULT]
    if a_path is not None and sized:
        raise click.UsageError(f"{', '.join(sized)} cannot be combined with --a/--b: the shapes come from the files")
    if save is not None and reduce_op != "sum":
        raise click.UsageError("--save stores the summed result, so it needs --reduce sum")
    check_distinct_outputs({"--out": out_json, "--csv": out_csv, "--save": save})

    world = World()
    if root >= world.size:
        raise click.BadParameter(f"{root} is not a rank of this job; ranks are 0..{world.size - 1}",
                                 param_hint="'--root'")
    cfg = MatmulConfig(
        m=m or size, n=n or size, k=k or size, dtype=parse_dtype(dtype), backends=parse_backends(world, backend),
        warmup=warmup, repeat=repeat, seed=seed, reduce=reduce_op, root=root, a_path=a_path, b_path=b_path,
        save=save, output=resolve_outputs("matmul", out_json, out_csv, json_stdout, world.bcast(utc_stamp())),
    )

    # Everything that can be wrong is found before any computing, and every rank learns of every error
    errors: list[str] = output_path_errors(cfg.output) if world.is_root else []
    if save is not None and world.rank == root:
        errors += [e for e in [check_writable(save, "--save")] if e]
    opened, open_errors = run.open_device(cfg, world)
    agree_or_exit(world, errors + open_errors)
    assert opened is not None
    prepared, input_errors = run.prepare_inputs(cfg, world, opened)
    agree_or_exit(world, input_errors)
    assert prepared is not None
    agree_or_exit(world, run.shape_errors(cfg, world, prepared))
    _warn_slow_host_fp16(cfg, world, prepared)

    from hetbench.report.console import sweep_progress

    try:
        with sweep_progress(enabled=world.is_root and not json_stdout, force=progress,
                            description="matmul") as on_step:
            outcome = run.run_rank(cfg, world, prepared, on_step)
    finally:
        prepared.backend.close()

    rows = world.gather(outcome.row)
    metadata = job_metadata(world) if world.is_root else None
    document = render = None
    verified = True
    if world.is_root:
        assert rows is not None
        summary = run.summarize_job(cfg, rows, outcome.reduced_verdict)
        document = make_document("matmul", metadata, cfg.to_dict(), rows, summary, summary["verified"])

        def render() -> None:
            from hetbench.report.console import console, matmul_summary_lines, matmul_table, print_table

            out = console()
            print_table(out, matmul_table(rows, summary, wide=wide), wide=wide)
            for line in matmul_summary_lines(summary):
                out.print(line)

        verified = summary["verified"]
    # the files are written even when a check failed: they record the failure
    emit(world, document, cfg.output, render,
         save=(save, outcome.reduced) if outcome.reduced is not None and save is not None else None)
    return 0 if world.bcast(verified) else 1


HOST_FP16_FLOPS = 1e9  # about what NumPy's fp16 GEMM (no BLAS) does on one core: 0.7 GFLOP/s measured here


def _warn_slow_host_fp16(cfg: MatmulConfig, world: World, prepared: Prepared) -> None:
    """Collective. Before the run, rank 0 says once (on stderr) when any rank computes fp16 on the host, where
    NumPy has no BLAS: a few hundred times slower than fp32, so a run that takes seconds in fp32 takes minutes."""
    m, n, k = prepared.mnk
    slow = prepared.info.backend == "host" and cfg.dtype.name == "fp16"
    gathered = world.gather((slow, 2 * m * n * k * (cfg.warmup + cfg.repeat)))
    if gathered is None or not any(s for s, _ in gathered):
        return
    ranks = [r for r, (s, _) in enumerate(gathered) if s]
    seconds = max(f for s, f in gathered if s) / HOST_FP16_FLOPS
    estimate = ("under 1 s" if seconds < 1 else f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} min")
    from hetbench.report.console import notice_line

    who = f"rank {ranks[0]} computes" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))} compute"
    notice_line(f"{who} fp16 on the host, where NumPy has no BLAS: hundreds of times slower than fp32 (~1 GFLOP/s); "
                f"{cfg.warmup + cfg.repeat} GEMMs may take {estimate} (fp32 is fast)")
