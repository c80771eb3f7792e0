"""`hetbench matmul`: every rank multiplies its own A_r @ B_r on its own device, the products are summed to the
root over MPI, and every figure goes to a table, JSON and CSV."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from hetbench.cli.common import (
    agree_or_exit,
    backend_option,
    emit,
    output_options,
    output_path_errors,
    parse_backends,
    resolve_outputs,
    utc_stamp,
)
from hetbench.cli.types import MAX_DIMENSION, MAX_RANK, MAX_REPEAT, MAX_SEED, MAX_WARMUP, int_range
from hetbench.config import DTYPE_NAMES, MatmulConfig, parse_dtype
from hetbench.results import check_writable, make_document, write_npy_atomic

DEFAULT_SIZE = 2048
_DIMENSION = int_range(1, MAX_DIMENSION)


@click.command()
@click.option("--size", type=_DIMENSION, default=DEFAULT_SIZE, show_default=True,
              help="m = n = k of each rank's product (each of --m/--n/--k overrides its own).")
@click.option("--m", "m", type=_DIMENSION, default=None, help="Rows of A_r and C_r.")
@click.option("--n", "n", type=_DIMENSION, default=None, help="Columns of B_r and C_r.")
@click.option("--k", "k", type=_DIMENSION, default=None, help="Columns of A_r, rows of B_r.")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
              help="Element type; checked against every rank's device.")
@backend_option
@click.option("--warmup", type=int_range(0, MAX_WARMUP), default=2, show_default=True, help="Untimed runs first.")
@click.option("--repeat", type=int_range(1, MAX_REPEAT), default=10, show_default=True, help="Timed runs; every one is kept.")
@click.option("--seed", type=int_range(0, MAX_SEED), default=0, show_default=True,
              help="Seeds the generated A_r, B_r (with the rank) and the verification vectors.")
@click.option("--reduce", "reduce_op", type=click.Choice(["sum", "none"]), default="sum", show_default=True,
              help="Sum the products to the root over MPI, or not.")
@click.option("--root", type=int_range(0, MAX_RANK), default=0, show_default=True,
              help="The rank that receives (and with --save stores) the sum.")
@click.option("--a", "a_path", metavar="PATH", default=None,
              help="Load A_r from this .npy file; {rank} and {host} in the path are replaced per rank.")
@click.option("--b", "b_path", metavar="PATH", default=None, help="Load B_r likewise (needs --a).")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the summed result to this .npy file at the root.")
@output_options
@click.pass_context
def matmul(ctx: click.Context, size: int, m: int | None, n: int | None, k: int | None, dtype: str, backend: str,
           warmup: int, repeat: int, seed: int, reduce_op: str, root: int, a_path: str | None, b_path: str | None,
           save: Path | None, out_json: Path | None, out_csv: Path | None, json_stdout: bool) -> int:
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

    try:
        outcome = run.run_rank(cfg, world, prepared)
    finally:
        prepared.backend.close()
    if outcome.reduced is not None and save is not None:
        write_npy_atomic(save, outcome.reduced)

    rows = world.gather(outcome.row)
    metadata = job_metadata(world) if world.is_root else None
    if world.is_root:
        assert rows is not None
        summary = run.summarize_job(cfg, rows, outcome.reduced_verdict)
        document = make_document("matmul", metadata, cfg.to_dict(), rows, summary, summary["verified"])

        def render() -> None:
            from hetbench.report.console import console, matmul_summary_lines, matmul_table

            out = console()
            out.print(matmul_table(rows, summary))
            for line in matmul_summary_lines(summary):
                out.print(line)

        emit(world, document, cfg.output, render)
        verified = summary["verified"]
    else:
        verified = True
    return 0 if world.bcast(verified) else 1
