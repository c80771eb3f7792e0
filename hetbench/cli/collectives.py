"""`hetbench collectives`: nccl-tests-style sweeps of MPI collectives between devices of any vendor, over the
host-staged path, the device-direct path, or both."""

from __future__ import annotations

from pathlib import Path

import click

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
from hetbench.cli.types import MAX_RANK, MAX_REPEAT, MAX_WARMUP, int_range
from hetbench.config import (
    COLLECTIVE_DTYPES,
    DTYPE_NAMES,
    PATHS,
    CollectivesConfig,
    check_collective_sizes,
    parse_bytes,
    parse_dtype,
    parse_ops,
)
from hetbench.results import make_document

DEFAULT_MAX_BYTES = "16M"


class ByteSize(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@click.command()
@click.option("--op", "op_texts", multiple=True, metavar="OP[,OP...]",
              help="allreduce, reduce_scatter, allgather, reduce, bcast, gather, scatter, alltoall, sendrecv, or "
                   "all (the default). Repeat or separate with commas.")
@click.option("--min-bytes", type=ByteSize(), default=None,
              help="First size (8, 1K, 16M, 1G; powers of 1024). Default: the smallest size every op can take "
                   "(one element, or one per rank for ops whose size is split over the ranks).")
@click.option("--max-bytes", type=ByteSize(), default=DEFAULT_MAX_BYTES, show_default=True, help="Last size, at most.")
@click.option("--factor", type=int_range(), default=2, show_default=True, help="Each size is the last one times this.")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
              help=f"Element type ({', '.join(COLLECTIVE_DTYPES)}: MPI has no half-precision reductions).")
@click.option("--warmup", type=int_range(0, MAX_WARMUP), default=5, show_default=True, help="Untimed iterations first.")
@click.option("--iters", type=int_range(1, MAX_REPEAT), default=20, show_default=True, help="Timed iterations.")
@click.option("--root", type=int_range(0, MAX_RANK), default=0, show_default=True,
              help="Root of reduce, bcast, gather and scatter.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Count wrong elements against the exactly known result.")
@click.option("--path", "path", type=click.Choice([*PATHS, "both"]), default="host", show_default=True,
              help="host: copy device -> host, MPI on host buffers, copy back. device: hand device buffers to a "
                   "GPU-aware MPI directly. both: one after the other.")
@click.option("--progress/--no-progress", default=None,
              help="A progress bar on stderr during the sweep. Default: when stderr is a terminal; under mpiexec, "
                   "which hands rank output on through pipes, give --progress to see it.")
@backend_option
@output_options
def collectives(op_texts: tuple[str, ...], min_bytes: int | None, max_bytes: int, factor: int, dtype: str,
                warmup: int, iters: int, root: int, check: bool, path: str, progress: bool | None, backend: str,
                out_json: Path | None, out_csv: Path | None, json_stdout: bool) -> int:
    """Collective benchmarks across the ranks' devices, with nccl-tests' algbw and busbw."""
    from hetbench.benchmarks.collectives import OPS
    from hetbench.comm.world import World
    from hetbench.harness import collectives as run
    from hetbench.harness.metadata import job_metadata

    try:
        ops = parse_ops(op_texts)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--op'") from None
    world = World()
    dt = parse_dtype(dtype)
    if min_bytes is None:
        min_bytes = dt.itemsize * (world.size if any(OPS[o].size_is_total for o in ops) else 1)
    try:
        check_collective_sizes(ops, min_bytes, max_bytes, factor, dt, world.size)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if root >= world.size:
        raise click.BadParameter(f"{root} is not a rank of this job; ranks are 0..{world.size - 1}",
                                 param_hint="'--root'")
    cfg = CollectivesConfig(
        ops=ops, min_bytes=min_bytes, max_bytes=max_bytes, factor=factor, dtype=dt,
        backends=parse_backends(world, backend), paths=PATHS if path == "both" else (path,), warmup=warmup,
        iters=iters, root=root, check=check,
        output=resolve_outputs("collectives", out_json, out_csv, json_stdout, world.bcast(utc_stamp())),
    )

    errors = output_path_errors(cfg.output) if world.is_root else []
    prepared, prepare_errors = run.prepare(cfg, world)
    agree_or_exit(world, errors + prepare_errors)
    assert prepared is not None

    from hetbench.report.console import sweep_progress

    try:
        with sweep_progress(enabled=world.is_root and not json_stdout, force=progress) as on_step:
            rows = run.run_sweep(cfg, world, prepared, on_step)
    finally:
        prepared.backend.close()
    ranks = run.rank_descriptions(world, prepared)
    verified = None
    if world.is_root:
        assert rows is not None and ranks is not None
        metadata = {**job_metadata(world), "ranks": ranks}
        summary = run.summarize(rows)
        verified = summary["verified"]
        document = make_document("collectives", metadata, cfg.to_dict(), rows, summary, verified)

        def render() -> None:
            from hetbench.report.console import collectives_report

            collectives_report(rows, summary, ranks)

        emit(world, document, cfg.output, render)
    return 1 if world.bcast(verified) is False else 0
